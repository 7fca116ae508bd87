"""The job scripts on a real Slurm cluster of two nodes built on this machine (tests/cluster.py): network and
UTS namespaces as nodes, slurmctld, slurmd and munged from Debian's packages, gloo between the nodes.

Marked ``cluster`` and run by ``make test-cluster`` (ACCEL_KIT_CLUSTER=1); elsewhere (``make test``) they
skip, and they skip with the reason where the machine cannot make the cluster (not root, the packages
missing: ``sh tests/cluster_setup.sh``, no namespaces). The last test checks that nothing of the cluster's
is left: no namespace, link, process or folder.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import cluster

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 300  # a job of the smoke profile's points; sbatch --wait is killed (and the job cancelled) past it

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _skip_reason() -> str | None:
    if os.environ.get("ACCEL_KIT_CLUSTER") != "1":
        return "the two-node cluster runs with make test-cluster (ACCEL_KIT_CLUSTER=1)"
    return cluster.why_not()


_SKIP = _skip_reason()
if _SKIP:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

_started: list[cluster.Cluster] = []


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    c = cluster.Cluster(tmp_path_factory.mktemp("akc-cluster"))
    _started.append(c)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _jobscript(tmp_path: Path, *args: str) -> Path:
    from accel_kit import cli

    out = tmp_path / "job.sh"
    assert cli.main(["jobscript", "scaling", "--scheduler", "slurm", "--nodes", "2", "--system", "cpu",
                     "--profile", "smoke", "--devices-per-node", "1", "--out", str(out), *args]) == 0
    return out


def _submit(slurm: cluster.Cluster, script: Path, outputs: Path) -> tuple[int, str]:
    """sbatch --wait the script, unedited, from its folder; (its exit status, its output). The job sees this
    checkout's code (PYTHONPATH) and writes its records under ``outputs``."""
    env = slurm.env | {"ACCEL_KIT_OUTPUT_DIR": str(outputs), "PYTHONPATH": str(ROOT)}
    log = script.parent / "job.out"
    try:
        proc = subprocess.run(["sbatch", "--wait", f"--chdir={script.parent}", f"--output={log}", str(script)],
                              capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        slurm.client(["scancel", "--full", "-u", "root"], check=False)
        pytest.fail(f"the job did not end within {JOB_TIMEOUT_S} s: {log.read_text()[-2000:] if log.exists() else ''}")
    return proc.returncode, (log.read_text(errors="replace") if log.exists() else "") + proc.stderr


def _records(outputs: Path) -> list[dict]:
    path = outputs / "scaling" / "cpu.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_cluster_is_two_nodes(slurm):
    out = slurm.client(["srun", "--nodes=2", "--ntasks=2", "hostname"], timeout_s=60).stdout.split()
    assert sorted(out) == list(cluster.NODES)


def test_slurm_job_script_runs_ddp_across_both_nodes(slurm, tmp_path):
    script = _jobscript(tmp_path, "-p", "preset", "gpt2-debug", "-p", "device_counts", "[2]", "-p", "precision", "fp32")
    assert "#SBATCH --ntasks-per-node=1" in script.read_text()
    status, output = _submit(slurm, script, tmp_path / "outputs")
    assert status == 0, output[-3000:]
    (rec,) = [r for r in _records(tmp_path / "outputs") if r["params"]["devices"] == 2]
    assert rec["status"] == "ok", (rec.get("reason"), output[-3000:])
    assert rec["env"]["hosts"] == ["node1", "node2"] and rec["env"]["launcher"] == "srun"
    assert rec["env"]["rendezvous"].startswith("node1:") and rec["params"]["devices_per_node"] == 1
    assert rec["metrics"]["dp"] == 2
    # The same point on one node (the runner's own torchrun, here): the same losses, step by step.
    from accel_kit import studies

    local = studies.run_study("scaling", system="cpu", profile="smoke", output_dir=tmp_path / "one-node",
                              progress=False, preset="gpt2-debug", device_counts=[2], devices_per_node=2,
                              precision="fp32")
    (one,) = [r for r in local.records if r["params"]["devices"] == 2]
    assert one["status"] == "ok" and one["env"]["hosts"] == [one["env"]["host"]]
    _assert_same_losses(rec["metrics"]["losses"], one["metrics"]["losses"], "two nodes against one")


def _assert_same_losses(losses, reference, what):
    # fp32, the same weights and data: only the all-reduce's summation order may differ (as tests/test_parallel.py)
    assert len(losses) == len(reference) > 0
    for step, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) / abs(b) < 1e-4, f"{what}: step {step}: {a} against {b}"


def test_nothing_is_left():
    """Last: stopped, the cluster leaves no namespace, link, daemon or scratch folder (its fixture's teardown, after
    this test, finds it stopped)."""
    assert _started, "no cluster was started"
    for c in _started:
        c.stop()  # (idempotent)
        assert c.leftovers() == []
