"""The grid command (`make grid`) redoes what changed and nothing else: a changed default redoes what it decides,
another profile reuses nothing; an arm's patience stops it after a round; the label sources' grid reports every
source, and `--through` stops an arm at its labels (tiny model). A killed or interrupted grid:
test_grid_interrupts.py."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import arm_assets
from noisy_student_assets.core.pseudo_labels.frontier import ORACLE
from noisy_student_assets.core.pseudo_labels.labels import SOURCES_FILE
from noisy_student_assets.core.reporting.eval_report import metadata_key
from noisy_student_assets.core.reporting.power import seed_hours
from noisy_student_assets.core.reporting.round_report import FLIPS_TABLE, SOURCES_TABLE
from tests.cli import DagsterCli, changed_defaults_env, materializing
from tests.tiny_configs import K_CHANGED, TINY_SAMPLING, op, round_names, tiny_config
from tools.tiny_models import sevens_problems

pytestmark = pytest.mark.e2e

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "grid.yaml"
ARM = "g"


def test_the_grid_redoes_exactly_what_a_changed_default_changes_and_another_profile_reuses_nothing(
    dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch
) -> None:
    sampling_op = op(layout.round_prefix(1), layout.GENERATIONS)
    config = tiny_config(tiny_model_dir, rounds=1)
    config = {
        "ops": config["ops"] | {sampling_op: {"config": {k: v for k, v in TINY_SAMPLING.items() if k != "k"}}}
    }  # K from its default
    dagster_cli.enter(monkeypatch)
    dagster_cli.grid_done(EXPERIMENT, config, tmp_path / "first.log")
    # the hours the arm's runs took, recorded in the lake for `grid power` (a results directory keeps them)
    (hours,) = seed_hours(dagster_cli.lake, [load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem].arm(ARM)]).values()
    assert 0 < hours < 1

    fewer_samples = changed_defaults_env({"TeacherSamplingSettings": {"k": 6}})
    text = dagster_cli.grid_done(EXPERIMENT, config, tmp_path / "k6.log", env=fewer_samples)
    redone = materializing(tmp_path / "k6.log", ARM).split("materializing ", 1)[1].split(", ")
    assert set(redone) == set(K_CHANGED), text[-3000:]
    assert f"[grid] arm {ARM}: round_001/generations: settings changed: config.k: 8 -> 6" in text
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        (latest,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey(layout.round_asset(1, layout.GENERATIONS)), asset_partitions=[ARM]
            ),
            limit=1,
        ).records
    assert latest.asset_materialization.metadata["config"].value["k"] == 6

    again = dagster_cli.grid_done(EXPERIMENT, config, tmp_path / "again.log", env=fewer_samples)
    assert f"[grid] arm {ARM}: up to date" in again, "an unchanged re-run materializes nothing"

    plan = dagster_cli.run_grid("plan", EXPERIMENT, config, env=fewer_samples | {"NOISY_STUDENT_PROFILE": "gpu"})
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "up to date" not in plan.stdout, plan.stdout
    planned = {line.split(": ")[1] for line in plan.stdout.splitlines() if line.startswith(f"[grid] arm {ARM}: ")}
    experiment = load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem]
    assert planned == set(arm_assets(experiment, experiment.arm(ARM))), plan.stdout
    assert f'[grid] arm {ARM}: {layout.PROBLEM_POOL}: settings changed: profile: "cpu" -> "gpu"' in plan.stdout, (
        plan.stdout
    )


def test_an_arm_with_patience_1_stops_after_the_first_round_whose_validation_accuracy_did_not_improve(
    dagster_cli: DagsterCli, tiny_model_dir, tmp_path, monkeypatch
) -> None:
    """The grid applies the stopping rule the next-round automation applies (`progress.stop_reason`), on the
    validation accuracy its own runs recorded: tests/experiments/patience.yaml's arm cannot improve, so round 2 never
    runs."""
    patience, arm = EXPERIMENT.parent / "patience.yaml", "patient-grid"
    config = tiny_config(tiny_model_dir, rounds=2)
    dagster_cli.enter(monkeypatch)
    text = dagster_cli.grid_done(patience, config, tmp_path / "grid.log")
    assert (
        f"[grid] arm {arm}: stopped after round 1: patience=1: validation accuracy did not improve on round 0's" in text
    ), text[-3000:]
    with dg.DagsterInstance.from_config(str(dagster_cli.home)) as instance:
        made = {
            name: instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(name.split("/")), asset_partitions=[arm]), limit=1
            ).records
            for name in (
                layout.LABELED_RL_VALIDATION,
                *round_names(1, layout.STUDENT_VALIDATION),
                *round_names(2, layout.GENERATIONS),
            )
        }
    assert made[layout.LABELED_RL_VALIDATION] and made[round_names(1, layout.STUDENT_VALIDATION)[0]], (
        "what the rule read"
    )
    assert not made[round_names(2, layout.GENERATIONS)[0]], "round 2 never ran"

    plan = dagster_cli.run_grid("plan", patience, config)
    assert plan.returncode == 0 and f"[grid] arm {arm}: up to date" in plan.stdout, (
        "the plan knows the arm stopped: " + plan.stdout
    )


def test_the_label_sources_grid_reports_every_source_s_frontier_the_verifier_s_auroc_and_the_flips(
    dagster_cli: DagsterCli, sevens_model_dir, tmp_path, monkeypatch
) -> None:
    """tests/experiments/label_sources.yaml, the three sources on one teacher, through the grid CLI: every check passes,
    and each arm's round report draws the frontier of every source it can judge beside the oracle, with the flips."""
    experiment = EXPERIMENT.parent / "label_sources.yaml"
    config = tiny_config(sevens_model_dir, rounds=1, tau=0.5)
    pool, held_out = (
        sevens_problems(tmp_path / "pool.jsonl", 40, 10),
        sevens_problems(tmp_path / "eval.jsonl", 5, 100),
    )
    config["ops"] |= {
        layout.PROBLEM_POOL: {"config": {"source": {"kind": "file", "path": str(pool)}}},
        layout.EVAL_PROBLEMS: {"config": {"source": {"kind": "file", "path": str(held_out)}}},
    }
    dagster_cli.enter(monkeypatch)
    labels = "/".join(layout.round_asset(1, layout.PSEUDO_LABELS))
    through = dagster_cli.grid_done(
        experiment, config, tmp_path / "labels.log", "--arm", "ls-verifier", "--through", labels
    )
    first = materializing(tmp_path / "labels.log", "ls-verifier")
    assert first.endswith(f"round_001/verifier, round_001/verifier_scores, {labels}"), (
        "the labels and what they read, no student"
    )
    assert "ls-majority" not in through and "materializing verdict" not in through
    sidecar = pl.read_json(
        layout.artifact_dir(dagster_cli.lake, layout.round_asset(1, layout.PSEUDO_LABELS), "ls-verifier") / SOURCES_FILE
    )
    assert set(sidecar["source"]) == {"majority", "confidence", "verifier", ORACLE}, (
        "the direct effect, without the students"
    )
    dagster_cli.grid_done(experiment, config, tmp_path / "grid.log")
    then = materializing(tmp_path / "grid.log", "ls-verifier")
    assert "round_001/verifier" not in then and "round_001/student_checkpoint" in then, "the rest, not the labels again"

    checks = dagster_cli.run_grid("checks", experiment)
    assert checks.returncode == 0, checks.stderr[-3000:]
    outcomes = [line for line in checks.stdout.splitlines() if line.startswith("| ls-")]
    assert outcomes and all(line.rstrip().endswith("| passed |") for line in outcomes), checks.stdout
    assert "| ls-verifier | round_001/verifier | verifier_informative | passed |" in checks.stdout, checks.stdout

    sources = {"ls-majority": {"majority", "confidence"}, "ls-confidence": {"majority", "confidence"}}
    sources["ls-verifier"] = {"majority", "confidence", "verifier"}
    for arm, judged in sources.items():
        report = layout.artifact_dir(dagster_cli.lake, layout.round_asset(1, layout.EVAL_REPORT), arm)
        assert (report / "label_frontier.png").is_file(), arm
        table = pl.read_parquet(report / f"{metadata_key(SOURCES_TABLE)}.parquet")
        assert set(table["source"]) == judged | {ORACLE}, arm
        flips = pl.read_parquet(report / f"{metadata_key(FLIPS_TABLE)}.parquet").row(0, named=True)
        assert flips["eval_set"] == "all" and flips["problems"] == 5, arm
        audit = pl.read_parquet(report / f"{metadata_key('Pseudo-label audit')}.parquet").row(0, named=True)
        assert audit["label_source"] == arm.removeprefix("ls-")
    assert audit["verifier_validation_auroc"] is not None, "the verifier arm's report shows its validation AUROC"
