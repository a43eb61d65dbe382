"""Labeled RL's stalled-validation stop materialized in-process (`grpo.validation_every`): the asset reads the arm's
validation problems, checks its greedy accuracy on them through the run's vLLM engine, stops once the checks stall,
keeps the best check's weights and says so in its compute record and metadata."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.core.settings import VLLM_ROLLOUTS
from noisy_student_assets.core.training.base import read_training_log
from noisy_student_assets.core.training.compute import read_compute
from noisy_student_assets.core.training.validation_stop import VALIDATION_LOGGED
from resources.data_lake import DataLake
from tests.lakes import materialize, metadata_of
from tests.tiny_configs import FOUNDATION, TINY_GRPO, tiny_config, with_op_config


def test_labeled_rl_stops_where_its_validation_accuracy_stalls_and_keeps_the_best_check(
    lake_root: Path, tiny_model_dir: Path
) -> None:
    """The random tiny model answers no validation problem: every check scores 0, so the first is the best and, with a
    patience of 2, the third check (step 3 of at most 6) stops the run."""
    checked = TINY_GRPO | {
        "max_steps": 6,
        "rollouts": VLLM_ROLLOUTS,
        "validation_every": 1,
        "validation_patience": 2,
        "save_steps": 1,
    }
    config = with_op_config(tiny_config(tiny_model_dir), layout.LABELED_RL, grpo=checked)
    lake = DataLake(root=str(lake_root))
    result = materialize(lake, [*FOUNDATION, layout.VALIDATION_PROBLEMS], config, arm="a")

    metadata = metadata_of(result, layout.LABELED_RL)
    assert metadata["steps"].value == 3
    assert metadata["validation_checks"].value == {"1": 0.0, "2": 0.0, "3": 0.0}
    assert metadata["kept_step"].value == 1
    checkpoint = lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), "a")
    stopped = read_compute(checkpoint).stopped
    assert stopped.startswith("validation stalled: greedy accuracy 0.000 at step 1 not beaten in 2 checks, to step 3")
    assert stopped.endswith("kept step 1's weights, the best of 3 checks") and metadata["stopped"].value == stopped
    assert [entry["step"] for entry in read_training_log(checkpoint) if VALIDATION_LOGGED in entry] == [1, 2, 3]
