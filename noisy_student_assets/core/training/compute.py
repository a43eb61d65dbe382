"""The training compute a checkpoint spent, and the compute of its whole lineage (no Dagster here).

A gain counts only against a control that spent the same compute: the same optimizer steps, prompts and
completions since the base model, trained the same way. Every trained checkpoint stores its own compute, its
lineage's total (its init checkpoint's total plus its own) and its own run's training recipe in `compute.json`;
the base model has none. A round's student and its controls are compared on `MATCHED_FIELDS` and on the recipe
(`RECIPE_FIELDS`: only their data may differ); generated tokens differ by nature (a model that answers in fewer
tokens spends fewer) and are reported, not matched.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import polars as pl

from noisy_student_assets.core.layout import COMPUTE_FILE
from noisy_student_assets.core.settings import GRPOSettings
from noisy_student_assets.core.training.dynamic_sampling import GENERATED_COMPLETIONS, GENERATED_TOKENS
from noisy_student_assets.core.training.shared_prefix import (
    LOSS_TOKENS_COMPLETIONS,
    LOSS_TOKENS_COMPUTED,
    LOSS_TOKENS_UNSHARED,
)

MATCHED_FIELDS = ("optimizer_steps", "prompts", "completions")
RECIPE_FIELDS = (
    "use_lora",
    "lora_r",
    "lora_alpha",
    "learning_rate",
    "beta",
    "epsilon",
    "loss_type",
    "scale_rewards",
    "max_completion_length",
    "num_generations",
    "temperature",
    "dynamic_sampling_replacements",
)
"""The GRPO settings a control shares with its student. The learning rate decays linearly to 0 over the run's steps in
every run (TRL's default schedule, no warmup), so equal steps and learning rates are an equal schedule."""
UNRECORDED_RECIPE = (
    "training recipe not compared: not recorded in a checkpoint trained before recipes were "
    "(materialize it again to compare)"
)


@dataclass(frozen=True)
class TrainingCompute:
    optimizer_steps: int = 0
    prompts: int = 0
    """Prompts trained on (a prompt drawn twice counts twice)."""
    completions: int = 0
    """Completions trained on: sampled for the GRPO groups, or the teacher's in SFT rows and DPO pairs."""
    generated_tokens: int = 0
    """Completion tokens sampled while training (GRPO's groups, the dropped ones included; SFT and DPO sample none)."""
    generated_completions: int = 0
    """Completions sampled while training: GRPO's groups trained on and, under dynamic sampling, the groups of equal
    reward it dropped (`dynamic_sampling`); SFT and DPO sample none. Reported beside the matched fields, not matched:
    which groups a run drops depends on its policy and its data."""
    loss_tokens: int = 0
    """Token positions GRPO's loss forward and backward ran over (`shared_prefix`: each group's prompt once per
    micro-batch, where that is on); reported, not matched: it measures how the loss was computed, not what it
    trained."""
    loss_tokens_unshared: int = 0
    """The positions TRL's own layout runs over for the same completions (each with its prompt)."""
    trained_tokens: int = 0
    """Completion tokens GRPO's loss trained on."""

    def __add__(self, other: TrainingCompute) -> TrainingCompute:
        return TrainingCompute(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def mismatches(self, other: TrainingCompute) -> list[str]:
        """The `MATCHED_FIELDS` on which the two differ, as 'optimizer_steps 12 != 15'."""
        return [
            f"{name} {getattr(self, name)} != {getattr(other, name)}"
            for name in MATCHED_FIELDS
            if getattr(self, name) != getattr(other, name)
        ]


@dataclass(frozen=True)
class CheckpointCompute:
    own: TrainingCompute
    """What training this checkpoint spent."""
    total: TrainingCompute
    """`own` plus the total of the checkpoint it started from: everything spent since the base model."""
    recipe: dict = field(default_factory=dict)
    """How this checkpoint's own run trained (`training_recipe`); empty in a record written before recipes were."""
    stopped: str = ""
    """Why its own run ended where it did (`grpo.stop_reason`); empty in a record written before it was kept."""

    def as_dict(self) -> dict:
        return {
            "own": self.own.as_dict(),
            "total": self.total.as_dict(),
            "recipe": self.recipe,
            "stopped": self.stopped,
        }


def training_recipe(grpo: GRPOSettings) -> dict:
    """The `RECIPE_FIELDS` of a run's GRPO settings (the LoRA rank and alpha only where it trains LoRA adapters)."""
    lora_only = () if grpo.use_lora else ("lora_r", "lora_alpha")
    return {name: getattr(grpo, name) for name in RECIPE_FIELDS if name not in lora_only}


def recipe_mismatches(control: dict, student: dict) -> list[str]:
    """The recipe settings on which a control's run differs from its student's, as 'learning_rate 0.0001 != 0.0002';
    none where either checkpoint predates recipes (`UNRECORDED_RECIPE` says so beside the check's result)."""
    if not control or not student:
        return []
    return [
        f"{name} {control.get(name)!r} != {student.get(name)!r}"
        for name in RECIPE_FIELDS
        if control.get(name) != student.get(name)
    ]


def grpo_compute(log_history: list[dict], steps: int, prompts_per_step: int, num_generations: int) -> TrainingCompute:
    """The compute of a GRPO run of `steps` optimizer steps from TRL's log history (logged every step;
    `completions/mean_length` is the mean completion length of a step's completions). Under dynamic sampling each step
    also logs what its rollout generated, dropped groups included (`dynamic_sampling.STEP_COUNTS`), and those counts
    are what was generated. The loss's token counts are the steps' logged ones (`shared_prefix.LOSS_TOKENS`; 0 in a
    run that logged none)."""
    completions_per_step = prompts_per_step * num_generations

    def logged(key: str) -> list[float]:
        return [entry[key] for entry in log_history if key in entry]

    lengths, generated, tokens = (
        logged("completions/mean_length"),
        logged(GENERATED_COMPLETIONS),
        logged(GENERATED_TOKENS),
    )
    return TrainingCompute(
        optimizer_steps=steps,
        prompts=steps * prompts_per_step,
        completions=steps * completions_per_step,
        generated_tokens=round(sum(tokens)) if tokens else round(sum(lengths) * completions_per_step),
        generated_completions=round(sum(generated)) if generated else steps * completions_per_step,
        loss_tokens=round(sum(logged(LOSS_TOKENS_COMPUTED))),
        loss_tokens_unshared=round(sum(logged(LOSS_TOKENS_UNSHARED))),
        trained_tokens=round(sum(logged(LOSS_TOKENS_COMPLETIONS))),
    )


def supervised_compute(steps: int, prompts_per_step: int, num_generations: int) -> TrainingCompute:
    """The compute of an SFT or DPO run laid out like GRPO's steps (`distillation`): each step trains on
    `prompts_per_step` problems x `num_generations` completions of the teacher's, and samples none."""
    return TrainingCompute(
        optimizer_steps=steps, prompts=steps * prompts_per_step, completions=steps * prompts_per_step * num_generations
    )


def read_compute(checkpoint_dir: Path) -> CheckpointCompute:
    """The compute recorded in a checkpoint; a checkpoint without a record (the base model) spent none."""
    path = checkpoint_dir / COMPUTE_FILE
    if not path.exists():
        return CheckpointCompute(own=TrainingCompute(), total=TrainingCompute())
    recorded = json.loads(path.read_text())
    return CheckpointCompute(
        own=TrainingCompute(**recorded["own"]),
        total=TrainingCompute(**recorded["total"]),
        recipe=recorded.get("recipe", {}),
        stopped=recorded.get("stopped", ""),
    )


def record_compute(
    checkpoint_dir: Path, own: TrainingCompute, init_dir: Path, recipe: dict, stopped: str = ""
) -> CheckpointCompute:
    """Write `compute.json` into a trained checkpoint: its own compute, recipe and why its run stopped, and its
    lineage's total, which depends on where this checkpoint started (a reused run's record is rewritten for its new
    lineage)."""
    compute = CheckpointCompute(own=own, total=read_compute(init_dir).total + own, recipe=recipe, stopped=stopped)
    path = checkpoint_dir / COMPUTE_FILE
    path.unlink(missing_ok=True)  # a new file: a reused checkpoint's is a hard link to the original's
    path.write_text(json.dumps(compute.as_dict(), indent=2))
    return compute


def compute_comparison(
    treatment_metrics: dict[str, float], control_metrics: dict[str, float]
) -> tuple[bool, pl.DataFrame]:
    """Whether two evaluated checkpoints' lineages spent the same `MATCHED_FIELDS`, and a table of both
    (from the `compute/total_*` entries every eval records)."""
    names = [f.name for f in fields(TrainingCompute)]
    rows = [
        {
            "compute": name,
            "treatment": treatment_metrics.get(f"compute/total_{name}"),
            "control": control_metrics.get(f"compute/total_{name}"),
        }
        for name in names
    ]
    matched = all(
        row["treatment"] == row["control"] and row["treatment"] is not None
        for row in rows
        if row["compute"] in MATCHED_FIELDS
    )
    return matched, pl.DataFrame(rows, schema={"compute": pl.Utf8, "treatment": pl.Float64, "control": pl.Float64})
