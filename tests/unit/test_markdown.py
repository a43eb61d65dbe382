from noisy_student_assets.markdown import figures_markdown, png_data_uri, report_html

PNG = b"\x89PNG\r\n\x1a\n fake"


def test_figures_link_files_or_inline_their_bytes() -> None:
    assert figures_markdown({"plot": "plot.png"}) == "\n![plot](plot.png)\n"
    assert figures_markdown({"plot": png_data_uri(PNG)}).startswith("\n![plot](data:image/png;base64,iVBORw0KGgo")


def test_report_html_renders_tables_and_images_and_escapes_the_title() -> None:
    page = report_html("a <b> report", "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n" + figures_markdown({"plot": png_data_uri(PNG)}))
    assert "<title>a &lt;b&gt; report</title>" in page
    assert "<table>" in page and "<td>1</td>" in page
    assert '<img alt="plot" src="data:image/png;base64,' in page
