"""Experiments and their arms (no Dagster here).

An experiment is a versioned YAML file, `experiments/<name>.yaml`: how many rounds, which compute-matched
controls, and its arms. An arm is a name plus overrides of the stage settings (seed, tau, K, sampling
temperature, student init, GRPO steps, eval samples, the student's mode, reward, agreement band and noise); it is a partition of every per-arm asset, so each arm
has its own split, labeled-RL checkpoint, rounds and controls, and the UI and backfills address it by name.

    description: tau 0.5 against 0.8, three seeds each
    rounds: 2
    controls: [labeled_only, gold_label, random_label]
    defaults: {labeled_rl_steps: 16, round_steps: 8}   # every arm's, unless the arm says otherwise
    arms:
      tau50-seed0: {tau: 0.5, seed: 0}
      tau80-seed0: {tau: 0.8, seed: 0}

An arm's overrides win over the run config (launchpad, `--config-json`) for the settings they name; every
other setting comes from the run config and the profile's defaults. `Arm.overrides(stage)` is the one place
where an arm field is mapped onto the settings it changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from noisy_student_assets.core.layout import CONTROLS
from noisy_student_assets.core.layout import LABELED_ONLY as LABELED_ONLY_CONTROL

EXPERIMENTS_ENV_VAR = "NOISY_STUDENT_EXPERIMENTS"
EXPERIMENT_SUFFIX = ".yaml"

PROBLEM_SPLIT, LABELED_RL, SAMPLING, PSEUDO_LABELS, STUDENT, LABELED_ONLY, EVAL = (
    "problem_split", "labeled_rl", "sampling", "pseudo_labels", "student", "labeled_only", "eval",
)
STAGES = (PROBLEM_SPLIT, LABELED_RL, SAMPLING, PSEUDO_LABELS, STUDENT, LABELED_ONLY, EVAL)
"""The settings an arm can change, by the stage that reads them (each stage's `dg.Config` names its stage)."""

_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ArmSpec(BaseModel):
    """The settings an arm overrides; None leaves the stage's own setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int | None = Field(default=None, description="labeled/unlabeled split, every GRPO run, the teacher's and the eval's samples")
    tau: float | None = Field(default=None, ge=0, le=1, description="keep a pseudo-label when its agreement >= tau")
    k: int | None = Field(default=None, ge=1, description="teacher samples per unlabeled problem")
    temperature: float | None = Field(default=None, ge=0, description="the teacher's sampling temperature")
    student_init: Literal["teacher", "base_model"] | None = Field(default=None, description="where each round's student starts")
    labeled_rl_steps: int | None = Field(default=None, ge=1, description="GRPO steps of labeled RL")
    round_steps: int | None = Field(default=None, ge=1, description="GRPO steps of each round's student and of each control")
    eval_samples: int | None = Field(default=None, ge=0, description="sampled eval completions per problem (0: greedy only)")
    mode: Literal["grpo", "sft", "dpo"] | None = Field(default=None, description="how the student trains (student.mode)")
    reward: Literal["hard", "vote_share"] | None = Field(default=None, description="GRPO's reward on pseudo-labels")
    agreement_low: float | None = Field(default=None, ge=0, le=1, description="train on kept labels with agreement >= this")
    agreement_high: float | None = Field(default=None, ge=0, le=1, description="... and <= this")
    prompt_noise: bool | None = Field(default=None, description="the student's prompts through several templates")
    dropout: float | None = Field(default=None, ge=0, lt=1, description="the student's model and LoRA dropout")
    sft_samples_per_problem: int | None = Field(default=None, ge=0, description="sft: distinct agreeing samples per problem")
    dpo_beta: float | None = Field(default=None, gt=0, description="dpo: DPO's beta")

    def over(self, defaults: ArmSpec) -> ArmSpec:
        """This spec with `defaults` filling the fields it leaves unset."""
        return defaults.model_copy(update=self.model_dump(exclude_none=True))

    def overrides(self, stage: str) -> dict:
        """The nested settings of `stage` that this spec changes (see `apply`)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        grpo = {"seed": self.seed, "max_steps": self.round_steps}
        student_grpo = grpo | {"lora_dropout": self.dropout}
        by_stage: dict[str, dict] = {
            PROBLEM_SPLIT: {"seed": self.seed},
            LABELED_RL: {"grpo": {"seed": self.seed, "max_steps": self.labeled_rl_steps}},
            SAMPLING: {"seed": self.seed, "k": self.k, "temperature": self.temperature},
            PSEUDO_LABELS: {"tau": self.tau},
            STUDENT: {
                "student_init": self.student_init,
                "mode": self.mode,
                "reward": self.reward,
                "agreement_low": self.agreement_low,
                "agreement_high": self.agreement_high,
                "prompt_noise": self.prompt_noise,
                "model_dropout": self.dropout,
                "sft_samples_per_problem": self.sft_samples_per_problem,
                "dpo_beta": self.dpo_beta,
                "grpo": student_grpo,
            },
            LABELED_ONLY: {"grpo": grpo},
            EVAL: {
                "seed": self.seed,
                "samples": self.eval_samples,
                "ks": None if self.eval_samples is None else sorted({1, self.eval_samples}) if self.eval_samples else [],
            },
        }
        return _without_none(by_stage[stage])

    def without_seed(self) -> ArmSpec:
        return self.model_copy(update={"seed": None})


class Experiment(BaseModel):
    """One experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    rounds: int = Field(default=2, ge=0, description="rounds of every arm (adding one: raise it, then run the grid)")
    controls: tuple[str, ...] = Field(default=CONTROLS, description=f"compute-matched controls per round: {', '.join(CONTROLS)}")
    validate_labeled_rl: bool = Field(default=False, description="also evaluate labeled RL on the validation split")
    held_out_eval: bool = Field(
        default=True, description="evaluate labeled RL on the held-out set (false in tuning experiments, which must not see it)"
    )
    defaults: ArmSpec = ArmSpec()
    arms: dict[str, ArmSpec]

    @field_validator("controls")
    @classmethod
    def _known_controls(cls, controls: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(controls) - set(CONTROLS))
        if unknown:
            raise ValueError(f"unknown controls {unknown}; choose from {list(CONTROLS)}")
        if LABELED_ONLY_CONTROL not in controls:
            raise ValueError(f"controls must include {LABELED_ONLY_CONTROL!r}: every round's verdict compares with it")
        return tuple(c for c in CONTROLS if c in controls)

    @field_validator("arms")
    @classmethod
    def _valid_arm_names(cls, arms: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        if not arms:
            raise ValueError("an experiment needs at least one arm")
        bad = [name for name in arms if not _ARM_NAME.match(name)]
        if bad:
            raise ValueError(f"arm names must be letters, digits, '_', '.' or '-' (at most 64): {bad}")
        return arms

    def arm(self, name: str) -> Arm:
        return Arm(name=name, experiment=self.name, spec=self.arms[name].over(self.defaults), own=self.arms[name])

    def all_arms(self) -> list[Arm]:
        return [self.arm(name) for name in self.arms]


class Arm(BaseModel):
    """An arm with its experiment's defaults applied."""

    model_config = ConfigDict(frozen=True)

    name: str
    experiment: str
    spec: ArmSpec
    own: ArmSpec = ArmSpec()
    """What the arm itself sets, without its experiment's defaults: what tells it from its siblings."""

    def overrides(self, stage: str) -> dict:
        return self.spec.overrides(stage)

    def overrides_sha(self, stage: str) -> str:
        """Fingerprint of what this arm changes in `stage`: a stage whose fingerprint changed is stale."""
        return hashlib.sha256(json.dumps(self.overrides(stage), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def seed_group(self) -> str:
        """Arms of one experiment whose specs differ at most by seed share a seed group."""
        return f"{self.experiment}:{self.spec.without_seed().model_dump_json(exclude_none=True)}"


def apply(settings: Mapping, overrides: Mapping) -> dict:
    """`settings` (nested dicts) with `overrides` written over them, key by key at every depth."""
    merged = dict(settings)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = apply(merged[key], value)
        else:
            merged[key] = value
    return merged


def overridden(settings: Mapping, overrides: Mapping, defaults: Mapping, prefix: str = "") -> list[str]:
    """Settings the run config set away from their defaults that `overrides` replace: 'tau=0.8 -> 0.5'."""
    changed = []
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            changed += overridden(settings.get(key, {}), value, defaults.get(key, {}), f"{name}.")
        elif key in settings and settings[key] != defaults.get(key) and settings[key] != value:
            changed.append(f"{name}={settings[key]!r} -> {value!r}")
    return changed


def default_experiments_dir() -> Path:
    """`NOISY_STUDENT_EXPERIMENTS`, else the repository's `experiments/`."""
    return Path(os.environ.get(EXPERIMENTS_ENV_VAR) or Path(__file__).resolve().parents[3] / "experiments")


def load_experiment(path: Path) -> Experiment:
    """Parse and validate one experiment file (its name is the file's stem)."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(document, dict):
        raise ValueError(f"{path}: an experiment file holds a mapping (description, rounds, controls, defaults, arms)")
    try:
        return Experiment(name=path.stem, **document)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error


def load_experiments(directory: Path) -> dict[str, Experiment]:
    """Every experiment file in `directory` by name; an arm name may appear in one file only."""
    experiments = {path.stem: load_experiment(path) for path in sorted(directory.glob(f"*{EXPERIMENT_SUFFIX}"))}
    seen: dict[str, str] = {}
    for experiment in experiments.values():
        for arm in experiment.arms:
            if arm in seen:
                raise ValueError(f"arm {arm!r} is declared in both {seen[arm]} and {experiment.name} ({directory})")
            seen[arm] = experiment.name
    return experiments


def find_arm(directory: Path, name: str) -> Arm:
    """The arm called `name` in any experiment file of `directory`."""
    for experiment in load_experiments(directory).values():
        if name in experiment.arms:
            return experiment.arm(name)
    raise KeyError(
        f"arm {name!r} is declared in no experiment file under {directory}: add it to one "
        "(or restore the file it came from) before materializing it"
    )


def max_rounds(directory: Path) -> int:
    """The most rounds any experiment asks for: how many rounds the code location defines."""
    return max((experiment.rounds for experiment in load_experiments(directory).values()), default=0)


def _without_none(settings: dict) -> dict:
    cleaned = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            value = _without_none(value)
            if not value:
                continue
        if value is not None:
            cleaned[key] = value
    return cleaned
