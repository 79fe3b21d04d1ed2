"""Export writes real PDF/SVG/PNG/HTML files, and fails clearly without a browser; so does
the export button."""

from __future__ import annotations

import struct
import subprocess
import sys

import plotly.graph_objects as go
import pytest

from steerlab import exporting as export_module
from steerlab.exporting import export, export_button, find_browser

needs_browser = pytest.mark.skipif(
    find_browser() is None,
    reason="no Chrome/Chromium for kaleido: run scripts/install_browser.sh or set BROWSER_PATH",
)


@pytest.fixture
def fig() -> go.Figure:
    return go.Figure(go.Scatter(x=[0, 1, 2], y=[2, 0, 1], name="line"), layout={"title": "t"})


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@needs_browser
@pytest.mark.parametrize(
    ("suffix", "magic"), [(".pdf", b"%PDF-"), (".svg", b"<svg"), (".png", b"\x89PNG")]
)
def test_static_export_writes_a_file_of_its_type(fig, tmp_path, suffix, magic):
    path = export(fig, tmp_path / "sub" / f"figure{suffix}")
    data = path.read_bytes()
    assert path == tmp_path / "sub" / f"figure{suffix}"
    assert data.startswith(magic)
    assert len(data) > 2000  # a real drawing, not an empty shell
    if suffix == ".svg":
        assert b"</svg>" in data and b"scatterlayer" in data


@needs_browser
@pytest.mark.parametrize(
    ("scale", "width", "height"), [(1, 400, 300), (2, None, None), (3, 200, 100)]
)
def test_png_pixels_follow_size_and_scale(fig, tmp_path, scale, width, height):
    path = export(fig, tmp_path / "f.png", scale=scale, width=width, height=height)
    # plotly's default layout size is 700 x 500 CSS pixels.
    assert _png_size(path.read_bytes()) == (scale * (width or 700), scale * (height or 500))


@needs_browser
def test_suffix_is_case_insensitive(fig, tmp_path):
    assert export(fig, tmp_path / "f.PDF").read_bytes().startswith(b"%PDF-")


def test_html_export_is_self_contained(fig, tmp_path):
    html = export(fig, tmp_path / "f.html").read_text()
    assert "Plotly.newPlot" in html
    assert '<script src="https://cdn' not in html  # plotly.js inlined: opens offline
    assert len(html) > 1_000_000


def test_unknown_suffix_is_refused_before_any_work(fig, tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "_start_kaleido", _must_not_run)
    with pytest.raises(ValueError, match=r"\.jpg.*\.pdf, \.svg, \.png, \.html"):
        export(fig, tmp_path / "new" / "f.jpg")
    with pytest.raises(ValueError, match="suffix"):
        export(fig, tmp_path / "f")
    assert not (tmp_path / "new").exists()


def test_missing_browser_is_a_clear_error_and_html_still_works(fig, tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    assert find_browser() is None
    for suffix in (".pdf", ".svg", ".png"):
        with pytest.raises(RuntimeError) as error:
            export(fig, tmp_path / f"f{suffix}")
        message = str(error.value)
        assert "apt-get install -y chromium" in message and "BROWSER_PATH" in message
        assert str(tmp_path / "no-such-chrome") in message
        assert not (tmp_path / f"f{suffix}").exists()
    assert export(fig, tmp_path / "f.html").stat().st_size > 1_000_000


def test_no_browser_on_path_is_reported(fig, tmp_path, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_browser() is None
    with pytest.raises(RuntimeError, match="none of chromium.*is on PATH"):
        export(fig, tmp_path / "f.svg")


def test_browser_path_override_wins(tmp_path, monkeypatch):
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(fake))
    assert find_browser() == str(fake)


def _must_not_run() -> None:
    raise AssertionError("kaleido started for a refused suffix")


def test_importing_export_stays_light():
    # steerlab.exporting is reachable from the core facade: plotly and kaleido load on first export.
    code = "import sys, steerlab.exporting; print(sorted({'plotly', 'kaleido'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_facade_export_stays_the_function_after_exporting_loads():
    import steerlab as sl
    import steerlab.exporting  # noqa: F401  (binds steerlab.exporting, never steerlab.export)

    assert callable(sl.export) and sl.export is export
    assert sl.export_button is export_button


def _pdf_page_points(data: bytes) -> tuple[float, float]:
    import re

    x0, y0, x1, y1 = map(float, re.search(rb"MediaBox\s*\[([^\]]*)\]", data).group(1).split())
    return x1 - x0, y1 - y0


@needs_browser
@pytest.mark.parametrize(("width", "inches"), [("column", 3.4), ("page", 7.0)])
def test_named_widths_print_at_paper_size_with_legible_text(fig, tmp_path, width, inches):
    page_w, page_h = _pdf_page_points(export(fig, tmp_path / "f.pdf", width=width).read_bytes())
    assert page_w == pytest.approx(inches * 72, abs=1)
    assert page_h == pytest.approx(page_w * 500 / 700, abs=1)  # the figure's own aspect
    svg = export(fig, tmp_path / "f.svg", width=width).read_text()
    import re

    sizes = [float(s) for s in re.findall(r"font-size: ?([\d.]+)px", svg)]
    assert sizes and all(7.5 <= s * 0.75 <= 9.5 for s in sizes), sizes  # points, printed
    png = export(fig, tmp_path / "f.png", width=width).read_bytes()
    assert _png_size(png)[0] == pytest.approx(inches * 300, abs=4)  # 300 dpi


@needs_browser
def test_export_uses_the_paper_theme_on_a_copy(fig, tmp_path):
    template_before = fig.layout.template.to_plotly_json()
    svg = export(fig, tmp_path / "f.svg").read_text()
    assert "rgb(229, 236, 246)" not in svg  # plotly's grey plot background
    assert "fill: rgb(255, 255, 255)" in svg or "fill:#fff" in svg.replace(" ", "")
    assert fig.layout.template.to_plotly_json() == template_before
    kept = export(fig, tmp_path / "g.svg", theme=None).read_text()
    assert "rgb(229, 236, 246)" in kept


def test_unknown_width_name_or_theme_is_refused_before_any_work(fig, tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "_start_kaleido", _must_not_run)
    with pytest.raises(ValueError, match="column"):
        export(fig, tmp_path / "f.pdf", width="colum")
    with pytest.raises(ValueError, match="theme"):
        export(fig, tmp_path / "f.pdf", theme="dark")
    assert not list(tmp_path.iterdir())


def test_export_button_writes_html_and_reports(tmp_path):
    box = export_button(go.Figure(go.Bar(y=[1])), tmp_path / "fig", default_format="html")
    dropdown, button, label = box.children
    assert list(dropdown.options) == ["pdf", "svg", "png", "html"]
    button.click()
    html = (tmp_path / "fig.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html>") and "Plotly.newPlot" in html
    assert label.value.startswith(f"saved {tmp_path / 'fig.html'}")


def test_export_button_reports_a_missing_browser(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    box = export_button(go.Figure(), tmp_path / "fig")
    box.children[1].click()
    assert box.children[2].value.startswith("failed:")
    assert "apt-get install -y chromium" in box.children[2].value
    assert not (tmp_path / "fig.pdf").exists()
