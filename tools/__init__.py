"""Tooling around the pipeline, outside its two floors: the offline wheelhouse (`make wheelhouse`), the check of a
CUDA node (`make gpu-check`) and the tiny models both run."""
