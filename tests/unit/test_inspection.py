"""The flips the notebooks list (`inspection.flipped_problems`) are the ones the eval report counts (`test_time.flips`),
against the round's own teacher: labeled RL in round 1, the previous round's student after."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.lake_reader import RoundLake
from noisy_student_assets.core.reporting import test_time
from noisy_student_assets.core.reporting.eval_report import GREEDY_FILE, SAMPLED_FILE
from noisy_student_assets.core.reporting.inspection import RIGHT_TO_WRONG, WRONG_TO_RIGHT, flipped_problems

ARM = "a"
GREEDY_CORRECT = {  # per evaluation, each problem's greedy answer is right or not (None: ungraded)
    layout.LABELED_RL_EVAL: [True, False, False, True],
    layout.round_asset(1, layout.EVAL_REPORT): [True, True, False, False],
    layout.round_asset(2, layout.EVAL_REPORT): [False, True, True, None],
}


def _publish(lake: Path, key_path: tuple[str, ...] | str, correct: list[bool | None]) -> None:
    """An evaluation as the eval stage publishes it, reduced to what the inspection reads: its greedy answers' scores
    and completions (the completion states the answer, `7` where it was right)."""
    directory = layout.artifact_dir(lake, key_path, ARM)
    directory.mkdir(parents=True)
    problem_ids = [f"p{index}" for index in range(len(correct))]
    (directory / layout.METRICS_FILE).write_text(json.dumps({"metrics": {"problems": len(correct)}}))
    pl.DataFrame(
        {"problem_id": problem_ids, "greedy_correct": correct},
        schema={"problem_id": pl.Utf8, "greedy_correct": pl.Boolean},
    ).write_parquet(directory / layout.SCORES_FILE)
    completions = [f"\\boxed{{{7 if right else 5}}}" for right in correct]
    pl.DataFrame({"problem_id": problem_ids, "completion": completions}).write_parquet(directory / GREEDY_FILE)
    pl.DataFrame(schema={"problem_id": pl.Utf8, "completion": pl.Utf8}).write_parquet(directory / SAMPLED_FILE)


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    for key_path, correct in GREEDY_CORRECT.items():
        _publish(tmp_path, key_path, correct)
    return tmp_path


@pytest.mark.parametrize("number", [1, 2])
def test_the_flips_are_those_the_report_counts_against_the_round_s_teacher(lake: Path, number: int) -> None:
    round_lake = RoundLake(lake, ARM, number)
    teacher = round_lake.teacher_evaluation()
    expected_teacher = layout.LABELED_RL_EVAL if number == 1 else layout.round_asset(1, layout.EVAL_REPORT)
    assert teacher.directory == layout.artifact_dir(lake, expected_teacher, ARM)

    flips = flipped_problems(round_lake)
    counted = test_time.flips(teacher.scores, round_lake.evaluation(layout.STUDENT_ROLE).scores).row(0, named=True)
    assert flips.filter(pl.col("flip") == WRONG_TO_RIGHT).height == counted["wrong_to_right"]
    assert flips.filter(pl.col("flip") == RIGHT_TO_WRONG).height == counted["right_to_wrong"]
    for row in flips.iter_rows(named=True):
        assert row["student/correct"] == (row["flip"] == WRONG_TO_RIGHT) != row["teacher/correct"]
        assert row["student/answer"] == ("7" if row["student/correct"] else "5")


def test_an_ungraded_answer_is_no_flip(lake: Path) -> None:
    assert "p3" not in flipped_problems(RoundLake(lake, ARM, 2))["problem_id"].to_list()
