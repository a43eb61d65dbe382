"""Problem tables: the labeled/unlabeled split of the training pool, and the held-out eval set."""

from collections.abc import Iterator

import dagster as dg
import polars as pl

from noisy_student_assets.assets.metadata import markdown_table
from noisy_student_assets.config import EvalProblemsConfig, ProblemSourceConfig, ProblemSplitConfig
from noisy_student_assets.problems import HIDDEN_GOLD_COLUMN, drop_overlap, fingerprint, load_problems, split_labeled_unlabeled

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
def problem_split(config: ProblemSplitConfig) -> Iterator[dg.Output]:
    pool = load_problems(**config.source.load_kwargs())
    labeled, unlabeled = split_labeled_unlabeled(pool, config.n_labeled, config.n_unlabeled, config.seed)
    split_metadata = {"pool_rows": pool.height, "split_seed": config.seed}
    yield dg.Output(labeled, "labeled_problems", metadata=_table_metadata(labeled, config.source) | split_metadata)
    yield dg.Output(unlabeled, "unlabeled_problems", metadata=_table_metadata(unlabeled, config.source) | split_metadata)


@dg.asset(group_name=GROUP)
def eval_problems(
    config: EvalProblemsConfig, labeled_problems: pl.DataFrame, unlabeled_problems: pl.DataFrame
) -> dg.Output[pl.DataFrame]:
    """Held-out problems every checkpoint is evaluated on, minus any prompt seen in training."""
    candidates = load_problems(**config.source.load_kwargs())
    held_out = drop_overlap(candidates, pl.concat([labeled_problems.select("prompt"), unlabeled_problems.select("prompt")]))
    return dg.Output(
        held_out,
        metadata=_table_metadata(held_out, config.source) | {"dropped_overlap_with_training": candidates.height - held_out.height},
    )
