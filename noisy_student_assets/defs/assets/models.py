"""Checkpoints that are not tied to a round (each arm's base model and labeled-RL checkpoint), their evaluations,
and the eval-asset factory every checkpoint's evaluation is made by."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import CheckpointInfo, conversion_key, materialize_checkpoint
from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.defs.assets.stages import HEAVY, evaluate, recalled, stage, train_on_labeled
from noisy_student_assets.defs.checks import EVAL_NOT_DEGENERATE, checkpoint_checks, reported_check
from noisy_student_assets.defs.config import BaseModelConfig, EvalConfig, LabeledRLConfig
from noisy_student_assets.defs.lineage import reuse_key
from noisy_student_assets.defs.partitions import ARMS, ASKED_FOR
from resources.data_lake import CONTENT_KEY_FILE
from resources.stage_resources import StageResources

GROUP = "models"
BASE_MODEL = dg.AssetKey(layout.BASE_MODEL)
LABELED_RL = dg.AssetKey(layout.LABELED_RL)


@dg.asset(name=layout.BASE_MODEL, io_manager_key="checkpoint_io_manager", group_name=GROUP, partitions_def=ARMS)
def base_model(
    context: dg.AssetExecutionContext,
    config: BaseModelConfig,
    stage_resources: StageResources,
) -> dg.Output[Path]:
    """The starting checkpoint of the arm, as a self-contained float32 safetensors directory with tokenizer and chat
    template. Arms of one model share its files: an identical published conversion is reused by hard links."""
    lake = stage_resources.lake
    with stage(context, config, stage_resources) as current:
        settings = current.settings
        key = reuse_key(conversion_key(settings.reference, settings.trust_remote_code), settings)
        if published := recalled(current, key, "the same model reference already converted"):
            staged = lake.stage_copy(published)
            info = CheckpointInfo.read(staged)
        else:
            context.log.info(f"Resolving model reference {settings.reference!r}")
            staged = lake.staging_dir()
            info = materialize_checkpoint(settings.reference, staged, trust_remote_code=settings.trust_remote_code)
            (staged / CONTENT_KEY_FILE).write_text(key)
    return current.output(
        staged,
        metadata={
            "reference": info.reference,
            "n_parameters": info.n_parameters,
            "dtype": info.dtype,
            "weights_sha256": info.weights_sha256,
            "chat_template": dg.MetadataValue.md(f"```jinja\n{info.chat_template}\n```"),
        },
    )


@dg.asset(
    name=layout.LABELED_RL,
    io_manager_key="checkpoint_io_manager",
    group_name=GROUP,
    partitions_def=ARMS,
    ins={
        "base_model": dg.AssetIn(BASE_MODEL, input_manager_key="checkpoint_io_manager"),
        "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
        "validation_problems": dg.AssetIn(layout.VALIDATION_PROBLEMS),
    },
    **HEAVY,
)
def labeled_rl_checkpoint(
    context: dg.AssetExecutionContext,
    config: LabeledRLConfig,
    base_model: Path,
    labeled_problems: pl.DataFrame,
    validation_problems: pl.DataFrame,
    stage_resources: StageResources,
) -> dg.Output[Path]:
    """GRPO from `base_model` on the arm's labeled problems, rewarded against their gold answers, until it has
    learned them (its answer reward saturates, or its greedy accuracy on `validation_problems` stalls, which keeps
    the best check's weights; `grpo.stop_reward`, `grpo.validation_every`): round 1's teacher."""
    with stage(context, config, stage_resources) as current:
        staged = train_on_labeled(current, base_model, labeled_problems, validation_problems)
    return current.output(staged)


def checkpoint_eval(
    key: dg.AssetKey,
    checkpoint: dg.AssetKey,
    *,
    group: str,
    problems: str = layout.EVAL_PROBLEMS,
) -> dg.AssetsDefinition:
    """An asset that evaluates the checkpoint asset `checkpoint` on `problems` (the held-out eval set, or
    the arm's validation split)."""

    @dg.asset(
        key=key,
        group_name=group,
        partitions_def=ARMS,
        io_manager_key="eval_io_manager",
        ins={
            "checkpoint_dir": dg.AssetIn(checkpoint, input_manager_key="checkpoint_io_manager"),
            "problems": dg.AssetIn(problems),
        },
        check_specs=[reported_check(EVAL_NOT_DEGENERATE, key)],
        description=f"`{checkpoint.to_user_string()}` evaluated on {problems} (greedy accuracy, maj@k, pass@k, "
        "format rate).",
        **HEAVY,
    )
    def _eval(
        context: dg.AssetExecutionContext,
        config: EvalConfig,
        checkpoint_dir: Path,
        problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> Iterator[dg.Output | dg.AssetCheckResult]:
        with stage(context, config, stage_resources) as current:
            staged, _, health_check = evaluate(current, checkpoint_dir=checkpoint_dir, eval_problems=problems)
        yield current.output(staged)
        yield health_check

    return _eval


base_model_eval = checkpoint_eval(dg.AssetKey(layout.BASE_MODEL_EVAL), BASE_MODEL, group=GROUP)
labeled_rl_eval = checkpoint_eval(dg.AssetKey(layout.LABELED_RL_EVAL), LABELED_RL, group=GROUP)
labeled_rl_validation = checkpoint_eval(
    dg.AssetKey(layout.LABELED_RL_VALIDATION), LABELED_RL, group=GROUP, problems=layout.VALIDATION_PROBLEMS
)


def definitions(asked_for: AskedFor = ASKED_FOR) -> dg.Definitions:
    """The base model and labeled RL with their evaluations; labeled RL's validation where `asked_for` says an arm
    runs it."""
    return dg.Definitions(
        assets=[
            base_model,
            labeled_rl_checkpoint,
            base_model_eval,
            labeled_rl_eval,
            *([labeled_rl_validation] if asked_for.labeled_rl_validation else []),
        ],
        asset_checks=[*checkpoint_checks(BASE_MODEL), *checkpoint_checks(LABELED_RL)],
    )
