"""The two-node cluster harness's own checks (tests/cluster.py), without a cluster: where it cannot run, the
cluster tests skip with the reason, they never fail."""
from __future__ import annotations

import subprocess

import pytest

import cluster


def test_why_not_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    assert "needs root" in cluster.why_not()
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None if name in ("slurmd", "munged") else f"/x/{name}")
    assert cluster.why_not().startswith("needs munged, slurmd") and "cluster_setup.sh" in cluster.why_not()


def test_why_not_when_namespaces_cannot_be_made(monkeypatch):
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster.shutil, "which", lambda name: f"/x/{name}")
    refused = subprocess.CompletedProcess([], 1, "", "unshare: unshare failed: Operation not permitted")
    monkeypatch.setattr(cluster.subprocess, "run", lambda *a, **k: refused)
    assert "cannot make namespaces" in cluster.why_not() and "Operation not permitted" in cluster.why_not()


def test_wait_for_is_bounded(monkeypatch):
    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    calls = []
    with pytest.raises(RuntimeError, match="never not within 2 s"):
        cluster.wait_for("never", lambda: calls.append(1), timeout_s=2)
    assert len(calls) == int(2 / cluster.POLL_S) + 1
