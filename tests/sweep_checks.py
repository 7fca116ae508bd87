"""Checks shared by the studies' tests (imported by name: pytest puts tests/ on the path)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from accel_kit import results


def kill_and_resume(args: list[str], path: Path, total: int) -> None:
    """SIGKILL the study command ``args`` (``python -m accel_kit.cli ...``) once it has recorded 2 points;
    the rerun must finish the ``total`` points with nothing lost, run twice or corrupt, and the earlier
    records untouched.

    The killed run is a process of its own; the rerun is the same command through ``cli.main`` in this
    process (what is resumed is read from the records file alone), which spares an interpreter's start
    and, after the file's earlier tests, a fork server's.
    """
    from accel_kit import cli

    assert args[:3] == [sys.executable, "-m", "accel_kit.cli"], args[:3]
    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # a bound that only stops a hang: a busy 2-core machine may take minutes
    while time.time() < deadline and (not path.exists() or len(path.read_bytes().splitlines()) < 2):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = [json.loads(line) for line in path.read_bytes().splitlines() if line.endswith(b"}")]
    assert 2 <= len(first) < total, f"{len(first)} of {total} points recorded at the kill: not mid-sweep"
    assert cli.main(args[3:]) == 0  # (its output, on a failure, is in the test's captured stdout and stderr)
    recs = list(results.iter_records(path))
    keys = [r["params"]["point_key"] for r in recs]
    seen = [(r["status"], r["params"]["point_key"], r.get("reason")) for r in recs]
    assert len(recs) == total and len(set(keys)) == total, seen  # nothing lost, nothing run twice
    assert all(r["status"] == "ok" for r in recs)
    assert [r["record_id"] for r in recs[:len(first)]] == [r["record_id"] for r in first]  # earlier ones untouched
