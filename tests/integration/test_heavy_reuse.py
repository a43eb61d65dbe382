"""The verifier and its scores run through the one heavy-stage step (`stages.run_heavy`), so an identical published
run is read back, not launched again: re-materialized with the same teacher, problems, settings and samples, both
name the run they reuse, and no payload starts."""

from __future__ import annotations

import shutil

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.defs.checks import VERIFIER_INFORMATIVE
from resources.data_lake import DataLake
from resources.launchers import StageLauncher
from tests.conftest import INSPECTED_ARM
from tests.lakes import materialize, metadata_of
from tests.tiny_configs import round_names, tiny_config

REUSED = (layout.VERIFIER, layout.VERIFIER_SCORES)


def test_an_identical_verifier_and_its_scores_are_read_back_not_launched(
    inspected_lake, sevens_model_dir, tmp_path, monkeypatch
) -> None:
    lake = DataLake(root=str(shutil.copytree(inspected_lake, tmp_path / "lake")))
    key = {name: dg.AssetKey(layout.round_asset(1, name)) for name in REUSED}
    place = {name: lake.artifact_dir(key[name], INSPECTED_ARM) for name in REUSED}
    verifier_sha = weights_sha256(place[layout.VERIFIER])
    scores = lake.read_table(key[layout.VERIFIER_SCORES], INSPECTED_ARM)

    def no_launch(self, context, specs):
        raise AssertionError(f"a payload was launched: {[spec.stage for spec in specs]}")

    monkeypatch.setattr(StageLauncher, "run_all", no_launch)
    result = materialize(lake, round_names(1, *REUSED), tiny_config(sevens_model_dir, rounds=1, tau=0.5), INSPECTED_ARM)

    for name in REUSED:
        metadata = metadata_of(result, key[name].to_user_string())
        assert metadata["reused_from"].value == str(place[name]), name
        assert not [key for key in metadata if key.endswith("_seconds")], f"{name} was not timed: nothing ran"
    assert weights_sha256(place[layout.VERIFIER]) == verifier_sha
    assert lake.read_table(key[layout.VERIFIER_SCORES], INSPECTED_ARM).equals(scores)
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == VERIFIER_INFORMATIVE]
    assert check.passed, "the check reads the reused verifier's validation scores"
