"""GRPO training of a policy on verifiable math rewards (no Dagster here).

One round of Noisy Student self-training (Xie et al. 2020, "Self-training with Noisy Student improves
ImageNet classification") trains on the labeled problems, graded against their gold answers, plus the
pseudo-labeled ones, graded against the teacher's majority-vote answer.  The optimiser is GRPO
(Shao et al. 2024, "DeepSeekMath", section 4.1): for each prompt a group of completions is sampled,
and each completion's advantage is its reward relative to the group's mean (optionally over its
standard deviation), so no value model is needed.  The loss, sampling and LoRA adapters are TRL's
``GRPOTrainer`` and peft's; this module maps the settings onto them, and the setup every trainer shares
(`base.TrainerSetup`) trains, guards and saves a merged checkpoint that vLLM and plain transformers can load.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core import grading
from noisy_student_assets.core.prompts import student_messages
from noisy_student_assets.core.pseudo_labels.consensus import Vote, majority_vote
from noisy_student_assets.core.pseudo_labels.student_data import vote_share_of
from noisy_student_assets.core.settings import (
    GROUP_MAJORITY_REWARD,
    HARD_REWARD,
    SATURATION_REWARD,
    SATURATION_WINDOW,
    VLLM_ROLLOUTS,
    VOTE_SHARE_REWARD,
)
from noisy_student_assets.core.training.base import (
    GOLD,
    PSEUDO,
    Loss,
    Rows,
    TrainerSetup,
    check_step_fits,
)
from noisy_student_assets.core.training.dynamic_sampling import STEP_COUNTS, DynamicSampling
from noisy_student_assets.core.training.rollouts import VllmRollouts, trl_sample
from noisy_student_assets.core.training.shared_prefix import shared_prefix_trainer_class
from noisy_student_assets.core.training.validation_stop import (
    best_check,
    logged_checks,
    require_validation,
    stalled,
    validation_prompts,
    validation_stop_callback,
)

if TYPE_CHECKING:
    from datasets import Dataset

    from noisy_student_assets.core.settings import GRPOSettings
    from noisy_student_assets.core.training.base import TrainingResult, TrainingRun

REWARDS = (HARD_REWARD, VOTE_SHARE_REWARD, GROUP_MAJORITY_REWARD)
"""GRPO's reward on pseudo-labeled rows: 1 for the pseudo-label's answer (`answer_reward`), the vote share
of the completion's answer (`vote_share_reward`), or 1 for its own group's majority answer (`group_majority_reward`)."""

TRL_COMPLETIONS_DIR = "completions"
"""Where TRL's GRPOTrainer writes each logged step's completions (`log_completions`), under its output directory."""

ANSWER_REWARD_LOGGED = "rewards/answer_reward/mean"
"""TRL's log of a step's mean answer reward: the share of its completions whose answer is the row's target."""
GRPO_LOGGED = (
    ("reward", "reward"),
    (ANSWER_REWARD_LOGGED, "answer_reward"),
    ("rewards/vote_share_reward/mean", "vote_share_reward"),
)
"""TRL's GRPO step logs summarised in `TrainingResult.metrics` (first and last quarter)."""


def logged_rewards(log_history: list[dict]) -> list[float]:
    """Each logged step's mean answer reward, from TRL's log history."""
    return [entry[ANSWER_REWARD_LOGGED] for entry in log_history if ANSWER_REWARD_LOGGED in entry]


def saturation_step(
    rewards: list[float], threshold: float = SATURATION_REWARD, window: int = SATURATION_WINDOW
) -> int | None:
    """The first step (from 1) at which the mean of the last `window` steps' rewards reaches `threshold`; None where
    it never does."""
    for step in range(window, len(rewards) + 1):
        if sum(rewards[step - window : step]) / window >= threshold:
            return step
    return None


def saturation_summary(rewards: list[float]) -> str:
    """Where `rewards` (a run's step rewards) saturated, in words: 'step 12 of 24', or 'not in 24 steps (last
    4-step mean 0.71)'."""
    step = saturation_step(rewards)
    if step is not None:
        return f"step {step} of {len(rewards)}"
    return f"not in {len(rewards)} steps ({_last_mean(rewards, SATURATION_WINDOW)})"


def _last_mean(rewards: list[float], window: int) -> str:
    last = rewards[-window:]
    return f"last {len(last)}-step mean {sum(last) / len(last):.2f}" if last else "no reward logged"


def stop_reason(log_history: list[dict], settings: GRPOSettings, steps: int) -> str:
    """Why a GRPO run under `settings` ended after `steps` optimizer steps with this step log: its stopping rule met
    at its last step (the answer reward saturated, `stop_reward`, or the validation checks stalled, `validation_every`),
    or its budget spent; and, where it checked, which step's weights it kept."""
    rewards, checks = logged_rewards(log_history), logged_checks(log_history)
    best = best_check(checks)
    kept = f"; kept step {best.step}'s weights, the best of {len(checks)} checks" if best else ""
    if (
        settings.stop_reward is not None
        and saturation_step(rewards, settings.stop_reward, settings.stop_window) == steps
    ):
        return (
            f"labels learned: the answer reward's {settings.stop_window}-step mean reached {settings.stop_reward} at "
            f"step {steps} of at most {settings.max_steps}{kept}"
        )
    if best and stalled(checks, settings.validation_patience) and checks[-1].step == steps:
        return (
            f"validation stalled: greedy accuracy {best.accuracy:.3f} at step {best.step} not beaten in "
            f"{settings.validation_patience} checks, to step {steps} of at most {settings.max_steps}{kept}"
        )
    rule = "" if settings.stop_reward is None else f", the stopping rule ({settings.stop_reward}) not met"
    return f"max_steps {settings.max_steps} reached{rule} ({_last_mean(rewards, settings.stop_window)}){kept}"


def reward_stop_callback(threshold: float, window: int):
    """A transformers `TrainerCallback` that stops training once the logged answer reward's mean over the last
    `window` steps reaches `threshold` (`saturation_step`); the class is built on first use, as TRL is imported only
    where a run trains. A resumed run reads the steps before it from the restored log history."""
    from transformers import TrainerCallback

    class RewardStop(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            if saturation_step(logged_rewards(state.log_history), threshold, window) is not None:
                control.should_training_stop = True

    return RewardStop()


COMPLETION_CAP_QUANTILE = 0.99
"""The share of the teacher's samples whose length a round's completion cap covers (`completion_cap`)."""


def completion_cap(teacher_tokens: pl.Series, settings: GRPOSettings) -> tuple[int, float]:
    """A round's GRPO completion cap and the teacher's samples' length at `COMPLETION_CAP_QUANTILE`
    (`teacher_tokens`: each sample's completion tokens): that length rounded up plus `settings.completion_cap_margin`,
    at most `settings.max_completion_length`; without a margin, `max_completion_length`. A cap the task's answers
    need, rather than a fixed one: a step samples until its longest completion stops, and pads the loss to it."""
    # the shortest length that at least that share of the samples fit in
    length = float(teacher_tokens.sort()[math.ceil(COMPLETION_CAP_QUANTILE * teacher_tokens.len()) - 1])
    if settings.completion_cap_margin is None:
        return settings.max_completion_length, length
    return min(settings.max_completion_length, math.ceil(length) + settings.completion_cap_margin), length


def build_training_dataset(
    labeled: pl.DataFrame,
    pseudo_labeled: pl.DataFrame | None,
    system_prompt: str,
    *,
    seed: int = 0,
    prompt_noise: bool = False,
    vote_shares: pl.DataFrame | None = None,
    unlabeled_share: float | None = None,
    prompts: int = 0,
) -> Dataset:
    """All labeled problems (target: gold answer) and all pseudo-labeled ones (target: pseudo-label),
    shuffled by `seed`, as TRL rows: "prompt" (chat messages), "target", "label_source", "problem_id".
    With `unlabeled_share`, `prompts` rows instead (`with_unlabeled_share`).

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
    if unlabeled_share is not None:
        rows = with_unlabeled_share(rows, unlabeled_share, prompts, seed)
    if vote_shares is not None:
        rows = rows.join(
            vote_shares.select("problem_id", "vote_shares"), on="problem_id", how="left", maintain_order="left"
        )
        rows = rows.with_columns(pl.col("vote_shares").fill_null("[]"))
    dataset = datasets.Dataset.from_list(
        [
            {
                "prompt": student_messages(
                    row["problem_id"], row["prompt"], system_prompt, seed if prompt_noise else None
                ),
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


def with_unlabeled_share(rows: pl.DataFrame, share: float, prompts: int, seed: int) -> pl.DataFrame:
    """`prompts` of the shuffled `rows` (a GRPO run's steps x prompts per step: one pass of TRL's sampler over the
    dataset), round(`share` x `prompts`) of them pseudo-labeled and the rest labeled, each part cycling through its
    own rows in their shuffled order (a part with fewer problems than its share repeats them), shuffled by `seed`.
    Without it the share is whatever the two sets' sizes imply; with it, it is a setting an arm can vary."""
    if prompts < 1:
        raise ValueError(f"unlabeled_share needs the run's prompts (steps x prompts per step), got {prompts}")
    wanted = {PSEUDO: round(share * prompts), GOLD: prompts - round(share * prompts)}
    parts = []
    for source, count in wanted.items():
        part = rows.filter(pl.col("label_source") == source)
        if count and part.is_empty():
            kind = "pseudo-labeled" if source == PSEUDO else "labeled"
            raise ValueError(f"unlabeled_share {share} asks for {count} {kind} prompts, and there are no {kind} rows")
        parts.append(part[[index % part.height for index in range(count)]] if count else part.clear())
    return pl.concat(parts).sample(fraction=1.0, shuffle=True, seed=seed)


def _training_rows(frame: pl.DataFrame, target_column: str, label_source: str) -> pl.DataFrame:
    return frame.select(
        pl.col("problem_id").cast(pl.String),
        pl.col("prompt").cast(pl.String),
        pl.col(target_column).cast(pl.String).alias("target"),
        pl.lit(label_source).alias("label_source"),
    )


def validate_training_dataset(dataset: Dataset) -> None:
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


def answer_reward(completions, target, label_source=None, log_metric=None, **kwargs) -> list[float | None]:
    """TRL reward function: 1.0 where the completion's final answer is equivalent to the row's target, None where
    that check is ungraded (`grading`): TRL turns None into NaN, which its group baseline leaves out and which
    gets no advantage (with a format reward beside it, the completion keeps that reward alone).

    Also logs (TRL's `log_metric` hook) the mean graded reward per label source - on pseudo rows it measures
    agreement with the teacher, which only the gold rows can tell apart from accuracy -, the share of
    completions whose reward is ungraded (`answer_reward/ungraded_share`), and under dynamic sampling the step's
    counts (`dynamic_sampling.STEP_COUNTS`).
    """
    rewards = [grading.answer_reward(completion_text(c), t) for c, t in zip(completions, target, strict=True)]
    if log_metric is not None:
        _log_answer_rewards("answer_reward", rewards, label_source, log_metric, kwargs)
    return rewards


@dataclass(frozen=True)
class MajorityGate:
    """When a group's online majority is a label (`group_majority_reward`): its top answer holds at least `min_share`
    of the group's votes and leads the runner-up by at least `min_margin` of them (SCRL's gate). The defaults let
    any plurality through, as TTRL does."""

    min_share: float = 0.0
    min_margin: int = 0

    def admits(self, vote: Vote) -> bool:
        return (
            vote.answer is not None
            and vote.agreement >= self.min_share
            and vote.count - vote.runner_up >= self.min_margin
        )


def group_majority_reward(
    completions, target, problem_id, label_source=None, log_metric=None, gate=MajorityGate(), **kwargs
) -> list[float | None]:
    """TRL reward function, the online pseudo-reward of TTRL (Zuo et al. 2025): on a pseudo-labeled row, 1.0 where
    the completion's answer is equivalent to the majority answer of its own group (the completions of its problem
    in this call: `consensus.majority_vote`), 0.0 where it is not or the group has no majority that `gate` admits
    (every completion 0: the group gives no gradient); the row's offline pseudo-label is not read. A labeled row
    keeps its 0/1 reward against the gold answer. None where ungraded, as in `answer_reward`. Logs the share of
    voted groups the gate turned away (`group_majority_reward/gated_share`) and of those whose online majority
    differs from the offline label (`group_majority_reward/differs_from_offline_label`) beside `answer_reward`'s
    figures."""
    texts = [completion_text(c) for c in completions]
    rows_of: dict[str, list[int]] = {}
    for row, problem in enumerate(problem_id):
        rows_of.setdefault(problem, []).append(row)
    online = list(target)
    voted = [rows for rows in rows_of.values() if label_source is None or label_source[rows[0]] == PSEUDO]
    gated = 0
    for rows in voted:
        vote = majority_vote([grading.extract_answer(texts[row]) for row in rows])
        admitted = gate.admits(vote)
        gated += vote.answer is not None and not admitted
        for row in rows:
            online[row] = vote.answer if admitted else None
    rewards = [grading.answer_reward(text, label) if label else 0.0 for text, label in zip(texts, online, strict=True)]
    if log_metric is not None:
        _log_answer_rewards("group_majority_reward", rewards, label_source, log_metric, kwargs)
        if voted:  # only where logged: each group's comparison is a math-verify check
            log_metric("group_majority_reward/gated_share", gated / len(voted))
            differs = [
                online[rows[0]] is None or grading.answers_equivalent(target[rows[0]], online[rows[0]]) is not True
                for rows in voted
            ]
            log_metric("group_majority_reward/differs_from_offline_label", sum(differs) / len(differs))
    return rewards


def _log_answer_rewards(
    reward_name: str,
    rewards: list[float | None],
    label_source: list[str] | None,
    log_metric: Callable[[str, float], None],
    columns: dict,
) -> None:
    """The ungraded share, the step's dynamic-sampling counts and the mean graded reward per label source: on pseudo
    rows it measures agreement with the label, which only the gold rows can tell apart from accuracy."""
    _log_ungraded(reward_name, rewards, log_metric)
    for name in STEP_COUNTS:  # under dynamic sampling, the step's rollout counted these (one value a step)
        if name in columns:
            log_metric(name, columns[name][0])
    for source in sorted(set(label_source or [])):
        source_rewards = [r for r, s in zip(rewards, label_source, strict=True) if s == source and r is not None]
        if source_rewards:
            log_metric(f"{reward_name}/{source}", sum(source_rewards) / len(source_rewards))


def vote_share_reward(
    completions, target, vote_shares, label_source=None, log_metric=None, **kwargs
) -> list[float | None]:
    """TRL reward function, the soft pseudo-reward: on a pseudo-labeled row, the share of the teacher's K votes
    that the completion's answer cluster won (the majority's agreement for the pseudo-label, less for a
    minority answer, 0 outside every cluster); on a labeled row ("[]"), 1.0 for the gold answer.  None where
    it is ungraded, as in `answer_reward`; the share of those is logged as `vote_share_reward/ungraded_share`."""
    hard = answer_reward(completions, target, label_source, log_metric, **kwargs)
    rewards = []
    for completion, shares, hard_reward in zip(completions, vote_shares, hard, strict=True):
        clusters = json.loads(shares)
        rewards.append(
            vote_share_of(grading.extract_answer(completion_text(completion)), clusters) if clusters else hard_reward
        )
    if log_metric is not None:
        _log_ungraded("vote_share_reward", rewards, log_metric)
    return rewards


def _log_ungraded(reward_name: str, rewards: list[float | None], log_metric: Callable[[str, float], None]) -> None:
    log_metric(f"{reward_name}/ungraded_share", rewards.count(None) / len(rewards))


def format_reward_fn(completions, **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the completion marks a final answer (see `grading.format_reward`)."""
    return [grading.format_reward(completion_text(c)) for c in completions]


GRPO_CONFIG_FIELDS = (
    "num_generations",
    "max_completion_length",
    "beta",
    "epsilon",
    "loss_type",
    "scale_rewards",
    "temperature",
    "use_vllm",
    "cast_lm_head_to_fp32",
)
"""The settings that are TRL's GRPOConfig fields of the same name."""


def grpo_loss(
    settings: GRPOSettings,
    *,
    reward: str = HARD_REWARD,
    majority_gate: MajorityGate = MajorityGate(),
    log_completions: bool = False,
) -> Loss:
    """TRL's GRPO for `settings`: its config's own fields and the reward functions (`reward`'s, group_majority's
    under `majority_gate`, and the format reward where it weighs), trained by TRL's GRPOTrainer with the
    shared-prefix loss (`shared_prefix`) where `settings.shared_prefix` is on, and stopped by `reward_stop_callback`
    once its answer reward saturates where `settings.stop_reward` is set. `log_completions` has TRL write each
    step's completions with their rewards and advantages into the work dir (`logged_completions` reads them)."""
    from trl import GRPOConfig

    answer = {
        HARD_REWARD: answer_reward,
        VOTE_SHARE_REWARD: vote_share_reward,
        GROUP_MAJORITY_REWARD: functools.update_wrapper(
            functools.partial(group_majority_reward, gate=majority_gate), group_majority_reward
        ),
    }[reward]
    with_format = settings.format_reward_weight > 0
    config = {name: getattr(settings, name) for name in GRPO_CONFIG_FIELDS} | {
        "reward_weights": [1.0, settings.format_reward_weight] if with_format else None,
        "vllm_mode": "colocate",
        "log_completions": log_completions,
        "num_completions_to_print": 0,  # the logged table is read back from the work dir, not printed
    }
    reward_funcs = [answer] + ([format_reward_fn] if with_format else [])
    options = {"reward_funcs": reward_funcs, "shared_prefix": settings.shared_prefix}
    stop = () if settings.stop_reward is None else (reward_stop_callback(settings.stop_reward, settings.stop_window),)
    return Loss("GRPO", shared_prefix_trainer_class(), GRPOConfig, config, GRPO_LOGGED, options, stop)


def with_rollouts(loss: Loss, dataset: Dataset, settings: GRPOSettings, engine: VllmRollouts | None) -> Loss:
    """`loss` whose groups `engine` samples (None: TRL's own generation) through TRL's `rollout_func`, and, with
    `settings.dynamic_sampling_replacements`, `dynamic_sampling.DynamicSampling` over that sampling: a group of equal
    rewards is replaced by another prompt's of `dataset`, up to that many a step."""
    if settings.dynamic_sampling_replacements:
        reward_funcs = loss.trainer_options["reward_funcs"]
        rollout = DynamicSampling(
            dataset,
            reward_funcs,
            loss.config["reward_weights"] or [1.0] * len(reward_funcs),
            settings.num_generations,
            settings.dynamic_sampling_replacements,
            settings.seed,
            engine.sample if engine else trl_sample,
        )
    elif engine:
        rollout = engine
    else:
        return loss
    return replace(loss, trainer_options=loss.trainer_options | {"rollout_func": rollout})


def grpo_rows(settings: GRPOSettings) -> Rows:
    """A GRPO step: `prompts_per_step` prompts, each sampled `num_generations` times. With one process, TRL generates
    `per_device_train_batch_size * gradient_accumulation_steps` completions per optimiser step (its
    `generation_batch_size`), which must be whole groups; so the batch is the step's completions."""
    return Rows(settings.completions_per_step, "prompts", None, needed=settings.prompts_per_step)


def logged_completions(work_dir: Path) -> pl.DataFrame:
    """The completions TRL logged while training into `work_dir` (`train_grpo(..., log_completions=True)`), one row
    per completion of each step's groups: the step, the question (the prompt's last turn), the completion's text,
    each reward function's reward (a column named after it; null where ungraded) and its advantage."""
    table = pl.concat(
        [pl.read_parquet(path) for path in sorted((work_dir / TRL_COMPLETIONS_DIR).glob("*.parquet"))],
        how="diagonal_relaxed",
    )
    messages_text = pl.element().struct.field("content")
    return table.with_columns(
        pl.col("prompt").list.last().struct.field("content").alias("question"),
        pl.col("completion").list.eval(messages_text).list.join(""),
        pl.col(pl.Float64).fill_nan(None),
    ).select(
        "step",
        "question",
        "completion",
        pl.exclude("step", "prompt", "question", "completion", "advantage"),
        "advantage",
    )


def train_grpo(
    init_checkpoint: Path,
    dataset: Dataset,
    settings: GRPOSettings,
    out_dir: Path,
    run: TrainingRun,
    *,
    reward: str = HARD_REWARD,
    majority_gate: MajorityGate = MajorityGate(),
    model_dropout: float = 0.0,
    log_completions: bool = False,
) -> TrainingResult:
    """GRPO-train the checkpoint at `init_checkpoint` on `dataset` (see `build_training_dataset`) and save
    the trained, merged model with its tokenizer to `out_dir`, over the one setup (`base.TrainerSetup`).

    Resumes from the latest ``checkpoint-*`` in `run.work_dir` if there is one. `reward` is one of `REWARDS`
    (group_majority's online vote under `majority_gate`);
    `model_dropout` is the student's dropout noise (see `base.load_policy`); `log_completions` keeps each step's
    groups with their rewards and advantages in `run.work_dir` (`logged_completions`).

    Every optimizer step is guarded (`guards.NonFiniteStepGuard`): a step with a non-finite loss or
    gradient norm is skipped and reported through `run.warn`; `settings.max_consecutive_skipped_steps` in a
    row raise `NonFiniteTrainingError`. The merged checkpoint is checked for non-finite weights before
    this returns (`NonFiniteWeightsError`), so a broken model never leaves `out_dir` for the lake.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward {reward!r} is not one of {REWARDS}")
    validate_training_dataset(dataset)
    require_validation(settings.validation_every, run.validation)
    checked = settings.validation_every > 0
    engine = (
        VllmRollouts(
            init_checkpoint,
            settings.seed,
            run.dtype,
            run.device,
            extra_prompts=validation_prompts(run.validation) if checked else [],
        )
        if settings.rollouts == VLLM_ROLLOUTS
        else None
    )
    loss = with_rollouts(
        grpo_loss(settings, reward=reward, majority_gate=majority_gate, log_completions=log_completions),
        dataset,
        settings,
        engine,
    )
    if checked:
        check = validation_stop_callback(
            settings.validation_every, settings.validation_patience, run.validation, engine, run.work_dir
        )
        loss = replace(loss, callbacks=(*loss.callbacks, check))
    setup = TrainerSetup.for_student(settings, model_dropout)
    try:
        return setup.train(loss, grpo_rows(settings), init_checkpoint, dataset, out_dir, run)
    finally:
        if engine:
            engine.close()
