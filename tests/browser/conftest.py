"""Fixtures that drive a real JupyterLab in headless Chromium, with plain Playwright.

Reusable by any notebook test::

    @pytest.mark.browser
    def test_my_notebook(jupyter_lab, lab_page, run_all_and_wait):
        lab = jupyter_lab(notebook_dir)
        run_all_and_wait(lab_page, lab, "my.ipynb")

``jupyter_lab(notebook_dir)`` starts a server on loopback with fresh config, data, runtime,
settings and workspace folders (so nothing from the user's own JupyterLab leaks in), and the
settings that keep it quiet and deterministic: the default kernel starts without a dialog
(without this, a "Select Kernel" dialog swallowed Run All in about half the runs), no news,
no update checks. Playwright drives Debian's chromium; ``playwright install`` is never needed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}
SERVER_START_TIMEOUT_S = 60
# With no kernel yet the indicator already reads "idle": a kernel must be named and connected.
_KERNEL_IDLE = r"""() => {
    const name = document.querySelector('.jp-NotebookPanel .jp-Toolbar-kernelName');
    const idle = document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']");
    return name !== null && !/No Kernel/.test(name.textContent) && idle !== null;
}"""
# Every code cell shows an execution count ("[3]:", not "[*]:" or "[ ]:") and the kernel is idle.
_ALL_CELLS_RAN = (
    r"""() => {
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
    const kernelIdle = ("""
    + _KERNEL_IDLE
    + r""")();
    return prompts.length > 0 && kernelIdle && prompts.every(p => /\[\d+\]/.test(p.textContent));
}"""
)


@dataclass
class LabServer:
    """A running JupyterLab: its base URL, the folder it serves, and its log file."""

    url: str
    root_dir: Path
    log: Path

    def notebook_url(self, nb_path: str | Path) -> str:
        relative = Path(nb_path)
        if relative.is_absolute():
            relative = relative.relative_to(self.root_dir)
        return f"{self.url}/lab/tree/{relative.as_posix()}"


def find_chromium() -> str | None:
    """Debian's chromium (or ``BROWSER_PATH``), as Playwright's ``executable_path``."""
    override = os.environ.get("BROWSER_PATH")
    if override and os.access(override, os.X_OK):
        return override
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("browser tests need chromium: run scripts/install_browser.sh")
    return path


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[object]:
    """One headless Chromium a module. Not one for the session: Playwright's sync API keeps
    an asyncio loop marked running in the main thread while it is open, and every later
    test that starts a loop of its own (Inspect's ``eval``) would fail with "cannot be
    called from a running event loop"."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def console_errors() -> list[str]:
    """Browser console errors and page errors seen by ``lab_page``, for tests to assert on."""
    return []


@pytest.fixture
def lab_page(browser, console_errors: list[str]) -> Iterator[object]:
    """A fresh page in its own context; tall viewport, since JupyterLab scrolls an inner panel."""
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    page = context.new_page()
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(str(e)))
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Path], LabServer]]:
    """A factory: ``jupyter_lab(notebook_dir)`` starts a server there; stopped after the test."""
    processes: list[subprocess.Popen] = []

    def start(notebook_dir: Path) -> LabServer:
        home = tmp_path_factory.mktemp("jupyter")
        env = _isolated_env(home)
        port = _free_port()
        log = home / "server.log"
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--ServerApp.disable_check_xsrf=True",
            f"--ServerApp.root_dir={notebook_dir}",
            "--allow-root",
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        _wait_for_server(url, process, log)
        return LabServer(url=url, root_dir=Path(notebook_dir), log=log)

    yield start
    for process in processes:
        _stop(process)


@pytest.fixture
def run_all_and_wait() -> Callable[..., None]:
    """The helper that opens a notebook, runs all cells and waits for them all to finish."""
    return run_notebook


@pytest.fixture
def screenshot_dir(request: pytest.FixtureRequest) -> Path:
    """``test-output/browser/<test name>/`` in the repository (gitignored; CI uploads it)."""
    path = REPO_ROOT / "test-output" / "browser" / request.node.name.replace("/", "_")
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_notebook(page, lab: LabServer, nb_path: str | Path, timeout_s: float = 60) -> None:
    """Open ``nb_path`` in ``lab``, choose Run > Run All Cells, wait until every cell ran.

    Done means: every code cell shows an execution count (no ``[*]`` or ``[ ]``) and the kernel
    indicator reads idle. Raises ``AssertionError`` with the cells' error outputs if any failed.
    """
    page.goto(lab.notebook_url(nb_path))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=timeout_s * 1000)
    page.wait_for_function(_KERNEL_IDLE, timeout=timeout_s * 1000, polling=100)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    try:
        page.wait_for_function(_ALL_CELLS_RAN, timeout=timeout_s * 1000, polling=200)
    except Exception as error:  # playwright's TimeoutError; keep evidence for CI
        shot = lab.log.with_name("timeout.png")
        page.screenshot(path=str(shot))
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        raise AssertionError(
            f"cells not done after {timeout_s} s; prompts {prompts}; screenshot {shot}; "
            f"server log {lab.log}"
        ) from error
    errors = cell_errors(page)
    assert not errors, "cells raised:\n" + "\n---\n".join(errors)


def cell_errors(page) -> list[str]:
    """Texts of the tracebacks shown in the open notebook."""
    outputs = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    return [text for text in outputs.all_inner_texts() if "Traceback" in text or "Error" in text]


def _isolated_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ("IPYTHONDIR", "ipython"),
    ]:
        (home / sub).mkdir()
        env[name] = str(home / sub)
    for relative, values in LAB_SETTINGS.items():
        path = home / "settings" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    # The python3 kernelspec runs "python": make it this interpreter, with steerlab importable.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(
        f"jupyter lab did not answer in {SERVER_START_TIMEOUT_S} s:\n{log.read_text()}"
    )


def _stop(process: subprocess.Popen) -> None:
    # SIGTERM lets the server shut its kernels down; kill only if it hangs.
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
