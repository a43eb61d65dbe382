"""Problem tables: the labeled/unlabeled split of the training pool, and the held-out eval set."""

from collections.abc import Iterator

import dagster as dg
import polars as pl

from noisy_student_assets.assets.metadata import markdown_table
from noisy_student_assets.config import EvalProblemsConfig, ProblemSourceConfig, ProblemSplitConfig, resolved_config
from noisy_student_assets.problems import HIDDEN_GOLD_COLUMN, drop_overlap, fingerprint, load_problems, split_labeled_unlabeled
from resources.tracking import MlflowTracking

GROUP = "problems"


def _table_metadata(frame: pl.DataFrame, source: ProblemSourceConfig) -> dict:
    return {
        "dagster/row_count": frame.height,
        "source": source.describe(),
        "fingerprint": fingerprint(frame),
        # The hidden gold is for audits only; it stays out of the preview too.
        "preview": markdown_table(frame.drop(HIDDEN_GOLD_COLUMN, strict=False)),
    }


@dg.multi_asset(
    outs={
        "labeled_problems": dg.AssetOut(
            description="Problems whose gold answers labeled RL may use (a seeded sample of the training pool).",
            group_name=GROUP,
        ),
        "unlabeled_problems": dg.AssetOut(
            description=f"Problems to pseudo-label; their gold answer is kept only in `{HIDDEN_GOLD_COLUMN}`, for audits.",
            group_name=GROUP,
        ),
    },
)
def problem_split(
    context: dg.AssetExecutionContext, config: ProblemSplitConfig, tracking: MlflowTracking
) -> Iterator[dg.Output]:
    source = config.resolved_source
    run_config = resolved_config(config)
    with tracking.start_run(context, "problem_split", {"config": run_config}) as run:
        pool = load_problems(**source.load_kwargs())
        labeled, unlabeled = split_labeled_unlabeled(pool, config.n_labeled, config.n_unlabeled, config.seed)
        tracking.log_metrics({"pool_rows": pool.height, "labeled_rows": labeled.height, "unlabeled_rows": unlabeled.height})
    split_metadata = {
        "pool_rows": pool.height,
        "split_seed": config.seed,
        "config": dg.MetadataValue.json(run_config),
        "mlflow_run_id": run.info.run_id,
    }
    yield dg.Output(labeled, "labeled_problems", metadata=_table_metadata(labeled, source) | split_metadata)
    yield dg.Output(unlabeled, "unlabeled_problems", metadata=_table_metadata(unlabeled, source) | split_metadata)


@dg.asset(group_name=GROUP)
def eval_problems(
    context: dg.AssetExecutionContext,
    config: EvalProblemsConfig,
    labeled_problems: pl.DataFrame,
    unlabeled_problems: pl.DataFrame,
    tracking: MlflowTracking,
) -> dg.Output[pl.DataFrame]:
    """Held-out problems every checkpoint is evaluated on, minus any prompt seen in training."""
    source = config.resolved_source
    run_config = resolved_config(config)
    with tracking.start_run(context, "eval_problems", {"config": run_config}) as run:
        candidates = load_problems(**source.load_kwargs())
        held_out = drop_overlap(candidates, pl.concat([labeled_problems.select("prompt"), unlabeled_problems.select("prompt")]))
        dropped = candidates.height - held_out.height
        tracking.log_metrics({"rows": held_out.height, "dropped_overlap_with_training": dropped})
    return dg.Output(
        held_out,
        metadata=_table_metadata(held_out, source)
        | {"dropped_overlap_with_training": dropped, "config": dg.MetadataValue.json(run_config), "mlflow_run_id": run.info.run_id},
    )
