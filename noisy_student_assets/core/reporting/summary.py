"""The run summary and the verdict across arms, read from the data lake (no Dagster here).

For every round of every arm: the student's greedy accuracy and each control's, and the difference
student minus control with a paired interval (`noisy_student_assets.core.reporting.verdict`): over eval problems on
one seed; arms of one experiment that differ only by seed are pooled, with an interval over seeds and problems. The
summary leads with the teacher (`teacher.py`: labeled RL's steps, why it stopped, its accuracy and its labels') and
which model taught each round, then one plain sentence per arm group: the last round against its labeled-only
control.

`python -m noisy_student_assets.summary` (run by `make run` after the grid) prints it and writes it to
`<data lake>/run_summary.md`; the `verdict` asset publishes the same tables with the comparison plot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.arms import Arm, load_experiments
from noisy_student_assets.core.experiments.directory import default_experiments_dir
from noisy_student_assets.core.lake_reader import ArmLake, RoundLabels, export_results
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.frontier import CURVE_SCHEMA, MATCHED_COVERAGES, coverage_column, kept_at
from noisy_student_assets.core.pseudo_labels.sources.majority import MajoritySource
from noisy_student_assets.core.reporting import test_time
from noisy_student_assets.core.reporting.eval_report import PublishedEval
from noisy_student_assets.core.reporting.markdown import markdown_table
from noisy_student_assets.core.reporting.round_report import FLIPS_TABLE
from noisy_student_assets.core.reporting.teacher import teacher_markdown, teacher_tables
from noisy_student_assets.core.reporting.verdict import PILOT, outcome_of, seeds_interval
from noisy_student_assets.core.training.compute import compute_comparison

SUMMARY_FILE = "run_summary.md"
ROLES = (layout.STUDENT_ROLE, *layout.CONTROLS)
VERIFIER_COLUMNS = (
    "pairs",
    "steps",
    "labeled_samples_right",
    "validation_samples_right",
    "validation_auroc",
    "validation_auroc_low",
    "validation_auroc_high",
    "validation_label_accuracy",
    "validation_maj_at_k",
    "validation_pass_at_k",
    "informative",
)
AUDIT_COLUMNS = (
    "label_source",
    "tau",
    "coverage",
    "kept",
    "kept_label_accuracy",
    "all_label_accuracy",
    "teacher_pass_at_1",
    "teacher_maj_at_k",
    "teacher_pass_at_k",
)
"""The audit's figures in the summary's audit table, and the verifier's validation AUROC (on arms with one)."""


def arm_evaluations(lake: Path, arm: str, rounds: int) -> dict[tuple[int, str], PublishedEval]:
    """(round, role) -> evaluation for one arm; round 0 is labeled RL, where the student's and labeled-only chains
    start and every control the arm evaluated in a later round."""
    found, arm_lake = {}, ArmLake(lake, arm)
    for number in range(1, rounds + 1):
        for role in ROLES:
            evaluation = arm_lake.round_evaluation(number, role)
            if evaluation:
                found[(number, role)] = evaluation
    labeled_rl = arm_lake.evaluation(layout.LABELED_RL_EVAL)
    if labeled_rl:
        chains = {layout.STUDENT_ROLE, layout.LABELED_ONLY} | {role for _, role in found}
        found |= {(0, role): labeled_rl for role in ROLES if role in chains}
    return found


def seed_label(arm: Arm) -> str:
    """An arm's seed in a per-seed table: '3', or '3 (split 0)' where another seed drew its split."""
    return str(arm.seed) if arm.split_seed == arm.seed else f"{arm.seed} (split {arm.split_seed})"


def group_label(arm: Arm, besides: tuple[str, ...] = ("seed", "split_seed")) -> str:
    """What an arm group sets itself besides the fields `besides` (its experiment's defaults aside): 'tau=0.8', or
    'defaults'."""
    spec = arm.own.model_copy(update=dict.fromkeys(besides)).model_dump(exclude_none=True)
    return " ".join(f"{name}={value}" for name, value in spec.items()) or "defaults"


@dataclass(frozen=True)
class ExperimentResults:
    accuracy: pl.DataFrame
    """experiment, group, arm, seed, round, checkpoint (role or base_model), greedy_accuracy."""
    differences: pl.DataFrame
    """Per experiment, group, round, control and eval set: the student minus the control over the group's seeds."""
    audits: pl.DataFrame
    """Per arm and round: the pseudo-label audit against the hidden gold."""
    calibration: pl.DataFrame
    """Per experiment, group, round and agreement bucket, over the group's seeds: labels, labels correct, accuracy."""
    sources: pl.DataFrame
    """Per arm, round and label source: kept-label accuracy at matched coverages, and at the source's tau."""
    curves: pl.DataFrame
    """Per arm, round and label source: its label-quality frontier (`frontier.CURVE_SCHEMA`), the oracle's beside it."""
    flips: pl.DataFrame
    """Per arm, round and eval set: the problems the student got right that its teacher got wrong, and the reverse."""
    yardsticks: pl.DataFrame
    """Per test-time arm and round: TTRL's yardstick on the transductive problems (`test_time.yardstick`)."""
    verifiers: pl.DataFrame
    """Per arm and round with a verifier: its training pairs and steps, and its measures on the validation problems."""
    validation: pl.DataFrame
    """Per arm with a `labeled_rl_validation`: its labeled-RL steps and greedy accuracy on the validation split."""
    sentences: list[str]
    """Per group: the last round against its labeled-only control, in words."""
    pending: list[str] = field(default_factory=list)
    """Per arm begun: the rounds its experiment asks for whose student has no evaluation yet, or why it failed
    (`failed`), in words (the sentences speak of the last round evaluated)."""
    failed: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_FAILED_SCHEMA))
    """Per arm whose round's verifier fails `verifier_informative` (a blocking check: no student trains on its
    labels): experiment, group, arm, seed, round and why."""
    margins: dict[str, float | None] = field(default_factory=dict)
    """Per experiment: its equivalence margin (`Experiment.equivalence_margin`), which words its verdicts."""
    break_even: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Per experiment, group, round and line (the student, each label control): the accuracy of the labels it
    trained the unlabeled problems on and its difference from the labeled-only control (`break_even_rows`)."""
    teachers: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Per arm: its labeled-RL teacher and the labeled-only control beside it (`teacher.teacher_row`)."""
    taught: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Per arm and round: which model taught it, the student against its control (`teacher.teaching_rows`)."""

    @property
    def frontiers(self) -> dict[tuple[str, int], pl.DataFrame]:
        """Per arm, its last round's frontier (`frontier.CURVE_SCHEMA`), by (arm, round)."""
        if not self.curves.height:
            return {}
        last = self.curves.group_by("arm", maintain_order=True).agg(pl.col("round").max())
        return {
            (arm, number): self.curves.filter((pl.col("arm") == arm) & (pl.col("round") == number)).select(
                CURVE_SCHEMA.names()
            )
            for arm, number in last.iter_rows()
        }


def collect(lake: Path, arms: list[Arm], rounds: int) -> ExperimentResults:
    """Everything the lake holds about `arms`, up to round `rounds`."""
    read, by_group, arms_by_group = _ArmsRead(), {}, {}
    margins = {arm.experiment: arm.equivalence_margin for arm in arms}
    for arm in arms:
        arm_lake = ArmLake(lake, arm.name)
        evaluations = arm_evaluations(lake, arm.name, rounds)
        eval_table, unlabeled = arm_lake.table(layout.EVAL_PROBLEMS), arm_lake.table(layout.UNLABELED_PROBLEMS)
        sets = (
            test_time.eval_sets(eval_table, unlabeled["problem_id"])
            if eval_table is not None and unlabeled is not None
            else None
        )
        by_group.setdefault((arm.experiment, group_label(arm)), []).append((evaluations, sets))
        arms_by_group.setdefault((arm.experiment, group_label(arm)), []).append(arm.name)
        read.add_arm(arm_lake, arm, evaluations, rounds)
    differences, sentences = _differences(by_group, rounds, margins)
    break_even = break_even_rows(by_group, arms_by_group, read.label_accuracy, rounds, margins)
    teachers, taught = teacher_tables(lake, arms)
    return ExperimentResults(
        accuracy=pl.DataFrame(read.accuracy, schema=_ACCURACY_SCHEMA),
        differences=pl.DataFrame(differences) if differences else pl.DataFrame(),
        audits=pl.DataFrame(read.audits) if read.audits else pl.DataFrame(),
        calibration=_pooled_calibration(read.calibration),
        sources=pl.concat(read.sources, how="diagonal_relaxed") if read.sources else pl.DataFrame(),
        flips=pl.concat(read.flips) if read.flips else pl.DataFrame(),
        yardsticks=pl.concat(read.yardsticks) if read.yardsticks else pl.DataFrame(),
        verifiers=pl.DataFrame(read.verifiers) if read.verifiers else pl.DataFrame(),
        curves=pl.concat(read.curves) if read.curves else pl.DataFrame(),
        validation=pl.DataFrame(read.validation) if read.validation else pl.DataFrame(),
        sentences=sentences,
        pending=read.pending,
        failed=pl.DataFrame(read.failed, schema=_FAILED_SCHEMA),
        margins=margins,
        break_even=pl.DataFrame(break_even, schema=BREAK_EVEN_SCHEMA),
        teachers=teachers,
        taught=taught,
    )


@dataclass
class _ArmsRead:
    """The rows `collect` reads from each arm's artifacts, one list per table of `ExperimentResults`."""

    accuracy: list[dict] = field(default_factory=list)
    audits: list[dict] = field(default_factory=list)
    calibration: list[pl.DataFrame] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    sources: list[pl.DataFrame] = field(default_factory=list)
    curves: list[pl.DataFrame] = field(default_factory=list)
    flips: list[pl.DataFrame] = field(default_factory=list)
    yardsticks: list[pl.DataFrame] = field(default_factory=list)
    verifiers: list[dict] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    label_accuracy: dict[tuple[str, str, int, str], dict[str, float]] = field(default_factory=dict)
    """(experiment, group, round, line) -> per arm, the accuracy of the labels its student (its kept pseudo-labels)
    or label control trained on."""

    def add_arm(
        self, arm_lake: ArmLake, arm: Arm, evaluations: dict[tuple[int, str], PublishedEval], rounds: int
    ) -> None:
        validated = arm_lake.evaluation(layout.LABELED_RL_VALIDATION)
        if validated:
            self.validation.append(
                {
                    "experiment": arm.experiment,
                    "arm": arm.name,
                    "labeled_rl_steps": arm.spec.labeled_rl_steps,
                    "validation_problems": validated.metrics["problems"],
                    "greedy_accuracy": validated.metrics["greedy_accuracy"],
                }
            )
        row = {"experiment": arm.experiment, "group": group_label(arm), "arm": arm.name, "seed": seed_label(arm)}
        base = arm_lake.evaluation(layout.BASE_MODEL_EVAL)
        if base and evaluations:
            self.accuracy.append(
                row | {"round": 0, "checkpoint": layout.BASE_MODEL, "greedy_accuracy": base.metrics["greedy_accuracy"]}
            )
        self.accuracy += [
            row | {"round": number, "checkpoint": role, "greedy_accuracy": evaluation.metrics["greedy_accuracy"]}
            for (number, role), evaluation in evaluations.items()
        ]
        verifier_failures = {}
        for number in range(1, rounds + 1):
            failure = self.add_round(arm_lake, row, number, evaluations.get((number, layout.STUDENT_ROLE)))
            if failure:
                verifier_failures[number] = failure
        asked = arm.stopping_rule.max_rounds
        missing = [number for number in range(1, asked + 1) if (number, layout.STUDENT_ROLE) not in evaluations]
        if missing and missing[0] in verifier_failures:
            number = missing[0]
            self.failed.append(row | {"round": number, "failure": verifier_failures[number]})
            self.pending.append(
                f"arm {arm.name} ({arm.experiment}) failed: round {number}'s verifier fails verifier_informative "
                f"({verifier_failures[number]}), so no student trained on its labels"
            )
        elif evaluations and missing:
            self.pending.append(
                f"arm {arm.name} ({arm.experiment}): round {', '.join(map(str, missing))} of its {asked} not evaluated "
                "yet"
            )

    def add_round(self, arm_lake: ArmLake, row: dict, number: int, student: PublishedEval | None) -> str | None:
        """Round `number`'s labels, verifier and student tables; why its verifier is not informative, if it is not."""
        labels, columns = arm_lake.labels(number), _arm_columns(row, number)
        experiment = pl.lit(row["experiment"]).alias("experiment")
        if labels and labels.buckets is not None:
            self.calibration.append(
                labels.buckets.select(
                    experiment,
                    pl.lit(row["group"]).alias("group"),
                    pl.lit(number).alias("round"),
                    "bucket",
                    "problems",
                    "labels_correct",
                )
            )
        if labels:
            if labels.sources is not None:
                self.sources.append(labels.sources.select(experiment, *columns, pl.all()))
                self.curves.append(labels.frontier.select(*columns, pl.all()))
            transductive = student.metrics.get(f"{test_time.TRANSDUCTIVE}/greedy_accuracy") if student else None
            self.audits.append(
                row
                | {"round": number}
                | {column: getattr(labels.audit, column) for column in AUDIT_COLUMNS}
                | {"verifier_validation_auroc": labels.audit.verifier.get("validation_auroc")}
                | {"student_transductive_greedy": transductive}
            )
        self.add_label_accuracy(arm_lake, row, number, labels)
        verifier = arm_lake.verifier(number)
        if verifier:
            self.verifiers.append(row | {"round": number} | {c: verifier.measures.get(c) for c in VERIFIER_COLUMNS})
        if student and (flips := student.optional_table(FLIPS_TABLE)) is not None:
            self.flips.append(flips.select(*columns, pl.all()))
        if student and (yardstick := student.optional_table(test_time.YARDSTICK_TABLE)) is not None:
            self.yardsticks.append(yardstick.select(experiment, *columns, pl.all()))
        return verifier.failure if verifier else None

    def add_label_accuracy(self, arm_lake: ArmLake, row: dict, number: int, labels: RoundLabels | None) -> None:
        """The accuracy against the hidden gold of the labels round `number`'s student kept and of those each label
        control trained on."""
        from noisy_student_assets.core.pseudo_labels.labels import with_label_correct

        key = (row["experiment"], row["group"], number)
        if labels and labels.audit.kept_label_accuracy is not None:
            self.label_accuracy.setdefault((*key, layout.STUDENT_ROLE), {})[row["arm"]] = (
                labels.audit.kept_label_accuracy
            )
        gold: dict[str, str] | None = None  # read once, where some control recorded its labels
        for control in layout.LABEL_CONTROLS:
            trained = arm_lake.checkpoint(layout.round_asset(number, layout.control_checkpoint(control)))
            if trained is None or trained.training_labels is None or not trained.training_labels.height:
                continue
            if gold is None:
                unlabeled = arm_lake.table(layout.UNLABELED_PROBLEMS)
                gold = dict(unlabeled.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
            graded = with_label_correct(trained.training_labels.rename({"label": "pseudo_label"}), gold)
            self.label_accuracy.setdefault((*key, control), {})[row["arm"]] = (
                graded["label_correct"].fill_null(False).mean()
            )


BREAK_EVEN_LINES = (layout.STUDENT_ROLE, *layout.LABEL_CONTROLS)
"""The checkpoints the break-even table places by the accuracy of their labels: the student, each label control."""
BREAK_EVEN_SCHEMA = {
    "experiment": pl.Utf8,
    "group": pl.Utf8,
    "round": pl.Int64,
    "line": pl.Utf8,
    "seeds": pl.Int64,
    "label_accuracy": pl.Float64,
    "estimate": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "mde": pl.Float64,
    "outcome": pl.Utf8,
}


def break_even_rows(
    by_group: dict[tuple[str, str], list],
    arms_by_group: dict[tuple[str, str], list[str]],
    label_accuracy: dict[tuple[str, str, int, str], dict[str, float]],
    rounds: int,
    margins: dict[str, float | None],
) -> list[dict]:
    """Per experiment, group, round and line (`BREAK_EVEN_LINES`) with labels of a known accuracy: that accuracy and
    the line's held-out accuracy minus its labeled-only control's, over the group's seeds that have all three (the
    accuracy their mean; the difference paired over seeds and problems, on the whole held-out set). Drawn against
    each other, the lines say how right labels must be to beat training longer on the labeled problems alone.
    `arms_by_group`: the arm of each of `by_group`'s runs."""
    rows = []
    for (experiment, group), arm_runs in by_group.items():
        for number in range(1, rounds + 1):
            for line in BREAK_EVEN_LINES:
                known = label_accuracy.get((experiment, group, number, line), {})
                measured = [
                    (runs, sets, known[arm])
                    for (runs, sets), arm in zip(arm_runs, arms_by_group[(experiment, group)], strict=True)
                    if arm in known and (number, line) in runs and (number, layout.LABELED_ONLY) in runs
                ]
                if not measured:
                    continue
                pairs = [
                    (runs[(number, line)].scores, runs[(number, layout.LABELED_ONLY)].scores, sets)
                    for runs, sets, _ in measured
                ]
                accuracies = [accuracy for _, _, accuracy in measured]
                difference = test_time.set_differences(
                    pairs,
                    treatment_name=f"round {number} {line} ({group})",
                    control_name="its labeled-only control",
                    margin=margins[experiment],
                )[test_time.ALL_EVAL]
                rows.append(
                    {"experiment": experiment, "group": group, "round": number, "line": line}
                    | {"seeds": difference.seeds, "label_accuracy": float(np.mean(accuracies))}
                    | {name: getattr(difference, name) for name in ("estimate", "low", "high", "mde", "outcome")}
                )
    return rows


def _differences(
    by_group: dict[tuple[str, str], list], rounds: int, margins: dict[str, float | None]
) -> tuple[list[dict], list[str]]:
    """Per experiment, group, round, control and eval set: the student minus the control over the group's seeds;
    and per group, its last round against its labeled-only control in words."""
    differences, last_verdicts = [], {}
    for (experiment, group), arm_runs in by_group.items():
        for number in range(1, rounds + 1):
            for control in layout.CONTROLS:
                pairs = [
                    (runs[(number, layout.STUDENT_ROLE)], runs[(number, control)], sets)
                    for runs, sets in arm_runs
                    if (number, layout.STUDENT_ROLE) in runs and (number, control) in runs
                ]
                if not pairs:
                    continue
                matched = all(compute_comparison(student.metrics, other.metrics)[0] for student, other, _ in pairs)
                by_set = test_time.set_differences(
                    [(student.scores, other.scores, sets) for student, other, sets in pairs],
                    treatment_name=f"round {number} ({group})",
                    control_name=f"its {control.replace('_', '-')} control",
                    margin=margins[experiment],
                )
                for eval_set, difference in by_set.items():
                    figures = {k: v for k, v in difference.as_dict().items() if k not in ("treatment", "control")}
                    differences.append(
                        {"experiment": experiment, "group": group, "round": number, "control": control}
                        | {"eval_set": eval_set}
                        | figures
                        | {"compute_matched": matched}
                    )
                    if control == layout.LABELED_ONLY:  # later rounds replace earlier ones
                        last_verdicts[(experiment, group, eval_set)] = (
                            f"**{experiment}, {group}**: {difference.sentence()}"
                            + ("" if matched else " (NOT compute-matched)")
                        )
    return differences, list(last_verdicts.values())


_FAILED_SCHEMA = {
    "experiment": pl.Utf8,
    "group": pl.Utf8,
    "arm": pl.Utf8,
    "seed": pl.Utf8,
    "round": pl.Int64,
    "failure": pl.Utf8,
}


_ACCURACY_SCHEMA = {
    "experiment": pl.Utf8,
    "group": pl.Utf8,
    "arm": pl.Utf8,
    "seed": pl.Utf8,
    "round": pl.Int64,
    "checkpoint": pl.Utf8,
    "greedy_accuracy": pl.Float64,
}


def sources_against(
    sources: pl.DataFrame,
    curves: pl.DataFrame,
    reference: str = MajoritySource.name,
    margins: dict[str, float | None] | None = None,
) -> pl.DataFrame:
    """The direct effect of each label source: per experiment, group, round, matched coverage and source, its
    kept-label accuracy and `reference`'s averaged over the group's seeds, and the source minus `reference` with an
    interval over seeds (`seeds_interval`). Each seed's sources weigh the same samples, so the difference is paired
    by seed. Within a seed, each source's accuracy over the labels it kept has its binomial variance, the two sources
    taken as independent: the interval is at least as wide as that allows, so a few seeds that agree by chance on a
    handful of labels take no side. Both sources judge the same samples, so their labels are right together more
    often than apart and this floor errs wide; a floor paired by problem would need each source's label of each
    problem, which the lake does not keep. One seed gives no interval. Each interval has its minimum detectable effect
    (mde) and is worded by the one rule (`verdict.outcome_of`), with its experiment's equivalence margin (`margins`).
    `sources`: `ExperimentResults.sources`; `curves`: `ExperimentResults.curves` (how many problems each arm labels)."""
    coverages = {
        coverage_column(coverage): coverage
        for coverage in MATCHED_COVERAGES
        if coverage_column(coverage) in sources.columns
    }
    index = ["experiment", "group", "arm", "round"]
    long = sources.unpivot(
        on=list(coverages), index=[*index, "source"], variable_name="coverage", value_name="label_accuracy"
    )
    references = long.filter(pl.col("source") == reference).select(
        *index, "coverage", pl.col("label_accuracy").alias(reference)
    )
    paired = (
        long.filter(pl.col("source") != reference)
        .join(references, on=[*index, "coverage"])
        .drop_nulls(["label_accuracy", reference])
    )
    first_rows = curves.group_by("arm", "round").agg(pl.col("kept", "coverage").first())
    problems = {(arm, number): round(kept / coverage) for arm, number, kept, coverage in first_rows.iter_rows()}
    rows = []
    for (experiment, group, number, coverage, source), seeds in paired.group_by(
        "experiment", "group", "round", "coverage", "source", maintain_order=True
    ):
        accuracy, reference_accuracy = seeds["label_accuracy"].to_numpy(), seeds[reference].to_numpy()
        differences = accuracy - reference_accuracy
        low, high, mde = None, None, None
        if len(differences) > 1:
            kept = np.array([kept_at(coverages[coverage], problems[(arm, number)]) for arm in seeds["arm"]])
            low, high, mde = seeds_interval(
                differences, (accuracy * (1 - accuracy) + reference_accuracy * (1 - reference_accuracy)) / kept
            )
        rows.append(
            {
                "experiment": experiment,
                "group": group,
                "round": number,
                "coverage": coverage,
                "source": source,
                "seeds": len(differences),
                "label_accuracy": accuracy.mean(),
                reference: reference_accuracy.mean(),
                f"minus {reference}": float(differences.mean()),
                "low": low,
                "high": high,
                "mde": mde,
                "outcome": outcome_of(low, high, (margins or {}).get(experiment)) if low is not None else PILOT,
            }
        )
    return (
        pl.DataFrame(rows, schema_overrides={"low": pl.Float64, "high": pl.Float64, "mde": pl.Float64})
        if rows
        else pl.DataFrame()
    )


def _arm_columns(row: dict, number: int) -> list[pl.Expr]:
    return [pl.lit(row["group"]).alias("group"), pl.lit(row["arm"]).alias("arm"), pl.lit(number).alias("round")]


def accuracy_pivot(accuracy: pl.DataFrame) -> pl.DataFrame:
    """Greedy accuracy as mean ± sd over seeds, one row per group and round, one column per checkpoint."""
    stats = accuracy.group_by("experiment", "group", "round", "checkpoint", maintain_order=True).agg(
        pl.format(
            "{} ± {} (n={})",
            pl.col("greedy_accuracy").mean().round(3),
            pl.col("greedy_accuracy").std().fill_null(0.0).round(3),
            pl.len(),
        ).alias("greedy_accuracy")
    )
    return stats.pivot(on="checkpoint", index=["experiment", "group", "round"], values="greedy_accuracy").sort(
        "experiment", "group", "round"
    )


def seed_accuracy_pivot(accuracy: pl.DataFrame) -> pl.DataFrame:
    """Greedy accuracy of each seed (the figures behind `accuracy_pivot`'s means), one row per group, round and seed,
    one column per checkpoint."""
    return accuracy.pivot(
        on="checkpoint",
        index=["experiment", "group", "round", "seed"],
        values="greedy_accuracy",
        aggregate_function="first",
    ).sort(  # by the training seed's number ('3 (split 0)' after '2')
        "experiment", "group", "round", pl.col("seed").str.extract(r"^(\d+)").cast(pl.Int64), "seed"
    )


def summary_markdown(results: ExperimentResults) -> str:
    """The teacher and who taught each round, the verdict sentences, then the tables, as markdown that can be pasted
    into a write-up."""
    lines = teacher_markdown(results.teachers, results.taught)
    lines += ["## Verdict: each arm group's last round against its labeled-only control (same compute)", ""]
    lines += [f"- {sentence}" for sentence in results.sentences] or [
        "No round has been evaluated against its labeled-only control yet."
    ]
    lines += [f"- {line}" for line in results.pending]
    for title, tables in _table_sections(results):
        if tables:
            lines += ["", f"## {title}", "", *"\n\n".join(tables).split("\n")]
    return "\n".join(lines) + "\n"


DIFFERENCE_COLUMNS = (
    *("experiment", "group", "round", "control", "eval_set", "seeds", "problems"),
    *("estimate", "low", "high", "mde", "outcome", "compute_matched"),
)


def _table_sections(results: ExperimentResults) -> list[tuple[str, list[str]]]:
    """The summary's tables after its verdict, each under its title; a section whose table is empty shows none."""

    def shown(table: pl.DataFrame, *dropped: str) -> list[str]:
        return [markdown_table(table.drop(*dropped))] if table.height else []

    over_seeds = (
        sources_against(results.sources, results.curves, margins=results.margins)
        if results.sources.height
        else pl.DataFrame()
    )
    yardstick_means = (
        results.yardsticks.group_by("experiment", "group", "round", maintain_order=True).agg(
            pl.len().alias("seeds"), pl.exclude("arm", "problems").mean()
        )
        if results.yardsticks.height
        else pl.DataFrame()
    )
    accuracy = results.accuracy.height > 0
    return [
        (
            "Student minus control, per round (paired 95% intervals: over seeds and problems, or over problems on one "
            "seed; mde: the smallest true effect the interval detects 80% of the time)",
            shown(results.differences.select(DIFFERENCE_COLUMNS) if results.differences.height else pl.DataFrame()),
        ),
        (
            "Break-even: each line minus its labeled-only control against the accuracy of the labels it trained on "
            "(the student: its kept pseudo-labels; paired 95% intervals, over problems alone on one seed)",
            shown(results.break_even, "experiment"),
        ),
        (
            "Greedy accuracy (mean ± sd over seeds; round 0 is labeled RL)",
            shown(accuracy_pivot(results.accuracy)) if accuracy else [],
        ),
        ("Greedy accuracy per seed", shown(seed_accuracy_pivot(results.accuracy)) if accuracy else []),
        ("Pseudo-labels (audited against the hidden gold)", shown(results.audits, "experiment", "group")),
        (
            "Label sources at matched coverage (kept-label accuracy vs the hidden gold; oracle: pass@K)",
            shown(results.sources, "experiment"),
        ),
        (
            "Label sources against majority at matched coverage, over seeds (the direct effect: interval over seeds, "
            "at least each seed's binomial width; mde: the smallest true effect it detects 80% of the time)",
            shown(over_seeds, "experiment"),
        ),
        ("Flips from the teacher (held-out problems, greedy)", shown(results.flips)),
        (
            "Verifiers (trained on the labeled problems' samples; measured on the validation problems' samples)",
            shown(results.verifiers, "experiment", "group"),
        ),
        (
            "TTRL's yardstick on the transductive problems (test-time arms; per arm, then the mean over each group's "
            "seeds)",
            shown(results.yardsticks) + shown(yardstick_means),
        ),
        ("Pseudo-label calibration (label accuracy by vote agreement, seeds pooled)", shown(results.calibration)),
        ("Labeled RL on the validation split", shown(results.validation)),
    ]


def _pooled_calibration(tables: list[pl.DataFrame]) -> pl.DataFrame:
    """The audits by agreement bucket of every arm and round, summed over each group's seeds."""
    if not tables:
        return pl.DataFrame()
    return (
        pl.concat(tables)
        .group_by("experiment", "group", "round", "bucket", maintain_order=True)
        .agg(pl.col("problems").sum(), pl.col("labels_correct").sum())
        .with_columns(
            pl.when(pl.col("problems") > 0).then(pl.col("labels_correct") / pl.col("problems")).alias("label_accuracy")
        )
    )


def lake_arms(lake: Path, experiments_dir: Path) -> tuple[list[Arm], int]:
    """The arms of the experiment files that have a labeled-RL evaluation (held-out or validation) in the lake, or a
    round's pseudo-labels (an arm run `--through` its labels), and the most rounds."""
    experiments = load_experiments(experiments_dir)
    arms = [
        arm
        for experiment in experiments.values()
        for arm in experiment.all_arms()
        if ArmLake(lake, arm.name).has_results()
    ]
    return arms, max((experiments[arm.experiment].max_rounds for arm in arms), default=0)


def break_even_figures(results: ExperimentResults) -> dict[str, bytes]:
    """Per experiment and round with a label control on it, the break-even figure (`plots.break_even`), by a name
    `break_even_<experiment>_round_<n>`."""
    from noisy_student_assets.core.reporting import plots

    table = results.break_even
    return {
        f"break_even_{experiment}_round_{number}": plots.break_even(rows)
        for (experiment, number), rows in table.group_by("experiment", "round", maintain_order=True)
        if rows.filter(pl.col("line") != layout.STUDENT_ROLE).height
    }


def main(
    mlflow_store: str,
    experiment: str | None = None,
    lake: Path | None = None,
    export: Path | None = None,
    figures: Path | None = None,
) -> None:
    """Print the run summary, of every experiment's arms in the lake or of `experiment`'s (a file name's stem) alone,
    and write it into the data lake; `mlflow_store` is the MLflow store the runs were logged to. `lake`: a lake or a
    results directory (`lake_reader.export_results`) to read instead of the data lake, printed only (the results
    directory is the repository's: reading it writes nothing there); `export`: copy the summarized arms' results
    there; `figures`: write the break-even figures (`break_even_figures`) there as PNG files."""
    writes_summary = lake is None
    lake = lake or layout.default_lake_root()
    print(f"\nData lake: {lake}")
    arms, rounds = lake_arms(lake, default_experiments_dir())
    if experiment:
        arms = [arm for arm in arms if arm.experiment == experiment]
    if not arms:
        print("No evaluated arms yet" + (f" of experiment {experiment}." if experiment else "."))
        return
    results = collect(lake, arms, rounds)
    summary = summary_markdown(results)
    print(summary)
    if figures:
        figures.mkdir(parents=True, exist_ok=True)
        for name, png in break_even_figures(results).items():
            (figures / f"{name}.png").write_bytes(png)
            print(f"Figure: {figures / name}.png")
    if writes_summary:
        name = SUMMARY_FILE if not experiment else f"{Path(SUMMARY_FILE).stem}_{experiment}.md"
        (lake / name).write_text(f"# noisy-student run summary{f': {experiment}' if experiment else ''}\n\n{summary}")
        print(f"Run summary (markdown): {lake / name}")
    if export:
        copied = export_results(lake, [arm.name for arm in arms], export)
        print(
            f"Results of {len(arms)} arms: {len(copied)} files copied into {export} "
            f"(python -m noisy_student_assets.summary --lake {export})"
        )
    print(f"Eval reports: {lake}/round_*/eval_report/<arm>/report.md")
    print(f"\nMLflow store: {mlflow_store}\n  compare runs: mlflow ui --backend-store-uri '{mlflow_store}'")
