"""The explorer (`make explore`) in a real browser, used as a person uses it: on a lake holding a whole round 1
(`inspected_lake`), pick a problem and see its samples, its votes and the hidden gold; ask the round's student and
its labeled-only control and see both answers; open a link to a problem; put a question of one's own to two
checkpoints and see two answers. Screenshots go to `ui-test-screenshots/` (`UI_TEST_SCREENSHOTS`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from playwright.sync_api import expect

from noisy_student_assets.core import layout
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.reporting.inspection import BASE_MODEL_NAME, RoundLake, explorer_link
from tests.cli import DagsterCli, free_port, wait_until_serving
from tests.conftest import INSPECTED_ARM
from tests.tiny_configs import TINY_EVAL
from tests.ui.conftest import CHROMIUM
from tests.ui.test_ui import SCREENSHOTS

pytestmark = pytest.mark.ui

START_TIMEOUT_S = 120
PAGE_TIMEOUT_MS = 30_000  # the page's first load reads and re-grades the round
ANSWER_TIMEOUT_MS = 180_000  # two checkpoints loaded and asked on CPU, beside whatever else the machine runs


@pytest.fixture(scope="module")
def explorer(inspected_lake: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module) -> str:
    """The explorer on `inspected_lake`, on a free port of 127.0.0.1: its base URL, which its links also name."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: `apt-get install chromium` (or set CHROMIUM)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    monkeypatch_module.setenv("NOISY_STUDENT_EXPLORER_URL", url)
    log = tmp_path_factory.mktemp("explorer") / "explorer.log"
    command = [
        sys.executable,
        "-m",
        "noisy_student_assets.explorer",
        "--lake",
        str(inspected_lake),
        "--port",
        str(port),
    ]
    with log.open("w") as out:
        process = subprocess.Popen(  # a process group of its own, stopped whole (`DagsterCli.stop`)
            [*command, "--max-new-tokens", str(TINY_EVAL["max_new_tokens"])],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_serving(url, process, log, START_TIMEOUT_S)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        yield url
    finally:
        DagsterCli.stop(process, timeout=30)  # a loaded machine may answer SIGTERM late: then SIGKILL


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _unlabeled(lake: Path) -> pl.DataFrame:
    return RoundLake(lake, INSPECTED_ARM, 1).unlabeled_problems()


def test_a_problem_s_samples_votes_and_both_checkpoints_answers(browser, explorer: str, inspected_lake: Path) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1400})
    page.goto(explorer_link(INSPECTED_ARM, 1))
    problems = _unlabeled(inspected_lake)
    first, second = problems.row(0, named=True), problems.row(1, named=True)
    gold = page.get_by_label("Hidden gold (the audit's only: no vote reads it)")
    expect(gold).to_have_value(first[HIDDEN_GOLD_COLUMN], timeout=PAGE_TIMEOUT_MS)

    # A person picks the second problem from the list.
    page.get_by_label("Unlabeled problem").click()
    page.get_by_role("option", name=f"{second['problem_id']}:").click()
    expect(gold).to_have_value(second[HIDDEN_GOLD_COLUMN], timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_label("Question")).to_have_value(second["prompt"])
    votes = page.locator("#votes-by-source")
    for source in ("majority (the arm's)", "confidence", "verifier"):
        expect(votes).to_contain_text(source)
    samples = (
        RoundLake(inspected_lake, INSPECTED_ARM, 1).generations().filter(pl.col("problem_id") == second["problem_id"])
    )
    expect(page.locator("#samples").get_by_role("row")).to_have_count(
        1 + samples.height
    )  # the header, then each sample

    page.get_by_role("button", name="Ask the round's student and its labeled-only control").click()
    for answer, name in (("#student-answer", "Round 1 student"), ("#control-answer", "Round 1 labeled_only")):
        expect(page.locator(answer)).to_contain_text("Answer:", timeout=ANSWER_TIMEOUT_MS)
        expect(page.locator(answer)).to_contain_text(name)
    expect(page.locator("#held-out")).to_contain_text("labeled_only/answer")
    page.screenshot(path=str(SCREENSHOTS / "explorer-round.png"), full_page=True)


def test_a_link_opens_on_its_problem(browser, explorer: str, inspected_lake: Path) -> None:
    last = _unlabeled(inspected_lake).row(-1, named=True)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(explorer_link(INSPECTED_ARM, 1, last["problem_id"]))
    expect(page.get_by_label("Hidden gold (the audit's only: no vote reads it)")).to_have_value(
        last[HIDDEN_GOLD_COLUMN], timeout=PAGE_TIMEOUT_MS
    )
    expect(page.get_by_label("Question")).to_have_value(last["prompt"])


def test_two_checkpoints_answer_a_question_of_one_s_own(browser, explorer: str) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(explorer)
    page.get_by_role("tab", name="Ask two checkpoints").click()
    # It offers the round's student against its labeled-only control; a person puts the base model on the left instead.
    expect(page.locator("#right-checkpoint input")).to_have_value(
        f"{INSPECTED_ARM} / round 1 / {layout.LABELED_ONLY}", timeout=PAGE_TIMEOUT_MS
    )
    page.locator("#left-checkpoint input").click()
    page.get_by_role("option", name=f"{INSPECTED_ARM} / {BASE_MODEL_NAME}").click()
    page.get_by_label("Your question").fill("What is 3 + 4?")
    page.get_by_role("button", name="Ask both").click()
    for answer, name in (
        ("#left-answer", f"{INSPECTED_ARM} / {BASE_MODEL_NAME}"),
        ("#right-answer", f"{INSPECTED_ARM} / round 1 / {layout.LABELED_ONLY}"),
    ):
        expect(page.locator(answer)).to_contain_text("Answer:", timeout=ANSWER_TIMEOUT_MS)
        expect(page.locator(answer)).to_contain_text(name)
    page.screenshot(path=str(SCREENSHOTS / "explorer-ask.png"), full_page=True)
