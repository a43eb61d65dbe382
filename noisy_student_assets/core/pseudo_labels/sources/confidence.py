"""`confidence`: each sample weighs the model's confidence in it, the geometric mean of its tokens' probabilities
(the exponential of its mean token log-probability, recorded at sampling time), and the least confident share of a
problem's samples can be left out of the vote first (DeepConf, Fu et al. 2025: confidence-weighted and
confidence-filtered voting)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from noisy_student_assets.core.pseudo_labels.sources.base import LabelSource

if TYPE_CHECKING:
    from noisy_student_assets.core.settings import PseudoLabelSettings


class ConfidenceSource(LabelSource):
    name = "confidence"
    description = (
        "each sample weighs exp(mean token log-probability); drop_least_confident leaves out that share of a problem's "
        "samples"
    )

    def missing_input(self, generations: pl.DataFrame, scores: pl.DataFrame | None) -> str | None:
        if "mean_logprob" not in generations.columns or generations["mean_logprob"].null_count() == generations.height:
            return (
                "label source 'confidence' reads each sample's token log-probabilities, and these generations have "
                "none: re-materialize them"
            )
        return None

    def sample_weights(self, settings: PseudoLabelSettings) -> pl.Expr:
        confidence = pl.col("mean_logprob").exp()
        # The least confident first (ties: the later sample), so that dropping a share is deterministic.
        rank = pl.struct(pl.col("mean_logprob"), -pl.col("sample_index")).rank("ordinal").over("problem_id")
        dropped = rank <= (pl.len().over("problem_id") * settings.drop_least_confident).floor()
        return pl.when(dropped).then(0.0).otherwise(confidence)
