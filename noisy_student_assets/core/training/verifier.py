"""A learned outcome verifier: a reward model that scores how likely a sample's final answer is right (no Dagster here).

Cobbe et al. 2021 ("Training Verifiers to Solve Math Word Problems") train an outcome verifier on a generator's
own samples, graded against the gold answers, and let it rank new samples. Here the verifier is the teacher's
backbone with a scalar head (`AutoModelForSequenceClassification`, one label), trained with TRL's
`RewardTrainer` on (right, wrong) pairs of the teacher's samples of the labeled problems: the Bradley-Terry loss
-log sigmoid(score(right) - score(wrong)) only asks that a right sample outscores a wrong one of the same
problem, so the verifier learns what tells them apart rather than how hard each problem is. Its score of a
sample of an unlabeled problem then weighs that sample's vote (`pseudo_labels/sources/verifier.py`). It trains
over the setup every trainer shares (`base.TrainerSetup`), its loss a scalar head's (`RewardModelLoss`).

The training chat and the scored chat are the same messages (`verifier_messages`: the problem's prompt as every
stage renders it, then the sample as the assistant's turn) through the tokenizer's chat template, so the
verifier scores exactly the kind of text it was trained on.

The ML libraries are imported inside the functions that use them, so that loading the code location does not
wait for them.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict

from noisy_student_assets.core.grading import answers_equivalent
from noisy_student_assets.core.layout import parse_sidecar, read_sidecar
from noisy_student_assets.core.prompts import build_messages
from noisy_student_assets.core.settings import INFORMATIVE_CONFIDENCE, VerifierSettings
from noisy_student_assets.core.training.base import GOLD, Lora, Loss, Rows, TrainerSetup, TrainingRun

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from noisy_student_assets.core.settings import ComputeSettings

VERIFIER_LOGGED = (("loss", "train_loss"), ("accuracy", "pair_accuracy"), ("margin", "reward_margin"))
"""TRL's reward-model step logs summarised in the training metrics (first and last quarter)."""

MAX_CONSECUTIVE_SKIPPED_STEPS = 3
"""Non-finite optimizer steps in a row that stop the verifier's training (GRPO's default)."""

CHECKPOINTS_PER_RUN = 10
"""Resumable TRL checkpoints a training saves at most: a killed run loses at most a tenth of its steps."""

CONSTANT_TOLERANCE = 1e-6
"""Scores that all lie within this of each other rank nothing."""

VERIFIER_METRICS_FILE = "verifier.json"
"""In a verifier's directory: {"metrics": training and validation figures, "settings": its `VerifierSettings`}."""
VALIDATION_SCORES_FILE, TRAINING_PAIRS_FILE = "validation_scores.parquet", "training_pairs.parquet"
"""In a verifier's directory: its validation samples, graded and scored; the (right, wrong) pairs it trained on."""


class VerifierMetrics(BaseModel):
    """A built verifier's metrics: the figures the reports read by name, and its trainer's (`base.TrainingResult`'s
    metrics, the `VERIFIER_LOGGED` summaries), which pass through as numbers."""

    model_config = ConfigDict(frozen=True, extra="allow", ser_json_inf_nan="constants")
    __pydantic_extra__: dict[str, float | None]

    pairs: float
    """(right, wrong) pairs it trained on."""
    steps: float
    labeled_samples_right: float
    """Share of the teacher's samples of the labeled problems that are right."""
    validation_auroc: float | None
    """AUROC of right against wrong samples of the validation problems; None when its scores rank nothing."""
    validation_label_accuracy: float
    validation_maj_at_k: float
    validation_pass_at_k: float
    validation_samples_right: float


class PublishedVerifier(BaseModel):
    """What a verifier's directory says of it (`VERIFIER_METRICS_FILE`): its metrics, and the settings it was trained
    with, which its scoring reads. Read through `read` or `from_files`."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    metrics: VerifierMetrics
    settings: VerifierSettings

    @classmethod
    def read(cls, verifier_dir: Path) -> PublishedVerifier:
        """The record in a verifier's directory."""
        return read_sidecar(cls, verifier_dir / VERIFIER_METRICS_FILE)

    @classmethod
    def from_files(cls, files: Mapping[str, str], table: str) -> PublishedVerifier:
        """The record among the files published beside a table (the verifier's scores; `table` names it in an
        error)."""
        return parse_sidecar(cls, files[VERIFIER_METRICS_FILE], f"{VERIFIER_METRICS_FILE} of {table}")


def verifier_messages(prompt: str, completion: str) -> list[dict[str, str]]:
    """The chat the verifier reads, in training and in scoring: the problem as every stage asks it, answered by
    `completion`."""
    return [*build_messages(prompt), {"role": "assistant", "content": completion}]


def graded_samples(generations: pl.DataFrame, problems: pl.DataFrame) -> pl.DataFrame:
    """The samples (`sampling.GENERATION_SCHEMA`) of problems with a gold answer (`problem_id`, `prompt`,
    `gold_answer`), with their problem's prompt and whether their answer is the gold one: columns
    `problem_id`, `sample_index`, `prompt`, `completion`, `answer`, `correct`. A sample without an answer is
    wrong; one whose check was ungraded is left out (ungraded is not wrong)."""
    samples = generations.select("problem_id", "sample_index", "completion", "answer").join(
        problems.select("problem_id", "prompt", "gold_answer"), on="problem_id", how="left"
    )
    orphans = samples.filter(pl.col("prompt").is_null())
    if orphans.height:
        raise ValueError(
            f"{orphans.height} samples are of problems missing from the problem table "
            f"(e.g. {orphans['problem_id'][0]!r})"
        )
    verdicts = [
        answers_equivalent(gold, answer) for gold, answer in samples.select("gold_answer", "answer").iter_rows()
    ]
    return (
        samples.with_columns(pl.Series("correct", verdicts, dtype=pl.Boolean))
        .drop_nulls("correct")
        .select("problem_id", "sample_index", "prompt", "completion", "answer", "correct")
    )


def preference_pairs(graded: pl.DataFrame, max_pairs_per_problem: int, seed: int) -> datasets.Dataset:
    """Up to `max_pairs_per_problem` (right, wrong) pairs of each problem of `graded` (`graded_samples`) that has
    both, drawn without replacement from all its pairs, seeded per problem (a problem's pairs do not depend on the
    others). TRL's conversational implicit-prompt preference rows: `chosen` and `rejected` are the whole chats
    (`verifier_messages`), beside the `problem_id` (which the trainer ignores)."""
    import datasets

    rows, n_all_right, n_all_wrong = [], 0, 0
    by_problem = graded.sort("problem_id", "sample_index").group_by("problem_id", maintain_order=True)
    for (problem_id,), samples in by_problem:
        right = samples.filter(pl.col("correct"))["completion"].to_list()
        wrong = samples.filter(~pl.col("correct"))["completion"].to_list()
        n_all_right += not wrong
        n_all_wrong += not right
        pairs = list(itertools.product(right, wrong))
        prompt = samples["prompt"][0]
        for chosen, rejected in random.Random(f"{seed}:{problem_id}").sample(
            pairs, min(max_pairs_per_problem, len(pairs))
        ):
            rows.append(
                {
                    "problem_id": problem_id,
                    "chosen": verifier_messages(prompt, chosen),
                    "rejected": verifier_messages(prompt, rejected),
                }
            )
    if not rows:
        raise ValueError(
            f"no labeled problem has both a right and a wrong graded sample ({n_all_right} problems have only right "
            f"ones, {n_all_wrong} only wrong ones): the verifier has no pair to learn from. Sample more per problem "
            "(verifier k) or at a higher temperature, or start from a teacher that solves some of the problems"
        )
    return datasets.Dataset.from_list(rows)


def load_reward_model(init_dir: Path, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The checkpoint's float32 backbone with a new scalar head (one label), initialised at random from `seed`, and
    its tokenizer. RewardTrainer sets the tokenizer's pad token (its eos when it has none) and the model config's
    pad_token_id, which the head reads to find each sequence's last token, and which the saved config keeps for
    scoring."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed

    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    set_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        init_dir, num_labels=1, dtype=torch.float32, use_safetensors=True
    )
    return model, tokenizer


@dataclass(frozen=True)
class RewardModelLoss(Loss):
    """TRL's reward-model (Bradley-Terry) loss, trained on a scalar head over the backbone: with LoRA, peft's
    sequence-classification task saves the `score` head whole."""

    task_type: ClassVar[str] = "SEQ_CLS"

    def load(self, init_checkpoint: Path, setup: TrainerSetup) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        return load_reward_model(init_checkpoint, setup.seed)


def train_verifier(
    init_dir: Path, pairs: datasets.Dataset, settings: VerifierSettings, out_dir: Path, run: TrainingRun
) -> dict[str, float]:
    """Train a verifier from the checkpoint `init_dir` (its backbone, a new scalar head) on `pairs`
    (`preference_pairs`) with TRL's `RewardTrainer`, and save it merged (safetensors and tokenizer, no adapters)
    into `out_dir`; return the training metrics (`base.TrainingResult.metrics` with the `VERIFIER_LOGGED`
    quarters, and `pairs`).

    `settings.max_steps` steps of `settings.pairs_per_step` pairs at `settings.learning_rate` decaying linearly;
    a pair longer than `settings.max_length` tokens is left out (TRL's filter). With `settings.use_lora`, LoRA
    adapters on every linear layer of the backbone and the whole head trained; otherwise every weight. Over the
    setup every trainer shares (`base.TrainerSetup`), it resumes from the latest whole checkpoint in `run.work_dir`,
    skips steps with a non-finite loss or gradient norm (reported through `run.warn`), and checks the saved weights
    are finite.
    """
    from trl import RewardConfig, RewardTrainer

    setup = TrainerSetup(
        max_steps=settings.max_steps,
        learning_rate=settings.learning_rate,
        seed=settings.seed,
        save_steps=max(1, settings.max_steps // CHECKPOINTS_PER_RUN),
        # A step holds 2 x pairs_per_step chats of up to max_length tokens: too many activations for a GPU, and on
        # the CPU (short chats) recomputing them would only slow the step.
        gradient_checkpointing=run.device != "cpu",
        max_consecutive_skipped_steps=MAX_CONSECUTIVE_SKIPPED_STEPS,
        lora=Lora(settings.lora_r, settings.lora_alpha) if settings.use_lora else None,
    )
    loss = RewardModelLoss(
        "verifier", RewardTrainer, RewardConfig, {"max_length": settings.max_length}, VERIFIER_LOGGED
    )
    # TRL's reward trainer keeps an epoch's last, partial batch: a single pair makes a step.
    rows = Rows(settings.pairs_per_step, "pairs", GOLD, needed=1)
    return setup.train(loss, rows, init_dir, pairs, out_dir, run).metrics | {"pairs": float(len(pairs))}


def score_samples(
    verifier_dir: Path,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    batch_size: int,
    max_length: int,
    device: str = "cpu",
    dtype: str = "float32",
) -> list[float]:
    """The verifier's score (a logit: higher, more likely right) of each completion of its problem's prompt, in
    order. Each chat is tokenized as in training (`verifier_messages` through the chat template) and cut to its
    first `max_length` tokens; chats of similar length share a batch of `batch_size`, padded on the right, and
    the head reads each one's last token that is not padding."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    tokenizer = AutoTokenizer.from_pretrained(verifier_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        verifier_dir, dtype=getattr(torch, dtype), use_safetensors=True
    )
    if model.config.num_labels != 1 or model.config.pad_token_id != tokenizer.pad_token_id:
        raise ValueError(
            f"{verifier_dir} is not a verifier: it has {model.config.num_labels} labels (a verifier 1) and pad token "
            f"id {model.config.pad_token_id} against its tokenizer's {tokenizer.pad_token_id} (a verifier the same)"
        )
    model.to(device).eval()
    ids = [
        tokenizer.apply_chat_template(verifier_messages(prompt, completion), tokenize=True, return_dict=True)[
            "input_ids"
        ][:max_length]
        for prompt, completion in zip(prompts, completions, strict=True)
    ]
    order = sorted(range(len(ids)), key=lambda index: len(ids[index]))  # less padding
    scores = [0.0] * len(ids)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            inputs = tokenizer.pad(
                {"input_ids": [ids[index] for index in batch]}, padding_side="right", return_tensors="pt"
            )
            logits = model(**inputs.to(device)).logits[:, 0].float().tolist()
            for index, score in zip(batch, logits, strict=True):
                scores[index] = score
    return scores


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """The area under the ROC curve of `scores` separating right (`labels` true) from wrong samples: the chance
    that a right sample outscores a wrong one, ties counting half (Mann-Whitney U over both counts). None when
    either class is absent."""
    values, right = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    if values.shape != right.shape:
        raise ValueError(f"{values.size} scores but {right.size} labels")
    if not np.isfinite(values).all():
        raise ValueError("scores must be finite to be ranked")
    n_right = int(right.sum())
    n_wrong = right.size - n_right
    if not (n_right and n_wrong):
        return None
    _, tie_group, tie_counts = np.unique(values, return_inverse=True, return_counts=True)
    mid_ranks = np.cumsum(tie_counts) - (tie_counts - 1) / 2  # 1-based ranks, a tie sharing its mean rank
    rank_sum = mid_ranks[tie_group][right].sum()
    return float((rank_sum - n_right * (n_right + 1) / 2) / (n_right * n_wrong))


def score_failure(scores: Sequence[float]) -> str | None:
    """Why the verifier's scores cannot weigh samples (none, some not finite, or all the same within
    `CONSTANT_TOLERANCE`), or None."""
    values = np.asarray(scores, dtype=float)
    if values.size == 0:
        return "the verifier scored no samples"
    non_finite = int((~np.isfinite(values)).sum())
    if non_finite:
        return f"{non_finite} of {values.size} verifier scores are NaN or infinite"
    if values.max() - values.min() <= CONSTANT_TOLERANCE:
        return (
            f"all {values.size} verifier scores are {values[0]:.6g} (within {CONSTANT_TOLERANCE:g}): the verifier "
            "tells no sample from another"
        )
    return None


AUROC_RESAMPLES = 2000
"""The bootstrap's resamples of the problems, for the validation AUROC's interval."""


def auroc_interval(
    scores: Sequence[float],
    labels: Sequence[bool],
    problems: Sequence[str],
    confidence: float = INFORMATIVE_CONFIDENCE,
    resamples: int = AUROC_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of the `auroc` of `scores` for `labels`, resampling whole problems (a problem's
    samples share its difficulty, so they are not independent draws): None when no resample has both classes."""
    values, right = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    _, problem_of = np.unique(np.asarray(problems), return_inverse=True)
    members = [np.flatnonzero(problem_of == index) for index in range(problem_of.max() + 1)]
    rng = np.random.default_rng(seed)
    estimates = []
    for _ in range(resamples):
        rows = np.concatenate([members[index] for index in rng.integers(len(members), size=len(members))])
        estimate = auroc(values[rows], right[rows])
        if estimate is not None:
            estimates.append(estimate)
    if not estimates:
        return None
    tail = (1 - confidence) / 2
    low, high = np.quantile(estimates, [tail, 1 - tail])
    return float(low), float(high)


def judged_auroc(
    scored: pl.DataFrame, confidence: float = INFORMATIVE_CONFIDENCE
) -> tuple[tuple[float, float] | None, str | None]:
    """A verifier's validation AUROC interval at `confidence` (`auroc_interval`; None where its scores are unusable or
    no resample can measure one), and why the verifier is not shown to rank right samples above wrong ones, or None
    (`scored`: its validation samples' `problem_id`, `correct`, `score`): `score_failure`, an interval that does not
    lie above 0.5, chance, or samples all right or all wrong."""
    if failure := score_failure(scored["score"].to_list()):
        return None, failure
    interval = auroc_interval(
        scored["score"].to_list(), scored["correct"].to_list(), scored["problem_id"].to_list(), confidence
    )
    if interval is None:
        return None, "the validation samples are all right or all wrong: the verifier's AUROC cannot be measured"
    low, high = interval
    if low > 0.5:
        return interval, None
    estimate = auroc(scored["score"].to_list(), scored["correct"].to_list())
    where = "contains 0.5" if high >= 0.5 else "lies below 0.5"
    return interval, (
        f"validation AUROC {estimate:.3f}, its {confidence:.0%} interval {low:.3f} to {high:.3f} over "
        f"{scored['problem_id'].n_unique()} problems {where}: the verifier is not shown to rank right samples above "
        "wrong ones"
    )


def build_verifier(
    teacher_dir: Path,
    labeled: pl.DataFrame,
    validation: pl.DataFrame,
    settings: VerifierSettings,
    compute: ComputeSettings,
    out_dir: Path,
    run: TrainingRun,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float | None]:
    """The verifier stage: the teacher's `settings.k` samples of every labeled and validation problem (one model
    load, saved shard by shard in `run.work_dir` and resumed from there), a verifier trained on pairs of the labeled
    problems' samples (its checkpoints beside them), and its measure on the validation problems' samples. Writes
    into `out_dir` the verifier, `VERIFIER_METRICS_FILE`, the validation samples with their scores and the training
    pairs; returns the metrics.

    Only the labeled problems' gold trains it; the validation problems' gold measures it. No unlabeled problem is
    read here."""
    from noisy_student_assets.core.sampling import SampleShards, SamplingSettings, generate

    say = progress or (lambda _: None)
    problems = pl.concat([labeled, validation]).select("problem_id", "prompt", "gold_answer")
    decoding = SamplingSettings(
        n=settings.k, temperature=settings.temperature, max_new_tokens=settings.max_new_tokens, seed=settings.seed
    )
    (generations,), _ = generate(
        teacher_dir,
        problems.select("problem_id", "prompt"),
        [decoding],
        shards=[SampleShards(run.work_dir / "samples", run.set_aside)],
        backend=settings.backend,
        progress=lambda done, total: say(f"verifier: sampled {done}/{total} problems"),
        **compute.generation_options(),
    )
    graded = graded_samples(generations, problems)
    on_labeled = graded.filter(pl.col("problem_id").is_in(labeled["problem_id"].implode()))
    pairs = preference_pairs(on_labeled, settings.max_pairs_per_problem, settings.seed)
    say(
        f"verifier: {len(pairs)} (right, wrong) pairs from the {len(set(pairs['problem_id']))} of {labeled.height} "
        "labeled problems with both a right and a wrong sample"
    )
    training = train_verifier(teacher_dir, pairs, settings, out_dir, replace(run, work_dir=run.work_dir / "trainer"))
    on_validation = graded.filter(pl.col("problem_id").is_in(validation["problem_id"].implode()))
    scored = _scored(out_dir, on_validation, settings, compute)
    metrics = (
        training
        | validation_metrics(scored, validation)
        | {"labeled_samples_right": float(on_labeled["correct"].mean())}
    )
    scored.drop("prompt").write_parquet(out_dir / VALIDATION_SCORES_FILE)
    pairs_table = [
        {"problem_id": row["problem_id"], "chosen": json.dumps(row["chosen"]), "rejected": json.dumps(row["rejected"])}
        for row in pairs
    ]
    pl.DataFrame(pairs_table, schema={"problem_id": pl.Utf8, "chosen": pl.Utf8, "rejected": pl.Utf8}).write_parquet(
        out_dir / TRAINING_PAIRS_FILE
    )
    published = PublishedVerifier(metrics=VerifierMetrics.model_validate(metrics), settings=settings)
    (out_dir / VERIFIER_METRICS_FILE).write_text(published.model_dump_json(indent=2))
    return metrics


def validation_metrics(scored: pl.DataFrame, validation: pl.DataFrame) -> dict[str, float | None]:
    """How well the verifier judges the validation problems' samples (`scored`: `graded_samples` with `score`):
    AUROC of right against wrong samples, and the share of problems whose label is right when the vote is weighted
    by it, beside the plain majority's (maj@K) and the oracle's (pass@K: a right sample exists), the label headroom
    a judge of the samples has."""
    from noisy_student_assets.core.pseudo_labels.labels import vote_pseudo_labels, with_label_correct
    from noisy_student_assets.core.pseudo_labels.sources.registry import label_source
    from noisy_student_assets.core.settings import PseudoLabelSettings

    gold = dict(validation.select("problem_id", "gold_answer").iter_rows())
    voted = {}
    for name in ("majority", "verifier"):
        source = label_source(name)
        weighted = source.weighted(
            scored, PseudoLabelSettings(label_source=name), scored.select("problem_id", "sample_index", "score")
        )
        labels = with_label_correct(vote_pseudo_labels(weighted, validation, tau=0.0), gold)
        voted[name] = float(labels["label_correct"].fill_null(False).mean())
    solved = scored.group_by("problem_id").agg(pl.col("correct").any())["correct"].sum()
    return {
        "validation_auroc": auroc(scored["score"].to_list(), scored["correct"].to_list())
        if score_failure(scored["score"]) is None
        else None,
        "validation_label_accuracy": voted["verifier"],
        "validation_maj_at_k": voted["majority"],
        "validation_pass_at_k": solved / validation.height,
        "validation_samples_right": float(scored["correct"].mean()),
    }


def score_round(verifier_dir: Path, samples: pl.DataFrame, compute: ComputeSettings) -> pl.DataFrame:
    """The verifier's score of each sample (`problem_id`, `sample_index`, `prompt`, `completion`), as `SCORE_SCHEMA`,
    read with the verifier's own training settings (its `max_length`)."""
    from noisy_student_assets.core.pseudo_labels.sources.base import SCORE_SCHEMA

    scored = _scored(verifier_dir, samples, PublishedVerifier.read(verifier_dir).settings, compute)
    return scored.select("problem_id", "sample_index", "score").match_to_schema(SCORE_SCHEMA)


def _scored(
    verifier_dir: Path, samples: pl.DataFrame, settings: VerifierSettings, compute: ComputeSettings
) -> pl.DataFrame:
    """`samples` (with `prompt` and `completion`) with the verifier's `score` of each."""
    scores = score_samples(
        verifier_dir,
        samples["prompt"].to_list(),
        samples["completion"].to_list(),
        batch_size=settings.score_batch_size,
        max_length=settings.max_length,
        device=compute.resolved_device(),
        dtype=compute.dtype,
    )
    return samples.with_columns(pl.Series("score", scores, dtype=pl.Float64))


def read_verifier_metrics(verifier_dir: Path) -> tuple[dict[str, float | None], str | None]:
    """A built verifier's metrics with its validation AUROC's interval, and why its validation scores are not shown
    to weigh a vote (None when they are): `judged_auroc`."""
    published = PublishedVerifier.read(verifier_dir)
    interval, failure = judged_auroc(
        pl.read_parquet(verifier_dir / VALIDATION_SCORES_FILE), published.settings.informative_confidence
    )
    low, high = interval or (None, None)
    return published.metrics.model_dump() | {"validation_auroc_low": low, "validation_auroc_high": high}, failure
