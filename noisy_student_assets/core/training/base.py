"""The one setup every trainer of the project shares (no Dagster here), as TRL's `base_config.py` with its
`get_peft_config` is for its trainers: the training arguments, the LoRA, the step budget, the non-finite step guard,
resuming from the latest whole checkpoint, and the merged checkpoint it saves, checked finite (`TrainerSetup.train`).

A method is its loss (`Loss`: TRL's trainer and config classes and the config's own fields) and its rows (`Rows`:
what a dataset row is and how many a step trains), nothing else: GRPO (`grpo.py`) and the verifier's reward model
(`verifier.py`) sit beside this module, as TRL's `{method}_trainer.py` beside its base; SFT and DPO, which only their
student modes train, in those modes (`modes/sft.py`, `modes/dpo.py`). Where a training runs and whom it tells is the
stage's (`TrainingRun`).

The ML libraries are imported inside the functions that use them, so that loading the code location (which
imports the settings) does not wait for torch, peft and TRL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import polars as pl

from noisy_student_assets.core.layout import TRAINING_LOG_FILE
from noisy_student_assets.core.resumable import SetAside, resume_point

if TYPE_CHECKING:
    import datasets
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

    from noisy_student_assets.core.settings import GRPOSettings

GOLD, PSEUDO = "gold", "pseudo"
"""Where a training row's target comes from: a gold answer, or a pseudo-label (or the teacher's samples)."""

DROPOUT_ATTRIBUTES = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout")
"""Model-config dropout probabilities across transformers architectures (Llama and Qwen2 have attention_dropout)."""

LOGGING_STEPS = 1
"""TRL logs every step: the compute accounting reads each step's completion lengths from the log."""


@dataclass(frozen=True)
class TrainingResult:
    checkpoint_dir: Path
    """Merged, self-contained checkpoint: safetensors weights, tokenizer and chat template, no adapters."""
    metrics: dict[str, float]
    """Final metrics: train_loss, train_runtime, steps (the global step reached), resumed_from_step,
    skipped_steps (optimizer steps of this call skipped for a non-finite loss or gradient norm),
    seconds_per_step (NaN when the checkpoint resumed from had already reached max_steps), and the first- and
    last-quarter means of the trainer's logged metrics (`Loss.logged`)."""
    log_history: list[dict]
    """`trainer.state.log_history`, including the steps of a checkpoint resumed from."""
    n_train_rows: int
    n_gold_rows: int
    n_pseudo_rows: int


def step_line(step: int, max_steps: int, logs: dict[str, float]) -> str:
    """One optimizer step's logs as one line of a stage's log (or a notebook's output)."""
    return f"step {step}/{max_steps}: { ({k: round(v, 4) for k, v in logs.items()}) }"


def step_logs_callback(report: Callable[[int, int, dict[str, float]], None]):
    """A TrainerCallback passing each step's logs (TRL's loss, reward, timers: its numbers) to `report`, with the
    step and the step budget."""
    from transformers import TrainerCallback

    class StepLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            report(
                state.global_step,
                state.max_steps,
                {k: v for k, v in (logs or {}).items() if isinstance(v, int | float)},
            )

    return StepLogs()


@dataclass(frozen=True)
class TrainingRun:
    """Where one training runs and whom it tells: what the stage gives a trainer beside its settings."""

    work_dir: Path
    """TRL's resumable checkpoints: a training resumes from the latest one there, so it belongs to this training
    alone."""
    device: str = "cpu"
    dtype: str = "float32"
    """The compute precision: mixed precision over float32 weights unless float32."""
    report_to: tuple[str, ...] = ("none",)
    """transformers' logging integrations: "mlflow" logs the trainer's arguments as params and the step logs as
    metrics into the active MLflow run, leaving it open (or into a run of its own, ended after training, when none
    is active)."""
    callbacks: tuple = ()
    """TrainerCallbacks beside the step guard."""
    warn: Callable[[str], None] | None = None
    """Told of each skipped step."""
    set_aside: SetAside | None = None
    """Told of each incomplete checkpoint in `work_dir` (a run killed while saving it), moved aside before resuming
    (`resumable.resume_point`)."""
    validation: pl.DataFrame | None = None
    """The arm's validation problems with their gold answers, which a GRPO run with `grpo.validation_every` checks its
    greedy accuracy on (labeled RL's)."""


@dataclass(frozen=True)
class Lora:
    """LoRA adapters (Hu et al. 2021), merged into the weights after training."""

    r: int
    alpha: int
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"
    """Module names, or peft's "all-linear" (every linear layer but the output head)."""


@dataclass(frozen=True)
class Loss:
    """What a method trains for: TRL's trainer and config classes, the config's own fields, and the trainer's own
    arguments (GRPO's reward functions). The model it trains is a causal LM, the policy (`load`)."""

    name: str
    """Names the method in errors: "GRPO", "SFT", "DPO", "verifier"."""
    trainer_class: type
    config_class: type
    config: dict
    logged: tuple[tuple[str, str], ...]
    """TRL's step-log keys whose first- and last-quarter means `TrainingResult.metrics` reports, under a name each."""
    trainer_options: dict = field(default_factory=dict)
    callbacks: tuple = ()
    """TrainerCallbacks of the method's own (GRPO's stopping rule), beside the run's."""
    task_type: ClassVar[str] = "CAUSAL_LM"
    """peft's name for the model's head, the task its LoRA adapts."""

    def load(self, init_checkpoint: Path, setup: TrainerSetup) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The model to train and its tokenizer."""
        return load_policy(init_checkpoint, setup.model_dropout)


@dataclass(frozen=True)
class Rows:
    """What a method's dataset holds and how an optimizer step reads it: the step budget."""

    batch: int
    """Rows of TRL's batch one optimizer step trains (completions, pairs), split over micro-batches and processes."""
    unit: str
    """What one dataset row is ("completions", "pairs", "prompts")."""
    label_source: str | None
    """Where every row's target comes from (`GOLD`, `PSEUDO`); None: each row says, in its `label_source` column."""
    needed: int | None = None
    """Dataset rows one step needs at least, where not `batch` (GRPO: the prompts whose groups fill the batch)."""
    in_order: bool = False
    """Read the rows in order (`grouped_by_problem` holds each step's groups in order), dropping an epoch's last,
    partial batch, so that every step trains on whole groups."""


@dataclass(frozen=True)
class TrainerSetup:
    """How any method trains: `max_steps` optimizer steps at `learning_rate`, decaying linearly to 0 without warmup;
    a resumable checkpoint every `save_steps` (0: none); a step whose loss or gradient norm is not finite skipped,
    `max_consecutive_skipped_steps` of them in a row stopping training; LoRA adapters, or every weight when `lora`
    is None."""

    max_steps: int
    learning_rate: float
    seed: int
    save_steps: int
    gradient_checkpointing: bool
    max_consecutive_skipped_steps: int
    lora: Lora | None
    gradient_accumulation_steps: int = 1
    processes: int = 1
    model_dropout: float = 0.0
    """The student's dropout noise (`load_policy`)."""

    @classmethod
    def for_student(cls, settings: GRPOSettings, model_dropout: float = 0.0) -> TrainerSetup:
        """A policy's setup in any student mode (labeled RL and the controls included), from its GRPO settings, which
        name the setup's fields alike."""
        lora = Lora(settings.lora_r, settings.lora_alpha, settings.lora_dropout, list(settings.lora_target_modules))
        named_alike = {setting.name for setting in fields(cls)} - {"lora", "model_dropout"}
        return cls(
            lora=lora if settings.use_lora else None,
            model_dropout=model_dropout,
            **settings.model_dump(include=named_alike),
        )

    def check_budget(self, rows: Rows, dataset: datasets.Dataset) -> None:
        """Raise ValueError when a step's batch cannot be split evenly over the processes, or `dataset` cannot fill
        one step."""
        if rows.batch % self.processes:
            raise ValueError(f"{rows.batch} rows a step cannot be split over {self.processes} processes")
        check_step_fits(dataset, rows.needed or rows.batch, rows.unit)

    def micro_batches(self, rows: Rows) -> int:
        """The micro-batches a process splits its share of a step's rows into: `gradient_accumulation_steps`, or the
        most of them that split the share evenly where it cannot be split that finely (a DPO step trains half as many
        pairs as GRPO's completions). They only bound memory: a step trains the same rows either way."""
        return math.gcd(self.gradient_accumulation_steps, rows.batch // self.processes)

    def config(self, loss: Loss, rows: Rows, run: TrainingRun) -> TrainingArguments:
        """The method's TRL config: the arguments every trainer shares, then the loss's own fields. A step trains
        `rows.batch` rows, split over the accumulation steps and the processes, so that a step trains the same rows on
        any number of them; only the latest checkpoint is kept (resuming needs no other, and a full fine-tune's holds
        optimiser state)."""
        shared = dict(
            output_dir=str(run.work_dir),
            max_steps=self.max_steps,
            per_device_train_batch_size=rows.batch // (self.micro_batches(rows) * self.processes),
            gradient_accumulation_steps=self.micro_batches(rows),
            learning_rate=self.learning_rate,
            lr_scheduler_type="linear",
            seed=self.seed,
            save_strategy="steps" if self.save_steps > 0 else "no",
            save_steps=self.save_steps,
            save_total_limit=1,
            bf16=run.dtype == "bfloat16",  # explicit: TRL turns bf16 on when it is left unset
            fp16=run.dtype == "float16",
            gradient_checkpointing=self.gradient_checkpointing,
            logging_steps=LOGGING_STEPS,
            report_to=list(run.report_to),
            use_cpu=run.device == "cpu",
        )
        in_order = {"train_sampling_strategy": "sequential", "dataloader_drop_last": True} if rows.in_order else {}
        return loss.config_class(**shared | in_order | loss.config)

    def peft_config(self, task_type: str) -> LoraConfig | None:
        if self.lora is None:
            return None
        from peft import LoraConfig

        return LoraConfig(
            task_type=task_type,
            r=self.lora.r,
            lora_alpha=self.lora.alpha,
            lora_dropout=self.lora.dropout,
            target_modules=self.lora.target_modules,
        )

    def train(
        self, loss: Loss, rows: Rows, init_checkpoint: Path, dataset: datasets.Dataset, out_dir: Path, run: TrainingRun
    ) -> TrainingResult:
        """Train `loss` from `init_checkpoint` on `dataset` (checked against the budget before the model loads),
        resuming from the latest whole checkpoint in `run.work_dir`, and save the trained, merged model with its
        tokenizer into `out_dir` (`fit`)."""
        self.check_budget(rows, dataset)
        model, tokenizer = loss.load(init_checkpoint, self)
        trainer_kwargs = dict(
            model=model,
            args=self.config(loss, rows, run),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=self.peft_config(loss.task_type),
            **loss.trainer_options,
        )
        label_sources = dataset["label_source"] if rows.label_source is None else [rows.label_source] * len(dataset)
        return fit(
            loss.trainer_class,
            trainer_kwargs,
            tokenizer,
            self.max_consecutive_skipped_steps,
            init_checkpoint,
            out_dir,
            work_dir=run.work_dir,
            callbacks=[*loss.callbacks, *run.callbacks],
            warn=run.warn,
            set_aside=run.set_aside,
            what=loss.name,
            label_sources=list(label_sources),
            logged=loss.logged,
        )


def check_step_fits(dataset: datasets.Dataset, per_step: int, what: str) -> None:
    """Raise ValueError when `dataset` is empty or smaller than one optimizer step's `per_step` rows."""
    if len(dataset) == 0:
        raise ValueError("no training rows")
    if len(dataset) < per_step:
        # The Trainer's sampler drops incomplete batches, so a smaller set would yield no step at all.
        raise ValueError(f"{len(dataset)} training rows cannot fill a step of {per_step} {what}")


def grouped_by_problem(frame: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`frame`'s rows with each problem's rows kept together, the problems in an order shuffled by `seed`."""
    problems = frame.select("problem_id").unique(maintain_order=True).sample(fraction=1.0, shuffle=True, seed=seed)
    order = problems.with_row_index("group")
    return frame.with_row_index("row").join(order, on="problem_id").sort("group", "row").drop("group", "row")


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
    model = AutoModelForCausalLM.from_pretrained(
        init_checkpoint, config=config, dtype=torch.float32, use_safetensors=True
    )
    return model, tokenizer


def fit(
    trainer_class: type,
    trainer_kwargs: dict,
    tokenizer: PreTrainedTokenizerBase,
    max_consecutive_skipped_steps: int,
    init_checkpoint: Path,
    out_dir: Path,
    *,
    work_dir: Path,
    callbacks: list | None,
    warn: Callable[[str], None] | None,
    set_aside: SetAside | None,
    what: str,
    label_sources: list[str],
    logged: tuple[tuple[str, str], ...],
) -> TrainingResult:
    """Train a TRL trainer (`trainer_class(**trainer_kwargs)`, its args checkpointing into `work_dir`) from
    `init_checkpoint` with the non-finite step guard (failing after `max_consecutive_skipped_steps` in a row), resuming
    from the latest whole checkpoint in `work_dir` (`resumable.resume_point`, which tells `set_aside` of each
    incomplete one it moves aside); save the merged model into `out_dir` and check its weights are finite.
    `logged` maps log keys to the names whose first- and last-quarter means the metrics report.

    `TrainerSetup.train` is its one caller; the payload fault tests (`tests/payload_faults`) wrap it where the
    trainer class and the callbacks meet."""
    from transformers import AutoConfig, set_seed

    from noisy_student_assets.core.training.guards import (
        assert_finite_checkpoint,
        guarded_trainer_class,
        step_guard_callback,
    )

    guard = step_guard_callback(max_consecutive_skipped_steps, warn)
    # TRL adds the LoRA adapters before the Trainer seeds itself: seeded here, their initial weights do not depend on
    # what ran before in the process (another stage's sampling, in a Dagster run of several steps).
    set_seed(trainer_kwargs["args"].seed)
    trainer = guarded_trainer_class(trainer_class)(**trainer_kwargs, callbacks=[guard, *(callbacks or [])])
    resume_from = resume_point(work_dir, set_aside)
    resumed_from_step = int(resume_from.name.split("-")[-1]) if resume_from else 0
    train_output = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if trainer.accelerator.is_main_process:  # one writer of the checkpoint when several processes train
        model = trainer.accelerator.unwrap_model(trainer.model)
        init_config = AutoConfig.from_pretrained(init_checkpoint)
        for name in DROPOUT_ATTRIBUTES:  # the noise was the student's: the checkpoint (a teacher next) has the init's
            if hasattr(init_config, name):
                setattr(model.config, name, getattr(init_config, name))
        save_merged(model, tokenizer, out_dir)
        assert_finite_checkpoint(out_dir, f"{what} from {init_checkpoint}")
        (out_dir / TRAINING_LOG_FILE).write_text(json.dumps(trainer.state.log_history))
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


def read_training_log(checkpoint_dir: Path) -> list[dict] | None:
    """The trainer's log of every step of the run that trained `checkpoint_dir` (`fit` keeps it beside the weights);
    None for a checkpoint trained before it was kept."""
    path = checkpoint_dir / TRAINING_LOG_FILE
    return json.loads(path.read_text()) if path.exists() else None


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
