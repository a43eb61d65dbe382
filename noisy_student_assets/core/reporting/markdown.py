"""Tables and figures as markdown text, and reports as HTML, for the lake, Dagster metadata and MLflow
(no Dagster here)."""

import base64
import html
import math
from collections.abc import Mapping
from pathlib import Path

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


def with_block(page: str, block: str, begin: str, end: str) -> str:
    """`page` with the text from its `begin` marker through its `end` marker replaced by `block` (which carries both
    markers, so that the page can be written again): a generated part of a hand-written page."""
    before, rest = page.split(begin, 1)
    _, after = rest.split(end, 1)
    return before + block + after


def png_data_uri(png: bytes) -> str:
    """A PNG as a data URI: an image that travels inside the text (Dagster metadata, an HTML artifact)."""
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def figures_markdown(sources: Mapping[str, str]) -> str:
    """One image line per figure, `{name: src}`: a file beside the report, or a data URI to inline it."""
    return "".join(f"\n![{name}]({src})\n" for name, src in sources.items())


def report_html(title: str, markdown_text: str) -> str:
    """A markdown report as a standalone HTML page (tables rendered), which MLflow's artifact viewer shows
    as a page, where it shows a `.md` file as raw text."""
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables"])
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:1em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{body}</body></html>\n"
    )


def write_report(directory: Path, name: str, title: str, text: str, figures: Mapping[str, bytes]) -> str:
    """Write a report into `directory`: each figure as `<stem>.png`, `<name>.md` linking them, and `<name>.html`
    with them inlined (`report_html`). Returns the markdown with the figures inlined, for Dagster metadata."""
    for stem, png in figures.items():
        (directory / f"{stem}.png").write_bytes(png)
    (directory / f"{name}.md").write_text(text + figures_markdown({stem: f"{stem}.png" for stem in figures}))
    inline = text + figures_markdown({stem: png_data_uri(png) for stem, png in figures.items()})
    (directory / f"{name}.html").write_text(report_html(title, inline))
    return inline
