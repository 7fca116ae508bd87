"""Opening and saving each study notebook in JupyterLab leaves it byte for byte as committed.

A real JupyterLab server and headless Chromium (Debian's ``chromium`` and the ``playwright``
package; no browser download): each notebook opens, its kernel starts, Ctrl+S saves it, and git
sees no change. The notebooks are copied into a scratch git repository first, so a failure never
rewrites the checkout. Set ACCEL_KIT_LAB_SCREENSHOTS=DIR to keep a screenshot of each.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from accel_kit import notebooks_meta

playwright = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
sync_playwright, PlaywrightTimeout = playwright.sync_playwright, playwright.TimeoutError

pytestmark = pytest.mark.slow

# Every wait below is on the real condition (the server answers, the tab exists, the kernel is idle
# and its metadata is in the notebook, the file is written); this bound only stops a hung run. On a
# busy 2-core machine the notebooks' kernels start side by side in well under a minute each; the
# bound is five minutes per wait so that a loaded machine is slow, never failed.
WAIT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab on 127.0.0.1 without a token, rooted at a scratch git repository of the notebooks."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    for path in notebooks_meta.tracked_notebooks():
        shutil.copy(path, repo / "notebooks" / path.name)
    # The control: an old save's display name, which JupyterLab must rewrite, so that the test
    # shows that a change made by opening and saving is seen.
    stale = (repo / "notebooks" / "gas.ipynb").read_text().replace('"Python 3 (ipykernel)"', '"Python 3"')
    (repo / "notebooks" / "stale_control.ipynb").write_text(stale)
    (repo / ".gitignore").write_text(".ipynb_checkpoints/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "notebooks")
    port = _free_port()
    # Lab's user settings and workspaces from a scratch folder: nothing of the user's changes the run.
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    # expose_app_in_browser: window.jupyterapp, from which the test reads the notebook's model.
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={repo}",
           "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}", repo
    finally:
        server.terminate()  # shuts its kernels down too
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _open(page, name):
    # From the file browser, as a user would: one JupyterLab page, one tab and kernel per notebook.
    # A double-click while the listing is still rendering can be lost: try again until the tab shows.
    item = page.locator(".jp-DirListing-item", has_text=name)
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)
    deadline = time.monotonic() + WAIT_S
    while True:
        item.dblclick()
        try:
            tab.wait_for(timeout=30_000)
            return
        except PlaywrightTimeout:
            assert time.monotonic() < deadline, f"{name}: no tab opened in {WAIT_S} s"


# True once the current notebook's kernel is idle and JupyterLab has written that kernel's spec and
# language_info into the notebook's metadata (what a save then writes): the condition itself, not
# a pause after the status bar says Idle.
KERNEL_METADATA_LANDED = """() => {
    const panel = window.jupyterapp?.shell?.currentWidget;
    const kernel = panel?.sessionContext?.session?.kernel;
    if (!panel?.model || !kernel || kernel.status !== "idle") return false;
    const spec = panel.model.getMetadata("kernelspec"), info = panel.model.getMetadata("language_info");
    return !!spec && !!info && spec.name === kernel.name
        && spec.display_name === panel.sessionContext.kernelDisplayName;
}"""
SAVED = "() => !window.jupyterapp.shell.currentWidget.model.dirty"


def _save_once_idle(page, path, screenshot_dir):
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=path.name).click()
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    notebook.locator(".jp-Cell").first.wait_for()
    page.wait_for_function(KERNEL_METADATA_LANDED)
    before = path.stat().st_mtime_ns
    notebook.locator(".jp-Cell").first.click()
    page.keyboard.press("Control+s")
    page.wait_for_function(SAVED)  # the model is clean once the server has answered the save
    deadline = time.monotonic() + WAIT_S
    while path.stat().st_mtime_ns == before:
        assert time.monotonic() < deadline, f"{path.name}: Ctrl+S did not save"
        time.sleep(0.1)
    if screenshot_dir:
        page.screenshot(path=str(Path(screenshot_dir) / f"{path.stem}.png"))


def test_opening_and_saving_in_jupyterlab_changes_no_notebook(lab, chromium):
    url, repo = lab
    screenshot_dir = os.environ.get("ACCEL_KIT_LAB_SCREENSHOTS")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(WAIT_S * 1000)  # every wait is on a condition; this only stops a hang
            page.goto(f"{url}/lab/tree/notebooks?reset")  # ?reset: a fresh workspace, the file browser in notebooks/
            # All opened before any is waited on, so that their kernels start side by side.
            paths = sorted((repo / "notebooks").glob("*.ipynb"))
            for path in paths:
                _open(page, path.name)
            for path in paths:
                _save_once_idle(page, path, screenshot_dir)
        finally:
            browser.close()
    changed = [line[3:] for line in _git(repo, "status", "--porcelain", "notebooks/").splitlines()]
    assert "notebooks/stale_control.ipynb" in changed, "the control was saved unchanged: the check sees nothing"
    changed.remove("notebooks/stale_control.ipynb")
    assert not changed, (f"opening and saving in JupyterLab changed {', '.join(changed)}; "
                         "run `make strip-notebooks` and commit the result")
