"""docs/usage.md's "Adding a round" path in a browser (`make ui-test`), as a user follows it: an experiment whose one
arm has made two rounds (the grid, tiny model), `max_rounds` raised to 3 in its file, *Reload definitions*, then
`round_003_job` launched for the arm from the job's page (the partition picked, the run config typed into the
launchpad's editor). The experiments directory holds this experiment alone, so the code location is its own view:
no launch warns of an asset it does not read, and the round's group holds its assets alone. Round 3 must make only
what the experiment asks for and show in the lineage, in the verdict materialized from the UI, and in MLflow's runs of
the experiment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
import yaml
from playwright.sync_api import Error as PlaywrightError

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.experiments.arms import load_experiment
from noisy_student_assets.core.experiments.progress import round_assets
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking, run_name
from tests.cli import DagsterCli, free_port, graphql, own_device_lock, run_failures, wait_until_serving
from tests.tiny_configs import round_names, tiny_config
from tests.ui.test_ui import SCREENSHOTS, UI_START_TIMEOUT_S, _lineage, _open

pytestmark = pytest.mark.ui

ARM = "r"
NEW_ROUND = 3
EXPERIMENT = {
    "description": "The 'Adding a round' browser test's experiment: one arm, the labeled-only control alone.",
    "defaults": {"max_rounds": NEW_ROUND - 1},
    "controls": [layout.LABELED_ONLY],
    "arms": {ARM: {}},
}
LOCATION = "noisy_student"
"""workspace.yaml's code location."""
ROUND_JOB = f"{layout.round_prefix(NEW_ROUND)}_job"
RUN_TIMEOUT_S = 900
VERDICT_TIMEOUT_S = 300
PARTITION_PLACEHOLDER = "Select a partition or create one"
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
"""Every step in the run's process: no Python start and torch import per step (CI time)."""


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> DagsterCli:
    """A project directory whose experiment file (in an experiments directory of its own) asks for 2 rounds of arm
    `ARM`, which the grid made."""
    cli = DagsterCli(tmp_path_factory.mktemp("adding_a_round"))
    experiments = cli.home / "experiments"
    experiments.mkdir()
    experiment_file = experiments / "adding.yaml"
    experiment_file.write_text(yaml.safe_dump(EXPERIMENT))
    cli.env |= {environment.EXPERIMENTS: str(experiments)} | own_device_lock(cli)
    log = cli.home / "grid.log"
    grid = cli.grid(experiment_file, tiny_config(tiny_model_dir, rounds=NEW_ROUND - 1), log)
    assert cli.finish(grid, log, RUN_TIMEOUT_S) == 0, log.read_text()[-3000:]
    return cli


def _raise_max_rounds(experiment_file: Path, rounds: int) -> None:
    document = yaml.safe_load(experiment_file.read_text())
    document["defaults"]["max_rounds"] = rounds
    experiment_file.write_text(yaml.safe_dump(document))


def _job_ops(url: str, job: str) -> set[str]:
    query = """query ($selector: PipelineSelector!) {
        pipelineOrError(params: $selector) { ... on Pipeline { solids { name } } }
    }"""
    selector = {"pipelineName": job, "repositoryName": "__repository__", "repositoryLocationName": LOCATION}
    return {solid["name"] for solid in graphql(url, query, {"selector": selector})["pipelineOrError"]["solids"]}


PICK_ATTEMPTS = 4


def _pick_partition(page, key: str) -> None:
    """Picks `key` in the launchpad's partition menu. The menu can re-render while the launchpad loads: a fresh-clone
    CI run saw the option detach under the click and the menu close, so a pick that did not take opens it again."""
    placeholder = page.get_by_text(PARTITION_PLACEHOLDER)
    for _ in range(PICK_ATTEMPTS):
        try:
            placeholder.click(timeout=15000)
            page.get_by_text(key, exact=True).filter(visible=True).first.click(timeout=15000)
        except PlaywrightError:
            pass
        page.keyboard.press("Escape")
        if not placeholder.count():
            return
    raise AssertionError(f"the partition menu never took {key!r} in {PICK_ATTEMPTS} attempts")


def _warnings(page) -> list[str]:
    """The warnings Dagster shows before a launch: its "Are you sure?" dialog (upstream assets never materialized)
    and the launchpad's "Upstream data missing" (the picked partition's upstream partitions)."""
    shown = [page.get_by_role("dialog").filter(has_text="Are you sure?"), page.get_by_text("Upstream data missing")]
    return [warning.first.inner_text() for warning in shown if warning.count()]


def _wait_for_run(
    instance_home: Path, launched_after: datetime, asset: str, timeout: float = RUN_TIMEOUT_S
) -> dg.DagsterRun:
    """The run that materializes `asset`, launched from the UI after `launched_after`, once it finished; it must have
    succeeded."""
    deadline = time.monotonic() + timeout
    key = dg.AssetKey.from_user_string(asset)
    with dg.DagsterInstance.from_config(str(instance_home)) as instance:
        while True:
            records = [
                record
                for record in instance.get_run_records(dg.RunsFilter(created_after=launched_after))
                if key in (record.dagster_run.asset_selection or ())
            ]
            if records and records[0].dagster_run.is_finished:
                run = records[0].dagster_run
                assert run.status == dg.DagsterRunStatus.SUCCESS, run_failures(instance, records[:1])
                return run
            assert time.monotonic() < deadline, f"no run materializing {asset} finished in {timeout} s"
            time.sleep(2)


def _materialized(instance_home: Path, run_id: str) -> set[str]:
    with dg.DagsterInstance.from_config(str(instance_home)) as instance:
        events = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    return {event.dagster_event.asset_key.to_user_string() for event in events}


def _partitions_filled(page, group: str, timeout: float = 60) -> dict[str, bool]:
    """Whether each asset node drawn in `group` says its one partition is filled, once every node has loaded its
    partition status ("100% filled" or "0% filled")."""
    deadline = time.monotonic() + timeout
    while True:
        drawn = page.locator("svg[class*=svgContainer] foreignObject").evaluate_all(
            "objects => objects.flatMap(o => { const name = o.querySelector('[data-tooltip]'); "
            "return name ? [[name.getAttribute('data-tooltip'), o.textContent]] : []; })"
        )
        nodes = {f"{group}/{name}": text for name, text in drawn if name != group}
        if nodes and all("% filled" in text for text in nodes.values()):
            return {name: "100% filled" in text for name, text in nodes.items()}
        assert time.monotonic() < deadline, f"the lineage did not show every node's partitions in {timeout} s: {nodes}"
        page.wait_for_timeout(1000)


def _mlflow_ui(cli: DagsterCli, store: str, log: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow ui` on `store`, as docs/usage.md starts it, on a free port; its URL once it answers."""
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("mlflow")),
                "ui",
                "--backend-store-uri",
                store,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=cli.home,
            env=cli.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, log, UI_START_TIMEOUT_S)
    except AssertionError:
        DagsterCli.stop(process)
        raise
    return process, url


def test_a_round_added_in_the_experiment_file_runs_from_the_ui_and_shows_in_the_lineage_verdict_and_mlflow(
    two_rounds: DagsterCli, browser, tiny_model_dir: Path, monkeypatch
) -> None:
    cli = two_rounds
    monkeypatch.chdir(cli.home)  # dagster.yaml's storage paths are relative to the working directory
    experiment_file = Path(cli.env[environment.EXPERIMENTS]) / "adding.yaml"
    new_round = layout.round_prefix(NEW_ROUND)
    with cli.dev(timeout=UI_START_TIMEOUT_S) as url:
        # Raise `max_rounds` and reload: the round's group appears.
        page = _open(browser, f"{url}/asset-groups")
        page.get_by_role("button", name=re.compile(layout.round_prefix(NEW_ROUND - 1))).wait_for(timeout=60000)
        assert not page.get_by_role("button", name=re.compile(new_round)).count()
        _raise_max_rounds(experiment_file, NEW_ROUND)
        page.get_by_role("button", name="Reload definitions").click()
        page.get_by_role("button", name=re.compile(new_round)).wait_for(timeout=180000)

        # The round's job for the arm: Materialize all..., the partition, the run config, launch.
        page.goto(f"{url}/locations/{LOCATION}/jobs/{ROUND_JOB}")
        page.get_by_role("button", name="Materialize all…").click()
        # The code location defines only what its experiments run: no verifier's scores for the vote to name as
        # never materialized, no control the arm does not run. Dagster opens the launchpad without a warning.
        confirm = page.get_by_role("dialog").filter(has_text="Are you sure?")
        page.get_by_text(PARTITION_PLACEHOLDER).or_(confirm).first.wait_for(timeout=60000)
        assert not _warnings(page)
        _pick_partition(page, ARM)
        page.get_by_text("Config", exact=True).click()
        page.get_by_role("button", name="Add config").click()
        ops = _job_ops(url, ROUND_JOB)
        config = {
            "ops": {
                op: op_config
                for op, op_config in tiny_config(tiny_model_dir, rounds=NEW_ROUND)["ops"].items()
                if op in ops
            }
        }
        page.locator(".CodeMirror").last.click()
        page.keyboard.insert_text(json.dumps(config | IN_PROCESS))
        page.get_by_role("button", name="Save config").click()
        assert not _warnings(page)  # by now the launchpad has read the picked partition's upstream
        launched = datetime.now(UTC)
        page.get_by_role("button", name="Launch 1 run").click()
        run = _wait_for_run(cli.home, launched, f"{new_round}/{layout.EVAL_REPORT}")
        assert run.job_name == ROUND_JOB
        page.goto(f"{url}/runs/{run.run_id}")
        page.get_by_text("Success", exact=True).first.wait_for(timeout=60000)
        page.screenshot(path=SCREENSHOTS / "adding-a-round-run.png")
        page.close()

        assert run.tags.get("dagster/partition") == ARM
        experiment = load_experiment(experiment_file)
        asked_for = set(round_assets(NEW_ROUND, experiment, experiment.arm(ARM)))
        assert _materialized(cli.home, run.run_id) == asked_for
        assert not asked_for & set(
            round_names(
                NEW_ROUND, layout.control_checkpoint(layout.GOLD_LABEL), layout.control_checkpoint(layout.RANDOM_LABEL)
            )
        )

        # The lineage: what the experiment asks for is filled for the arm, the rest is not.
        page = _lineage(browser, url, f"group:{new_round}", width=2600, height=1500)
        filled = _partitions_filled(page, new_round)
        assert set(filled) == asked_for and all(filled.values()), filled  # the group holds the arm's assets alone
        page.screenshot(path=SCREENSHOTS / "adding-a-round-lineage.png")
        page.close()

        # The verdict from its page: it reads every arm's control evaluations, so Dagster lists those no experiment
        # made here (gold and random labels); round 3 is in it once it ran.
        page = _open(browser, f"{url}/assets/{layout.VERDICT}")
        launched = datetime.now(UTC)
        page.locator("button", has_text=re.compile(r"^\s*Materialize\s*$")).first.click()
        # No control the experiment does not run is upstream of it: no dialog holds the launch.
        _wait_for_run(cli.home, launched, layout.VERDICT, timeout=VERDICT_TIMEOUT_S)
        page.reload()
        page.get_by_text(re.compile(rf"round {NEW_ROUND} \(defaults\) minus .*, one seed")).first.wait_for(
            timeout=60000
        )
        page.screenshot(path=SCREENSHOTS / "adding-a-round-verdict.png")
        page.close()

    # MLflow: the experiment's runs table, at the address docs/usage.md gives, then filtered on round 3 as it says: one
    # run per asset made, named by `run_name` (`r3 eval student r`, ...), none hidden under a parent.
    store = f"sqlite:///{cli.lake / layout.TRACKING_DB_NAME}"
    mlflow_ui, mlflow_url = _mlflow_ui(cli, store, cli.home / "mlflow-ui.log")
    try:
        import mlflow

        tracking = MlflowTracking(lake=DataLake(root=str(cli.lake)), ui_url=mlflow_url)
        experiment_id = mlflow.MlflowClient(store).get_experiment_by_name("noisy-student").experiment_id
        every_name = {run.info.run_name for run in mlflow.MlflowClient(store).search_runs([experiment_id])}
        names = {run_name(name.split("/"), ARM) for name in asked_for}
        page = _open(browser, tracking.runs_url(experiment_id))
        for name in names:
            page.get_by_text(name, exact=True).wait_for(timeout=60000)
        page.screenshot(path=SCREENSHOTS / "mlflow-runs-first-page.png")
        page.close()
        search = urllib.parse.quote(f"tags.round = '{new_round}'")
        page = _open(browser, f"{tracking.runs_url(experiment_id)}&searchFilter={search}")
        for name in names:
            page.get_by_text(name, exact=True).wait_for(timeout=30000)
        assert {name for name in every_name if page.get_by_text(name, exact=True).count()} == names
        page.screenshot(path=SCREENSHOTS / "adding-a-round-mlflow.png")
        page.close()
    finally:
        DagsterCli.stop(mlflow_ui)
