"""GRPO training of a policy on verifiable math rewards (no Dagster here).

One round of Noisy Student self-training (Xie et al. 2020, "Self-training with Noisy Student improves
ImageNet classification") trains on the labeled problems, graded against their gold answers, plus the
pseudo-labeled ones, graded against the teacher's majority-vote answer.  The optimiser is GRPO
(Shao et al. 2024, "DeepSeekMath", section 4.1): for each prompt a group of completions is sampled,
and each completion's advantage is its reward relative to the group's mean (optionally over its
standard deviation), so no value model is needed.  The loss, sampling and LoRA adapters are TRL's
``GRPOTrainer`` and peft's; this module only maps settings onto them and saves a merged checkpoint
that vLLM and plain transformers can load.

The ML libraries are imported inside the functions that use them: the Dagster config imports the
settings here, and loading the code location should not wait for torch, peft and TRL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core import grading
from noisy_student_assets.core.prompts import build_messages, noisy_template
from noisy_student_assets.core.pseudo_labels.student_data import vote_share_of

if TYPE_CHECKING:
    import datasets
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import GRPOConfig

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo")
"""TRL 1.16 loss aggregations usable with token-level importance sampling ("luspo" needs sequence-level).
TRL itself only rejects an unknown one after the first generation batch, hence the early check."""

SCALE_REWARDS = ("group", "batch", "none")
"""TRL 1.16 advantage scaling: by the group's reward std (GRPO), the batch's, or not at all (Dr. GRPO)."""

GOLD, PSEUDO = "gold", "pseudo"

HARD_REWARD, VOTE_SHARE_REWARD = "hard", "vote_share"
REWARDS = (HARD_REWARD, VOTE_SHARE_REWARD)
"""GRPO's reward on pseudo-labeled rows: 1 for the pseudo-label's answer (`answer_reward`), or the vote share
of the completion's answer (`vote_share_reward`)."""

GRPO_LOGGED = (("reward", "reward"), ("rewards/answer_reward/mean", "answer_reward"), ("rewards/vote_share_reward/mean", "vote_share_reward"))
"""TRL's GRPO step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


@dataclass(frozen=True)
class GRPOSettings:
    """Hyper-parameters of one GRPO run; see `grpo_config` for how each maps onto TRL's `GRPOConfig`."""

    max_steps: int = 20
    num_generations: int = 8
    """Completions sampled per prompt: the GRPO group whose mean reward is the baseline."""
    prompts_per_step: int = 2
    """Prompts per optimiser step, so a step trains on `prompts_per_step * num_generations` completions."""
    max_completion_length: int = 64
    learning_rate: float = 2e-4
    beta: float = 0.0
    """KL coefficient towards the initial policy; 0 loads no reference model."""
    epsilon: float = 0.2
    """PPO-style clip range of the importance ratio."""
    loss_type: str = "dapo"
    """How token losses are averaged; one of `LOSS_TYPES` (TRL's default is "dapo", Yu et al. 2025)."""
    scale_rewards: str = "group"
    """One of `SCALE_REWARDS`."""
    temperature: float = 1.0
    format_reward_weight: float = 0.0
    """Weight of the format reward beside the answer reward (weight 1); 0 trains on the answer reward only."""
    use_lora: bool = True
    """LoRA adapters (Hu et al. 2021), merged into the weights after training; False fine-tunes every weight."""
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    seed: int = 0
    save_steps: int = 0
    """Save a resumable TRL checkpoint into the work dir every this many steps; 0 saves none."""
    use_vllm: bool = False
    """Sample with vLLM colocated on the training GPU instead of `model.generate`."""
    bf16: bool = False
    gradient_accumulation_steps: int = 1
    """Micro-batches each step's completions are split into (memory only: the step's batch is unchanged)."""
    logging_steps: int = 1
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~20% slower (TRL turns it on by default)."""
    max_consecutive_skipped_steps: int = 3
    """A step whose loss or gradient norm is not finite is skipped (`guards.NonFiniteStepGuard`); this many
    skipped in a row stop training with an error naming the last good resumable checkpoint."""
    cast_lm_head_to_fp32: bool = False
    """TRL's `cast_lm_head_to_fp32`: logits in float32 under bf16 (the ScaleRL recipe, Khatri et al. 2025)."""
    merge_lora_for_generation: bool = True
    """With LoRA and transformers generation, merge the adapters into the weights while the GRPO groups are
    sampled and unmerge them after (as TRL does before a vLLM weight sync): every decoding step then runs
    one matmul per projection instead of three. The sampled policy is the same up to float rounding."""

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations is {self.num_generations}; GRPO needs a group of at least 2 (its baseline is the "
                "group's mean reward)"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r} is not one of {LOSS_TYPES}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards {self.scale_rewards!r} is not one of {SCALE_REWARDS}")
        if self.max_consecutive_skipped_steps < 1:
            raise ValueError(f"max_consecutive_skipped_steps must be >= 1, got {self.max_consecutive_skipped_steps}")
        if self.completions_per_step % self.gradient_accumulation_steps:
            raise ValueError(
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) must divide the "
                f"{self.completions_per_step} completions of a step (prompts_per_step * num_generations)"
            )

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainingResult:
    checkpoint_dir: Path
    """Merged, self-contained checkpoint: safetensors weights, tokenizer and chat template, no adapters."""
    metrics: dict[str, float]
    """Final metrics: train_loss, train_runtime, steps (the global step reached), resumed_from_step,
    skipped_steps (optimizer steps of this call skipped for a non-finite loss or gradient norm),
    seconds_per_step (NaN when the checkpoint resumed from had already reached max_steps), and the mean
    reward and answer reward over the first and last quarter of the logged steps."""
    log_history: list[dict]
    """`trainer.state.log_history`, including the steps of a checkpoint resumed from."""
    n_train_rows: int
    n_gold_rows: int
    n_pseudo_rows: int


def build_training_dataset(
    labeled: pl.DataFrame,
    pseudo_labeled: pl.DataFrame | None,
    system_prompt: str,
    *,
    seed: int = 0,
    prompt_noise: bool = False,
    vote_shares: pl.DataFrame | None = None,
) -> datasets.Dataset:
    """All labeled problems (target: gold answer) and all pseudo-labeled ones (target: pseudo-label),
    shuffled by `seed`, as TRL rows: "prompt" (chat messages), "target", "label_source", "problem_id".

    Only problem_id, prompt and pseudo_label are read from `pseudo_labeled`, so no other column of it
    (a gold answer carried along for analysis, say) can leak into training. `prompt_noise` renders each
    prompt through the template `prompts.noisy_template` picks for it and `seed`. `vote_shares`
    (`student_data.vote_share_table`) adds a "vote_shares" column, the soft targets of `vote_share_reward`
    ("[]" on labeled rows, which keep their 0/1 reward).
    """
    import datasets

    parts = [_training_rows(labeled, "gold_answer", GOLD)]
    if pseudo_labeled is not None:
        parts.append(_training_rows(pseudo_labeled, "pseudo_label", PSEUDO))
    rows = pl.concat(parts).sample(fraction=1.0, shuffle=True, seed=seed)
    if vote_shares is not None:
        rows = rows.join(vote_shares.select("problem_id", "vote_shares"), on="problem_id", how="left", maintain_order="left")
        rows = rows.with_columns(pl.col("vote_shares").fill_null("[]"))
    dataset = datasets.Dataset.from_list(
        [
            {
                "prompt": student_messages(row["problem_id"], row["prompt"], system_prompt, seed if prompt_noise else None),
                "target": row["target"],
                "label_source": row["label_source"],
                "problem_id": row["problem_id"],
                **({"vote_shares": row["vote_shares"]} if vote_shares is not None else {}),
            }
            for row in rows.iter_rows(named=True)
        ]
    )
    validate_training_dataset(dataset)
    return dataset


def student_messages(problem_id: str, prompt: str, system_prompt: str, noise_seed: int | None) -> list[dict[str, str]]:
    """A training prompt's chat messages: the one format of every stage, or with `noise_seed` the noisy
    template `prompts.noisy_template` picks for the problem and seed."""
    template = noisy_template(problem_id, noise_seed) if noise_seed is not None else 0
    return build_messages(prompt, system_prompt, template)


def _training_rows(frame: pl.DataFrame, target_column: str, label_source: str) -> pl.DataFrame:
    return frame.select(
        pl.col("problem_id").cast(pl.String),
        pl.col("prompt").cast(pl.String),
        pl.col(target_column).cast(pl.String).alias("target"),
        pl.lit(label_source).alias("label_source"),
    )


def validate_training_dataset(dataset: datasets.Dataset) -> None:
    """Raise ValueError unless `dataset` has rows and every row has a non-empty target."""
    check_step_fits(dataset, 1, "rows")
    for row in dataset.select_columns(["problem_id", "label_source", "target"]):
        if not (isinstance(row["target"], str) and row["target"].strip()):
            raise ValueError(
                f"training row problem_id={row['problem_id']!r} ({row['label_source']}) has no target answer"
            )


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion, plain or conversational (the assistant turns' contents)."""
    if isinstance(completion, str):
        return completion
    return "".join(message["content"] for message in completion if message["role"] == "assistant")


def answer_reward(completions, target, label_source=None, log_metric=None, **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the completion's final answer is equivalent to the row's target.

    Also logs the mean reward per label source (TRL's `log_metric` hook): on pseudo rows it measures
    agreement with the teacher, which only the gold rows can tell apart from accuracy.
    """
    rewards = [grading.answer_reward(completion_text(c), t) for c, t in zip(completions, target, strict=True)]
    if log_metric is not None and label_source is not None:
        for source in sorted(set(label_source)):
            source_rewards = [r for r, s in zip(rewards, label_source, strict=True) if s == source]
            log_metric(f"answer_reward/{source}", sum(source_rewards) / len(source_rewards))
    return rewards


def vote_share_reward(completions, target, vote_shares, label_source=None, log_metric=None, **kwargs) -> list[float]:
    """TRL reward function, the soft pseudo-reward: on a pseudo-labeled row, the share of the teacher's K votes
    that the completion's answer cluster won (the majority's agreement for the pseudo-label, less for a
    minority answer, 0 outside every cluster); on a labeled row ("[]"), 1.0 for the gold answer."""
    hard = answer_reward(completions, target, label_source, log_metric)
    rewards = []
    for completion, shares, hard_reward in zip(completions, vote_shares, hard, strict=True):
        clusters = json.loads(shares)
        rewards.append(vote_share_of(grading.extract_answer(completion_text(completion)), clusters) if clusters else hard_reward)
    return rewards


def format_reward_fn(completions, **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the completion marks a final answer (see `grading.format_reward`)."""
    return [grading.format_reward(completion_text(c)) for c in completions]


def grpo_config(settings: GRPOSettings, work_dir: Path, *, device: str, report_to: list[str]) -> GRPOConfig:
    """TRL's GRPOConfig for `settings`, checkpointing into `work_dir`.

    With one process, TRL generates `per_device_train_batch_size * gradient_accumulation_steps`
    completions per optimiser step (its `generation_batch_size`), which must be whole groups; so the
    per-device batch is the step's completions over the accumulation steps.
    """
    from trl import GRPOConfig

    return GRPOConfig(
        **trainer_args(settings, settings.completions_per_step, work_dir, device, report_to),
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        beta=settings.beta,
        epsilon=settings.epsilon,
        loss_type=settings.loss_type,
        scale_rewards=settings.scale_rewards,
        temperature=settings.temperature,
        reward_weights=[1.0, settings.format_reward_weight] if settings.format_reward_weight > 0 else None,
        use_vllm=settings.use_vllm,
        vllm_mode="colocate",
        cast_lm_head_to_fp32=settings.cast_lm_head_to_fp32,
    )


def trainer_args(settings: GRPOSettings, per_step: int, work_dir: Path, device: str, report_to: list[str]) -> dict:
    """The TrainingArguments every mode's TRL config shares: `per_step` rows an optimizer step (split over the
    accumulation steps), checkpoints into `work_dir` every `save_steps` (only the latest is kept: resuming needs
    no other, and full fine-tune checkpoints hold optimiser state)."""
    return dict(
        output_dir=str(work_dir),
        max_steps=settings.max_steps,
        per_device_train_batch_size=per_step // settings.gradient_accumulation_steps,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=settings.learning_rate,
        seed=settings.seed,
        save_strategy="steps" if settings.save_steps > 0 else "no",
        save_steps=settings.save_steps,
        save_total_limit=1,
        bf16=settings.bf16,  # explicit: TRL turns bf16 on when it is left unset
        gradient_checkpointing=settings.gradient_checkpointing,
        logging_steps=settings.logging_steps,
        report_to=report_to,
        use_cpu=device == "cpu",
    )


def lora_config(settings: GRPOSettings) -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM",
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(settings.lora_target_modules),
    )


def train_grpo(
    init_checkpoint: Path,
    dataset: datasets.Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    *,
    work_dir: Path,
    device: str = "cpu",
    report_to: list[str] | None = None,
    callbacks: list | None = None,
    warn: Callable[[str], None] | None = None,
    model_dropout: float = 0.0,
    reward: str = HARD_REWARD,
) -> TrainingResult:
    """GRPO-train the checkpoint at `init_checkpoint` on `dataset` (see `build_training_dataset`) and save
    the trained, merged model with its tokenizer to `out_dir`.

    Resumes from the latest ``checkpoint-*`` in `work_dir` if there is one, so `work_dir` must belong to
    this training alone.  `report_to` names transformers' logging integrations (default none): "mlflow"
    logs the trainer's arguments as params and the step logs as metrics into the active MLflow run,
    leaving it open (or into a run of its own, ended after training, when none is active).
    `model_dropout` is the student's dropout noise (see `load_policy`); `reward` is one of `REWARDS`.

    Every optimizer step is guarded (`guards.NonFiniteStepGuard`): a step with a non-finite loss or
    gradient norm is skipped and reported through `warn`; `settings.max_consecutive_skipped_steps` in a
    row raise `NonFiniteTrainingError`. The merged checkpoint is checked for non-finite weights before
    this returns (`NonFiniteWeightsError`), so a broken model never leaves `out_dir` for the lake.
    """
    from trl import GRPOTrainer

    if reward not in REWARDS:
        raise ValueError(f"reward {reward!r} is not one of {REWARDS}")
    validate_training_dataset(dataset)
    check_step_fits(dataset, settings.prompts_per_step, "prompts")
    model, tokenizer = load_policy(init_checkpoint, model_dropout)
    answer = vote_share_reward if reward == VOTE_SHARE_REWARD else answer_reward
    reward_funcs = [answer] + ([format_reward_fn] if settings.format_reward_weight > 0 else [])
    trainer_class = _merged_lora_generation(GRPOTrainer) if settings.merge_lora_for_generation else GRPOTrainer
    return fit(
        trainer_class,
        dict(
            model=model,
            reward_funcs=reward_funcs,
            args=grpo_config(settings, work_dir, device=device, report_to=report_to or ["none"]),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(settings) if settings.use_lora else None,
        ),
        tokenizer,
        settings,
        init_checkpoint,
        out_dir,
        work_dir=work_dir,
        callbacks=callbacks,
        warn=warn,
        what="GRPO",
        label_sources=list(dataset["label_source"]),
    )


def check_step_fits(dataset: datasets.Dataset, per_step: int, what: str) -> None:
    """Raise ValueError when `dataset` is empty or smaller than one optimizer step's `per_step` rows."""
    if len(dataset) == 0:
        raise ValueError("no training rows")
    if len(dataset) < per_step:
        # The Trainer's sampler drops incomplete batches, so a smaller set would yield no step at all.
        raise ValueError(f"{len(dataset)} training rows cannot fill a step of {per_step} {what}")


DROPOUT_ATTRIBUTES = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout")
"""Model-config dropout probabilities across transformers architectures (Llama and Qwen2 have attention_dropout)."""


def load_policy(init_checkpoint: Path, model_dropout: float = 0.0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The float32 model and tokenizer to train. `model_dropout` > 0 sets every dropout probability the
    model's config has (the student's model noise, Xie et al. 2020); `fit` saves the checkpoint with the
    init's dropout again, so a student never passes its noise on as a teacher."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(init_checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = AutoConfig.from_pretrained(init_checkpoint)
    if model_dropout:
        if not 0.0 < model_dropout < 1.0:
            raise ValueError(f"model_dropout must be within [0, 1), got {model_dropout}")
        names = [name for name in DROPOUT_ATTRIBUTES if hasattr(config, name)]
        if not names:
            raise ValueError(f"{type(config).__name__} has none of {DROPOUT_ATTRIBUTES}: model_dropout cannot apply")
        for name in names:
            setattr(config, name, model_dropout)
    model = AutoModelForCausalLM.from_pretrained(init_checkpoint, config=config, dtype=torch.float32, use_safetensors=True)
    return model, tokenizer


def fit(
    trainer_class: type,
    trainer_kwargs: dict,
    tokenizer: PreTrainedTokenizerBase,
    settings: GRPOSettings,
    init_checkpoint: Path,
    out_dir: Path,
    *,
    work_dir: Path,
    callbacks: list | None,
    warn: Callable[[str], None] | None,
    what: str,
    label_sources: list[str],
    logged: tuple[tuple[str, str], ...] = GRPO_LOGGED,
) -> TrainingResult:
    """Train a TRL trainer (`trainer_class(**trainer_kwargs)`, its args checkpointing into `work_dir`) from
    `init_checkpoint` with the non-finite step guard, resuming from the latest checkpoint in `work_dir`;
    save the merged model into `out_dir` and check its weights are finite. `logged` maps log keys to the names whose first- and
    last-quarter means the metrics report."""
    from transformers import AutoConfig
    from transformers.trainer_utils import get_last_checkpoint

    from noisy_student_assets.core.training.guards import assert_finite_checkpoint, guarded_trainer_class, step_guard_callback

    guard = step_guard_callback(settings.max_consecutive_skipped_steps, warn)
    trainer = guarded_trainer_class(trainer_class)(**trainer_kwargs, callbacks=[guard, *(callbacks or [])])
    resume_from = get_last_checkpoint(work_dir) if work_dir.is_dir() else None
    resumed_from_step = int(Path(resume_from).name.split("-")[-1]) if resume_from else 0
    train_output = trainer.train(resume_from_checkpoint=resume_from)
    model = trainer.accelerator.unwrap_model(trainer.model)
    init_config = AutoConfig.from_pretrained(init_checkpoint)
    for name in DROPOUT_ATTRIBUTES:  # the noise was the student's: the checkpoint (a teacher next) has the init's
        if hasattr(init_config, name):
            setattr(model.config, name, getattr(init_config, name))
    save_merged(model, tokenizer, out_dir)
    assert_finite_checkpoint(out_dir, f"{what} from {init_checkpoint}")
    log_history = list(trainer.state.log_history)
    metrics = _final_metrics(train_output.metrics, log_history, trainer.state.global_step, resumed_from_step, logged)
    return TrainingResult(
        checkpoint_dir=out_dir,
        metrics=metrics | {"skipped_steps": float(len(guard.state.skipped_steps))},
        log_history=log_history,
        n_train_rows=len(label_sources),
        n_gold_rows=label_sources.count(GOLD),
        n_pseudo_rows=label_sources.count(PSEUDO),
    )


def _merged_lora_generation(trainer_class: type) -> type:
    """`trainer_class` sampling its GRPO groups with the LoRA adapters merged in (see
    `GRPOSettings.merge_lora_for_generation`); vLLM generation and full fine-tuning are left as they are."""
    from peft import PeftModel

    class MergedLoraGeneration(trainer_class):
        def _generate_single_turn(self, *args, **kwargs):
            model = self.accelerator.unwrap_model(self.model)
            if self.use_vllm or not isinstance(model, PeftModel):
                return super()._generate_single_turn(*args, **kwargs)
            model.merge_adapter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                model.unmerge_adapter()

    MergedLoraGeneration.__name__ = MergedLoraGeneration.__qualname__ = f"MergedLoraGeneration{trainer_class.__name__}"
    return MergedLoraGeneration


def save_merged(model: PreTrainedModel | PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """Save the trained policy as a plain checkpoint: LoRA adapters merged in, so no peft is needed to load it."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.config.use_cache = True  # the Trainer turns the KV cache off for training; inference wants it
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _final_metrics(
    train_metrics: dict[str, float],
    log_history: list[dict],
    global_step: int,
    resumed_from_step: int,
    logged: tuple[tuple[str, str], ...],
) -> dict[str, float]:
    trained_steps = global_step - resumed_from_step
    metrics = {
        "train_loss": train_metrics["train_loss"],
        "train_runtime": train_metrics["train_runtime"],
        "steps": float(global_step),
        "resumed_from_step": float(resumed_from_step),
        "seconds_per_step": train_metrics["train_runtime"] / trained_steps if trained_steps else math.nan,
    }
    for key, name in logged:
        values = [entry[key] for entry in log_history if key in entry]
        if values:
            quarter = max(1, len(values) // 4)
            metrics[f"{name}_first_quarter"] = sum(values[:quarter]) / quarter
            metrics[f"{name}_last_quarter"] = sum(values[-quarter:]) / quarter
    return metrics
