"""The explorer (`make explore`) in a real browser, used as a person uses it: on a lake holding a whole round 1
(`inspected_lake`, one problem's samples written out at length), pick a problem from a list that marks each label
kept or not and right or wrong, and see its samples, its votes, which label sources judged them and the hidden gold;
ask the round's student and its labeled-only control and see both answers; open a link to a problem; put a question
of one's own to two checkpoints and see two answers. Every event shows a progress bar, and a checkpoint is loaded
once for the questions put to it. Screenshots go to `ui-test-screenshots/` (`UI_TEST_SCREENSHOTS`)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import polars as pl
import pytest
from PIL import Image
from playwright.sync_api import expect

from noisy_student_assets.core import layout
from noisy_student_assets.core.lake_reader import BASE_MODEL_NAME, RoundLake
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.reporting.inspection import explorer_link, source_labels
from noisy_student_assets.core.sampling import load_transformers_model
from tests.cli import DagsterCli, free_port, wait_until_serving
from tests.conftest import INSPECTED_ARM
from tests.tiny_configs import TINY_EVAL
from tests.ui.conftest import CHROMIUM
from tests.ui.test_ui import SCREENSHOTS

pytestmark = pytest.mark.ui

START_TIMEOUT_S = 120
PAGE_TIMEOUT_MS = 30_000  # the page's first load reads and re-grades the round
ANSWER_TIMEOUT_MS = 180_000  # two checkpoints loaded and asked on CPU, beside whatever else the machine runs


LONG_REASONING = "Add the tens, then the ones, carrying a ten where the ones pass nine. " * 40
"""Written after each of one problem's samples: the 2,800 characters a model reasoning at length leaves."""


@pytest.fixture(scope="module")
def explored_lake(inspected_lake: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`inspected_lake`, the second unlabeled problem's samples written out at length (their answers unchanged)."""
    root = tmp_path_factory.mktemp("explored") / "lake"
    shutil.copytree(inspected_lake, root)
    round_lake = RoundLake(root, INSPECTED_ARM, 1)
    second = round_lake.unlabeled_problems()["problem_id"][1]
    path = round_lake.arm_lake.artifact_dir(layout.round_asset(1, layout.GENERATIONS)) / layout.TABLE_FILE_NAME
    generations = pl.read_parquet(path)
    long = pl.when(pl.col("problem_id") == second).then(pl.col("completion") + LONG_REASONING)
    generations.with_columns(long.otherwise(pl.col("completion")).alias("completion")).write_parquet(path)
    return root


@pytest.fixture(scope="module")
def explorer(explored_lake: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module) -> str:
    """The explorer on `explored_lake`, on a free port of 127.0.0.1: its base URL, which its links also name."""
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
        str(explored_lake),
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


def test_a_problem_s_samples_votes_and_both_checkpoints_answers(browser, explorer: str, explored_lake: Path) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1400})
    page.goto(explorer_link(INSPECTED_ARM, 1))
    problems = _unlabeled(explored_lake)
    first, second = problems.row(0, named=True), problems.row(1, named=True)
    gold = page.get_by_label("Hidden gold (the audit's only: no vote reads it)")
    expect(gold).to_have_value(first[HIDDEN_GOLD_COLUMN], timeout=PAGE_TIMEOUT_MS)

    # A person picks the second problem from the list, which marks each problem's label kept or not, right or wrong.
    from noisy_student_assets.explorer import RIGHT_MARKS  # Gradio: the explore extra, which make ui-test installs

    round_lake = RoundLake(explored_lake, INSPECTED_ARM, 1)
    chosen = source_labels(round_lake).filter("chosen")
    page.get_by_label("Unlabeled problem").click()
    for problem_id, kept, right in chosen.select("problem_id", "kept", "label_correct").iter_rows():
        mark = f"{problem_id} · {'kept' if kept else 'not kept'} {RIGHT_MARKS[right]}:"
        expect(page.get_by_role("option", name=mark)).to_have_count(1)
    page.get_by_role("option", name=f"{second['problem_id']} · ").click()
    expect(gold).to_have_value(second[HIDDEN_GOLD_COLUMN], timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_label("Question")).to_have_value(second["prompt"])
    votes = page.locator("#votes-by-source")
    for source in ("majority (the arm's)", "confidence", "verifier"):
        expect(votes).to_contain_text(source)
    expect(page.locator("#label-sources")).to_contain_text(
        "Label sources of this round: majority (the arm's), confidence, verifier."
    )
    samples = round_lake.generations().filter(pl.col("problem_id") == second["problem_id"])
    expect(page.locator("#samples").get_by_role("row")).to_have_count(
        1 + samples.height
    )  # the header, then each sample
    # Long completions leave every column readable at 1600 pixels: no header squeezed to a letter a line, none
    # pushed off the page.
    headers = page.locator("#samples").get_by_role("columnheader")
    widths = headers.evaluate_all("cells => cells.map(cell => cell.getBoundingClientRect().width)")
    assert len(widths) >= 6 and min(widths) >= 40, widths
    right_edge = headers.evaluate_all("cells => Math.max(...cells.map(cell => cell.getBoundingClientRect().right))")
    assert right_edge <= 1600, (right_edge, headers.all_inner_texts())

    page.get_by_role("button", name="Ask the round's student and its labeled-only control").click()
    for answer, name in (("#student-answer", "Round 1 student"), ("#control-answer", "Round 1 labeled_only")):
        expect(page.locator(answer)).to_contain_text("Answer:", timeout=ANSWER_TIMEOUT_MS)
        expect(page.locator(answer)).to_contain_text(name)
    expect(page.locator("#held-out")).to_contain_text("labeled_only/answer")
    page.screenshot(path=str(SCREENSHOTS / "explorer-round.png"), full_page=True)


def test_a_link_opens_on_its_problem(browser, explorer: str, explored_lake: Path) -> None:
    last = _unlabeled(explored_lake).row(-1, named=True)
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


def test_an_ask_s_progress_is_on_the_screen_within_a_second(browser, explorer: str) -> None:
    """A person who clicks *Ask both* sees, within a second, the progress drawn over each answer's box: an element
    with a height on the screen, not only in the DOM (an empty answer had no height to draw it in)."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(explorer)
    page.get_by_role("tab", name="Ask two checkpoints").click()
    expect(page.locator("#right-checkpoint input")).not_to_have_value("", timeout=PAGE_TIMEOUT_MS)
    page.get_by_label("Your question").fill("What is 5 + 6?")
    page.get_by_role("button", name="Ask both").click()
    for answer in ("#left-answer", "#right-answer"):
        progress = page.locator(f"{answer} .wrap .progress-text, {answer} .wrap .meta-text").first
        expect(progress).to_be_visible(timeout=1000)  # in the DOM with a box, which an ancestor may still clip
        shown, drawn_in = progress.bounding_box(), page.locator(answer).bounding_box()
        assert drawn_in["y"] <= shown["y"] and shown["y"] + shown["height"] <= drawn_in["y"] + drawn_in["height"], (
            shown,
            drawn_in,
        )
        pixels = Image.open(io.BytesIO(page.locator(answer).screenshot())).convert("L")
        assert pixels.getextrema()[0] < 200, f"nothing drawn in {answer}'s box"
    page.screenshot(path=str(SCREENSHOTS / "explorer-asking.png"))
    expect(page.locator("#right-answer")).to_contain_text("Answer:", timeout=ANSWER_TIMEOUT_MS)


def test_every_event_shows_its_progress(explored_lake: Path) -> None:
    """Each of the page's events (opening it, an arm, a round, a problem, each ask) has a progress bar: Gradio shows it
    on the event's outputs with the text the event gives."""
    from noisy_student_assets.explorer import Explorer, build

    page = build(Explorer(explored_lake, TINY_EVAL["max_new_tokens"]))
    events = {function.name: function.tracks_progress for function in page.fns.values()}
    assert set(events) == {"open_page", "show_arm", "show_round", "show_problem", "ask_round_checkpoints", "ask_two"}
    assert all(events.values()), events


def test_a_checkpoint_is_loaded_once_for_two_questions(explored_lake: Path, monkeypatch) -> None:
    import noisy_student_assets.explorer as page_module
    from noisy_student_assets.explorer import Explorer

    loads = []

    def counted(checkpoint: Path):
        loads.append(checkpoint)
        return load_transformers_model(checkpoint)

    monkeypatch.setattr(page_module, "load_transformers_model", counted)
    monkeypatch.setattr(page_module, "_MODELS", OrderedDict())  # nothing loaded, nothing answered yet
    page_module._answer.cache_clear()
    explorer = Explorer(explored_lake, TINY_EVAL["max_new_tokens"])
    student = RoundLake(explored_lake, INSPECTED_ARM, 1).checkpoint(layout.STUDENT_ROLE)
    assert explorer.asking("the student", student) == "Asking the student (loading it on CPU: once, then it is kept)"
    first, second = explorer.answer(student, "What is 3 + 4?"), explorer.answer(student, "What is 5 + 2?")
    assert loads == [student] and first["completion"] and second["completion"]
    assert explorer.asking("the student", student) == "Asking the student"
