"""Controls that say how much of the possible gain self-training recovered: the same GRPO as a round,
from the same teacher, but with every unlabeled problem carrying its true answer. No real run has
those labels, so this is the upper bound a round's pseudo-labels are measured against."""

from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.assets.models import HEAVY_RETRY, checkpoint_eval
from noisy_student_assets.assets.stages import train_checkpoint
from noisy_student_assets.checks import checkpoint_checks
from noisy_student_assets.config import GoldLabelRLConfig, resolved_config
from noisy_student_assets.problems import HIDDEN_GOLD_COLUMN
from resources.compute import GPU_POOL, ComputeResource
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking

GROUP = "controls"


@dg.asset(io_manager_key="checkpoint_io_manager", group_name=GROUP, pool=GPU_POOL, retry_policy=HEAVY_RETRY)
def gold_label_rl_checkpoint(
    context: dg.AssetExecutionContext,
    config: GoldLabelRLConfig,
    labeled_rl_checkpoint: Path,
    labeled_problems: pl.DataFrame,
    unlabeled_problems: pl.DataFrame,
    compute: ComputeResource,
    tracking: MlflowTracking,
    data_lake: DataLake,
) -> dg.Output[Path]:
    """GRPO from `labeled_rl_checkpoint` on labeled + unlabeled problems, all rewarded against their
    true answers: what round 1 would reach if every pseudo-label were kept and right."""
    # The one place the hidden gold trains anything, deliberately: this checkpoint is a yardstick,
    # never a teacher.
    revealed = unlabeled_problems.select("problem_id", "prompt", pl.col(HIDDEN_GOLD_COLUMN).alias("gold_answer"))
    staged, metadata = train_checkpoint(
        context,
        "gold_label_rl_checkpoint",
        init_dir=labeled_rl_checkpoint,
        labeled=pl.concat([labeled_problems.select("problem_id", "prompt", "gold_answer"), revealed]),
        pseudo_labeled=None,
        grpo=config.grpo,
        run_config=resolved_config(config),
        compute=compute,
        tracking=tracking,
        lake=data_lake,
    )
    return dg.Output(staged, metadata=metadata)


gold_label_rl_eval = checkpoint_eval("gold_label_rl_eval", "gold_label_rl_checkpoint", group=GROUP)
gold_label_rl_checkpoint_checks = checkpoint_checks("gold_label_rl_checkpoint")
