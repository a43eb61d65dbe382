"""A changed default in the UI (`make ui-test`): on a lake the grid made, K's default changed as an edit of
`core/settings.py` would change it; `dagster dev` then shows exactly the assets the grid would redo as unsynced
(round 1's generations and what reads them), with the reason, and nothing upstream of them."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import load_experiments
from noisy_student_assets.core.experiments.progress import arm_assets
from tests.cli import REPO_ROOT, DagsterCli, changed_defaults_env, graphql, own_device_lock
from tests.tiny_configs import K_CHANGED, TINY_SAMPLING, op, tiny_config
from tests.ui.conftest import CHROMIUM
from tests.ui.test_ui import SCREENSHOTS, UI_START_TIMEOUT_S, _open

pytestmark = pytest.mark.ui

EXPERIMENT = REPO_ROOT / "tests" / "experiments" / "grid.yaml"
ARM = "g"
REDONE = set(K_CHANGED)
"""What a changed default K redoes (tests/e2e/test_grid_cli.py shows the grid does just that)."""


@pytest.fixture(scope="module")
def changed_ui(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir):
    """A lake made by the grid (one arm, one round, K at its default), then `dagster dev` over it with K's default
    changed from 8 to 6; its base URL."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: `apt-get install chromium` (or set CHROMIUM)")
    cli = DagsterCli(tmp_path_factory.mktemp("unsynced"))
    config = tiny_config(tiny_model_dir, rounds=1)
    sampling_op = op(layout.round_prefix(1), layout.GENERATIONS)
    config["ops"][sampling_op] = {"config": {k: v for k, v in TINY_SAMPLING.items() if k != "k"}}  # K from its default
    grid = cli.run_grid("run", EXPERIMENT, config, env=own_device_lock(cli))
    assert grid.returncode == 0, grid.stdout[-3000:] + grid.stderr[-3000:]
    cli.env |= changed_defaults_env({"TeacherSamplingSettings": {"k": 6}})
    with cli.dev(timeout=UI_START_TIMEOUT_S) as url:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        yield url


def _stale(url: str, asset: str, partition: str | None) -> tuple[str, list[str]]:
    """The UI's stale status of one asset (partition) and its causes, as the asset page asks for them."""
    argument = f"(partition: {json.dumps(partition)})" if partition else ""
    query = (
        "query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {"
        f" staleStatus{argument} staleCauses{argument} {{ key {{ path }} reason }} }} }} }}"
    )
    node = graphql(url, query, {"key": {"path": asset.split("/")}})["assetNodeOrError"]
    return node["staleStatus"], [f"{'/'.join(cause['key']['path'])} {cause['reason']}" for cause in node["staleCauses"]]


def test_the_ui_shows_exactly_what_the_grid_would_redo_as_unsynced(changed_ui) -> None:
    experiment = load_experiments(EXPERIMENT.parent)[EXPERIMENT.stem]
    status = {asset: _stale(changed_ui, asset, ARM) for asset in arm_assets(experiment, experiment.arm(ARM))}
    unsynced = {asset for asset, (state, _) in status.items() if state == "STALE"}
    assert unsynced == REDONE, status
    generations = "/".join(layout.round_asset(1, layout.GENERATIONS))
    assert status[generations][1] == [f"{generations} has a new code version"]


def test_the_asset_page_of_an_unsynced_partition_says_so_and_of_a_synced_one_does_not(changed_ui, browser) -> None:
    for asset, unsynced in (("/".join(layout.round_asset(1, layout.GENERATIONS)), True), (layout.LABELED_RL, False)):
        query = urllib.parse.urlencode({"view": "partitions", "partition": ARM})
        page = _open(browser, f"{changed_ui}/assets/{asset}?{query}")
        page.get_by_text("Latest materialization", exact=False).first.wait_for(timeout=60000)
        page.wait_for_timeout(2000)
        tags = page.get_by_text("Unsynced (", exact=False)  # the partition's status tag: "Unsynced (1)"
        shown = any(tags.nth(index).is_visible() for index in range(tags.count()))
        page.screenshot(path=SCREENSHOTS / f"unsynced-{asset.replace('/', '-')}.png")
        page.close()
        assert shown == unsynced, f"{asset} partition {ARM}: 'Unsynced' shown: {shown}"
