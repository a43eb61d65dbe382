"""The Dagster web UI in a real browser (`make ui-test`): `dagster dev` on 127.0.0.1, driven by Debian's
chromium through Playwright. The lineage must draw every real input of a round as an edge, and a cheap
asset must materialize from the UI. Screenshots go to `ui-test-screenshots/` (`UI_TEST_SCREENSHOTS`)."""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from pathlib import Path

import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.defs.partitions import ARMS
from tests.cli import REPO_ROOT, DagsterCli
from tests.ui.conftest import CHROMIUM

pytestmark = pytest.mark.ui

SCREENSHOTS = Path(os.environ.get("UI_TEST_SCREENSHOTS", REPO_ROOT / "ui-test-screenshots"))
UI_START_TIMEOUT_S = 180
UI_ARM = "a"
"""The arm the UI materializes a cheap asset of (tests/experiments/tests.yaml declares it)."""


def _round(number: int, name: str) -> str:
    return "/".join(layout.round_asset(number, name))


# Every real input of a round that issue 2/4 asks the UI to draw: round N's generations <- its teacher (round 1:
# labeled RL; round N: promoted from round N-1's student and teacher), pseudo-labels <- generations, student <-
# pseudo-labels + teacher, eval report <- student + audit + the reports it compares with.
DRAWN_EDGES = [
    (layout.EVAL_PROBLEMS, layout.UNLABELED_PROBLEMS),  # a test-time arm's unlabeled problems are eval problems
    (layout.VALIDATION_PROBLEMS, layout.LABELED_RL),  # where labeled RL checks itself and stops
    (layout.LABELED_RL, _round(1, layout.GENERATIONS)),
    (_round(1, layout.GENERATIONS), _round(1, layout.PSEUDO_LABELS)),
    (_round(1, layout.PSEUDO_LABELS), _round(1, layout.STUDENT)),
    (_round(1, layout.GENERATIONS), _round(1, layout.STUDENT)),  # sft rows, dpo pairs, vote shares
    (layout.LABELED_RL, _round(1, layout.STUDENT)),
    (_round(1, layout.STUDENT), _round(1, layout.EVAL_REPORT)),
    (_round(1, layout.PSEUDO_LABELS), _round(1, layout.EVAL_REPORT)),
    (_round(1, layout.control_eval(layout.LABELED_ONLY)), _round(1, layout.EVAL_REPORT)),
    (_round(1, layout.STUDENT), _round(2, layout.TEACHER)),  # the promotion between the rounds
    (_round(1, layout.STUDENT_VALIDATION), _round(2, layout.TEACHER)),
    (_round(2, layout.TEACHER), _round(2, layout.GENERATIONS)),
    (_round(1, layout.EVAL_REPORT), _round(2, layout.EVAL_REPORT)),
]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory):
    """`dagster dev` (webserver and daemon) over a fresh instance and lake, on 127.0.0.1; its base URL."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: `apt-get install chromium` (or set CHROMIUM)")
    cli = DagsterCli(tmp_path_factory.mktemp("ui"))
    with cli.dev(timeout=UI_START_TIMEOUT_S) as url:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        yield cli, url


def _open(browser, url: str, width: int = 1800, height: int = 1000):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    # A first visit offers the newsletter in a dialog that covers the page.
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(timeout=8000)
        skip.click()
    except Exception:  # noqa: BLE001 - Playwright's TimeoutError: no dialog this time
        pass
    return page


def _lineage(browser, base_url: str, selection: str, width: int = 1800, height: int = 1000):
    """The global lineage filtered to `selection`, every group expanded (the UI's Alt+E toggles them)."""
    page = _open(browser, f"{base_url}/asset-groups~{urllib.parse.quote(selection, safe='')}/", width, height)
    page.locator("svg[class*=svgContainer] foreignObject").first.wait_for(timeout=30000)
    page.wait_for_timeout(1000)
    if not _nodes(page):
        page.locator("svg[class*=svgContainer]").click(position={"x": 5, "y": 5})
        page.keyboard.press("Alt+KeyE")
        page.wait_for_timeout(1500)
    return page


def _nodes(page) -> dict[str, dict]:
    """Each drawn asset node's box in the graph's coordinates, by its asset key: the name it shows, under
    the prefix of the round group drawn around it (`round_002/eval_report`)."""
    drawn = page.locator("svg[class*=svgContainer] foreignObject").evaluate_all(
        """objects => objects.flatMap(o => {
            const name = o.querySelector('[data-tooltip]');
            return name ? [{name: name.getAttribute('data-tooltip'),
                asset: !!o.querySelector('[class*=assetNodeContainer]'),
                x: +o.getAttribute('x'), y: +o.getAttribute('y'),
                width: +o.getAttribute('width'), height: +o.getAttribute('height')}] : [];
        })"""
    )
    groups = [box for box in drawn if not box["asset"]]
    nodes = {}
    for box in (box for box in drawn if box["asset"]):
        centre = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        group = next((g["name"] for g in groups if _inside(*centre, g, slack=0)), "")
        nodes[f"{group}/{box['name']}" if group.startswith(layout.ROUND_PREFIX) else box["name"]] = box
    return nodes


def _edges(page) -> list[tuple[float, float, float, float]]:
    """Each drawn edge as (start x, start y, end x, end y) in the graph's coordinates."""
    paths = page.locator("svg[class*=svgContainer] > path[marker-end]").evaluate_all(
        "paths => paths.map(p => p.getAttribute('d'))"
    )
    edges = []
    for d in paths:
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", d)]
        edges.append((numbers[0], numbers[1], numbers[-2], numbers[-1]))
    return edges


def _inside(x: float, y: float, box: dict, slack: float = 12) -> bool:
    return (
        box["x"] - slack <= x <= box["x"] + box["width"] + slack
        and box["y"] - slack <= y <= box["y"] + box["height"] + slack
    )


@pytest.mark.parametrize(("upstream", "downstream"), DRAWN_EDGES, ids=[f"{u}->{d}" for u, d in DRAWN_EDGES])
def test_the_lineage_draws_each_input_as_an_edge(ui, browser, upstream: str, downstream: str) -> None:
    _, url = ui
    page = _lineage(browser, url, f'key:"{upstream}" or key:"{downstream}"')
    nodes = _nodes(page)
    # Assets of one group are drawn without the group's box around them: then the name alone tells them apart.
    source, target = (nodes.get(key, nodes.get(key.split("/")[-1])) for key in (upstream, downstream))
    assert source and target, f"{upstream} or {downstream} not drawn; nodes: {list(nodes)}"
    edges = _edges(page)
    assert any(_inside(x0, y0, source) and _inside(x1, y1, target) for x0, y0, x1, y1 in edges), (
        f"no edge drawn from {upstream} to {downstream}; edges {edges}, nodes {nodes}"
    )
    page.close()


def test_screenshot_of_two_rounds(ui, browser) -> None:
    """One picture of round 1 and round 2's first steps, with labeled RL as round 1's teacher."""
    _, url = ui
    selection = (
        f'key:"{layout.LABELED_RL}" or group:{layout.round_prefix(1)} '
        f'or key:"{_round(2, layout.GENERATIONS)}" or key:"{_round(2, layout.EVAL_REPORT)}"'
    )
    page = _lineage(browser, url, selection, width=2600, height=1500)
    assert len(_nodes(page)) >= 10 and len(_edges(page)) >= 15
    page.screenshot(path=SCREENSHOTS / "lineage.png")
    page.close()


def test_a_cheap_asset_materializes_from_the_ui(ui, browser, monkeypatch) -> None:
    import dagster as dg

    cli, url = ui
    monkeypatch.chdir(cli.home)  # dagster.yaml's storage paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(cli.home)) as instance:
        instance.add_dynamic_partitions(ARMS.name, [UI_ARM])
    page = _open(browser, f"{url}/assets/{layout.PROBLEM_POOL}")
    # The asset is partitioned by arm: "Materialize…" opens the partitions dialog, where the one arm registered is
    # all there is to pick.
    page.locator("button", has_text=re.compile(r"^\s*Materialize…\s*$")).first.click()
    page.get_by_role("button", name="All", exact=True).click()
    page.get_by_role("button", name="Launch 1 run", exact=True).click()
    deadline = time.monotonic() + 60
    with dg.DagsterInstance.from_config(str(cli.home)) as instance:
        while not (runs := instance.get_run_records(limit=1)):
            assert time.monotonic() < deadline, "clicking Materialize launched no run"
            time.sleep(1)
    run_id = runs[0].dagster_run.run_id
    page.goto(f"{url}/runs/{run_id}")
    page.get_by_text("Success", exact=True).first.wait_for(timeout=300000)
    page.screenshot(path=SCREENSHOTS / "run-from-ui.png")
    page.close()

    with dg.DagsterInstance.from_config(str(cli.home)) as instance:
        run = instance.get_run_by_id(run_id)
        records = instance.fetch_materializations(dg.AssetKey(layout.PROBLEM_POOL), limit=1).records
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert records and records[0].run_id == run_id and records[0].partition_key == UI_ARM
    assert (cli.lake / layout.PROBLEM_POOL / UI_ARM / "data.parquet").is_file()
