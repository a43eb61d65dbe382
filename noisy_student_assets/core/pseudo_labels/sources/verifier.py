"""`verifier`: each sample weighs the round's learned outcome verifier's probability that it is right (the sigmoid
of its score): verifier-weighted voting (Cobbe et al. 2021; Lightman et al. 2023 with an outcome verifier)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.pseudo_labels.sources.base import LabelSource

if TYPE_CHECKING:
    from noisy_student_assets.core.settings import PseudoLabelSettings


class VerifierSource(LabelSource):
    name = "verifier"
    description = (
        "each sample weighs the round's verifier's probability that it is right (round_00N/verifier, trained on "
        "labeled problems)"
    )
    reads_verifier = True

    def sample_weights(self, settings: PseudoLabelSettings) -> pl.Expr:
        return 1.0 / (1.0 + (-pl.col("score")).exp())
