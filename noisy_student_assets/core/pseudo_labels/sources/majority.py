"""`majority`: every sample counts once, the plain head count (self-consistency, Wang et al. 2023)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.pseudo_labels.sources.base import LabelSource

if TYPE_CHECKING:
    from noisy_student_assets.core.settings import PseudoLabelSettings


class MajoritySource(LabelSource):
    name = "majority"
    description = "each sample counts once: the majority answer by mathematical equivalence"

    def sample_weights(self, settings: PseudoLabelSettings) -> pl.Expr:
        return pl.lit(1.0)
