import os
import shutil
import subprocess
from pathlib import Path

import pytest


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
