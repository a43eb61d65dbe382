"""The grid on the suite's Ray cluster: two arms with `--parallel-arms 2` run their heavy steps at once on distinct
GPUs and give what the same arms give run one after another in process; a grid killed while a Ray job trains
resumes without two jobs ever writing one stage's work dir, and publishes each artifact once."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from noisy_student_assets.core import layout
from tests.cli import DagsterCli, own_device_lock
from tests.conftest import TEST_EXPERIMENTS
from tests.tiny_configs import tiny_config

pytestmark = pytest.mark.ray

TWO_ARMS = TEST_EXPERIMENTS / "two_arms.yaml"
ONE_ARM = TEST_EXPERIMENTS / "grid.yaml"
ARMS = ("p", "q")
HEAVY = [
    layout.LABELED_RL,
    layout.LABELED_RL_EVAL,
    *("/".join(layout.round_asset(1, name)) for name in (layout.GENERATIONS, layout.STUDENT, layout.EVAL_REPORT)),
    *(
        "/".join(layout.round_asset(1, name))
        for name in (layout.control_checkpoint(layout.LABELED_ONLY), layout.control_eval(layout.LABELED_ONLY))
    ),
]
"""Each arm's assets whose stage is a payload (a Ray job under the ray launcher)."""


@contextlib.contextmanager
def instance_of(cli: DagsterCli):
    with (
        contextlib.chdir(cli.home),
        dg.DagsterInstance.from_config(str(cli.home)) as instance,
    ):  # dagster.yaml's paths are relative
        yield instance


def latest_metadata(instance: dg.DagsterInstance, name: str, arm: str) -> dict:
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(name.split("/")), asset_partitions=[arm]), limit=1
    ).records
    return {key: value.value for key, value in record.asset_materialization.metadata.items()}


def run_grid(
    cli: DagsterCli, experiment: Path, config: dict, log: Path, *options: str, env: dict | None = None
) -> None:
    grid = cli.grid(experiment, config, log, *options, env=own_device_lock(cli) | (env or {}))
    assert cli.finish(grid, log, 1500) == 0, log.read_text()[-4000:]


@pytest.fixture(scope="module")
def two_grids(tiny_model_dir, tmp_path_factory, ray_address) -> dict[str, DagsterCli]:
    """The two arms run one after another in process, and at once on Ray."""
    config = tiny_config(tiny_model_dir, rounds=1)
    grids = {}
    for name, options, env in (
        ("sequential", ["--launcher", "inprocess"], {}),
        ("parallel", ["--parallel-arms", "2"], {"RAY_ADDRESS": ray_address}),
    ):
        cli = DagsterCli(tmp_path_factory.mktemp(name))
        with instance_of(cli):
            pass  # its SQLite storage is created here, not by two arm processes at once
        run_grid(cli, TWO_ARMS, config, cli.home / "grid.log", *options, env=env)
        grids[name] = cli
    return grids


@pytest.mark.long
def test_two_arms_on_ray_run_at_once_on_distinct_gpus(two_grids) -> None:
    with instance_of(two_grids["parallel"]) as instance:
        metadata = {(arm, name): latest_metadata(instance, name, arm) for arm in ARMS for name in HEAVY}
    # A stage identical to one already published (same weights, rows, settings) is reused, not run.
    ran = {key: entry for key, entry in metadata.items() if "reused_from" not in entry}
    assert all(entry["ray/job_id"] and entry["payload/cuda_visible_devices"] in ("0", "1") for entry in ran.values())
    assert {arm for arm, _ in ran} == set(ARMS)
    overlapping = [
        (mine, theirs)
        for (arm, _), mine in ran.items()
        for (other, _), theirs in ran.items()
        if arm == "p"
        and other == "q"
        and mine["payload/started_at"] < theirs["payload/finished_at"]
        and theirs["payload/started_at"] < mine["payload/finished_at"]
    ]
    assert overlapping, "no heavy step of one arm ran while one of the other did"
    assert all(
        mine["payload/cuda_visible_devices"] != theirs["payload/cuda_visible_devices"] for mine, theirs in overlapping
    )


@pytest.mark.long
def test_two_arms_on_ray_give_what_they_give_one_after_another_in_process(two_grids) -> None:
    lakes = [cli.lake for cli in (two_grids["sequential"], two_grids["parallel"])]
    for arm in ARMS:
        labels = [
            pl.read_parquet(
                layout.artifact_dir(lake, layout.round_asset(1, layout.PSEUDO_LABELS), arm) / "data.parquet"
            )
            for lake in lakes
        ]
        assert labels[0].equals(labels[1]), arm
        for name in (layout.LABELED_RL_EVAL, "/".join(layout.round_asset(1, layout.EVAL_REPORT))):
            scores = [
                pl.read_parquet(layout.artifact_dir(lake, tuple(name.split("/")), arm) / "scores.parquet")
                for lake in lakes
            ]
            assert scores[0].equals(scores[1]), (arm, name)
    for table in ("accuracy.parquet", "differences.parquet"):  # the verdict's
        verdicts = [pl.read_parquet(layout.artifact_dir(lake, layout.VERDICT) / table) for lake in lakes]
        assert verdicts[0].equals(verdicts[1]), table


def test_a_grid_killed_while_a_ray_job_runs_resumes_without_a_second_writer(
    tiny_model_dir, tmp_path, ray_address
) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    from resources.launchers.ray import RAY_WORK_DIR

    client = JobSubmissionClient(ray_address)
    earlier = {job.submission_id for job in client.list_jobs()}
    cli = DagsterCli(tmp_path)
    with instance_of(cli):
        pass
    config = tiny_config(tiny_model_dir, rounds=1)
    env = {"RAY_ADDRESS": ray_address}
    # Labeled RL alone (--rounds 0): the grid is killed while its training job runs.
    first = cli.grid(
        ONE_ARM, config, tmp_path / "first.log", "--launcher", "ray", "--rounds", "0", env=own_device_lock(cli) | env
    )
    training = f"/{layout.LABELED_RL}/"
    deadline = time.monotonic() + 600
    while not (
        running := [
            j
            for j in client.list_jobs()
            if j.submission_id not in earlier
            and training in j.metadata.get(RAY_WORK_DIR, "")
            and j.status == JobStatus.RUNNING
        ]
    ):
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "labeled RL's Ray job did not run within 10 minutes"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    (orphan,) = running
    assert client.get_job_status(orphan.submission_id) == JobStatus.RUNNING, (
        "the grid's death does not stop its Ray job"
    )

    run_grid(cli, ONE_ARM, config, tmp_path / "second.log", "--launcher", "ray", "--rounds", "0", env=env)
    assert (
        "stopping Ray job" in (tmp_path / "second.log").read_text()
        or client.get_job_status(orphan.submission_id) == JobStatus.SUCCEEDED
    )
    jobs = [job for job in client.list_jobs() if job.submission_id not in earlier]
    by_work_dir: dict[str, list] = {}
    for job in jobs:
        by_work_dir.setdefault(job.metadata[RAY_WORK_DIR], []).append(job)
    for work_dir, writers in by_work_dir.items():
        spans = sorted((job.start_time, job.end_time) for job in writers)
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans)), (
            f"two jobs wrote {work_dir} at once"
        )
    assert client.get_job_status(orphan.submission_id) in (JobStatus.STOPPED, JobStatus.SUCCEEDED)
    with instance_of(cli) as instance:
        for name in (layout.LABELED_RL, layout.LABELED_RL_EVAL):
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(name.split("/")), asset_partitions=["g"]), limit=5
            ).records
            assert len(records) == 1, f"{name} was published {len(records)} times"
