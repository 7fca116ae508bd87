import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# What the tests' kernels, notebooks, compilers and browsers would otherwise keep in the user's home: IPython's
# profile and history, Jupyter's runtime files, data (the notebook-signature database) and config,
# matplotlib's font cache, torch's and triton's compiled extensions, the XDG caches (Hugging Face and
# others). Each points into one scratch folder for the session, removed after it; its subprocesses inherit
# it (pytest-xdist's workers share their controller's). Nothing a test does outlives it.
SCRATCH_HOME_ENV = "ACCEL_KIT_TEST_SCRATCH_HOME"
SCRATCH_DIRS = {"IPYTHONDIR": "ipython", "JUPYTER_RUNTIME_DIR": "jupyter/runtime", "JUPYTER_DATA_DIR": "jupyter/data",
                "JUPYTER_CONFIG_DIR": "jupyter/config", "MPLCONFIGDIR": "matplotlib",
                "TORCH_EXTENSIONS_DIR": "torch_extensions", "TRITON_CACHE_DIR": "triton", "XDG_CACHE_HOME": "cache"}
# The user's own Jupyter data folder, where the tests check that no accel-kit kernel was installed.
USER_JUPYTER_DATA_ENV = "ACCEL_KIT_TEST_USER_JUPYTER_DATA_DIR"
_made_scratch: list[str] = []


def pytest_configure(config):
    if os.environ.get(SCRATCH_HOME_ENV):  # an xdist worker: its controller made it
        return
    os.environ[USER_JUPYTER_DATA_ENV] = _user_jupyter_data_dir()
    scratch = tempfile.mkdtemp(prefix="accel-kit-test-home-")
    _made_scratch.append(scratch)
    os.environ[SCRATCH_HOME_ENV] = scratch
    for name, sub in SCRATCH_DIRS.items():
        os.environ[name] = str(Path(scratch, sub))


def pytest_collection_modifyitems(session, config, items):
    """The heaviest files first: the notebooks (each one a unit of nbval's) and the files with the most slow
    tests. make test hands whole files to its workers in this order (--dist loadfile); a long file left for
    last kept one core busy while the other sat idle. Within a file the order is kept (module fixtures)."""
    slow: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        slow[path] = slow.get(path, 0) + (path.endswith(".ipynb") or item.get_closest_marker("slow") is not None)
    rank = {path: i for i, path in enumerate(slow)}  # collection order among equals
    items.sort(key=lambda item: (not item.nodeid.split("::")[0].endswith(".ipynb"), -slow[item.nodeid.split("::")[0]],
                                 rank[item.nodeid.split("::")[0]]))


def _user_jupyter_data_dir() -> str:
    try:
        from jupyter_core.paths import jupyter_data_dir
    except ImportError:  # an environment without Jupyter: its default on Linux
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return os.environ.get("JUPYTER_DATA_DIR") or str(Path(base) / "jupyter")
    return jupyter_data_dir()


def pytest_unconfigure(config):
    for scratch in _made_scratch:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """A scratch results root; also exported so notebooks and subprocesses write there."""
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(tmp_path))
    return tmp_path


def _find_chromium() -> str | None:
    found = shutil.which("chromium")
    return found or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium for browser tests: installed with apt-get where missing (as root); the
    test is skipped, with the reason, only when it cannot be installed. Never a browser download."""
    path = _find_chromium()
    if path:
        return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("needs Debian's chromium; not root or no apt-get here to install it (apt-get install chromium)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log = []
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]):
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"needs Debian's chromium; `{' '.join(cmd)}` did not finish in 15 minutes")
        log.append(proc.stdout[-500:] + proc.stderr[-1000:])
        if proc.returncode:
            pytest.skip(f"needs Debian's chromium; `{' '.join(cmd)}` failed: {log[-1].strip()[-300:]}")
    path = _find_chromium()
    if not path:
        pytest.skip("needs Debian's chromium; apt-get install chromium ran but no chromium is on PATH")
    return path
