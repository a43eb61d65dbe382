"""The compute every heavy asset runs on. Heavy assets also share the op pool `gpu` (limit 1 in
dagster.yaml), so two GPU steps never overlap, across runs too."""

import os

import dagster as dg
from pydantic import Field

from noisy_student_assets.profiles import by_profile

GPU_POOL = "gpu"


class ComputeResource(dg.ConfigurableResource):
    """Device, dtype and memory share for generation and training."""

    device: str = Field(default=by_profile(cpu="cpu", gpu="cuda"), description="cpu | cuda | auto")
    dtype: str = Field(
        default=by_profile(cpu="float32", gpu="bfloat16"), description="compute dtype: float32 | bfloat16 | float16"
    )
    memory_share: float = Field(
        default=0.85, gt=0, le=1, description="share of accelerator memory vLLM may reserve (GPU only)"
    )
    cpu_threads: int = Field(default=0, ge=0, description="torch CPU threads (0: one per core)")

    @property
    def resolved_device(self) -> str:
        import torch  # here, not at import: loading the code location should not wait for torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("ComputeResource.device is 'cuda' but torch sees no CUDA device (use the cpu profile)")
        return self.device

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        import torch

        torch.set_num_threads(self.cpu_threads or os.cpu_count() or 1)
