"""A round's compute-matched controls, per arm (made by `round_controls(n)`). Each trains the round's GRPO
(the same steps, prompts per step and completions per prompt, and the completion cap the teacher's samples give
the student) on other labels, so that since the base model it has spent exactly what the round's student spent
(the `compute_matched` check says so):

- `labeled_only`: the labeled problems alone, continuing its own chain (round 1 from labeled RL, round N
  from labeled-only N-1): what the user would do anyway, train longer on the labels they have;
- `gold_label`: from the student's init, the unlabeled problems with their true answers: the upper bound;
- `random_label`: from the student's init, the kept problems with their pseudo-labels shuffled among them:
  does label correctness matter at all?
- `dose_label`: from the student's init, the unlabeled problems with their true answers, a share `dose_rho` of them
  made wrong: where on the accuracy of its labels a student breaks even with labeled-only;
- `kept_gold_label`: from the student's init, the problems the label source kept with their true answers: coverage
  apart from accuracy.

Each label control records the labels it trained the unlabeled problems on (`layout.TRAINING_LABELS_FILE`).
"""

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.core.pseudo_labels.control_data import (
    dosed_gold_labels,
    gold_revealed,
    kept_gold_labels,
    shuffled_pseudo_labels,
)
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

LabeledControl = tuple[StudentData, pl.DataFrame]
"""What a label control trains on, and the label (`problem_id`, `label`) it gives each unlabeled problem it trains."""


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


def _gold_inputs(number: int, *, kept: bool = False) -> dict[str, dg.AssetIn]:
    """What a control trained on the unlabeled problems' gold reads: the eval problems to refuse a test-time arm, and
    the round's pseudo-labels where it keeps their problems or takes the teacher's wrong answers."""
    return {
        "teacher": dg.AssetIn(teacher_key(number), input_manager_key="checkpoint_io_manager"),
        "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
        "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS),
        "eval_problems": dg.AssetIn(layout.EVAL_PROBLEMS),  # read to refuse training on its gold
        "base_model": BASE_MODEL_INPUT,
        "generations": _generations(number),
        **({"pseudo_labels": dg.AssetIn(round_key(number, layout.PSEUDO_LABELS))} if kept else {}),
    }


def _refuse_held_out_gold(current: StageRun, control: str, unlabeled: pl.DataFrame, eval_problems: pl.DataFrame):
    """A test-time arm's unlabeled problems are held-out ones: a control on their gold would train on eval answers."""
    held_out = unlabeled.join(eval_problems, on="problem_id", how="semi").height
    if held_out:
        raise dg.Failure(
            f"{held_out} of arm {current.partition}'s unlabeled problems are held-out eval problems (a test-time "
            f"arm): the {control.replace('_', '-')} control would train on their eval answers",
            allow_retries=False,
        )


def _with_labeled(current: StageRun, labeled_problems: pl.DataFrame, gold: pl.DataFrame) -> LabeledControl:
    """`gold` (labeled-problem columns) after the labeled problems the student trains on, and the labels it gives."""
    labeled = labeled_rows(labeled_problems, current.settings.pseudo_only).select("problem_id", "prompt", "gold_answer")
    rows = gold.select("problem_id", "prompt", "gold_answer")
    return StudentData(pl.concat([labeled, rows])), rows.select("problem_id", pl.col("gold_answer").alias("label"))


def _gold_label_asset(number: int) -> dg.AssetsDefinition:
    @dg.asset(
        key=round_key(number, layout.control_checkpoint(layout.GOLD_LABEL)),
        ins=_gold_inputs(number),
        description="Control: the round's GRPO from the student's init on the labeled problems and every unlabeled "
        "problem with its true answer (the upper bound; trained on the hidden gold). Refused on a test-time arm, "
        "whose hidden gold is the held-out set's.",
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
        def revealed(current: StageRun) -> LabeledControl:
            _refuse_held_out_gold(current, layout.GOLD_LABEL, unlabeled_problems, eval_problems)
            return _with_labeled(current, labeled_problems, gold_revealed(unlabeled_problems))

        yield from _student_control(
            context, config, stage_resources, layout.GOLD_LABEL, (teacher, base_model), generations, revealed
        )

    return gold_label_checkpoint


def _dosed(current: StageRun, unlabeled: pl.DataFrame, pseudo_labels: LakeTable, _: dg.AssetKey) -> pl.DataFrame:
    """The unlabeled problems' true answers, a share dose_rho of them replaced by a wrong one."""
    from noisy_student_assets.core.grading import answers_equivalent

    rho = current.settings.dose_rho
    if rho is None:
        raise dg.Failure(f"arm {current.partition} sets no dose_rho for its dose-label control", allow_retries=False)
    labels = dosed_gold_labels(
        unlabeled,
        pseudo_labels.frame,
        rho,
        seed=current.settings.grpo.seed,
        equivalent=lambda gold, label: answers_equivalent(gold, label) is not False,  # ungraded: not made wrong
    )
    current.metadata |= {"dose_rho": rho, "labels_made_wrong": int(labels["replaced"].sum())}
    return labels


def _kept_gold(current: StageRun, unlabeled: pl.DataFrame, pseudo_labels: LakeTable, key: dg.AssetKey) -> pl.DataFrame:
    """The true answers of the problems whose pseudo-labels the student keeps."""
    return kept_gold_labels(unlabeled, kept_pseudo_labels(current, pseudo_labels, key))


_GOLD_ON_LABELS = {
    layout.DOSE_LABEL: (
        "every unlabeled problem with its true answer, a share dose_rho of them replaced by a wrong answer (the "
        "teacher's wrong majority answer where it has one): a student of known label accuracy",
        _dosed,
    ),
    layout.KEPT_GOLD_LABEL: (
        "the problems whose pseudo-labels the student keeps, with their true answers: the label source's coverage "
        "at perfect accuracy",
        _kept_gold,
    ),
}
"""The controls on gold answers that the round's pseudo-labels shape: what they train on, and the function of the
stage, the unlabeled problems, the pseudo-labels and their key that gives those rows (labeled-problem columns)."""


def _gold_on_labels_asset(number: int, control: str) -> dg.AssetsDefinition:
    """A control of `_GOLD_ON_LABELS`, trained from the student's init on the labeled problems and its rows. Refused
    on a test-time arm."""
    description, labels_of = _GOLD_ON_LABELS[control]
    labels_key = round_key(number, layout.PSEUDO_LABELS)

    @dg.asset(
        key=round_key(number, layout.control_checkpoint(control)),
        ins=_gold_inputs(number, kept=True),
        description=f"Control: the round's GRPO from the student's init on the labeled problems and {description}. "
        "Refused on a test-time arm, whose hidden gold is the held-out set's.",
        **_heavy(number),
    )
    def checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        labeled_problems: pl.DataFrame,
        unlabeled_problems: pl.DataFrame,
        eval_problems: pl.DataFrame,
        base_model: Path,
        generations: pl.DataFrame,
        pseudo_labels: LakeTable,
        stage_resources: StageResources,
    ) -> Iterator[dg.Output[Path]]:
        def training_data(current: StageRun) -> LabeledControl:
            _refuse_held_out_gold(current, control, unlabeled_problems, eval_problems)
            rows = labels_of(current, unlabeled_problems, pseudo_labels, labels_key)
            return _with_labeled(current, labeled_problems, rows)

        yield from _student_control(
            context, config, stage_resources, control, (teacher, base_model), generations, training_data
        )

    return checkpoint


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
        def shuffled(current: StageRun) -> LabeledControl:
            kept = kept_pseudo_labels(current, pseudo_labels, labels_key)
            labels = shuffled_pseudo_labels(kept, seed=current.settings.grpo.seed)
            moved = int((labels["pseudo_label"] != kept["pseudo_label"]).sum())
            current.metadata |= {"shuffled_labels": labels.height, "labels_changed_by_shuffle": moved}
            trained_on = labels.select("problem_id", pl.col("pseudo_label").alias("label"))
            return StudentData(labeled_rows(labeled_problems, current.settings.pseudo_only), labels), trained_on

        yield from _student_control(
            context, config, stage_resources, layout.RANDOM_LABEL, (teacher, base_model), generations, shuffled
        )

    return random_label_checkpoint


CONTROL_CHECKPOINTS: dict[str, Callable[[int], dg.AssetsDefinition]] = {
    layout.LABELED_ONLY: _labeled_only_asset,
    layout.GOLD_LABEL: _gold_label_asset,
    layout.RANDOM_LABEL: _random_label_asset,
    **{control: partial(_gold_on_labels_asset, control=control) for control in _GOLD_ON_LABELS},
}
"""Each control's checkpoint asset of a round: its inputs, what it trains on, its description."""


def _student_control(
    context: dg.AssetExecutionContext,
    config: StudentConfig,
    stage_resources: StageResources,
    control: str,
    inits: tuple[Path, Path],
    generations: pl.DataFrame,
    training_data: Callable[[StageRun], LabeledControl],
) -> Iterator[dg.Output[Path]]:
    """A control trained as the round's student is, from its init (`inits`: the teacher, the base model) and with its
    completion cap (from the teacher's samples, `generations`), on other data (`training_data`, in the stage, with
    the labels it gives the unlabeled problems, recorded in the checkpoint); nothing where the arm's experiment does
    not ask for it."""
    if skipped := not_asked_for(context, stage_resources):
        context.log.info(skipped)
        return
    with stage(context, config, stage_resources) as current:
        _refuse_unmatched_training(current, control)
        capped_to_teacher(current, generations)
        data, labels = training_data(current)
        staged = train_from_student_init(current, *inits, data)
        labels.write_parquet(staged / layout.TRAINING_LABELS_FILE)
        current.metadata["trained_labels"] = labels.height
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
