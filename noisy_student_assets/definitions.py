"""The code location (`dagster dev -w workspace.yaml`, `dagster asset materialize -m
noisy_student_assets.definitions`)."""

from noisy_student_assets.defs.code_location import defs

__all__ = ["defs"]
