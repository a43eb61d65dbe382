"""A round's compute-matched controls, per arm (made by `round_controls(n)`). Each trains the round's GRPO
(the same steps, prompts per step and completions per prompt, and the completion cap the teacher's samples give
the student) on other labels, so that since the base model it has spent exactly what the round's student spent
(the `compute_matched` check says so):

- `labeled_only`: the labeled problems alone, continuing its own chain (round 1 from labeled RL, round N
  from labeled-only N-1): what the user would do anyway, train longer on the labels they have;
- `gold_label`: from the student's init, the unlabeled problems with their true answers: the upper bound;
- `random_label`: from the student's init, the kept problems with their pseudo-labels shuffled among them:
  does label correctness matter at all?
"""

from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.core.pseudo_labels.control_data import gold_revealed, shuffled_pseudo_labels
from noisy_student_assets.core.pseudo_labels.student_data import labeled_rows
from noisy_student_assets.core.training.modes.base import StudentData
from noisy_student_assets.core.training.modes.registry import student_mode
from noisy_student_assets.defs.assets.models import checkpoint_eval
from noisy_student_assets.defs.assets.rounds import BASE_MODEL_INPUT, kept_pseudo_labels, train_from_student_init
from noisy_student_assets.defs.assets.stages import (
    HEAVY,
    StageRun,
    capped_to_teacher,
    not_asked_for,
    stage,
    train_on_labeled,
)
from noisy_student_assets.defs.checks import checkpoint_checks, compute_matched_check
from noisy_student_assets.defs.config import LabeledOnlyConfig, StudentConfig
from noisy_student_assets.defs.partitions import (
    ARMS,
    ASKED_FOR,
    labeled_only_init_key,
    round_group,
    round_key,
    teacher_key,
)
from resources.data_lake import LakeTable
from resources.stage_resources import StageResources


def round_controls(number: int, asked_for: AskedFor = ASKED_FOR) -> dg.Definitions:
    """Round `number`'s control checkpoints that `asked_for` lists (`CONTROL_CHECKPOINTS`), their evaluations and
    checks."""
    student_key = round_key(number, layout.STUDENT)
    checkpoint_key = {control: round_key(number, layout.control_checkpoint(control)) for control in layout.CONTROLS}
    checks = []
    for control in asked_for.controls:
        checks += [
            *checkpoint_checks(checkpoint_key[control]),
            compute_matched_check(checkpoint_key[control], student_key),
        ]
    evals = [
        checkpoint_eval(round_key(number, layout.control_eval(c)), checkpoint_key[c], group=round_group(number))
        for c in asked_for.controls
    ]
    checkpoints = [CONTROL_CHECKPOINTS[control](number) for control in asked_for.controls]
    return dg.Definitions(assets=[*checkpoints, *evals], asset_checks=checks)


def _heavy(number: int) -> dict:
    """What a control checkpoint is declared with. output_required: a control the arm's experiment does not list
    yields nothing (`not_asked_for`)."""
    return {
        "group_name": round_group(number),
        "partitions_def": ARMS,
        "io_manager_key": "checkpoint_io_manager",
        "output_required": False,
        **HEAVY,
    }


def _generations(number: int) -> dg.AssetIn:
    """The round's samples: the cap of a control's completions comes from the teacher's samples."""
    return dg.AssetIn(round_key(number, layout.GENERATIONS))


def _labeled_only_asset(number: int) -> dg.AssetsDefinition:
    @dg.asset(
        key=round_key(number, layout.control_checkpoint(layout.LABELED_ONLY)),
        ins={
            "init": dg.AssetIn(labeled_only_init_key(number), input_manager_key="checkpoint_io_manager"),
            "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
            "generations": _generations(number),
        },
        description="Control: the round's GRPO on the labeled problems alone, from the previous round's labeled-only "
        "checkpoint (round 1: labeled RL).",
        **_heavy(number),
    )
    def labeled_only_checkpoint(
        context: dg.AssetExecutionContext,
        config: LabeledOnlyConfig,
        init: Path,
        labeled_problems: pl.DataFrame,
        generations: pl.DataFrame,
        stage_resources: StageResources,
    ) -> Iterator[dg.Output[Path]]:
        if skipped := not_asked_for(context, stage_resources):
            context.log.info(skipped)
            return
        with stage(context, config, stage_resources) as current:
            capped_to_teacher(current, generations)
            staged = train_on_labeled(current, init, labeled_problems)
        yield current.output(staged)

    return labeled_only_checkpoint


def _gold_label_asset(number: int) -> dg.AssetsDefinition:
    @dg.asset(
        key=round_key(number, layout.control_checkpoint(layout.GOLD_LABEL)),
        ins={
            "teacher": dg.AssetIn(teacher_key(number), input_manager_key="checkpoint_io_manager"),
            "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
            "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS),
            "eval_problems": dg.AssetIn(layout.EVAL_PROBLEMS),  # read to refuse training on its gold
            "base_model": BASE_MODEL_INPUT,
            "generations": _generations(number),
        },
        description="Control: the round's GRPO from the student's init on the labeled problems and every unlabeled "
        "problem with its true answer (the upper bound; the only asset trained on the hidden gold). Refused on a "
        "test-time arm, whose hidden gold is the held-out set's.",
        **_heavy(number),
    )
    def gold_label_checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        labeled_problems: pl.DataFrame,
        unlabeled_problems: pl.DataFrame,
        eval_problems: pl.DataFrame,
        base_model: Path,
        generations: pl.DataFrame,
        stage_resources: StageResources,
    ) -> Iterator[dg.Output[Path]]:
        def revealed(current: StageRun) -> StudentData:
            held_out = unlabeled_problems.join(eval_problems, on="problem_id", how="semi").height
            if held_out:
                raise dg.Failure(
                    f"{held_out} of arm {current.partition}'s unlabeled problems are held-out eval problems (a "
                    "test-time arm): the gold-label control would train on their eval answers",
                    allow_retries=False,
                )
            labeled = labeled_rows(labeled_problems, current.settings.pseudo_only)
            gold = labeled.select("problem_id", "prompt", "gold_answer")
            return StudentData(pl.concat([gold, gold_revealed(unlabeled_problems)]))

        yield from _student_control(
            context, config, stage_resources, layout.GOLD_LABEL, (teacher, base_model), generations, revealed
        )

    return gold_label_checkpoint


def _random_label_asset(number: int) -> dg.AssetsDefinition:
    labels_key = round_key(number, layout.PSEUDO_LABELS)

    @dg.asset(
        key=round_key(number, layout.control_checkpoint(layout.RANDOM_LABEL)),
        ins={
            "teacher": dg.AssetIn(teacher_key(number), input_manager_key="checkpoint_io_manager"),
            "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
            "pseudo_labels": dg.AssetIn(labels_key),
            "base_model": BASE_MODEL_INPUT,
            "generations": _generations(number),
        },
        description="Control: the student's training with the kept pseudo-labels shuffled among the kept problems "
        "(no problem keeps its own label).",
        **_heavy(number),
    )
    def random_label_checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        labeled_problems: pl.DataFrame,
        pseudo_labels: LakeTable,
        base_model: Path,
        generations: pl.DataFrame,
        stage_resources: StageResources,
    ) -> Iterator[dg.Output[Path]]:
        def shuffled(current: StageRun) -> StudentData:
            kept = kept_pseudo_labels(current, pseudo_labels, labels_key)
            labels = shuffled_pseudo_labels(kept, seed=current.settings.grpo.seed)
            moved = int((labels["pseudo_label"] != kept["pseudo_label"]).sum())
            current.metadata |= {"shuffled_labels": labels.height, "labels_changed_by_shuffle": moved}
            return StudentData(labeled_rows(labeled_problems, current.settings.pseudo_only), labels)

        yield from _student_control(
            context, config, stage_resources, layout.RANDOM_LABEL, (teacher, base_model), generations, shuffled
        )

    return random_label_checkpoint


CONTROL_CHECKPOINTS: dict[str, Callable[[int], dg.AssetsDefinition]] = {
    layout.LABELED_ONLY: _labeled_only_asset,
    layout.GOLD_LABEL: _gold_label_asset,
    layout.RANDOM_LABEL: _random_label_asset,
}
"""Each control's checkpoint asset of a round: its inputs, what it trains on, its description."""


def _student_control(
    context: dg.AssetExecutionContext,
    config: StudentConfig,
    stage_resources: StageResources,
    control: str,
    inits: tuple[Path, Path],
    generations: pl.DataFrame,
    training_data: Callable[[StageRun], StudentData],
) -> Iterator[dg.Output[Path]]:
    """A control trained as the round's student is, from its init (`inits`: the teacher, the base model) and with its
    completion cap (from the teacher's samples, `generations`), on other data (`training_data`, in the stage);
    nothing where the arm's experiment does not ask for it."""
    if skipped := not_asked_for(context, stage_resources):
        context.log.info(skipped)
        return
    with stage(context, config, stage_resources) as current:
        _refuse_unmatched_training(current, control)
        capped_to_teacher(current, generations)
        staged = train_from_student_init(current, *inits, training_data(current))
    yield current.output(staged)


def _refuse_unmatched_training(current: StageRun, control: str) -> None:
    """A control the arm's student mode does not admit (`StudentMode.admits`) would not be the student's training on
    other labels: it is refused."""
    settings = current.settings
    if not student_mode(settings.mode).admits(control, settings):
        raise dg.Failure(
            f"{'/'.join(current.context.asset_key.path)} trains GRPO with the hard reward on its own labels, no "
            f"counterpart of mode={settings.mode}, reward={settings.reward}, "
            f"unlabeled_share={settings.unlabeled_share}: list only labeled_only under the experiment's controls",
            allow_retries=False,
        )
