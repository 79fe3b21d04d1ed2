"""Screenshots of the live panel in a real JupyterLab, for docs/images/.

    .venv/bin/python scripts/panel_screenshots.py docs/images

Starts JupyterLab the way ``make lab`` does (repository root, opening on tutorials/, test
plumbing hidden), runs tutorial 04 in headless Debian chromium through Playwright, moves the
alpha slider to 4 with the keyboard, and saves the page with the file browser open at 1024
and 1440 px wide, 768 px tall (a laptop screen). Reuses the browser-test fixtures' helpers (tests/browser/conftest.py).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "browser"))
from conftest import (  # noqa: E402  (the browser tests' helpers, not a package)
    CHROMIUM_FLAGS,
    LabServer,
    _free_port,
    _isolated_env,
    _stop,
    _wait_for_server,
    find_chromium,
    run_notebook,
)

HIDDEN = '["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "conftest.py", "sanitize.cfg"]'
NOTEBOOK = "tutorials/04_live_panel.ipynb"
PRESSES = 8  # alpha step 0.5: 0 -> 4


def start_lab(home: Path) -> tuple[subprocess.Popen, LabServer]:
    """JupyterLab on the repository root, configured as ``make lab`` configures it."""
    port = _free_port()
    log = home / "server.log"
    env = _isolated_env(home)
    no_autosave = (
        home / "settings" / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    )
    no_autosave.parent.mkdir(parents=True, exist_ok=True)
    no_autosave.write_text('{"autosave": false}')  # never write the run back into the repository
    every_cell = (
        home / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    )
    every_cell.parent.mkdir(parents=True, exist_ok=True)
    every_cell.write_text('{"windowingMode": "none"}')  # draw every cell, for screenshots
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={REPO}",
        "--LabApp.default_url=/lab/tree/tutorials", f"--ContentsManager.hide_globs={HIDDEN}",
        "--allow-root",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_for_server(url, process, log)
    return process, LabServer(url=url, root_dir=REPO, log=log)


def shoot(page, lab: LabServer, out: Path) -> None:
    run_notebook(page, lab, NOTEBOOK, timeout_s=180)
    page.wait_for_function(
        "() => document.querySelector('.steerlab-steered-title')?.textContent.includes('α = 0')"
    )
    alpha = page.locator(".steerlab-panel .widget-hslider").filter(
        has=page.locator(".widget-label", has_text=re.compile(r"^alpha$"))
    )
    handle = alpha.locator(".noUi-handle")
    handle.focus()
    for _ in range(PRESSES):
        handle.press("ArrowRight")
    page.wait_for_function(
        "() => document.querySelector('.steerlab-steered-title')?.textContent.includes('α = 4')",
        timeout=60_000,
    )
    page.wait_for_timeout(1500)  # plotly's relayout after the update
    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 768})
        page.wait_for_timeout(1500)
        panel = page.locator(".steerlab-panel")
        panel.scroll_into_view_if_needed()
        page.screenshot(path=str(out / f"panel_{width}.png"))
        print(out / f"panel_{width}.png")


def in_browser(shoot_page, out: Path) -> None:
    """Start JupyterLab and headless chromium, and call ``shoot_page(page, lab, out)``."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as home:
        process, lab = start_lab(Path(home))
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=find_chromium(), headless=True, args=CHROMIUM_FLAGS
                )
                page = browser.new_page(viewport={"width": 1024, "height": 1500})
                page.set_default_timeout(60_000)
                shoot_page(page, lab, out)
                browser.close()
        finally:
            _stop(process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def listed_then_shoot(page, lab: LabServer, out: Path) -> None:
        page.goto(lab.url)  # the default URL: the file browser on tutorials/
        page.wait_for_selector(".jp-DirListing-item")
        listing = page.locator(".jp-DirListing-itemText").all_inner_texts()
        print("tutorials/ lists:", listing)
        assert "conftest.py" not in listing and "sanitize.cfg" not in listing
        shoot(page, lab, out)

    in_browser(listed_then_shoot, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
