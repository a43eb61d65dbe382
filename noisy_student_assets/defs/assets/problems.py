"""Problem tables, per arm: the training pool and the held-out eval set of the arm's task (identical for every arm
of a task, so that arms are compared on the same problems), and the arm's seeded labeled / unlabeled / validation
draw from the pool."""

from collections.abc import Iterator

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.problems import (
    HIDDEN_GOLD_COLUMN,
    drop_overlap,
    eval_halves,
    fingerprint,
    load_problems,
    split_problems,
)
from noisy_student_assets.core.settings import ProblemSource
from noisy_student_assets.defs.assets.metadata import markdown_table
from noisy_student_assets.defs.assets.stages import stage
from noisy_student_assets.defs.config import EvalProblemsConfig, ProblemPoolConfig, ProblemSplitConfig
from noisy_student_assets.defs.partitions import ARMS
from resources.stage_resources import StageResources

GROUP = "problems"


def _table_metadata(frame: pl.DataFrame, source: ProblemSource | None = None) -> dict:
    return {
        "dagster/row_count": frame.height,
        "fingerprint": fingerprint(frame),
        # The hidden gold is for audits only; it stays out of the preview too.
        "preview": markdown_table(frame.drop(HIDDEN_GOLD_COLUMN, strict=False)),
    } | ({"source": source.describe()} if source else {})


@dg.asset(name=layout.PROBLEM_POOL, group_name=GROUP, partitions_def=ARMS)
def problem_pool(
    context: dg.AssetExecutionContext, config: ProblemPoolConfig, stage_resources: StageResources
) -> dg.Output[pl.DataFrame]:
    """The training pool of the arm's task, which its labeled, unlabeled and validation problems are drawn from."""
    with stage(context, config, stage_resources) as current:
        source = current.settings.resolved_source
        pool = load_problems(**source.load_kwargs())
        current.log_metrics({"rows": pool.height})
    return current.output(pool, metadata=_table_metadata(pool, source))


@dg.asset(name=layout.EVAL_PROBLEMS, group_name=GROUP, partitions_def=ARMS)
def eval_problems(
    context: dg.AssetExecutionContext,
    config: EvalProblemsConfig,
    problem_pool: pl.DataFrame,
    stage_resources: StageResources,
) -> dg.Output[pl.DataFrame]:
    """Held-out problems of the arm's task, which every checkpoint of the arm is evaluated on, minus any prompt or
    problem id of the training pool (so no split can contain one); every arm of a task has the same ones."""
    with stage(context, config, stage_resources) as current:
        source = current.settings.resolved_source
        candidates = load_problems(**source.load_kwargs())
        held_out = drop_overlap(candidates, problem_pool.select("problem_id", "prompt"))
        dropped = candidates.height - held_out.height
        current.log_metrics({"rows": held_out.height, "dropped_overlap_with_pool": dropped})
    return current.output(held_out, metadata=_table_metadata(held_out, source) | {"dropped_overlap_with_pool": dropped})


@dg.multi_asset(
    outs={
        layout.LABELED_PROBLEMS: dg.AssetOut(
            description="Problems whose gold answers RL may use (the arm's seeded draw from the pool).",
            group_name=GROUP,
        ),
        layout.UNLABELED_PROBLEMS: dg.AssetOut(
            description="Problems to pseudo-label (a test-time arm's come from the held-out set); their gold answer is "
            f"kept only in `{HIDDEN_GOLD_COLUMN}`, for audits.",
            group_name=GROUP,
        ),
        layout.VALIDATION_PROBLEMS: dg.AssetOut(
            description="Labeled problems held out to choose settings on (where labeled RL stops, which model teaches "
            "the next round); nothing trains on them.",
            group_name=GROUP,
        ),
    },
    partitions_def=ARMS,
)
def problem_split(
    context: dg.AssetExecutionContext,
    config: ProblemSplitConfig,
    problem_pool: pl.DataFrame,
    eval_problems: pl.DataFrame,
    stage_resources: StageResources,
) -> Iterator[dg.Output]:
    """The arm's seeded draw from the pool; a test-time arm draws its unlabeled problems from the transductive half of
    `eval_problems` instead (gold hidden), which is why the held-out set is an input of every arm's split."""
    with stage(context, config, stage_resources, name="problem_split") as current:
        settings = current.settings
        transductive = eval_halves(eval_problems)[0] if settings.test_time else None
        tables = dict(
            zip(
                (layout.LABELED_PROBLEMS, layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS),
                split_problems(
                    problem_pool,
                    settings.n_labeled,
                    settings.n_unlabeled,
                    settings.seed,
                    settings.n_validation,
                    transductive,
                ),
                strict=True,
            )
        )
        current.log_metrics({f"{name}_rows": table.height for name, table in tables.items()})
    split_metadata = {
        "pool_rows": problem_pool.height,
        "split_seed": settings.seed,
        "unlabeled_from": "the held-out set's transductive half, all of it (test-time arm; n_unlabeled not read)"
        if settings.test_time
        else "the pool",
    }
    for name, table in tables.items():
        yield current.output(table, name, metadata=_table_metadata(table) | split_metadata)


defs = dg.Definitions(assets=[problem_pool, eval_problems, problem_split])
