"""Metadata helpers shared by the assets."""

from __future__ import annotations

import dagster as dg
import polars as pl


def markdown_table(frame: pl.DataFrame, max_rows: int = 5, max_chars: int = 80) -> dg.MetadataValue:
    """The first rows of `frame` as a markdown table, cells cut to `max_chars`, pipes and newlines escaped."""

    def cell(value: object) -> str:
        text = "" if value is None else str(value)
        text = text.replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.head(max_rows).iter_rows()]
    return dg.MetadataValue.md("\n".join(lines))
