"""A changed default in the UI (`make ui-test`): on a lake the grid made, K's default changed as an edit of
`core/settings.py` would change it; `dagster dev` then shows exactly the assets the grid would redo as unsynced
(round 1's generations and what reads them), with the reason, and nothing upstream of them: Dagster's own status in
the Partitions tab, and the `made_with_current_defaults` check's warning on the lineage, naming `config.k: 8 -> 6`.
With the default restored, nothing is."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import arm_assets
from noisy_student_assets.defs.current_defaults import CURRENT_DEFAULTS
from noisy_student_assets.defs.grid import ARM_TAG, GRID_TAG, ROUND_TAG
from noisy_student_assets.defs.jobs import ARM_JOB
from tests.cli import REPO_ROOT, DagsterCli, changed_defaults_env, graphql, own_device_lock
from tests.tiny_configs import K_CHANGED, TINY_SAMPLING, op, tiny_config
from tests.ui.conftest import CHROMIUM
from tests.ui.test_ui import SCREENSHOTS, UI_START_TIMEOUT_S, _open

pytestmark = pytest.mark.ui

EXPERIMENT = REPO_ROOT / "tests" / "experiments" / "grid.yaml"
ARM = "g"
REDONE = set(K_CHANGED)
"""What a changed default K redoes (tests/e2e/test_grid_cli.py shows the grid does just that)."""
SENSOR_INTERVAL_S = 5
"""The current-defaults sensor's interval in this file's `dagster dev` (`environment.DEFAULTS_CHECK_INTERVAL_S`): a
test of what a reload shows need not wait out the default's half minute twice."""
SENSOR_WAIT_S = 6 * SENSOR_INTERVAL_S + 60
"""How long the current-defaults sensor may take to report: the daemon starts it after the webserver is up, and an
evaluation on a loaded machine takes seconds of its own."""


@pytest.fixture(scope="module")
def grid_lake(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> DagsterCli:
    """A lake made by the grid: one arm, one round, K at its default."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: `apt-get install chromium` (or set CHROMIUM)")
    cli = DagsterCli(tmp_path_factory.mktemp("unsynced"))
    config = tiny_config(tiny_model_dir, rounds=1)
    sampling_op = op(layout.round_prefix(1), layout.GENERATIONS)
    config["ops"][sampling_op] = {"config": {k: v for k, v in TINY_SAMPLING.items() if k != "k"}}  # K from its default
    grid = cli.run_grid("run", EXPERIMENT, config, env=own_device_lock(cli))
    assert grid.returncode == 0, grid.stdout[-3000:] + grid.stderr[-3000:]
    return cli


@pytest.fixture(scope="module")
def changed_ui(grid_lake: DagsterCli, browser):
    """`dagster dev` over the grid's lake, then K's default changed from 8 to 6 and *Reload definitions* clicked; its
    base URL and the file of the changed defaults (the restored default's test empties it and reloads again)."""
    changes = grid_lake.home / "changed_defaults.json"
    changes.write_text("{}")
    grid_lake.env |= changed_defaults_env(file=changes) | {
        environment.DEFAULTS_CHECK_INTERVAL_S: str(SENSOR_INTERVAL_S)
    }
    with grid_lake.dev(timeout=UI_START_TIMEOUT_S) as url:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        changes.write_text(json.dumps({"TeacherSamplingSettings": {"k": 6}}))
        _reload_definitions(browser, url, stale=True)
        yield url, changes


def _reload_definitions(browser, url: str, stale: bool) -> None:
    """Click *Reload definitions*, and wait until round 1's generations is stale (`stale`) or not in the UI."""
    page = _open(browser, f"{url}/asset-groups")
    page.get_by_role("button", name="Reload definitions").click()
    generations = "/".join(layout.round_asset(1, layout.GENERATIONS))
    deadline = time.monotonic() + UI_START_TIMEOUT_S
    while (_stale(url, generations, ARM)[0] == "STALE") != stale:
        assert time.monotonic() < deadline, f"{generations} did not turn {'stale' if stale else 'fresh'} after a reload"
        time.sleep(2)
    page.close()


def _stale(url: str, asset: str, partition: str | None) -> tuple[str, list[str]]:
    """The UI's stale status of one asset (partition) and its causes, as the asset page asks for them."""
    argument = f"(partition: {json.dumps(partition)})" if partition else ""
    query = (
        "query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {"
        f" staleStatus{argument} staleCauses{argument} {{ key {{ path }} reason }} }} }} }}"
    )
    node = graphql(url, query, {"key": {"path": asset.split("/")}})["assetNodeOrError"]
    return node["staleStatus"], [f"{'/'.join(cause['key']['path'])} {cause['reason']}" for cause in node["staleCauses"]]


def _current_defaults(url: str, asset: str) -> tuple[str, str]:
    """The status and description of the current-defaults check's latest evaluation of `asset`, as the lineage shows
    it (none yet: '', '')."""
    query = (
        "query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode { assetChecksOrError {"
        " ... on AssetChecks { checks { name executionForLatestMaterialization { status evaluation { description }"
        " } } } } } } }"
    )
    node = graphql(url, query, {"key": {"path": asset.split("/")}})["assetNodeOrError"]
    check = next(check for check in node["assetChecksOrError"]["checks"] if check["name"] == CURRENT_DEFAULTS)
    execution = check["executionForLatestMaterialization"] or {}
    return execution.get("status", ""), (execution.get("evaluation") or {}).get("description", "")


def _reported(url: str, assets: list[str], unsynced: set[str]) -> dict[str, tuple[str, str]]:
    """Each asset's current-defaults outcome once the sensor reported the one expected of each (failed where it is
    in `unsynced`, else succeeded), or what it reported by the deadline."""
    deadline = time.monotonic() + SENSOR_WAIT_S
    while True:
        outcomes = {asset: _current_defaults(url, asset) for asset in assets}
        expected = {asset: "FAILED" if asset in unsynced else "SUCCEEDED" for asset in assets}
        if {asset: status for asset, (status, _) in outcomes.items()} == expected or time.monotonic() > deadline:
            return outcomes
        time.sleep(5)


def test_the_ui_shows_exactly_what_the_grid_would_redo_as_unsynced(changed_ui) -> None:
    url, _ = changed_ui
    experiment = load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem]
    status = {asset: _stale(url, asset, ARM) for asset in arm_assets(experiment, experiment.arm(ARM))}
    unsynced = {asset for asset, (state, _) in status.items() if state == "STALE"}
    assert unsynced == REDONE, status
    generations = "/".join(layout.round_asset(1, layout.GENERATIONS))
    assert status[generations][1] == [f"{generations} has a new code version"]


def test_the_asset_page_of_an_unsynced_partition_says_so_and_of_a_synced_one_does_not(changed_ui, browser) -> None:
    url, _ = changed_ui
    for asset, unsynced in (
        ("/".join(layout.round_asset(1, layout.GENERATIONS)), True),
        (layout.LABELED_RL, False),
    ):
        query = urllib.parse.urlencode({"view": "partitions", "partition": ARM})
        page = _open(browser, f"{url}/assets/{asset}?{query}")
        page.get_by_text("Latest materialization", exact=False).first.wait_for(timeout=60000)
        page.wait_for_timeout(2000)
        tags = page.get_by_text("Unsynced (", exact=False)  # the partition's status tag: "Unsynced (1)"
        shown = any(tags.nth(index).is_visible() for index in range(tags.count()))
        page.screenshot(path=SCREENSHOTS / f"unsynced-{asset.replace('/', '-')}.png")
        page.close()
        assert shown == unsynced, f"{asset} partition {ARM}: 'Unsynced' shown: {shown}"


def test_the_lineage_warns_on_exactly_what_a_changed_default_left_behind_naming_it(changed_ui, browser) -> None:
    url, _ = changed_ui
    experiment = load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem]
    assets = arm_assets(experiment, experiment.arm(ARM))
    outcomes = _reported(url, assets, REDONE)
    assert {asset for asset, (status, _) in outcomes.items() if status == "FAILED"} == REDONE, outcomes
    generations = "/".join(layout.round_asset(1, layout.GENERATIONS))
    assert outcomes[generations][1] == f"arm {ARM}: default changed: config.k: 8 -> 6"
    downstream = sorted(REDONE - {generations})
    assert all(
        outcomes[asset][1] == f"arm {ARM}: upstream {generations}: default changed: config.k: 8 -> 6"
        for asset in downstream
    ), {asset: outcomes[asset] for asset in downstream}

    page = _open(browser, f"{url}/assets/{generations}?view=checks")
    page.get_by_text("config.k: 8 -> 6", exact=False).first.wait_for(timeout=60000)
    page.screenshot(path=SCREENSHOTS / "current-defaults-check.png")
    page.close()
    # Tall enough that the downstream graph (the student and five controls) fits at a zoom that draws whole nodes,
    # with their checks, not the names alone.
    page = _open(browser, f"{url}/assets/{generations}?view=lineage&lineageScope=downstream", height=1600)
    page.get_by_text("Asset checks", exact=False).first.wait_for(timeout=60000)
    page.wait_for_timeout(2000)
    page.screenshot(path=SCREENSHOTS / "current-defaults-lineage.png")
    page.close()


def test_with_the_default_restored_nothing_is_left_behind(changed_ui, browser) -> None:
    url, changes = changed_ui
    changes.write_text("{}")
    _reload_definitions(browser, url, stale=False)
    experiment = load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem]
    assets = arm_assets(experiment, experiment.arm(ARM))
    outcomes = _reported(url, assets, set())
    assert all(status == "SUCCEEDED" for status, _ in outcomes.values()), outcomes
    assert not [asset for asset in assets if _stale(url, asset, ARM)[0] == "STALE"]


def test_the_runs_page_lists_the_grid_s_run_by_job_with_its_experiment_arm_and_rounds(changed_ui, browser) -> None:
    url, _ = changed_ui
    page = _open(browser, f"{url}/runs")
    page.get_by_text(ARM_JOB, exact=True).first.wait_for(timeout=60_000)
    text = page.inner_text("body")
    page.screenshot(path=SCREENSHOTS / "runs-by-job.png")
    assert "__ephemeral_asset_job__" not in text and "__ASSET_JOB" not in text
    for tag, value in ((GRID_TAG, EXPERIMENT.stem), (ARM_TAG, ARM), (ROUND_TAG, "0,1")):
        assert page.get_by_text(f"{tag}: {value}").first.is_visible(), (tag, value, text[:3000])
