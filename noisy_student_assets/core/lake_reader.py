"""The one reader of the lake (no Dagster here): an arm's artifacts, by asset and by round, as typed records. The run
summary, the round report's inputs, the headroom table, the explorer and the notebooks read through `ArmLake`; each
record knows which files of its artifact hold what, and an artifact not materialized (or not kept in a results
directory, which has the lake's layout) reads as None.

    arm_lake = ArmLake(layout.default_lake_root(), "default")
    arm_lake.evaluation(layout.LABELED_RL_EVAL)     # PublishedEval | None: metrics, per-problem scores, tables
    arm_lake.checkpoint(layout.LABELED_RL)          # TrainedCheckpoint | None: its compute record and training log
    arm_lake.labels(1)                              # RoundLabels | None: the audit, its buckets, sources, frontier
    arm_lake.verifier(1), arm_lake.promotion(2)     # the verifier's measures; the decision of who taught round 2

A **results directory** (`export_results`) holds a lake's results apart from its checkpoints and samples, in the
lake's own layout, so that it is read as a lake is and can be committed beside the results page (`results/`): a
reader without the lake prints the page's tables (`python -m noisy_student_assets.summary --lake results/<name>`),
and seeds run on different days or machines pool by copying their results into one directory (the arms are
partitions, their files never collide). Kept per arm (`result_files`): every evaluation's metrics, per-problem
scores and report tables (not its completions), the base model's among them; each round's pseudo-label audit,
frontier and settings (not the labels' table); the verifier's measures and its validation samples' scores (they judge
it informative or not, and are small); the held-out and unlabeled problems (their ids say which held-out problems a
test-time arm trained on); each trained checkpoint's compute and training log (not its weights); each promotion's
decision; the labels each label control trained on; and the hours the grid's runs of the arm took.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import polars as pl
from pydantic import BaseModel

from noisy_student_assets.core import layout
from noisy_student_assets.core.layout import parse_sidecar
from noisy_student_assets.core.promotion import PROMOTION_FILE, Promotion, read_promotion
from noisy_student_assets.core.pseudo_labels.labels import (
    AUDIT_BUCKETS_FILE,
    AUDIT_FILE,
    FRONTIER_FILE,
    SETTINGS_FILE,
    SOURCES_FILE,
    PublishedAudit,
)
from noisy_student_assets.core.reporting.eval_report import (
    GREEDY_FILE,
    SAMPLED_FILE,
    PublishedEval,
    read_published_eval,
)
from noisy_student_assets.core.settings import PseudoLabelSettings
from noisy_student_assets.core.training.base import read_training_log
from noisy_student_assets.core.training.compute import CheckpointCompute, read_compute
from noisy_student_assets.core.training.verifier import (
    VALIDATION_SCORES_FILE,
    VERIFIER_METRICS_FILE,
    PublishedVerifier,
    read_verifier_metrics,
)

CHECKPOINT_CONFIG = "config.json"
"""What every checkpoint directory holds once materialized (the checkpoint IO manager checks the same)."""
BASE_MODEL_NAME = "base model"
AssetName = str | tuple[str, ...]
"""An asset as `layout.artifact_dir` names it: `labeled_rl_checkpoint`, or a round's key path (`layout.round_asset`)."""


@dataclass(frozen=True)
class TrainedCheckpoint:
    """A trained checkpoint's records: the compute it spent and the trainer's log of its steps (None where a
    checkpoint was trained before the log was kept)."""

    directory: Path

    @cached_property
    def compute(self) -> CheckpointCompute:
        return read_compute(self.directory)

    @cached_property
    def training_log(self) -> list[dict] | None:
        return read_training_log(self.directory)

    @cached_property
    def training_labels(self) -> pl.DataFrame | None:
        """The label a label control (`layout.LABEL_CONTROLS`) trained each unlabeled problem on (`problem_id`,
        `label`); None for other checkpoints."""
        path = self.directory / layout.TRAINING_LABELS_FILE
        return pl.read_parquet(path) if path.is_file() else None

    @property
    def step_rewards(self) -> list[float] | None:
        """The mean answer reward of each step of the GRPO run that trained it; None where it logged none (trained
        before the log was kept, or not by GRPO's answer reward)."""
        from noisy_student_assets.core.training.grpo import logged_rewards

        return logged_rewards(self.training_log or []) or None


@dataclass(frozen=True)
class RoundLabels:
    """A round's published pseudo-labels, read from the small files published beside their table (`files`: name ->
    text, as the pseudo-labels' input brings them to an asset, or `read` from the lake): the audit against the
    hidden gold, its accuracy by agreement bucket, the vote's settings, and, for labels published since label sources
    were compared, each source's frontier. `name` says which labels an error is about."""

    files: Mapping[str, str]
    name: str
    directory: Path | None = None
    """Where they were read from (None: given as files): their table's directory."""

    @classmethod
    def read(cls, directory: Path, name: str) -> RoundLabels | None:
        """The labels published in `directory`, or None where none are (no audit)."""
        if not (directory / AUDIT_FILE).exists():
            return None
        files = {path.name: path.read_text() for path in directory.glob("*.json")}
        return cls(files, name, directory)

    @cached_property
    def audit(self) -> PublishedAudit:
        return PublishedAudit.from_files(self.files, self.name)

    @cached_property
    def buckets(self) -> pl.DataFrame | None:
        """Label accuracy against the hidden gold by agreement bucket; None where it was not kept."""
        return pl.read_json(self.files[AUDIT_BUCKETS_FILE].encode()) if AUDIT_BUCKETS_FILE in self.files else None

    @cached_property
    def sources(self) -> pl.DataFrame | None:
        """Each label source's labels at the round's tau; None where the labels predate the comparison."""
        return pl.read_json(self.files[SOURCES_FILE].encode()) if SOURCES_FILE in self.files else None

    @cached_property
    def frontier(self) -> pl.DataFrame | None:
        """Each label source's coverage against accuracy over thresholds; None where `sources` is."""
        return pl.read_json(self.files[FRONTIER_FILE].encode()) if FRONTIER_FILE in self.files else None

    @cached_property
    def settings(self) -> PseudoLabelSettings:
        """The settings the round's vote ran with."""
        return parse_sidecar(PseudoLabelSettings, self.files[SETTINGS_FILE], f"{SETTINGS_FILE} of {self.name}")

    def table(self) -> pl.DataFrame:
        """The labels themselves (a lake's, not a results directory's)."""
        return pl.read_parquet(self._table_path)

    @property
    def version(self) -> int:
        """When the labels' table was last written (what a cache of views of them keys on)."""
        return self._table_path.stat().st_mtime_ns

    @property
    def _table_path(self) -> Path:
        if self.directory is None:
            raise ValueError(f"{self.name} were given as files, not read from the lake")
        return self.directory / layout.TABLE_FILE_NAME


@dataclass(frozen=True)
class VerifierMeasures:
    """A round's verifier as the summary judges it: its measures, `informative` among them, and why it is not."""

    measures: dict[str, float | bool | None]
    failure: str | None


class ArmHours(BaseModel):
    """`layout.GRID_HOURS_FILE`: what the grid's runs of one arm of `experiment` took, as the Dagster instance that ran
    them recorded them (every finished run of the arm in that experiment: a failed attempt and its retry, or a redo
    after a changed setting, count too)."""

    experiment: str
    hours: float
    runs: int


@dataclass(frozen=True)
class ArmLake:
    """Arm `arm`'s artifacts in the lake (or results directory) at `root`."""

    root: Path
    arm: str

    def artifact_dir(self, asset: AssetName) -> Path:
        """Where `asset`'s artifact of this arm lives (for a reader that opens a checkpoint's weights)."""
        return layout.artifact_dir(self.root, asset, self.arm)

    def table(self, asset: AssetName) -> pl.DataFrame | None:
        """A table asset (problems, generations, labels), or None."""
        path = self.artifact_dir(asset) / layout.TABLE_FILE_NAME
        return pl.read_parquet(path) if path.exists() else None

    def evaluation(self, asset: AssetName) -> PublishedEval | None:
        """An eval asset's published metrics, scores and tables, or None."""
        return read_published_eval(self.artifact_dir(asset))

    def round_evaluation(self, number: int, role: str) -> PublishedEval | None:
        """Round `number`'s held-out evaluation of its student or a control (`layout.CONTROLS`), or None."""
        return self.evaluation(layout.round_asset(number, layout.eval_of(role)))

    def checkpoint(self, asset: AssetName) -> TrainedCheckpoint | None:
        """A trained checkpoint's records (its compute record or its training log), or None before it is trained (the
        base model has neither)."""
        directory = self.artifact_dir(asset)
        records = (layout.COMPUTE_FILE, layout.TRAINING_LOG_FILE)
        return TrainedCheckpoint(directory) if any((directory / name).exists() for name in records) else None

    def labels(self, number: int) -> RoundLabels | None:
        """Round `number`'s published pseudo-labels, or None."""
        asset = layout.round_asset(number, layout.PSEUDO_LABELS)
        return RoundLabels.read(self.artifact_dir(asset), f"{'/'.join(asset)} of arm {self.arm}")

    def verifier(self, number: int) -> VerifierMeasures | None:
        """Round `number`'s verifier's measures with whether it is `informative`, and why not (`read_verifier_metrics`,
        the rule of the `verifier_informative` check); where its validation scores were not kept (results exported
        before they were), its published metrics alone, with no judgement (`informative` None). None: no verifier."""
        directory = self.artifact_dir(layout.round_asset(number, layout.VERIFIER))
        if not (directory / VERIFIER_METRICS_FILE).exists():
            return None
        if (directory / VALIDATION_SCORES_FILE).exists():
            measured, failure = read_verifier_metrics(directory)
            return VerifierMeasures(measured | {"informative": failure is None}, failure)
        return VerifierMeasures(PublishedVerifier.read(directory).metrics.model_dump() | {"informative": None}, None)

    def grid_hours(self) -> ArmHours | None:
        """What the grid's runs of the arm took, where the grid recorded it."""
        path = self.artifact_dir(layout.GRID_RUNS) / layout.GRID_HOURS_FILE
        return layout.read_sidecar(ArmHours, path) if path.exists() else None

    def record_grid_hours(self, spent: ArmHours) -> None:
        """Write what the grid's runs of the arm took (a results directory keeps it, so the cost of a seed travels
        with the seed)."""
        directory = self.artifact_dir(layout.GRID_RUNS)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / layout.GRID_HOURS_FILE).write_text(spent.model_dump_json(indent=2))

    def has_results(self) -> bool:
        """Whether the arm has a labeled-RL evaluation (held-out or validation) or a round's pseudo-labels (an arm run
        `--through` its labels): what the summary reports on."""
        evaluated = [self.artifact_dir(name) for name in (layout.LABELED_RL_EVAL, layout.LABELED_RL_VALIDATION)]
        labeled = [
            round_dir / layout.PSEUDO_LABELS / self.arm for round_dir in self.root.glob(f"{layout.ROUND_PREFIX}*")
        ]
        return any(directory.is_dir() for directory in evaluated + labeled)

    def promotion(self, number: int) -> Promotion | None:
        """The decision of which model taught round `number`, or None where no promotion made its teacher."""
        return read_promotion(self.artifact_dir(layout.round_asset(number, layout.TEACHER)))


@dataclass(frozen=True)
class RoundLake:
    """Round `number` of arm `arm` in the lake at `root`, as the notebooks and the explorer inspect it."""

    root: Path
    arm: str
    number: int

    @property
    def arm_lake(self) -> ArmLake:
        return ArmLake(self.root, self.arm)

    def generations(self) -> pl.DataFrame:
        """The teacher's K samples of each unlabeled problem."""
        return self._table(layout.round_asset(self.number, layout.GENERATIONS))

    def unlabeled_problems(self) -> pl.DataFrame:
        """The arm's unlabeled problems, with their hidden gold (the audit's, never the vote's)."""
        return self._table(layout.UNLABELED_PROBLEMS)

    def labels(self) -> RoundLabels:
        """The round's published pseudo-labels."""
        labels = self.arm_lake.labels(self.number)
        if labels is None:
            raise FileNotFoundError(f"round {self.number} of arm {self.arm} has no pseudo-labels in {self.root}")
        return labels

    def verifier_scores(self) -> pl.DataFrame | None:
        """The verifier's score of each sample, where the arm materialized them."""
        return self.arm_lake.table(layout.round_asset(self.number, layout.VERIFIER_SCORES))

    def checkpoint(self, role: str) -> Path:
        """The checkpoint directory of the round's student or of one of its controls (`layout.CONTROLS`)."""
        return self.arm_lake.artifact_dir(layout.round_asset(self.number, layout.checkpoint_of(role)))

    def trained(self, role: str) -> TrainedCheckpoint | None:
        """The records of the round's student or control checkpoint, or None before it is trained."""
        return self.arm_lake.checkpoint(layout.round_asset(self.number, layout.checkpoint_of(role)))

    def evaluation(self, role: str) -> PublishedEval | None:
        """The held-out evaluation of the round's student (its eval report) or of a control, if published."""
        return self.arm_lake.round_evaluation(self.number, role)

    def teacher_evaluation(self) -> PublishedEval | None:
        """The held-out evaluation of the model that labeled the round: labeled RL's in round 1, the previous round's
        student's after."""
        if self.number == 1:
            return self.arm_lake.evaluation(layout.LABELED_RL_EVAL)
        return self.arm_lake.round_evaluation(self.number - 1, layout.STUDENT_ROLE)

    def _table(self, asset: AssetName) -> pl.DataFrame:
        table = self.arm_lake.table(asset)
        if table is None:
            name = asset if isinstance(asset, str) else "/".join(asset)
            raise FileNotFoundError(f"arm {self.arm} has no {name} table in {self.root}")
        return table


def checkpoint_version(checkpoint: Path) -> int | None:
    """When a checkpoint directory was last materialized (what a cache of loaded models keys on); None where it holds
    no checkpoint."""
    config = checkpoint / CHECKPOINT_CONFIG
    return config.stat().st_mtime_ns if config.is_file() else None


def lake_rounds(root: Path) -> pl.DataFrame:
    """The (arm, round) pairs whose pseudo-labels the lake holds, in order."""
    rows = [
        {"arm": arm_dir.name, "round": layout.round_number(round_dir.name)}
        for round_dir in sorted(root.glob(f"{layout.ROUND_PREFIX}*"))
        for arm_dir in sorted((round_dir / layout.PSEUDO_LABELS).glob("*"))
        if (arm_dir / layout.TABLE_FILE_NAME).exists()
    ]
    return pl.DataFrame(rows, schema={"arm": pl.Utf8, "round": pl.Int64}).sort("arm", "round")


def lake_checkpoints(root: Path) -> dict[str, Path]:
    """Every checkpoint the lake holds, by a name a person reads: per arm its base model, its labeled-RL checkpoint
    and each round's student and controls (`default / round 1 / labeled_only`)."""
    found = {}
    rounds = sorted(layout.round_number(path.name) for path in root.glob(f"{layout.ROUND_PREFIX}*") if path.is_dir())
    arms = {path.name for name in (layout.BASE_MODEL, layout.LABELED_RL) for path in (root / name).glob("*")}
    for arm in sorted(arms):
        found[f"{arm} / {BASE_MODEL_NAME}"] = layout.artifact_dir(root, layout.BASE_MODEL, arm)
        found[f"{arm} / labeled RL"] = layout.artifact_dir(root, layout.LABELED_RL, arm)
        for number in rounds:
            for role in (layout.STUDENT_ROLE, *layout.CONTROLS):
                found[f"{arm} / round {number} / {role}"] = RoundLake(root, arm, number).checkpoint(role)
    return {name: path for name, path in found.items() if checkpoint_version(path) is not None}


ARM_EVAL_ASSETS = (layout.BASE_MODEL_EVAL, layout.LABELED_RL_EVAL, layout.LABELED_RL_VALIDATION)
ROUND_EVAL_ASSETS = (
    layout.EVAL_REPORT,
    layout.STUDENT_VALIDATION,
    *(layout.control_eval(control) for control in layout.CONTROLS),
)
TABLE_ASSETS = (layout.EVAL_PROBLEMS, layout.UNLABELED_PROBLEMS)
ROUND_CHECKPOINTS = (layout.STUDENT, *(layout.control_checkpoint(control) for control in layout.CONTROLS))
CHECKPOINT_FILES = (layout.COMPUTE_FILE, layout.TRAINING_LOG_FILE, layout.TRAINING_LABELS_FILE)
COMPLETIONS = (GREEDY_FILE, SAMPLED_FILE)


def result_files(lake: Path, arms: list[str]) -> list[Path]:
    """The files of `arms` that a results directory keeps, as paths relative to `lake`."""
    directories = []
    for arm in arms:
        directories += [
            layout.artifact_dir(lake, name, arm)
            for name in (*ARM_EVAL_ASSETS, *TABLE_ASSETS, layout.LABELED_RL, layout.GRID_RUNS)
        ]
        for round_dir in sorted(lake.glob(f"{layout.ROUND_PREFIX}*")):
            directories += [
                round_dir / name / arm
                for name in (
                    *ROUND_EVAL_ASSETS,
                    *ROUND_CHECKPOINTS,
                    layout.TEACHER,
                    layout.PSEUDO_LABELS,
                    layout.VERIFIER,
                )
            ]
    files = []
    for directory in directories:
        if not directory.is_dir():
            continue
        asset = directory.parent.name if directory.name in arms else directory.name
        files += [path for path in sorted(directory.iterdir()) if path.is_file() and _kept(asset, path.name)]
    return [path.relative_to(lake) for path in files]


def _kept(asset: str, file_name: str) -> bool:
    if asset in (*ARM_EVAL_ASSETS, *ROUND_EVAL_ASSETS):
        return file_name.endswith((".json", ".parquet")) and file_name not in COMPLETIONS
    if asset == layout.PSEUDO_LABELS:
        return file_name.endswith(".json")
    if asset == layout.VERIFIER:
        return file_name in (VERIFIER_METRICS_FILE, VALIDATION_SCORES_FILE)
    if asset in (layout.LABELED_RL, *ROUND_CHECKPOINTS):
        return file_name in CHECKPOINT_FILES
    if asset == layout.TEACHER:
        return file_name == PROMOTION_FILE
    if asset == layout.GRID_RUNS:
        return file_name == layout.GRID_HOURS_FILE
    return asset in TABLE_ASSETS and file_name == layout.TABLE_FILE_NAME


def export_results(lake: Path, arms: list[str], destination: Path) -> list[Path]:
    """Copy the result files of `arms` from `lake` into `destination` in the same layout (what was there of other
    arms stays); the files copied, relative to both."""
    files = result_files(lake, arms)
    for relative in files:
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lake / relative, target)
    return files
