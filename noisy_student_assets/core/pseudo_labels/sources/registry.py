"""The label sources, by name: the one place a source is listed (the arms, the run config, the assets and the
configuration reference look sources up here)."""

from noisy_student_assets.core.pseudo_labels.sources.base import LabelSource
from noisy_student_assets.core.pseudo_labels.sources.confidence import ConfidenceSource
from noisy_student_assets.core.pseudo_labels.sources.majority import MajoritySource
from noisy_student_assets.core.pseudo_labels.sources.verifier import VerifierSource

SOURCES: dict[str, LabelSource] = {
    source.name: source for source in (MajoritySource(), ConfidenceSource(), VerifierSource())
}


def label_source(name: str) -> LabelSource:
    if name not in SOURCES:
        raise ValueError(f"label source {name!r} is not one of {tuple(SOURCES)}")
    return SOURCES[name]
