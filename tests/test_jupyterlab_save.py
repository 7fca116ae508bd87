"""Opening and saving each study notebook in JupyterLab leaves it byte for byte as committed; in the
JupyterLab that `make lab` starts (the project's jupyter_server_config.py), running a cell that prints and
saving leaves `git status` clean too.

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


ROOT = Path(__file__).resolve().parent.parent
PRINTS = 'print("an output")'


def _printing_notebook() -> str:
    """A notebook in the committed form whose one cell prints a line."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PRINTS)])
    return notebooks_meta.serialise(notebooks_meta.normalise(nb))


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
    yield from _lab(tmp_path, repo)


@pytest.fixture
def project_lab(tmp_path):
    """The JupyterLab `make lab` starts (the checkout's jupyter_server_config.py, through JUPYTER_CONFIG_PATH),
    rooted at a scratch git repository holding a tracked notebook that prints."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "notebooks" / "prints.ipynb").write_text(_printing_notebook())
    yield from _lab(tmp_path, repo, JUPYTER_CONFIG_PATH=str(ROOT))


def _lab(tmp_path, repo, **extra_env):
    (repo / ".gitignore").write_text(".ipynb_checkpoints/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "notebooks")
    port = _free_port()
    # Lab's user settings and workspaces from a scratch folder: nothing of the user's changes the run.
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               **extra_env)
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


def _outputs(path):
    import json

    # nbformat keeps multi-line text as a list of lines
    return ["".join(out.get("text") or []) for cell in json.loads(path.read_text())["cells"]
            for out in cell.get("outputs", [])]


def test_running_a_cell_and_saving_in_make_labs_jupyterlab_leaves_git_status_clean(project_lab, chromium):
    from accel_kit import results

    url, repo = project_lab
    tracked = repo / "notebooks" / "prints.ipynb"
    # The control: the same notebook, not tracked (the user's own): saved with its output, which shows
    # that the cell ran and that the save writes what the page holds.
    mine = repo / "notebooks" / "mine.ipynb"
    mine.write_text(tracked.read_text())
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(WAIT_S * 1000)
            page.goto(f"{url}/lab/tree/notebooks?reset")
            for path in (tracked, mine):
                _open(page, path.name)
            for path in (tracked, mine):
                page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=path.name).click()
                notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
                page.wait_for_function(KERNEL_METADATA_LANDED)
                notebook.locator(".jp-Cell").first.click()
                page.keyboard.press("Control+Enter")  # runs the cell and stays on it (Shift+Enter would add one)
                notebook.locator(".jp-OutputArea-output", has_text="an output").first.wait_for()
                _save_once_idle(page, path, None)
        finally:
            browser.close()
    assert _outputs(mine) == ["an output\n"], "the control was saved without its output: the check sees nothing"
    assert _outputs(tracked) == [] and tracked.read_text() == _git(repo, "show", "HEAD:notebooks/prints.ipynb")
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert results.git_state(repo)["dirty"] is False  # what a record says of the checkout
