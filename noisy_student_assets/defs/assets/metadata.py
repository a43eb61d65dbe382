"""Metadata helpers shared by the assets."""

from __future__ import annotations

import dagster as dg
import polars as pl

from noisy_student_assets.core.reporting import markdown


def markdown_table(frame: pl.DataFrame, max_rows: int | None = 5, max_chars: int = 80) -> dg.MetadataValue:
    """The first rows of `frame` as a markdown table (see `noisy_student_assets.core.reporting.markdown`)."""
    return dg.MetadataValue.md(markdown.markdown_table(frame, max_rows, max_chars))


def png_markdown(title: str, png: bytes) -> dg.MetadataValue:
    """A PNG inlined as a data URI, which the Dagster UI renders in the metadata panel."""
    return dg.MetadataValue.md(f"![{title}]({markdown.png_data_uri(png)})")
