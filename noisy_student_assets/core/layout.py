"""Names and places of the artifacts (no Dagster here): asset names, round prefixes, roles, and where
each artifact lives in the data lake. Every module that names an asset, a round or a lake path takes
it from here, so the Dagster graph, the run summary and the scripts cannot drift apart.

An asset's key is its name, or `(round prefix, name)` for the assets of a round (`round_002/pseudo_labels`);
its artifact lives at `<lake>/<key path>/<arm>/`, or `<lake>/<key path>/` when it is shared by every arm.

A small JSON file published beside an artifact (a sidecar: the pseudo-labels' audit, a verifier's measures) has one
typed model, in the module that writes it, and is read through `read_sidecar`: a file that does not match its model
fails where it is read, naming the file, not later at a key a reader looks up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from noisy_student_assets.core import environment

SidecarModel = TypeVar("SidecarModel", bound=BaseModel)

# Shared by every arm (not partitioned).
PROBLEM_POOL = "problem_pool"
EVAL_PROBLEMS = "eval_problems"
BASE_MODEL = "base_model"
BASE_MODEL_EVAL = "base_model_eval"
VERDICT = "verdict"

# One per arm.
LABELED_PROBLEMS = "labeled_problems"
UNLABELED_PROBLEMS = "unlabeled_problems"
VALIDATION_PROBLEMS = "validation_problems"
LABELED_RL = "labeled_rl_checkpoint"
LABELED_RL_EVAL = "labeled_rl_eval"
LABELED_RL_VALIDATION = "labeled_rl_validation"

# One per arm and round, under the round's prefix.
TEACHER = "teacher"
"""Round N's teacher from round 2 on: round N-1's student or its teacher, promoted (`core/promotion.py`)."""
GENERATIONS = "generations"
VERIFIER = "verifier"
"""The round's outcome verifier, trained on the teacher's samples of labeled problems (arms whose label source reads
it)."""
VERIFIER_SCORES = "verifier_scores"
"""The verifier's score of each of the round's samples: what the vote of such an arm reads."""
PSEUDO_LABELS = "pseudo_labels"
STUDENT = "student_checkpoint"
STUDENT_VALIDATION = "student_validation"
"""The round's student on the arm's validation problems: what a patience reads (never the held-out set)."""
EVAL_REPORT = "eval_report"

STUDENT_ROLE = "student"
LABELED_ONLY = "labeled_only"
GOLD_LABEL = "gold_label"
RANDOM_LABEL = "random_label"
DOSE_LABEL = "dose_label"
KEPT_GOLD_LABEL = "kept_gold_label"
CONTROLS = (LABELED_ONLY, GOLD_LABEL, RANDOM_LABEL, DOSE_LABEL, KEPT_GOLD_LABEL)
"""The compute-matched controls of a round: labeled problems only (its own chain), the unlabeled problems
with their true answers, with the kept pseudo-labels shuffled among them, with their true answers a share
`dose_rho` of which are made wrong (a known label accuracy), and the kept problems with their true answers
(the label source's coverage at perfect accuracy)."""
DEFAULT_CONTROLS = (LABELED_ONLY, GOLD_LABEL, RANDOM_LABEL)
"""An experiment's controls where its file lists none."""
LABEL_CONTROLS = (GOLD_LABEL, RANDOM_LABEL, DOSE_LABEL, KEPT_GOLD_LABEL)
"""The controls that train the unlabeled problems on labels of their own: each records them in its checkpoint
(`TRAINING_LABELS_FILE`), so that a report can place it by their accuracy."""

ROUND_PREFIX = "round_"
DEFAULT_ARM = "default"
"""The arm of `make run` (experiments/default.yaml)."""

TRACKING_DB_NAME = "mlflow.db"
TABLE_FILE_NAME = "data.parquet"
"""A table asset's artifact: `<artifact dir>/data.parquet`."""
METRICS_FILE = "metrics.json"
"""In an eval's artifact: {"metrics": ..., "settings": ..., "eval_problems": fingerprint}."""
SCORES_FILE = "scores.parquet"
"""In an eval's artifact: one row per eval problem (`problem_id`, `greedy_correct`, ...)."""
COMPUTE_FILE = "compute.json"
"""In a trained checkpoint: the compute it spent and the compute of its whole lineage (`compute.TrainingCompute`)."""
TRAINING_LOG_FILE = "training_log.json"
"""In a trained checkpoint: the trainer's log of every step (`trainer.state.log_history`), the reward among them."""
TRAINING_LABELS_FILE = "training_labels.parquet"
"""In a label control's checkpoint (`LABEL_CONTROLS`): the label it trained each unlabeled problem on
(`problem_id`, `label`)."""
GRID_RUNS = "grid_runs"
GRID_HOURS_FILE = "hours.json"
"""`<lake>/grid_runs/<arm>/hours.json`: the hours the grid's runs of an arm took (`grid power` reads the cost of a seed
from it, in a lake or a results directory)."""


def round_prefix(number: int) -> str:
    """3 -> `round_003`."""
    if number < 1:
        raise ValueError(f"rounds are numbered from 1, got {number}")
    return f"{ROUND_PREFIX}{number:03d}"


def round_number(prefix: str) -> int:
    """`round_003` -> 3."""
    number = prefix.removeprefix(ROUND_PREFIX)
    if not prefix.startswith(ROUND_PREFIX) or not number.isdigit():
        raise ValueError(f"{prefix!r} is not a round prefix like {round_prefix(1)!r}")
    return int(number)


def round_asset(number: int, name: str) -> tuple[str, str]:
    """The key path of a round's asset: (3, "pseudo_labels") -> ("round_003", "pseudo_labels")."""
    return (round_prefix(number), name)


def control_checkpoint(control: str) -> str:
    return f"{control}_checkpoint"


def control_eval(control: str) -> str:
    return f"{control}_eval"


def round_asset_names(
    number: int, controls: tuple[str, ...], validated: bool = False, verified: bool = False
) -> list[str]:
    """Round `number`'s assets of an arm whose experiment runs `controls`, in dependency order, as key
    paths joined by '/' (`round_001/generations`, ..., `round_001/eval_report`); `validated`: with the student's
    validation eval; `verified`: with the verifier and its scores, which the vote reads. From round 2 on, the round
    opens with its promoted teacher."""
    chain = (
        ([TEACHER] if number > 1 else [])
        + [GENERATIONS]
        + ([VERIFIER, VERIFIER_SCORES] if verified else [])
        + [PSEUDO_LABELS, STUDENT]
        + ([STUDENT_VALIDATION] if validated else [])
    )
    for control in controls:
        chain += [control_checkpoint(control), control_eval(control)]
    return ["/".join(round_asset(number, name)) for name in [*chain, EVAL_REPORT]]


def checkpoint_of(role: str) -> str:
    """The round asset holding a role's checkpoint: the student's or a control's."""
    return STUDENT if role == STUDENT_ROLE else control_checkpoint(role)


def eval_of(role: str) -> str:
    """The round asset holding a role's evaluation: the student's eval report or a control's eval."""
    return EVAL_REPORT if role == STUDENT_ROLE else control_eval(role)


def artifact_dir(root: Path, key_path: tuple[str, ...] | str, partition: str | None = None) -> Path:
    """Where an asset's artifact lives: `<root>/<key path>/[<arm>/]`."""
    path = root.joinpath(*([key_path] if isinstance(key_path, str) else key_path))
    return path / partition if partition else path


def default_lake_root() -> Path:
    """`NOISY_STUDENT_DATA_LAKE` (written to `.env` by `make setup`), else `./data_lake`."""
    return environment.data_lake_root()


def read_sidecar(model: type[SidecarModel], path: Path) -> SidecarModel:
    """The sidecar at `path` as its typed model (`parse_sidecar`)."""
    return parse_sidecar(model, path.read_text(), str(path))


def parse_sidecar(model: type[SidecarModel], text: str, where: str) -> SidecarModel:
    """A sidecar's text as its typed model; one that does not match it (a key missing, renamed or of another type) is
    refused with `where` (the file) named."""
    try:
        return model.model_validate_json(text)
    except ValidationError as error:
        raise ValueError(f"{where} is not a {model.__name__} as this code writes it: {error}") from error
