"""A round's compute-matched controls, per arm (made by `round_controls(n)`). Each trains the round's GRPO
(the same steps, prompts per step and completions per prompt) on other labels, so that since the base
model it has spent exactly what the round's student spent (the `compute_matched` check says so):

- `labeled_only`: the labeled problems alone, continuing its own chain (round 1 from labeled RL, round N
  from labeled-only N-1): what the user would do anyway, train longer on the labels they have;
- `gold_label`: from the student's init, the unlabeled problems with their true answers: the upper bound;
- `random_label`: from the student's init, the kept problems with their pseudo-labels shuffled among them:
  does label correctness matter at all?
"""

from functools import partial
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.pseudo_labels.control_data import gold_revealed, shuffled_pseudo_labels
from noisy_student_assets.core.training.grpo import HARD_REWARD
from noisy_student_assets.core.training.student import GRPO_MODE
from noisy_student_assets.defs.assets.models import BASE_MODEL, HEAVY_RETRY, checkpoint_eval
from noisy_student_assets.defs.assets.rounds import kept_pseudo_labels, train_from_student_init
from noisy_student_assets.defs.assets.stages import StageRun, stage, train_checkpoint
from noisy_student_assets.defs.checks import checkpoint_checks, compute_matched_check
from noisy_student_assets.defs.config import LabeledOnlyConfig, StudentConfig
from noisy_student_assets.defs.partitions import ARMS, labeled_only_init_key, round_group, round_key, teacher_key
from resources.compute import GPU_POOL
from resources.stage_resources import StageResources


def round_controls(number: int) -> dg.Definitions:
    """Round `number`'s control checkpoints, their evaluations and checks."""
    key = partial(round_key, number)
    student_key, labels_key = key(layout.STUDENT), key(layout.PSEUDO_LABELS)
    checkpoint_key = {control: key(layout.control_checkpoint(control)) for control in layout.CONTROLS}
    heavy = {
        "group_name": round_group(number),
        "partitions_def": ARMS,
        "pool": GPU_POOL,
        "retry_policy": HEAVY_RETRY,
        "io_manager_key": "checkpoint_io_manager",
    }
    teacher = dg.AssetIn(teacher_key(number), input_manager_key="checkpoint_io_manager")
    labeled = dg.AssetIn(layout.LABELED_PROBLEMS)

    @dg.asset(
        key=checkpoint_key[layout.LABELED_ONLY],
        ins={"init": dg.AssetIn(labeled_only_init_key(number), input_manager_key="checkpoint_io_manager"), "labeled_problems": labeled},
        description="Control: the round's GRPO on the labeled problems alone, from the previous round's labeled-only "
        "checkpoint (round 1: labeled RL).",
        **heavy,
    )
    def labeled_only_checkpoint(
        context: dg.AssetExecutionContext,
        config: LabeledOnlyConfig,
        init: Path,
        labeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[Path]:
        with stage(context, config, stage_resources) as current:
            staged = train_checkpoint(current, init_dir=init, labeled=labeled_problems, pseudo_labeled=None)
        return dg.Output(staged, metadata=current.metadata)

    @dg.asset(
        key=checkpoint_key[layout.GOLD_LABEL],
        ins={"teacher": teacher, "labeled_problems": labeled, "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS)},
        deps=[BASE_MODEL],
        description="Control: the round's GRPO from the student's init on the labeled problems and every unlabeled "
        "problem with its true answer (the upper bound; the only asset trained on the hidden gold).",
        **heavy,
    )
    def gold_label_checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        labeled_problems: pl.DataFrame,
        unlabeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[Path]:
        with stage(context, config, stage_resources) as current:
            _refuse_other_training(current)
            revealed = pl.concat([labeled_problems.select("problem_id", "prompt", "gold_answer"), gold_revealed(unlabeled_problems)])
            staged = train_from_student_init(current, teacher, revealed, None)
        return dg.Output(staged, metadata=current.metadata)

    @dg.asset(
        key=checkpoint_key[layout.RANDOM_LABEL],
        ins={"teacher": teacher, "labeled_problems": labeled, "pseudo_labels": dg.AssetIn(labels_key)},
        deps=[BASE_MODEL],
        description="Control: the student's training with the kept pseudo-labels shuffled among the kept problems "
        "(no problem keeps its own label).",
        **heavy,
    )
    def random_label_checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        labeled_problems: pl.DataFrame,
        pseudo_labels: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[Path]:
        with stage(context, config, stage_resources) as current:
            _refuse_other_training(current)
            kept = kept_pseudo_labels(current, pseudo_labels, labels_key)
            shuffled = shuffled_pseudo_labels(kept, seed=current.config.grpo.seed)
            moved = int((shuffled["pseudo_label"] != kept["pseudo_label"]).sum())
            current.metadata |= {"shuffled_labels": shuffled.height, "labels_changed_by_shuffle": moved}
            staged = train_from_student_init(current, teacher, labeled_problems, shuffled)
        return dg.Output(staged, metadata=current.metadata)

    checks = []
    for control_key in checkpoint_key.values():
        checks += [*checkpoint_checks(control_key, partitions_def=ARMS), compute_matched_check(control_key, student_key, ARMS)]
    evals = [checkpoint_eval(key(layout.control_eval(c)), checkpoint_key[c], group=round_group(number)) for c in layout.CONTROLS]
    return dg.Definitions(assets=[labeled_only_checkpoint, gold_label_checkpoint, random_label_checkpoint, *evals], asset_checks=checks)


def _refuse_other_training(current: StageRun) -> None:
    """The gold- and random-label controls train GRPO on 0/1 rewards against their labels: there is no gold or
    shuffled counterpart of sft rows, dpo pairs or vote shares, so another mode or reward is refused."""
    config = current.config
    if config.mode != GRPO_MODE or config.reward != HARD_REWARD:
        raise dg.Failure(
            f"{'/'.join(current.context.asset_key.path)} is defined for mode={GRPO_MODE}, reward={HARD_REWARD}; this arm "
            f"trains mode={config.mode}, reward={config.reward}: list only labeled_only under the experiment's controls",
            allow_retries=False,
        )
