"""The findings table: what the pages show is what the command prints from `results/`."""

from __future__ import annotations

from pathlib import Path

import pytest

from noisy_student_assets.core.experiments.arms import load_experiment
from noisy_student_assets.core.reporting import findings as findings_module
from noisy_student_assets.core.reporting.findings import (
    BEGIN,
    END,
    findings,
    findings_block,
    findings_markdown,
    headline,
    with_findings,
)
from noisy_student_assets.core.reporting.summary import collect
from noisy_student_assets.core.reporting.verdict import PILOT
from noisy_student_assets.findings import PAGES, REPO

PASSES_STUDENTS, PASSES_PEERS = "passes_label_sources.yaml", "passes_peers.yaml"


@pytest.fixture(scope="module")
def printed() -> str:
    return findings_markdown(findings(REPO / "results", REPO / "experiments"))


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_each_page_shows_the_findings_the_command_prints_from_results(page: Path, printed: str) -> None:
    assert findings_block(page.read_text()) == printed, (
        f"{page.name}'s findings differ from the results: python -m noisy_student_assets.findings --write"
    )


def test_the_readme_leads_with_the_headline_the_command_prints_from_results() -> None:
    lead = headline(REPO / "results", REPO / "experiments")
    readme = (REPO / "README.md").read_text()
    assert lead in readme, (
        "README.md's headline differs from the results: python -m noisy_student_assets.findings --write"
    )
    assert readme.index(lead) < readme.index("## Asset graph") and "95% interval" in lead


def test_the_headline_is_the_experiment_that_asks_for_it_and_says_when_it_has_no_results(tmp_path: Path) -> None:
    (tmp_path / "first.yaml").write_text("headline: true\narms:\n  only: {}\n")
    (tmp_path / "second.yaml").write_text("arms:\n  other: {}\n")
    assert "`experiments/first.yaml` has no results" in headline(tmp_path / "results", tmp_path)


def test_every_finding_has_its_interval_mde_verdict_and_command(printed: str) -> None:
    rows = findings(REPO / "results", REPO / "experiments")
    assert len(rows) >= 8
    for row in rows:
        assert row.low is not None and row.low <= row.estimate <= row.high and row.mde > 0
        # a pilot's one seed takes no side: its interval covers problems alone
        assert row.seeds >= 3 or (row.seeds == 1 and row.verdict == PILOT), row
        assert row.verdict.startswith(
            ("better", "worse", "inconclusive: could have missed", "no effect larger than", PILOT)
        )
        assert row.command.startswith("python -m noisy_student_assets.") and row.command.endswith("--lake results")


def test_each_label_source_s_student_in_the_passes_regime_has_its_row() -> None:
    """passes_label_sources.yaml's students, each against its labeled-only control, once their seeds are in results;
    passes_peers.yaml's variants of the majority student beside them, each named by what its arm sets."""
    students = load_experiment(REPO / "experiments" / PASSES_STUDENTS)
    rows = findings(REPO / "results", REPO / "experiments")
    where = f"{students.defaults.task} n_labeled={students.defaults.n_labeled}"

    students_rows = sorted(row.question for row in rows if f"experiments/{PASSES_STUDENTS} " in row.command)
    peers_rows = sorted(row.question for row in rows if f"experiments/{PASSES_PEERS} " in row.command)
    assert peers_rows == [
        f"The majority-label student ({variant}) beats labeled-only (round 1), {where}"
        for variant in ("tau=0.0 reward=group_majority", "unlabeled_share=0.75")
    ]
    assert [question.split(where)[0] for question in students_rows] == [
        f"The {source}-label student beats labeled-only (round 1), "
        for source in ("confidence", "majority", "verifier")
    ]
    failed = collect(REPO / "results", students.all_arms(), students.max_rounds).failed
    for group, seed in failed.select("group", "seed").rows():
        # a seed whose verifier failed its check has no student: its row says so
        source = group.removeprefix("label_source=")
        row = next(question for question in students_rows if question.startswith(f"The {source}-label"))
        assert f" {seed}" in row.split(where)[1] and "not informative" in row, row


def test_a_student_s_row_names_what_its_student_sets_not_its_dose_control_s_rho() -> None:
    """teacher_pilot.yaml's confidence arm sets dose_rho 0.5 for its dose control: its student's row says only
    'confidence', as the majority arm's (dose_rho 0.25 from the defaults) says only 'majority'."""
    rows = findings(REPO / "results", REPO / "experiments")
    pilot = sorted(row.question for row in rows if "experiments/teacher_pilot.yaml " in row.command)
    where = "two-digit-sums n_labeled=8, a teacher that learned its labels"
    assert pilot == [
        f"The {source}-label student beats labeled-only (round 1), {where}" for source in ("confidence", "majority")
    ]


def test_writing_replaces_only_the_table_between_the_markers() -> None:
    page = f"intro\n{BEGIN}\n| old |\n{END}\nlater\n"
    table = f"{BEGIN}\n| new |\n{END}"

    written = with_findings(page, table)

    assert written == f"intro\n{table}\nlater\n" and with_findings(written, table) == written


def test_the_findings_code_names_no_experiment_the_experiment_files_declare_the_questions() -> None:
    source = Path(findings_module.__file__).read_text()
    assert ".yaml" not in source, "the findings code names an experiment file"
    asked = {name: load_experiment(REPO / "experiments" / f"{name}.yaml").findings for name in ("headroom", "passes")}
    assert [question.ask for question in asked["headroom"]] == ["data_headroom", "students"]
    assert asked["passes"][0].labeled_only_passes
