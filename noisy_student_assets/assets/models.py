"""Checkpoints that are not tied to a round, and their evaluations."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.assets.stages import evaluate, train_checkpoint
from noisy_student_assets.checkpoints import materialize_checkpoint
from noisy_student_assets.checks import checkpoint_checks, eval_not_degenerate_spec
from noisy_student_assets.config import BaseModelConfig, EvalConfig, LabeledRLConfig, resolved_config
from resources.compute import GPU_POOL, ComputeResource
from resources.data_lake import DataLake
from resources.tracking import MlflowTracking

GROUP = "models"
HEAVY_RETRY = dg.RetryPolicy(max_retries=1, delay=10)


@dg.asset(io_manager_key="checkpoint_io_manager", group_name=GROUP)
def base_model(
    context: dg.AssetExecutionContext, config: BaseModelConfig, data_lake: DataLake, tracking: MlflowTracking
) -> dg.Output[Path]:
    """The starting checkpoint as a self-contained safetensors directory with tokenizer and chat template."""
    staged = data_lake.staging_dir()
    context.log.info(f"Resolving model reference {config.reference!r}")
    run_config = resolved_config(config)
    with tracking.start_run(context, "base_model", {"config": run_config}) as run:
        info = materialize_checkpoint(
            config.reference, staged, dtype=config.dtype, trust_remote_code=config.trust_remote_code
        )
    return dg.Output(
        staged,
        metadata={
            "reference": info.reference,
            "n_parameters": info.n_parameters,
            "dtype": info.dtype,
            "weights_sha256": info.weights_sha256,
            "chat_template": dg.MetadataValue.md(f"```jinja\n{info.chat_template}\n```"),
            "config": dg.MetadataValue.json(run_config),
            "mlflow_run_id": run.info.run_id,
        },
    )


@dg.asset(io_manager_key="checkpoint_io_manager", group_name=GROUP, pool=GPU_POOL, retry_policy=HEAVY_RETRY)
def labeled_rl_checkpoint(
    context: dg.AssetExecutionContext,
    config: LabeledRLConfig,
    base_model: Path,
    labeled_problems: pl.DataFrame,
    compute: ComputeResource,
    tracking: MlflowTracking,
    data_lake: DataLake,
) -> dg.Output[Path]:
    """GRPO from `base_model` on the labeled problems, rewarded against their gold answers: round 1's teacher."""
    staged, metadata = train_checkpoint(
        context,
        "labeled_rl_checkpoint",
        init_dir=base_model,
        labeled=labeled_problems,
        pseudo_labeled=None,
        grpo=config.grpo,
        run_config=resolved_config(config),
        compute=compute,
        tracking=tracking,
        lake=data_lake,
    )
    return dg.Output(staged, metadata=metadata)


def checkpoint_eval(name: str, checkpoint: str, group: str = GROUP) -> dg.AssetsDefinition:
    """An asset that evaluates the checkpoint asset `checkpoint` on eval_problems."""

    @dg.asset(
        name=name,
        group_name=group,
        pool=GPU_POOL,
        retry_policy=HEAVY_RETRY,
        ins={"checkpoint_dir": dg.AssetIn(checkpoint, input_manager_key="checkpoint_io_manager")},
        check_specs=[eval_not_degenerate_spec(name)],
        description=f"`{checkpoint}` evaluated on eval_problems (greedy accuracy, maj@k, pass@k, format rate).",
    )
    def _eval(
        context: dg.AssetExecutionContext,
        config: EvalConfig,
        checkpoint_dir: Path,
        eval_problems: pl.DataFrame,
        compute: ComputeResource,
        tracking: MlflowTracking,
        data_lake: DataLake,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        _, metadata, health_check = evaluate(
            context,
            name,
            checkpoint_dir=checkpoint_dir,
            eval_problems=eval_problems,
            config=config,
            compute=compute,
            tracking=tracking,
            lake=data_lake,
        )
        yield dg.MaterializeResult(metadata=metadata)
        yield health_check

    return _eval


base_model_eval = checkpoint_eval("base_model_eval", "base_model")
labeled_rl_eval = checkpoint_eval("labeled_rl_eval", "labeled_rl_checkpoint")
base_model_checks = checkpoint_checks("base_model")
labeled_rl_checkpoint_checks = checkpoint_checks("labeled_rl_checkpoint")
