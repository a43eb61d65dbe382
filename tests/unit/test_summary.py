"""The run summary and the verdict across arms, the report tables and the figures (no model: the lake is
written by hand in the layout the assets publish)."""

from __future__ import annotations

import io
import json
import re
import shutil
from dataclasses import fields
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm, ArmSpec, Experiment
from noisy_student_assets.core.promotion import PROMOTION_FILE, decide, record
from noisy_student_assets.core.pseudo_labels.frontier import MATCHED_COVERAGES, coverage_column, frontier
from noisy_student_assets.core.pseudo_labels.labels import AUDIT_BUCKETS_FILE, AUDIT_FILE, PublishedAudit
from noisy_student_assets.core.reporting import plots
from noisy_student_assets.core.reporting.eval_report import metadata_key
from noisy_student_assets.core.reporting.markdown import markdown_table
from noisy_student_assets.core.reporting.summary import (
    SUMMARY_FILE,
    ExperimentResults,
    accuracy_pivot,
    collect,
    group_label,
    lake_arms,
    main,
    seed_accuracy_pivot,
    sources_against,
    summary_markdown,
)
from noisy_student_assets.core.reporting.test_time import YARDSTICK_TABLE
from noisy_student_assets.core.reporting.verdict import PILOT
from noisy_student_assets.core.settings import VALIDATION_PROMOTION, VerifierSettings
from noisy_student_assets.core.training.compute import CheckpointCompute, TrainingCompute
from noisy_student_assets.core.training.validation_stop import VALIDATION_LOGGED
from noisy_student_assets.core.training.verifier import (
    VALIDATION_SCORES_FILE,
    VERIFIER_METRICS_FILE,
    PublishedVerifier,
    VerifierMetrics,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROBLEMS = 40
COMPUTE = {"compute/total_optimizer_steps": 9.0, "compute/total_prompts": 18.0, "compute/total_completions": 144.0}
AUDIT = PublishedAudit.model_validate_json(
    '{"coverage": 0.25, "kept": 12.0, "mean_agreement": 0.7, "kept_label_accuracy": 0.8, "all_label_accuracy": 0.6, '
    '"teacher_pass_at_1": 0.3, "tau": 0.5}'
)
"""An arm's round-1 audit as the pseudo-label stage publishes it, with the figures every audit has."""
TEACHER_STOPPED = (
    "validation stalled: greedy accuracy 0.500 at step 16 not beaten in 2 checks, to step 32 of at most 96"
)


def _eval(
    lake: Path, key_path: tuple[str, ...] | str, arm: str | None, correct: list[bool], compute: dict = COMPUTE
) -> None:
    directory = layout.artifact_dir(lake, key_path, arm)
    directory.mkdir(parents=True)
    metrics = {"greedy_accuracy": sum(correct) / len(correct), "problems": float(len(correct))} | compute
    (directory / layout.METRICS_FILE).write_text(json.dumps({"metrics": metrics}))
    pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(len(correct))], "greedy_correct": correct}).write_parquet(
        directory / layout.SCORES_FILE
    )


def write_audit(lake: Path, arm: str, **figures: float) -> None:
    """Round 1's audit of `arm` as the pseudo-label stage publishes it: `AUDIT` with `figures`."""
    labels = layout.artifact_dir(lake, layout.round_asset(1, layout.PSEUDO_LABELS), arm)
    labels.mkdir(parents=True)
    (labels / AUDIT_FILE).write_text(PublishedAudit.model_validate(AUDIT.model_dump() | figures).model_dump_json())


def write_teacher(lake: Path, arm: str, checks: dict[int, float], steps: int, stopped: str) -> None:
    """`arm`'s labeled-RL checkpoint as a trained one leaves its records: the compute record with why it stopped and
    the training log with its validation checks (`checks`: step -> greedy accuracy)."""
    checkpoint = layout.artifact_dir(lake, layout.LABELED_RL, arm)
    checkpoint.mkdir(parents=True)
    own = TrainingCompute(optimizer_steps=steps, prompts=2 * steps, completions=8 * steps)
    (checkpoint / layout.COMPUTE_FILE).write_text(
        json.dumps(CheckpointCompute(own=own, total=own, stopped=stopped).as_dict())
    )
    log = [
        {"step": step, "loss": 0.1} | ({VALIDATION_LOGGED: checks[step]} if step in checks else {})
        for step in range(1, steps + 1)
    ]
    (checkpoint / layout.TRAINING_LOG_FILE).write_text(json.dumps(log))


def _correct(share: float, shift: int = 0) -> list[bool]:
    return [((i + shift) % PROBLEMS) < share * PROBLEMS for i in range(PROBLEMS)]


ARMS = [
    Experiment(
        name="grid",
        defaults=ArmSpec(round_steps=16),
        arms={
            "tau50-s0": ArmSpec(tau=0.5, seed=0),
            "tau50-s1": ArmSpec(tau=0.5, seed=1),
            "tau80-s0": ArmSpec(tau=0.8, seed=0),
        },
    ).arm(name)
    for name in ("tau50-s0", "tau50-s1", "tau80-s0")
]


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """Two rounds per arm: the student gains 10 points a round over labeled RL (0.3); the labeled-only
    control stays at 0.3 in the tau-0.5 arms and matches the student in the tau-0.8 arm."""
    for index, arm in enumerate(ARMS):
        _eval(tmp_path, layout.BASE_MODEL_EVAL, arm.name, _correct(0.1), compute={})
        _eval(tmp_path, layout.LABELED_RL_EVAL, arm.name, _correct(0.3, index))
        for number in (1, 2):
            student = _correct(0.3 + 0.1 * number, index)
            _eval(tmp_path, layout.round_asset(number, layout.EVAL_REPORT), arm.name, student)
            control = student if arm.spec.tau == 0.8 else _correct(0.3, index)
            _eval(tmp_path, layout.round_asset(number, "labeled_only_eval"), arm.name, control)
        write_audit(tmp_path, arm.name, tau=arm.spec.tau)
    write_teacher(tmp_path, ARMS[0].name, {8: 0.4, 16: 0.5, 24: 0.45, 32: 0.5}, 32, TEACHER_STOPPED)
    _eval(tmp_path, layout.LABELED_RL_VALIDATION, ARMS[0].name, _correct(0.5))
    student_dir = layout.artifact_dir(tmp_path, layout.round_asset(1, layout.STUDENT), ARMS[0].name)
    teacher = layout.artifact_dir(tmp_path, layout.round_asset(2, layout.TEACHER), ARMS[0].name)
    teacher.mkdir(parents=True)
    labeled_rl = layout.artifact_dir(tmp_path, layout.LABELED_RL, ARMS[0].name)
    record(decide(VALIDATION_PROMOTION, student_dir, labeled_rl, 0.45, 0.5), teacher)
    _eval(
        tmp_path, layout.round_asset(1, "gold_label_eval"), ARMS[0].name, _correct(0.6), compute={}
    )  # not compute-matched
    return tmp_path


def test_arms_differing_only_by_seed_are_pooled() -> None:
    assert group_label(ARMS[0]) == group_label(ARMS[1]) == "tau=0.5"  # the experiment's defaults are not repeated
    assert group_label(ARMS[2]) != group_label(ARMS[0])
    assert group_label(Arm(name="x", experiment="e", spec=ArmSpec(seed=3), own=ArmSpec(seed=3))) == "defaults"


def test_collect_compares_every_round_with_its_controls(lake: Path) -> None:
    results = collect(lake, ARMS, rounds=2)
    rows = {(r["group"], r["round"], r["control"]): r for r in results.differences.iter_rows(named=True)}
    pooled = rows[("tau=0.5", 2, "labeled_only")]
    assert (pooled["seeds"], pooled["problems"]) == (2, PROBLEMS)
    assert pooled["estimate"] == pytest.approx(0.2) and pooled["low"] > 0 and pooled["outcome"] == "better"
    assert pooled["compute_matched"]
    same = rows[("tau=0.8", 1, "labeled_only")]
    assert same["estimate"] == 0 and same["outcome"] == PILOT and same["seeds"] == 1
    gold = rows[("tau=0.5", 1, "gold_label")]
    assert gold["seeds"] == 1 and not gold["compute_matched"]  # only seed 0 has one, and it recorded no compute
    assert results.sentences[0].startswith(
        "**grid, tau=0.5**: round 2 (tau=0.5) beats its labeled-only control: +0.200"
    )
    assert "2 seeds x 40 eval problems" in results.sentences[0]
    assert results.sentences[1].startswith(
        "**grid, tau=0.8**: round 2 (tau=0.8) minus its labeled-only control, one seed"
    )
    assert "One seed: no verdict" in results.sentences[1]
    assert pooled["mde"] > pooled["high"] - pooled["estimate"]
    assert results.audits.select("arm", "round", "tau").rows() == [
        ("tau50-s0", 1, 0.5),
        ("tau50-s1", 1, 0.5),
        ("tau80-s0", 1, 0.8),
    ]


def test_the_summary_leads_with_the_teacher_then_who_taught_each_round(lake: Path) -> None:
    """Labeled RL's steps, why it stopped, the step it kept and its accuracy, its labels' against the gold, beside the
    labeled-only control; then per round which model taught and the student against its control; then the verdict."""
    results = collect(lake, ARMS, rounds=2)
    teacher = results.teachers.row(0, named=True)
    assert results.teachers["arm"].to_list() == [ARMS[0].name], "only an arm whose labeled RL has trained"
    assert (teacher["steps"], teacher["stopped"], teacher["kept_step"], teacher["best_check"]) == (
        32,
        TEACHER_STOPPED,
        16,
        0.5,
    ), "the earliest of the best checks is kept"
    assert (teacher["validation_greedy"], teacher["held_out_greedy"]) == (0.5, 0.3)
    assert (teacher["labels_kept"], teacher["kept_label_accuracy"], teacher["all_label_accuracy"]) == (
        "12 of 48",
        0.8,
        0.6,
    )
    assert (teacher["control_round"], teacher["control_held_out_greedy"]) == (2, 0.3)
    taught = {row["round"]: row for row in results.taught.filter(pl.col("arm") == ARMS[0].name).iter_rows(named=True)}
    assert taught[1]["taught_by"] == "Round 1 is taught by labeled RL."
    assert taught[2]["taught_by"].startswith("Round 2 is taught by round 1's teacher again, kept over its student")
    assert "(-0.050)" in taught[2]["taught_by"]
    assert (taught[2]["student_held_out"], taught[2]["control_held_out"]) == (0.5, 0.3)
    assert taught[2]["student_minus_control"] == pytest.approx(0.2)
    text = summary_markdown(results).splitlines()
    headings = [line for line in text if line.startswith("## ")]
    assert headings[0].startswith("## The teacher: labeled RL") and headings[1].startswith("## Who taught each round")
    assert headings[2].startswith("## Verdict")
    verdict = text.index(headings[2])
    assert text[verdict + 2].startswith("- **grid, tau=0.5**: round 2 (tau=0.5) beats its labeled-only control")
    pivot = accuracy_pivot(results.accuracy)
    first = pivot.filter((pl.col("group") == "tau=0.5") & (pl.col("round") == 0)).row(0, named=True)
    assert first["base_model"] == "0.1 ± 0.0 (n=2)" and first["student"] == "0.3 ± 0.0 (n=2)"
    assert (
        "## Pseudo-labels (audited against the hidden gold)" in headings
        and "## Student minus control" in headings[3]
        and TEACHER_STOPPED in text[4]
    )


def test_seeds_are_listed_in_number_order_and_an_arm_without_a_seed_is_listed_too() -> None:
    accuracy = pl.DataFrame(
        [
            {"experiment": "e", "group": group, "arm": f"{group}-{seed}", "seed": seed, "round": 1}
            | {"checkpoint": "student", "greedy_accuracy": 0.5}
            for group, seed in (("g", "10"), ("g", "2"), ("defaults", "None"))
        ]
    )
    assert seed_accuracy_pivot(accuracy).select("group", "seed").rows() == [
        ("defaults", "None"),
        ("g", "2"),
        ("g", "10"),
    ]


def test_an_arm_without_a_seed_is_listed_under_the_seed_it_runs_with() -> None:
    unseeded = Experiment(name="e", arms={"plain": ArmSpec(), "seeded": ArmSpec(seed=3)})
    assert [unseeded.arm(name).seed for name in ("plain", "seeded")] == [0, 3]


def test_reading_a_results_directory_writes_nothing_there_and_the_data_lake_keeps_its_summary(
    lake: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "grid.yaml").write_text(
        "defaults: {round_steps: 16}\narms:\n  tau50-s0: {tau: 0.5, seed: 0}\n  tau50-s1: {tau: 0.5, seed: 1}\n"
    )
    monkeypatch.setenv("NOISY_STUDENT_EXPERIMENTS", str(experiments))
    monkeypatch.setenv("NOISY_STUDENT_DATA_LAKE", str(lake))
    before = sorted(lake.rglob("*"))
    main(mlflow_store="mlruns", lake=lake)
    assert sorted(lake.rglob("*")) == before and "Run summary (markdown)" not in capsys.readouterr().out
    main(mlflow_store="mlruns")
    assert (lake / SUMMARY_FILE).read_text().startswith("# noisy-student run summary")


def test_the_summary_prints_each_seed_behind_the_means(lake: Path) -> None:
    results = collect(lake, ARMS, rounds=2)
    per_seed = seed_accuracy_pivot(results.accuracy).filter(pl.col("group") == "tau=0.5", pl.col("round") == 2)
    assert per_seed.select("seed", "student", "labeled_only").rows() == [("0", 0.5, 0.3), ("1", 0.5, 0.3)]
    assert "## Greedy accuracy per seed\n\n" + markdown_table(seed_accuracy_pivot(results.accuracy)) in (
        summary_markdown(results)
    )


def test_validation_results_are_listed_by_labeled_rl_steps(tmp_path: Path) -> None:
    sweep = [Arm(name=f"steps-{n}", experiment="tune", spec=ArmSpec(labeled_rl_steps=n)) for n in (8, 16)]
    for arm, share in zip(sweep, (0.2, 0.5), strict=True):
        _eval(tmp_path, layout.LABELED_RL_VALIDATION, arm.name, _correct(share))
    results = collect(tmp_path, sweep, rounds=0)
    assert results.validation.select("labeled_rl_steps", "greedy_accuracy").rows() == [(8, 0.2), (16, 0.5)]
    assert "## Labeled RL on the validation split" in summary_markdown(results)


def test_an_empty_lake_says_so(tmp_path: Path) -> None:
    results = collect(tmp_path, ARMS, rounds=2)
    assert results.sentences == [] and "No round has been evaluated" in summary_markdown(results)


def test_lake_arms_are_the_declared_arms_with_an_evaluation(lake: Path, tmp_path: Path) -> None:
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "grid.yaml").write_text(
        "defaults: {max_rounds: 2}\narms:\n  tau50-s0: {tau: 0.5, seed: 0}\n  never-run: {seed: 5}\n"
    )
    (experiments / "labels.yaml").write_text("defaults: {max_rounds: 1}\narms:\n  labels-only: {seed: 6}\n")
    layout.artifact_dir(lake, layout.round_asset(1, layout.PSEUDO_LABELS), "labels-only").mkdir(
        parents=True
    )  # run --through its labels
    arms, rounds = lake_arms(lake, experiments)
    assert [arm.name for arm in arms] == ["tau50-s0", "labels-only"] and rounds == 2


def test_markdown_table_formats_and_escapes() -> None:
    frame = pl.DataFrame({"name": ["a|b", None], "value": [0.123456, float("nan")], "text": ["x\ny", "z" * 100]})
    lines = markdown_table(frame, max_chars=10).splitlines()
    assert lines[0] == "| name | value | text |"
    assert lines[2] == "| a\\|b | 0.1235 | x y |"
    assert lines[3] == "| n/a | n/a | zzzzzzzzz… |"
    assert len(markdown_table(frame, max_rows=1).splitlines()) == 3


def _image_size(png: bytes) -> tuple[int, int]:
    import matplotlib.image

    assert png.startswith(PNG_SIGNATURE)
    height, width, _ = matplotlib.image.imread(io.BytesIO(png)).shape
    return width, height


def test_figures_are_pngs(lake: Path) -> None:
    accuracy = collect(lake, ARMS, rounds=2).accuracy
    buckets = pl.DataFrame({"bucket": ["[0.0, 0.3)", "[0.3, 0.5)"], "problems": [3, 0], "label_accuracy": [0.5, None]})
    assert _image_size(plots.accuracy_by_round(accuracy)) == (720, 400)
    assert _image_size(plots.accuracy_by_round(accuracy.drop("group"))) == (720, 400)
    assert _image_size(plots.agreement_histogram([0.25, 0.5, 1.0], tau=0.5, k=8)) == (640, 360)
    assert _image_size(plots.label_accuracy_vs_agreement(buckets)) == (640, 360)


def test_calibration_is_pooled_over_a_group_s_seeds(lake: Path) -> None:
    for index, arm in enumerate(ARMS):
        buckets = pl.DataFrame(
            {"bucket": ["[0.0, 0.3)", "[0.9, 1.0]"], "problems": [4, 10], "labels_correct": [1, 8 + index]}
        )
        buckets.with_columns(label_accuracy=pl.col("labels_correct") / pl.col("problems")).write_json(
            layout.artifact_dir(lake, layout.round_asset(1, layout.PSEUDO_LABELS), arm.name) / AUDIT_BUCKETS_FILE
        )
    results = collect(lake, ARMS, rounds=2)
    pooled = {(row["group"], row["bucket"]): row for row in results.calibration.iter_rows(named=True)}
    assert (pooled[("tau=0.5", "[0.9, 1.0]")]["problems"], pooled[("tau=0.5", "[0.9, 1.0]")]["labels_correct"]) == (
        20,
        17,
    )
    assert pooled[("tau=0.5", "[0.9, 1.0]")]["label_accuracy"] == pytest.approx(0.85)
    assert pooled[("tau=0.8", "[0.0, 0.3)")]["problems"] == 4 and "## Pseudo-label calibration" in summary_markdown(
        results
    )


def test_the_summary_prints_ttrl_s_yardstick_per_arm_and_its_mean_over_seeds(lake: Path) -> None:
    for arm, maj in ((ARMS[0], 0.5), (ARMS[1], 0.7)):
        row = {
            "problems": 20,
            "teacher_greedy": 0.4,
            "teacher_maj_at_k": maj,
            "teacher_pass_at_k": 0.8,
            "teacher_sampled_pass_at_1": 0.3,
            "student_greedy": 0.5,
            "labeled_only_greedy": 0.45,
        }
        student = layout.artifact_dir(lake, layout.round_asset(1, layout.EVAL_REPORT), arm.name)
        pl.DataFrame([row]).write_parquet(student / f"{metadata_key(YARDSTICK_TABLE)}.parquet")
    results = collect(lake, ARMS, rounds=2)
    assert results.yardsticks.height == 2
    text = summary_markdown(results)
    assert "## TTRL's yardstick on the transductive problems" in text
    assert (
        "| grid | tau=0.5 | 1 | 2 | 0.4 | 0.6 | 0.8 |" in text
    )  # the group's two seeds: maj@K 0.5 and 0.7 average to 0.6


VERIFIER_MEASURES = {
    "pairs": 79.0,
    "steps": 24.0,
    "validation_auroc": 0.627,
    "validation_label_accuracy": 0.17,
    "validation_maj_at_k": 0.135,
    "validation_pass_at_k": 0.325,
    "labeled_samples_right": 0.15,
    "validation_samples_right": 0.12,
}


def test_the_summary_prints_each_verifier_s_validation_measures(lake: Path) -> None:
    verifier = layout.artifact_dir(lake, layout.round_asset(1, layout.VERIFIER), ARMS[0].name)
    verifier.mkdir(parents=True)
    published = PublishedVerifier(metrics=VerifierMetrics(**VERIFIER_MEASURES), settings=VerifierSettings())
    (verifier / VERIFIER_METRICS_FILE).write_text(published.model_dump_json())
    results = collect(lake, ARMS, rounds=2)
    assert results.verifiers.select("arm", "round", "pairs", "validation_auroc").rows() == [
        ("tau50-s0", 1, 79.0, 0.627)
    ]
    assert "## Verifiers" in summary_markdown(results)


def _write_verifier(lake: Path, number: int, arm: str, scores_follow_correctness: bool) -> None:
    """Round `number`'s verifier of `arm` with its validation samples' scores: 40 problems of 4 samples, 2 right,
    scored by rightness (informative) or by sample parity (AUROC 0.5)."""
    verifier = layout.artifact_dir(lake, layout.round_asset(number, layout.VERIFIER), arm)
    verifier.mkdir(parents=True)
    published = PublishedVerifier(metrics=VerifierMetrics(**VERIFIER_MEASURES), settings=VerifierSettings())
    (verifier / VERIFIER_METRICS_FILE).write_text(published.model_dump_json())
    samples = pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(PROBLEMS) for _ in range(4)]}).with_columns(
        sample_index=pl.int_range(pl.len()) % 4
    )
    samples = samples.with_columns(correct=pl.col("sample_index") < 2)
    score = pl.col("correct") if scores_follow_correctness else pl.col("sample_index") % 2 == 0
    samples.with_columns(score=score.cast(pl.Float64)).write_parquet(verifier / VALIDATION_SCORES_FILE)


def test_an_arm_whose_verifier_fails_verifier_informative_is_said_failed_not_pending(lake: Path) -> None:
    """The check blocks the student: the summary says the arm failed and why, by the check's own rule, and the
    verifier table says which verifiers were judged informative."""
    three = Experiment(
        name="grid", defaults=ArmSpec(round_steps=16, max_rounds=3), arms={"tau50-s0": ArmSpec(tau=0.5, seed=0)}
    )
    _write_verifier(lake, 1, "tau50-s0", scores_follow_correctness=True)
    _write_verifier(lake, 3, "tau50-s0", scores_follow_correctness=False)
    results = collect(lake, [three.arm("tau50-s0")], rounds=3)

    assert results.verifiers.select("round", "informative").rows() == [(1, True), (3, False)]
    assert results.verifiers["validation_auroc_low"][0] > 0.5
    assert results.failed.select("arm", "round").rows() == [("tau50-s0", 3)]
    assert results.pending == [
        "arm tau50-s0 (grid) failed: round 3's verifier fails verifier_informative (validation AUROC 0.500, its 95% "
        "interval 0.500 to 0.500 over 40 problems contains 0.5: the verifier is not shown to rank right samples above "
        "wrong ones), so no student trained on its labels"
    ]


def test_every_verifier_record_committed_in_results_reads_as_it_was_written() -> None:
    paths = sorted((Path(__file__).resolve().parents[2] / "results").glob("**/verifier.json"))
    assert paths, "results/ holds the label-source grid's verifiers"
    for path in paths:
        read = PublishedVerifier.read(path.parent).model_dump()
        assert json.dumps(read, sort_keys=True) == json.dumps(json.loads(path.read_text()), sort_keys=True), path


def test_a_verifier_record_whose_measures_were_renamed_is_refused_naming_its_file(tmp_path: Path) -> None:
    measured = {name.removeprefix("validation_"): value for name, value in VERIFIER_MEASURES.items()}
    (tmp_path / VERIFIER_METRICS_FILE).write_text(json.dumps({"metrics": measured, "settings": {}}))
    with pytest.raises(ValueError, match=rf"(?s){re.escape(str(tmp_path / VERIFIER_METRICS_FILE))}.*validation_label"):
        PublishedVerifier.read(tmp_path)


def test_a_round_asked_for_and_not_evaluated_yet_is_said(lake: Path) -> None:
    """The verdict speaks of each group's last evaluated round: a round the experiment asks for beyond it is named."""
    three = Experiment(
        name="grid", defaults=ArmSpec(round_steps=16, max_rounds=3), arms={"tau50-s0": ArmSpec(tau=0.5, seed=0)}
    )
    results = collect(lake, [three.arm("tau50-s0")], rounds=3)
    assert results.pending == ["arm tau50-s0 (grid): round 3 of its 3 not evaluated yet"]
    assert "- arm tau50-s0 (grid): round 3 of its 3 not evaluated yet" in summary_markdown(results)
    assert collect(lake, ARMS, rounds=2).pending == []


def test_a_results_directory_summarizes_as_its_lake_does(lake: Path, tmp_path: Path) -> None:
    """`summary --export` keeps the evaluations and audits, a checkpoint's compute and training log but not its weights,
    and no completions, in the lake's layout: the summary of the copy is the lake's, and seeds exported at different
    times pool in one directory."""
    from noisy_student_assets.core.lake_reader import export_results

    checkpoint = layout.artifact_dir(lake, layout.round_asset(1, layout.STUDENT), ARMS[0].name)
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    for recorded in (layout.COMPUTE_FILE, layout.TRAINING_LOG_FILE):
        (checkpoint / recorded).write_text("{}")
    teacher = layout.artifact_dir(lake, layout.round_asset(2, layout.TEACHER), ARMS[0].name)
    shutil.copytree(checkpoint, teacher, dirs_exist_ok=True)
    completions = layout.artifact_dir(lake, layout.round_asset(1, layout.EVAL_REPORT), ARMS[0].name) / "greedy.parquet"
    pl.DataFrame({"problem_id": ["p00"], "completion": ["42"]}).write_parquet(completions)

    results = tmp_path / "results"
    export_results(lake, [ARMS[0].name], results)
    copied = export_results(lake, [arm.name for arm in ARMS[1:]], results)  # the other seeds, later
    assert (
        layout.artifact_dir(lake, layout.round_asset(2, layout.EVAL_REPORT), ARMS[1].name).relative_to(lake)
        / layout.SCORES_FILE
        in copied
    )
    kept = sorted(path.name for path in (results / checkpoint.relative_to(lake)).iterdir())
    assert kept == [layout.COMPUTE_FILE, layout.TRAINING_LOG_FILE], "a checkpoint's records, not its weights"
    assert [path.name for path in (results / teacher.relative_to(lake)).iterdir()] == [PROMOTION_FILE], (
        "a promoted teacher's decision, not a second copy of its checkpoint's records"
    )
    assert not (results / completions.relative_to(lake)).exists()
    original, exported = collect(lake, ARMS, rounds=2), collect(results, ARMS, rounds=2)
    assert exported.sentences == original.sentences and exported.differences.equals(original.differences)
    assert exported.audits.equals(original.audits) and summary_markdown(exported) == summary_markdown(original)


def _arm_sources(
    group: str, arm: str, kept_in_order: dict[str, list[bool]], number: int = 1
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """An arm's round-`number` sources at matched coverage and their frontiers, as `collect` reads them: each source's
    labels right or not in the order it keeps them, over as many unlabeled problems as the longest list (a shorter
    list leaves the rest unlabeled); the oracle solves 80% of them."""
    problems = max(len(right) for right in kept_in_order.values())
    labelled = {
        source: pl.DataFrame(
            {
                "pseudo_label": ["7"] * len(right) + [None] * (problems - len(right)),
                "agreement": [1 - rank / problems for rank in range(len(right))] + [None] * (problems - len(right)),
                "label_correct": right + [None] * (problems - len(right)),
            },
            schema={"pseudo_label": pl.Utf8, "agreement": pl.Float64, "label_correct": pl.Boolean},
        )
        for source, right in kept_in_order.items()
    }
    curve, sources = frontier(labelled, pass_at_k=0.8)
    columns = [
        pl.lit("lsg").alias("experiment"),
        pl.lit(group).alias("group"),
        pl.lit(arm).alias("arm"),
        pl.lit(number).alias("round"),
    ]
    return sources.select(*columns, pl.all(), pl.lit(0.5).alias("at tau: coverage")), curve.select(*columns, pl.all())


def _right(first: int, of: int = 20) -> list[bool]:
    return [rank < first for rank in range(of)]


def test_label_sources_are_compared_with_majority_at_matched_coverage_over_seeds() -> None:
    """The direct effect: per coverage, each source minus majority in the same seed, with an interval over seeds at
    least as wide as each seed's labels allow. At 50% coverage each source keeps 10 labels (20 in `by-one`)."""
    arms = [
        # the verifier wins by 8 of 10 labels on each seed: better, seeds or not
        _arm_sources("verifier", "v-s0", {"majority": _right(2), "verifier": _right(10), "confidence": _right(3)}),
        _arm_sources("verifier", "v-s1", {"majority": _right(1), "verifier": _right(9), "confidence": _right(1)}),
        _arm_sources("verifier", "v-s2", {"majority": _right(2), "verifier": _right(10), "confidence": _right(1)}),
        _arm_sources(
            "verifier", "v-s3", {"majority": _right(2), "verifier": _right(8, of=8), "confidence": _right(2)}
        ),  # keeps 8 only
        # by one label of 20 on each of 3 seeds of 40 problems: the seeds agree exactly, but one label is no finding
        _arm_sources("by-one", "b-s0", {"majority": _right(5, of=40), "verifier": _right(6, of=40)}),
        _arm_sources("by-one", "b-s1", {"majority": _right(4, of=40), "verifier": _right(5, of=40)}),
        _arm_sources("by-one", "b-s2", {"majority": _right(6, of=40), "verifier": _right(7, of=40)}),
        _arm_sources("one", "o-s0", {"majority": _right(5), "verifier": _right(9)}),
        _arm_sources("one", "o-s0", {"majority": _right(6), "verifier": _right(9)}, number=2),
    ]
    sources, curves = pl.concat([arm[0] for arm in arms], how="diagonal_relaxed"), pl.concat([arm[1] for arm in arms])
    table = sources_against(sources, curves)
    row = {(r["group"], r["source"]): r for r in table.filter(pl.col("coverage") == "at 50%").iter_rows(named=True)}
    verifier = row[("verifier", "verifier")]
    assert verifier["seeds"] == 3 and verifier["minus majority"] == pytest.approx(0.80, abs=0.04)
    assert verifier["majority"] == pytest.approx(5 / 30) and verifier["label_accuracy"] == pytest.approx(29 / 30)
    assert 0 < verifier["low"] < verifier["minus majority"] < verifier["high"] and verifier["outcome"] == "better"
    confidence = row[("verifier", "confidence")]
    assert (
        confidence["seeds"] == 4
        and confidence["low"] < 0 < confidence["high"]
        and confidence["outcome"] == "inconclusive"
        and confidence["mde"] > confidence["high"] - confidence["minus majority"]
    )
    by_one = row[("by-one", "verifier")]
    assert by_one["minus majority"] == pytest.approx(0.05) and by_one["outcome"] == "inconclusive"
    # binomial variances (0.3*0.7 + 0.25*0.75)/20, (0.25*0.75 + 0.2*0.8)/20, (0.35*0.65 + 0.3*0.7)/20:
    # 0.05 ± 1.96 * sqrt(0.059125) / 3
    assert (by_one["low"], by_one["high"]) == (pytest.approx(-0.1089, abs=1e-3), pytest.approx(0.2089, abs=1e-3))
    assert row[("one", "verifier")]["outcome"] == PILOT and row[("one", "verifier")]["low"] is None
    margined = sources_against(sources, curves, margins={by_one["experiment"]: 0.25})
    same_row = [pl.col(column) == by_one[column] for column in ("group", "round", "coverage", "source")]
    assert margined.filter(*same_row)["outcome"].to_list() == ["no effect larger than 0.25"]
    assert ("verifier", "majority") not in row and row[("verifier", "oracle (pass@K)")][
        "minus majority"
    ] == pytest.approx(33 / 40)
    assert set(table["coverage"]) == {coverage_column(coverage) for coverage in MATCHED_COVERAGES}, (
        "the operating point at tau is no matched coverage"
    )
    results = _results_with_sources(sources, curves)
    assert "at least each seed's binomial width" in summary_markdown(results)
    assert set(results.frontiers) == {(arm, 1) for arm in sources["arm"] if arm != "o-s0"} | {("o-s0", 2)}, (
        "each arm's last round"
    )
    assert results.frontiers[("v-s0", 1)].equals(arms[0][1].drop("experiment", "group", "arm", "round"))


def _results_with_sources(sources: pl.DataFrame, curves: pl.DataFrame) -> ExperimentResults:
    """Results holding `sources` and `curves` and no other table."""
    tables = {field.name: pl.DataFrame() for field in fields(ExperimentResults) if field.type == "pl.DataFrame"}
    return ExperimentResults(**tables | {"sources": sources, "curves": curves}, sentences=[])


def test_the_accuracy_figure_shows_only_the_chains_a_group_ran() -> None:
    """Every chain starts at labeled RL (round 0): a control without a later round was never trained by the arm, and
    stays out of the figure's legend (notebook 03, the verdict)."""
    accuracy = pl.DataFrame(
        {
            "group": ["default"] * 5,
            "checkpoint": ["student", "labeled_only", "gold_label", "student", "labeled_only"],
            "round": [0, 0, 0, 1, 1],
            "greedy_accuracy": [0.4, 0.4, 0.4, 0.45, 0.5],
        }
    )
    assert plots.ran_chains(accuracy)["checkpoint"].to_list() == ["student", "labeled_only", "student", "labeled_only"]


def test_a_break_even_point_counts_only_the_seeds_with_both_evaluations() -> None:
    """The student's labels are audited on every seed that labeled, its point placed by the seeds that also trained
    and evaluated it beside labeled-only."""
    from types import SimpleNamespace

    from noisy_student_assets.core.reporting.summary import break_even_rows

    def evaluated(share: float) -> SimpleNamespace:
        correct = _correct(share)
        return SimpleNamespace(
            scores=pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(len(correct))], "greedy_correct": correct})
        )

    runs = {(1, layout.STUDENT_ROLE): evaluated(0.6), (1, layout.LABELED_ONLY): evaluated(0.5)}
    by_group = {("e", "g"): [(runs, None), ({}, None)]}
    accuracy = {("e", "g", 1, layout.STUDENT_ROLE): {"s0": 0.6, "s1": 0.2}}
    (row,) = break_even_rows(by_group, {("e", "g"): ["s0", "s1"]}, accuracy, 1, {"e": None})
    assert (row["line"], row["seeds"], row["label_accuracy"]) == (layout.STUDENT_ROLE, 1, 0.6)
    assert row["estimate"] == pytest.approx(0.1)
