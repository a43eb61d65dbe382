"""Tables as markdown text, for reports and Dagster metadata (no Dagster here)."""

import math

import polars as pl


def markdown_table(frame: pl.DataFrame, max_rows: int | None = None, max_chars: int = 80) -> str:
    """The first `max_rows` rows of `frame` (all when None) as a markdown table: floats to 4
    significant digits (NaN and null as "n/a"), cells cut to `max_chars`, pipes and newlines escaped."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return "n/a" if math.isnan(value) else f"{value:.4g}"
        text = "n/a" if value is None else str(value)
        text = text.replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"

    rows = frame if max_rows is None else frame.head(max_rows)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows.iter_rows()])
