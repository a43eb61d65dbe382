from noisy_student_assets.core.reporting.markdown import figures_markdown, png_data_uri, report_html, write_report

PNG = b"\x89PNG\r\n\x1a\n fake"


def test_figures_link_files_or_inline_their_bytes() -> None:
    assert figures_markdown({"plot": "plot.png"}) == "\n![plot](plot.png)\n"
    assert figures_markdown({"plot": png_data_uri(PNG)}).startswith("\n![plot](data:image/png;base64,iVBORw0KGgo")


def test_report_html_renders_tables_and_images_and_escapes_the_title() -> None:
    page = report_html(
        "a <b> report", "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n" + figures_markdown({"plot": png_data_uri(PNG)})
    )
    assert "<title>a &lt;b&gt; report</title>" in page
    assert "<table>" in page and "<td>1</td>" in page
    assert '<img alt="plot" src="data:image/png;base64,' in page


def test_a_written_report_links_its_figure_files_and_inlines_them_in_html_and_metadata(tmp_path) -> None:
    inline = write_report(tmp_path, "report", "R", "# R\n", {"plot": PNG})
    assert (tmp_path / "plot.png").read_bytes() == PNG
    assert (tmp_path / "report.md").read_text() == "# R\n\n![plot](plot.png)\n"
    assert inline == "# R\n" + figures_markdown({"plot": png_data_uri(PNG)})
    assert png_data_uri(PNG) in (tmp_path / "report.html").read_text()
