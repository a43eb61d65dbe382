"""What a label source is (no Dagster here): a judge of the teacher's samples, whose judgement weighs each sample's
answer in the vote (`consensus.weighted_vote`).

A source is a subclass in a module of its own, listed in `registry.SOURCES`; nothing else dispatches on sources.
It reads the round's generations (answers, token log-probabilities) and, if it needs them, the verifier's scores
of those samples, never a problem's hidden gold: the vote it weighs is audited against the gold afterwards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import polars as pl

if TYPE_CHECKING:
    from noisy_student_assets.core.settings import PseudoLabelSettings

VOTE_COLUMNS = ("problem_id", "sample_index", "answer", "weight")
"""What a source hands the vote: each sample's answer and its weight."""
SCORE_SCHEMA = pl.Schema({"problem_id": pl.Utf8, "sample_index": pl.Int32, "score": pl.Float64})
"""The verifier's scores of a round's samples (`round_00N/verifier_scores`): one logit per sample."""


class LabelSource(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    """One line for the configuration reference."""
    reads_verifier: ClassVar[bool] = False
    """Whether it weighs samples by the round's verifier scores (its arms then train a verifier)."""

    @abstractmethod
    def sample_weights(self, settings: PseudoLabelSettings) -> pl.Expr:
        """Each sample's weight, as an expression over the generations (with the verifier's `score` joined where the
        source reads it); the vote rejects a weight that is negative or not finite."""

    def missing_input(self, generations: pl.DataFrame, scores: pl.DataFrame | None) -> str | None:
        """Why this source cannot judge these samples, or None."""
        if self.reads_verifier and scores is None:
            return (
                f"label source {self.name!r} weighs samples by the round's verifier scores, and there are none: "
                "materialize round_00N/verifier_scores (round_00N_verifier_job)"
            )
        return None

    def weighted(
        self, generations: pl.DataFrame, settings: PseudoLabelSettings, scores: pl.DataFrame | None = None
    ) -> pl.DataFrame:
        """The samples as the vote reads them (`VOTE_COLUMNS`); a ValueError saying why when the source cannot judge
        them."""
        if missing := self.missing_input(generations, scores):
            raise ValueError(missing)
        samples = generations
        if self.reads_verifier:
            samples = generations.join(
                scores.select("problem_id", "sample_index", "score"), on=["problem_id", "sample_index"], how="left"
            )
            unscored = samples.filter(pl.col("score").is_null()).height
            if unscored:
                raise ValueError(
                    f"the verifier scored {samples.height - unscored} of the round's {samples.height} samples: "
                    "its scores are of other samples"
                )
            if not samples["score"].is_finite().all():
                raise ValueError("the verifier gave a sample a non-finite score: it cannot weigh a vote")
        return samples.with_columns(self.sample_weights(settings).cast(pl.Float64).alias("weight")).select(VOTE_COLUMNS)
