"""Experiments and their arms (no Dagster here).

An experiment is a versioned YAML file, `experiments/<name>.yaml`: which compute-matched controls, and its
arms. An arm is a name plus overrides of the stage settings (its task and base model, seed, tau, K, sampling
temperature, student init, GRPO steps, eval samples, the student's mode, reward, agreement band and noise) and of
its stopping rule (how many rounds at most, and a patience on validation accuracy); it is a partition of every
asset but the verdict, so each arm has its own pool, held-out set, base model, split, labeled-RL checkpoint, rounds
and controls (arms of one task and model read back each other's identical pools and evaluations), and the UI and
backfills address it by name.

    description: tau 0.5 against 0.8, three seeds each
    controls: [labeled_only, gold_label, random_label]
    defaults: {task: chain-sums, max_rounds: 2, labeled_rl_steps: 16}   # every arm's, unless the arm says otherwise
    arms:
      tau50-seed0: {tau: 0.5, seed: 0}
      tau80-seed0: {tau: 0.8, seed: 0}

An arm's overrides win over the run config (launchpad, `--config-json`) for the settings they name; every
other setting comes from the run config and the profile's defaults. `ARM_FIELDS` is the one place where an arm
field is mapped onto the settings it changes; each field's type, bounds and help come from those settings.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from noisy_student_assets.core.experiments import tasks
from noisy_student_assets.core.layout import CONTROLS, DEFAULT_CONTROLS
from noisy_student_assets.core.layout import DOSE_LABEL as DOSE_LABEL_CONTROL
from noisy_student_assets.core.layout import GOLD_LABEL as GOLD_LABEL_CONTROL
from noisy_student_assets.core.layout import KEPT_GOLD_LABEL as KEPT_GOLD_LABEL_CONTROL
from noisy_student_assets.core.layout import LABELED_ONLY as LABELED_ONLY_CONTROL
from noisy_student_assets.core.settings import (
    BaseModelSettings,
    ComputeSettings,
    EvalProblemsSettings,
    EvalSettings,
    LabeledOnlySettings,
    LabeledRLSettings,
    LauncherSettings,
    ProblemPoolSettings,
    ProblemSplitSettings,
    PromotionRule,
    PromotionSettings,
    PseudoLabelSettings,
    RoundsSettings,
    Settings,
    StudentSettings,
    TeacherSamplingSettings,
    VerifierSettings,
)
from noisy_student_assets.core.training.modes.registry import accepted

EXPERIMENT_SUFFIX = ".yaml"

PROBLEM_POOL, EVAL_PROBLEMS, BASE_MODEL = "problem_pool", "eval_problems", "base_model"
PROBLEM_SPLIT, LABELED_RL, SAMPLING, VERIFIER, PSEUDO_LABELS, STUDENT, LABELED_ONLY, EVAL, PROMOTION, ROUNDS = (
    "problem_split",
    "labeled_rl",
    "sampling",
    "verifier",
    "pseudo_labels",
    "student",
    "labeled_only",
    "eval",
    "promotion",
    "rounds",
)
STAGE_SETTINGS: dict[str, type[Settings]] = {
    PROBLEM_POOL: ProblemPoolSettings,
    EVAL_PROBLEMS: EvalProblemsSettings,
    BASE_MODEL: BaseModelSettings,
    PROBLEM_SPLIT: ProblemSplitSettings,
    LABELED_RL: LabeledRLSettings,
    SAMPLING: TeacherSamplingSettings,
    VERIFIER: VerifierSettings,
    PSEUDO_LABELS: PseudoLabelSettings,
    STUDENT: StudentSettings,
    LABELED_ONLY: LabeledOnlySettings,
    EVAL: EvalSettings,
    PROMOTION: PromotionSettings,
    ROUNDS: RoundsSettings,
}
"""The settings an arm can change, by the stage that reads them (`rounds`: the stopping rule, which the next-round
automation and the grid read, and no asset)."""
STAGES = tuple(STAGE_SETTINGS)
GOLD_CONTROLS = (GOLD_LABEL_CONTROL, DOSE_LABEL_CONTROL, KEPT_GOLD_LABEL_CONTROL)
"""The controls that train on the unlabeled problems' hidden gold."""

_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


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
            # A nested block may be None (a problem source left to the profile): nothing of it was set.
            changed += overridden(settings.get(key) or {}, value, defaults.get(key) or {}, f"{name}.")
        elif key in settings and settings[key] != defaults.get(key) and settings[key] != value:
            changed.append(f"{name}={settings[key]!r} -> {value!r}")
    return changed


@dataclass(frozen=True)
class ArmField:
    """An arm field: the settings it sets, as (stage, dotted path) pairs, each value passed through `convert` if
    given. Its type and bounds are those of the first setting; `help` when it sets several."""

    targets: tuple[tuple[str, str] | tuple[str, str, Callable], ...]
    help: str = ""
    annotation: type | None = None
    """The field's type when it is not the first setting's (a name that `convert` turns into the settings)."""

    def setting(self) -> FieldInfo:
        if self.annotation is not None:
            return FieldInfo(annotation=self.annotation, description=self.help)
        stage, path = self.targets[0][:2]
        model: type[BaseModel] = STAGE_SETTINGS[stage]
        *parents, name = path.split(".")
        for parent in parents:
            model = model.model_fields[parent].annotation
        return model.model_fields[name]


def _ks_for(samples: int) -> list[int]:
    """maj@k and pass@k at 1 and at every sample."""
    return sorted({1, samples}) if samples else []


def _settings_of(stage: str, *names: str) -> dict[str, ArmField]:
    """Arm fields that each set the setting of `stage` they are named after."""
    return {name: ArmField(((stage, name),)) for name in names}


ARM_FIELDS: dict[str, ArmField] = {
    "task": ArmField(
        ((PROBLEM_POOL, "source", tasks.training_source), (EVAL_PROBLEMS, "source", tasks.eval_source)),
        "a task of experiments/tasks/: its training pool and held-out set (default: the profile's)",
        annotation=str,
    ),
    "base_model": ArmField(((BASE_MODEL, "reference"),), "the model every checkpoint of the arm starts from"),
    "seed": ArmField(
        (
            (PROBLEM_SPLIT, "seed"),
            (LABELED_RL, "grpo.seed"),
            (SAMPLING, "seed"),
            (VERIFIER, "seed"),
            (STUDENT, "grpo.seed"),
            (LABELED_ONLY, "grpo.seed"),
            (EVAL, "seed"),
        ),
        "labeled/unlabeled split, every GRPO run, the verifier, the teacher's and the eval's samples",
    ),
    "split_seed": ArmField(
        ((PROBLEM_SPLIT, "seed"),),
        "the labeled/unlabeled split alone, over `seed`'s: arms of one split_seed and several seeds train several "
        "times on one split",
    ),
    **_settings_of(PROBLEM_SPLIT, "n_labeled", "n_unlabeled", "test_time"),
    **_settings_of(PSEUDO_LABELS, "tau", "label_source", "drop_least_confident"),
    "k": ArmField(((SAMPLING, "k"),), "teacher samples per unlabeled problem"),
    "temperature": ArmField(((SAMPLING, "temperature"),), "the teacher's sampling temperature"),
    **_settings_of(STUDENT, "student_init"),
    "labeled_rl_steps": ArmField(((LABELED_RL, "grpo.max_steps"),), "GRPO steps of labeled RL"),
    "labeled_rl_stop_reward": ArmField(
        ((LABELED_RL, "grpo.stop_reward"),),
        "labeled RL stops once its answer reward's mean over grpo.stop_window steps reaches this, within "
        "labeled_rl_steps (null: it runs them all)",
    ),
    "labeled_rl_validation_every": ArmField(
        ((LABELED_RL, "grpo.validation_every"),),
        "labeled RL checks its greedy validation accuracy every this many steps, stops after "
        "labeled_rl_validation_patience checks without a higher one and keeps the best check's weights, within "
        "labeled_rl_steps (0: no check)",
    ),
    "labeled_rl_validation_patience": ArmField(
        ((LABELED_RL, "grpo.validation_patience"),), "checks without a higher validation accuracy that stop labeled RL"
    ),
    "labeled_rl_lora": ArmField(
        ((LABELED_RL, "grpo.use_lora"),), "labeled RL with LoRA adapters; false: it fine-tunes every weight"
    ),
    "labeled_rl_learning_rate": ArmField(((LABELED_RL, "grpo.learning_rate"),), "labeled RL's peak learning rate"),
    "round_steps": ArmField(
        ((STUDENT, "grpo.max_steps"), (LABELED_ONLY, "grpo.max_steps")),
        "GRPO steps of each round's student and of each control",
    ),
    "prompts_per_step": ArmField(
        ((STUDENT, "grpo.prompts_per_step"), (LABELED_ONLY, "grpo.prompts_per_step")),
        "prompts per GRPO step of each round's student and of each control",
    ),
    **_settings_of(STUDENT, "pseudo_only", "unlabeled_share"),
    "completion_cap_margin": ArmField(
        ((STUDENT, "grpo.completion_cap_margin"), (LABELED_ONLY, "grpo.completion_cap_margin")),
        "each round's GRPO completions capped at the teacher's samples' 99th percentile length plus this many tokens "
        "(the student and every control alike)",
    ),
    "eval_samples": ArmField(
        ((EVAL, "samples"), (EVAL, "ks", _ks_for)),
        "sampled eval completions per problem, with maj@k and pass@k at 1 and k (0: greedy only)",
    ),
    **_settings_of(
        STUDENT,
        "mode",
        "reward",
        "vote_min_share",
        "vote_min_margin",
        "agreement_low",
        "agreement_high",
        "prompt_noise",
    ),
    "dropout": ArmField(
        ((STUDENT, "model_dropout"), (STUDENT, "grpo.lora_dropout")), "the student's model dropout and LoRA dropout"
    ),
    **_settings_of(STUDENT, "sft_samples_per_problem", "dpo_beta"),
    **_settings_of(STUDENT, "dose_rho"),
    "promotion": ArmField(((PROMOTION, "rule"),), "which model teaches the next round"),
    **_settings_of(ROUNDS, "max_rounds", "patience", "min_improvement"),
}
"""The experiment vocabulary: each arm field and the stage settings it overrides (the one place they are mapped)."""


class _ArmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def over(self, defaults: ArmSpec) -> ArmSpec:
        """This spec with `defaults` filling the fields it leaves unset."""
        return defaults.model_copy(update=self.model_dump(exclude_none=True))

    def overrides(self, stage: str) -> dict:
        """The nested settings of `stage` that this spec changes (see `apply`)."""
        if stage not in STAGE_SETTINGS:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        changes: dict = {}
        for name, field in ARM_FIELDS.items():
            value = getattr(self, name)
            for target_stage, path, *convert in field.targets:
                if value is not None and target_stage == stage:
                    *parents, leaf = path.split(".")
                    node = changes
                    for parent in parents:
                        node = node.setdefault(parent, {})
                    node[leaf] = convert[0](value) if convert else value
        return changes

    def settings(self, stage: str) -> Settings:
        """`stage`'s settings with this spec over their defaults."""
        defaults = STAGE_SETTINGS[stage]()
        return type(defaults)(**apply(defaults.model_dump(), self.overrides(stage)))

    def test_time_conflict(self) -> str | None:
        """Why this spec's data fields contradict each other, or None."""
        if self.test_time and self.n_unlabeled is not None:
            return (
                "a test-time arm's unlabeled problems are the whole transductive half of the held-out set: "
                f"n_unlabeled={self.n_unlabeled} would not be read"
            )
        return None

    @model_validator(mode="after")
    def _settings_accept_it(self) -> _ArmSpec:
        """Every stage's settings, with this spec over their defaults, are valid (a mode that is not registered,
        a reward the mode has no use for, an agreement band upside down)."""
        for stage in STAGE_SETTINGS:
            accepted(self.settings(stage))
        if conflict := self.test_time_conflict():
            raise ValueError(conflict)
        return self


def _arm_spec_class() -> type[_ArmSpec]:
    """`ArmSpec`: one optional field per `ARM_FIELDS` entry, typed and bounded like the setting it overrides."""
    fields = {}
    for name, arm_field in ARM_FIELDS.items():
        setting = arm_field.setting()
        bounds = {
            kind: value
            for item in setting.metadata
            for kind in ("ge", "gt", "le", "lt")
            if (value := getattr(item, kind, None)) is not None
        }
        fields[name] = (
            setting.annotation | None,
            Field(default=None, description=arm_field.help or setting.description, **bounds),
        )
    return create_model(
        "ArmSpec",
        __base__=_ArmSpec,
        __doc__="The settings an arm overrides; None leaves the stage's own setting.",
        **fields,
    )


ArmSpec = _arm_spec_class()


FINDING_ASKS = ("data_headroom", "students", "label_sources")
"""What a findings question asks of an experiment's results (`reporting.findings`): the gold-label control minus the
labeled-only one per task and regime; each arm group's student minus its labeled-only control at the last round; each
label source's kept-label accuracy minus the head count's."""


class FindingQuestion(BaseModel):
    """A question the findings table asks of an experiment's committed results."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ask: Literal[FINDING_ASKS]
    rank: int = Field(description="where its rows stand in the findings table, all experiments' questions ascending")
    group: str = Field(
        default="{task}",
        description="students: how a question names a group's task and regime, from its arm's fields ('{task}')",
    )
    labeled_only_passes: bool = Field(
        default=False, description="data_headroom: say how many passes over its labels the labeled-only control made"
    )
    command: str | None = Field(
        default=None,
        description="what prints the figures (default: the summary's, or for data_headroom the headroom table's, of "
        "this experiment, from results/)",
    )


class Experiment(BaseModel):
    """One experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    controls: tuple[str, ...] = Field(
        default=DEFAULT_CONTROLS,
        description=f"compute-matched controls per round: {', '.join(CONTROLS)} (default: "
        f"{', '.join(DEFAULT_CONTROLS)})",
    )
    validate_labeled_rl: bool = Field(default=False, description="also evaluate labeled RL on the validation split")
    held_out_eval: bool = Field(
        default=True,
        description="evaluate labeled RL on the held-out set (false in tuning experiments, which must not see it)",
    )
    launcher: LauncherSettings | None = Field(
        default=None,
        description="where the grid runs this experiment's heavy stages: a kind (inprocess, subprocess, ray) or the "
        "launcher's "
        "fields (null: the launcher resource's)",
    )
    compute: ComputeSettings | None = Field(
        default=None,
        description="the compute the grid runs this experiment's heavy stages with: the compute resource's fields "
        "(null: the resource's)",
    )
    equivalence_margin: float | None = Field(
        default=None,
        gt=0,
        description="the accuracy difference below which a verdict may read 'no effect larger than' it, named before "
        "the run (null: a verdict that takes no side is inconclusive; `verdict.outcome_of`)",
    )
    findings: tuple[FindingQuestion, ...] = Field(
        default=(), description="the questions the findings table asks of this experiment's committed results"
    )
    headline: bool = Field(
        default=False,
        description="the README's headline is what this experiment found: its teacher, then its last round against "
        "the labeled-only control (`python -m noisy_student_assets.findings`); one experiment sets it",
    )
    defaults: ArmSpec = ArmSpec()
    arms: dict[str, ArmSpec]

    @model_validator(mode="before")
    @classmethod
    def _rounds_is_an_arm_field(cls, document):
        if isinstance(document, dict) and "rounds" in document:
            raise ValueError(
                f"`rounds: {document['rounds']}` is the arm field `max_rounds` now: write "
                f"`defaults: {{max_rounds: {document['rounds']}}}`"
            )
        return document

    @property
    def max_rounds(self) -> int:
        """The most rounds any of its arms runs."""
        return max(arm.stopping_rule.max_rounds for arm in self.all_arms())

    @field_validator("launcher", mode="before")
    @classmethod
    def _launcher_kind(cls, launcher):
        return {"kind": launcher} if isinstance(launcher, str) else launcher

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

    @model_validator(mode="after")
    def _test_time_arms_where_they_may_be(self) -> Experiment:
        """A test-time arm's unlabeled problems are held-out ones: the controls that read their gold would train on
        their eval answers, and a tuning experiment (held_out_eval false) must not see the held-out set at all. The
        dose control needs each arm's dose_rho."""
        merged = {name: spec.over(self.defaults) for name, spec in self.arms.items()}
        for name, spec in merged.items():
            if conflict := spec.test_time_conflict():
                raise ValueError(f"arm {name} (with the experiment's defaults): {conflict}")
        test_time = [name for name, spec in merged.items() if spec.test_time]
        if test_time and (on_gold := [control for control in GOLD_CONTROLS if control in self.controls]):
            raise ValueError(
                f"test-time arms {test_time} draw their unlabeled problems from the held-out set, so the "
                f"{', '.join(map(repr, on_gold))} control would train on eval answers: put these arms in an "
                "experiment without it"
            )
        if DOSE_LABEL_CONTROL in self.controls and (
            unset := [name for name, spec in merged.items() if spec.dose_rho is None]
        ):
            raise ValueError(f"the {DOSE_LABEL_CONTROL!r} control needs each arm's dose_rho; arms {unset} set none")
        if test_time and not self.held_out_eval:
            raise ValueError(
                f"test-time arms {test_time} train on held-out prompts, which a tuning experiment "
                "(held_out_eval: false) must not see"
            )
        return self

    def arm(self, name: str) -> Arm:
        return Arm(
            name=name,
            experiment=self.name,
            spec=self.arms[name].over(self.defaults),
            own=self.arms[name],
            equivalence_margin=self.equivalence_margin,
        )

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
    equivalence_margin: float | None = None
    """Its experiment's `equivalence_margin`."""

    def overrides(self, stage: str) -> dict:
        return self.spec.overrides(stage)

    @property
    def stopping_rule(self) -> RoundsSettings:
        """How many rounds this arm runs (its `rounds` settings, with the defaults filling what it leaves)."""
        return self.spec.settings(ROUNDS)

    @property
    def promotion_rule(self) -> PromotionRule:
        """Which model teaches this arm's next round (its `promotion`, else the default)."""
        return self.spec.settings(PROMOTION).rule

    @property
    def label_source(self) -> str:
        """Whose judgement weighs this arm's votes (its `label_source`, else the default)."""
        return self.spec.settings(PSEUDO_LABELS).label_source

    @property
    def seed(self) -> int:
        """The seed this arm trains and samples with: its own or its experiment's, else the default (every stage the
        `seed` arm field sets defaults to the same)."""
        return self.spec.settings(LABELED_RL).grpo.seed

    @property
    def split_seed(self) -> int:
        """The seed that drew this arm's labeled/unlabeled split: its `split_seed`, else its `seed`."""
        return self.spec.settings(PROBLEM_SPLIT).seed

    def overrides_sha(self, stage: str) -> str:
        """Fingerprint of what this arm changes in `stage`: a stage whose fingerprint changed is stale."""
        return hashlib.sha256(json.dumps(self.overrides(stage), sort_keys=True).encode()).hexdigest()[:16]


def load_experiment(path: Path) -> Experiment:
    """Parse and validate one experiment file (its name is the file's stem)."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(document, dict):
        raise ValueError(f"{path}: an experiment file holds a mapping (description, controls, defaults, arms)")
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


def max_rounds(experiments: Iterable[Experiment]) -> int:
    """The most rounds any of `experiments` asks for: how many rounds the code location defines."""
    return max((experiment.max_rounds for experiment in experiments), default=0)
