"""The next-round automation through the daemon, as a user switches it on: with an arm's round 2 recorded and its
checks passed, `next_round_automation` launches that arm's round 3 by itself, one run of the round's assets (the
round conditions are Python, evaluated in the code server). Stand-ins record rounds 0-2 without training."""

from __future__ import annotations

import datetime
import subprocess
import time

import dagster as dg
import pytest

from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import pre_round_assets, round_assets
from noisy_student_assets.defs.automation import NEXT_ROUND_AUTOMATION
from noisy_student_assets.defs.jobs import MAX_RUNTIME_TAG, RUN_TAGS
from noisy_student_assets.defs.partitions import ARMS
from tests.cli import DAGSTER_DAEMON, DagsterCli
from tests.conftest import TEST_EXPERIMENTS
from tests.stand_ins import record

pytestmark = pytest.mark.e2e

ARM = "auto"


def test_switched_on_the_automation_launches_round_3_once_round_2s_checks_passed(tmp_path, monkeypatch) -> None:
    experiment = load_experiments(TEST_EXPERIMENTS)["automation"]
    arm = experiment.arm(ARM)
    cli = DagsterCli(tmp_path)
    monkeypatch.chdir(tmp_path)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        instance.add_dynamic_partitions(ARMS.name, [ARM])
        record(instance, pre_round_assets(experiment, arm), ARM)
        for number in (1, 2):
            record(instance, round_assets(number, experiment, arm), ARM)
    cli("sensor", "start", NEXT_ROUND_AUTOMATION, "-w", "workspace.yaml")

    log, switched_on = tmp_path / "daemon.log", datetime.datetime.now(datetime.UTC)
    launched_runs = dg.RunsFilter(tags={"dagster/partition": ARM}, created_after=switched_on)  # not the stand-ins' runs
    daemon = subprocess.Popen(
        [DAGSTER_DAEMON, "run", "-w", "workspace.yaml"],
        cwd=tmp_path,
        env=cli.env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
            deadline = time.monotonic() + 300
            while not instance.get_run_records(launched_runs):
                assert daemon.poll() is None, log.read_text()[-4000:]
                assert time.monotonic() < deadline, "no run launched in 5 minutes:\n" + log.read_text()[-4000:]
                time.sleep(2)
            time.sleep(70)  # the next tick (a minute later) must not launch it again
            runs = instance.get_run_records(launched_runs)
    finally:
        DagsterCli.stop(daemon)
    (launched,) = [record.dagster_run for record in runs]
    assert launched.tags["dagster/sensor_name"] == NEXT_ROUND_AUTOMATION
    assert {key.to_user_string() for key in launched.asset_selection} == set(round_assets(3, experiment, arm)), (
        launched.asset_selection
    )
    assert launched.tags[MAX_RUNTIME_TAG] == RUN_TAGS[MAX_RUNTIME_TAG], (
        "run monitoring stops it past the run time limit"
    )
