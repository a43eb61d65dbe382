"""Model checkpoints that are not tied to a round."""

from pathlib import Path

import dagster as dg

from noisy_student_assets.checkpoints import materialize_checkpoint
from noisy_student_assets.config import BaseModelConfig
from resources.data_lake import DataLake


@dg.asset(io_manager_key="checkpoint_io_manager", group_name="models")
def base_model(context: dg.AssetExecutionContext, config: BaseModelConfig, data_lake: DataLake) -> dg.Output[Path]:
    """The starting checkpoint as a self-contained safetensors directory with tokenizer and chat template."""
    staged = data_lake.staging_dir()
    context.log.info(f"Resolving model reference {config.reference!r}")
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
        },
    )
