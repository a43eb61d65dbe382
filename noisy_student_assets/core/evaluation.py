"""Evaluation of a checkpoint on held-out problems (no Dagster here): greedy accuracy, maj@k, pass@k,
format rate and completion length, overall and per subject/level.

A check against the gold that is ungraded (see ``grading``) is neither right nor wrong: it is left out of its
metric's denominator (a null ``greedy_correct`` or ``maj@k_correct``; a sample left out of pass@k's n) and
counted in the ``ungraded`` metric.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from noisy_student_assets.core.grading import answers_equivalent, format_reward, unevaluated
from noisy_student_assets.core.problems import fingerprint
from noisy_student_assets.core.pseudo_labels.consensus import majority_vote
from noisy_student_assets.core.sampling import (
    Progress,
    SampleShards,
    SamplingSettings,
    generate,
)

if TYPE_CHECKING:
    from noisy_student_assets.core.resumable import SetAside
    from noisy_student_assets.core.settings import ComputeSettings, EvalSettings, SmokeSettings
    from noisy_student_assets.core.training.guards import OutputHealth

BREAKDOWN_COLUMNS = ("subject", "level")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def score_problems(
    eval_problems: pl.DataFrame, greedy: pl.DataFrame, sampled: pl.DataFrame, ks: tuple[int, ...]
) -> pl.DataFrame:
    """One row per problem: greedy correctness/format/length, correct and ungraded samples, and maj@k for each
    k; a correctness is null where its check was ungraded.

    maj@k votes over each problem's first k samples (by `sample_index`).
    """
    greedy_by_id = {row["problem_id"]: row for row in greedy.iter_rows(named=True)}
    sampled_answers = dict(
        sampled.sort("problem_id", "sample_index").group_by("problem_id", maintain_order=True).agg("answer").iter_rows()
    )
    rows = []
    for problem in eval_problems.iter_rows(named=True):
        gold, pid = problem["gold_answer"], problem["problem_id"]
        first = greedy_by_id[pid]
        answers = sampled_answers.get(pid, [])  # none in a greedy-only eval
        verdicts = [answers_equivalent(gold, answer) for answer in answers]
        row = {
            "problem_id": pid,
            "subject": problem["subject"],
            "level": problem["level"],
            "greedy_correct": answers_equivalent(gold, first["answer"]),
            "greedy_formatted": format_reward(first["completion"]) == 1.0,
            "greedy_unevaluated": unevaluated(gold, first["answer"]),
            "greedy_tokens": first["n_tokens"],
            "samples": len(answers),
            "samples_correct": verdicts.count(True),
            "samples_ungraded": verdicts.count(None),
        }
        for k in ks:
            row[f"maj@{k}_correct"] = answers_equivalent(gold, majority_vote(answers[:k]).answer)
        rows.append(row)
    return pl.DataFrame(
        rows, schema_overrides={"greedy_correct": pl.Boolean} | {f"maj@{k}_correct": pl.Boolean for k in ks}
    )


def summarize(scores: pl.DataFrame, ks: tuple[int, ...]) -> dict[str, float]:
    """Headline metrics over all problems, each over the checks that were graded; `ungraded` counts the others."""
    correct_columns = ["greedy_correct", *(f"maj@{k}_correct" for k in ks)]
    metrics = {
        "greedy_accuracy": scores["greedy_correct"].mean(),
        "format_rate": scores["greedy_formatted"].mean(),
        "unevaluated_rate": scores["greedy_unevaluated"].mean(),
        "mean_completion_tokens": scores["greedy_tokens"].mean(),
        "problems": float(scores.height),
        "ungraded": float(
            sum(scores[column].null_count() for column in correct_columns) + scores["samples_ungraded"].sum()
        ),
    }
    for k in ks:
        metrics[f"maj@{k}"] = scores[f"maj@{k}_correct"].mean()
        graded = [
            (n - u, c)
            for n, c, u in scores.select("samples", "samples_correct", "samples_ungraded").iter_rows()
            if u == 0 or n - u >= k
        ]
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for n, c in graded]))
    return metrics


def breakdown(scores: pl.DataFrame) -> pl.DataFrame:
    """Greedy accuracy per subject and per level, where the eval set records them."""
    parts = [
        scores.filter(pl.col(column).is_not_null())
        .group_by(pl.col(column).cast(pl.Utf8).alias("value"))
        .agg(pl.len().alias("problems"), pl.col("greedy_correct").mean().alias("greedy_accuracy"))
        .with_columns(pl.lit(column).alias("by"))
        .select("by", "value", "problems", "greedy_accuracy")
        for column in BREAKDOWN_COLUMNS
    ]
    return pl.concat(parts).sort("by", "value")


@dataclass(frozen=True)
class EvalResult:
    scores: pl.DataFrame
    metrics: dict[str, float]
    breakdown: pl.DataFrame
    greedy: pl.DataFrame
    sampled: pl.DataFrame


def eval_content_key(weights_sha256: str, eval_problems: pl.DataFrame, settings: EvalSettings) -> str:
    """The identity of an eval's completions: the same weights on the same problems with the same generation
    settings give the same completions, whichever asset or arm asked."""
    generation = settings.model_dump(include=set(settings.GENERATION_FIELDS))
    identity = ["eval", weights_sha256, fingerprint(eval_problems), generation, settings.backend, settings.batch_size]
    if settings.backend == "transformers":  # its samples follow the batches, which shards cut
        identity.append(settings.shard_size)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def eval_completions(
    checkpoint_dir: Path,
    eval_problems: pl.DataFrame,
    settings: EvalSettings,
    compute: ComputeSettings,
    shards_dir: Path,
    *,
    progress: Progress | None = None,
    set_aside: SetAside | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """The evaluation stage's generation: greedy and sampled completions for every eval problem. Finished shards
    are kept in `shards_dir` (`greedy/`, `sampled/`), so an evaluation killed midway resumes after them; returns
    both tables and the number of problem passes read back from an earlier attempt's shards. A shard that does not
    read whole is moved aside and told to `set_aside`."""
    sample_sets = [SamplingSettings(n=1, temperature=0.0, max_new_tokens=settings.max_new_tokens, seed=settings.seed)]
    if settings.samples:
        sample_sets.append(
            SamplingSettings(
                n=settings.samples,
                temperature=settings.temperature,
                max_new_tokens=settings.max_new_tokens,
                seed=settings.seed,
            )
        )
    shards = [SampleShards(shards_dir / name, set_aside) for name in ("greedy", "sampled")[: len(sample_sets)]]
    (greedy, *sampled), resumed = generate(
        checkpoint_dir,
        eval_problems,
        sample_sets,
        shards=shards,
        backend=settings.backend,
        batch_size=settings.batch_size,
        shard_size=settings.shard_size,
        progress=progress,
        **compute.generation_options(),
    )
    return greedy, sampled[0] if sampled else greedy.clear(), resumed


def scored(
    eval_problems: pl.DataFrame, greedy: pl.DataFrame, sampled: pl.DataFrame, settings: EvalSettings
) -> EvalResult:
    """An eval's completions scored (scoring is cheap and deterministic: published completions are scored again)."""
    scores = score_problems(eval_problems, greedy, sampled, tuple(settings.ks))
    return EvalResult(
        scores=scores,
        metrics=summarize(scores, tuple(settings.ks)),
        breakdown=breakdown(scores),
        greedy=greedy,
        sampled=sampled,
    )


def smoke_test(
    checkpoint_dir: Path, eval_problems: pl.DataFrame, settings: SmokeSettings, compute: ComputeSettings
) -> tuple[pl.DataFrame, OutputHealth, str | None]:
    """Greedy completions (transformers) of the first eval prompts: the completions, their health, and why they
    look broken (None when they do not)."""
    from noisy_student_assets.core.training.guards import output_health, smoke_failure

    (completions,), _ = generate(
        checkpoint_dir,
        eval_problems.head(settings.prompts),
        [SamplingSettings(n=1, temperature=0.0, max_new_tokens=settings.max_new_tokens)],
        backend="transformers",
        **compute.generation_options(),
    )
    health = output_health(completions)
    return (
        completions,
        health,
        smoke_failure(health, max_empty_rate=settings.max_empty_rate, max_truncation_rate=settings.max_truncation_rate),
    )
