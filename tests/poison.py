"""Fault injection for the guard tests: a training callback that makes chosen steps' gradients NaN."""

from __future__ import annotations

import math

import torch
from transformers import TrainerCallback


class PoisonGradients(TrainerCallback):
    """Makes the gradients of the given optimizer steps (1-based) NaN, through a hook on one trainable
    weight: what a bf16 overflow in the backward pass does to a real run."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self.handle = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 in self.steps:
            weight = next(p for p in model.parameters() if p.requires_grad)
            self.handle = weight.register_hook(lambda grad: torch.full_like(grad, math.nan))

    def on_step_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
