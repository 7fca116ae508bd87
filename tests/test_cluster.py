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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cluster

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 300  # a job of the smoke profile's points; cancelled past it (and the test fails)

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


def _jobscript(tmp_path: Path, *args: str, devices_per_node: str = "1") -> Path:
    from accel_kit import cli

    out = tmp_path / "job.sh"
    assert cli.main(["jobscript", "scaling", "--scheduler", "slurm", "--nodes", "2", "--system", "cpu",
                     "--profile", "smoke", "--devices-per-node", devices_per_node, "--out", str(out), *args]) == 0
    return out


def _job_env(outputs: Path) -> dict[str, str]:
    """The job sees this checkout's code (PYTHONPATH) and writes its records under ``outputs``."""
    return {"ACCEL_KIT_OUTPUT_DIR": str(outputs), "PYTHONPATH": str(ROOT)}


def _job_output(script: Path) -> str:
    log = script.parent / "job.out"
    return log.read_text(errors="replace") if log.exists() else ""


def _submit(slurm: cluster.Cluster, script: Path, outputs: Path) -> tuple[tuple[str, str], str]:
    """The script, unedited, submitted with sbatch and waited for: ((its end state, exit code), its output)."""
    job = slurm.submit(script, _job_env(outputs))
    return slurm.wait_job(job, JOB_TIMEOUT_S), _job_output(script)


def _records(outputs: Path) -> list[dict]:
    path = outputs / "scaling" / "cpu.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_cluster_is_two_nodes(slurm):
    out = slurm.client(["srun", "--nodes=2", "--ntasks=2", "hostname"], timeout_s=60).stdout.split()
    assert sorted(out) == list(cluster.NODES)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """The job's point (2 DDP ranks, fp32) on one node: the runner's own local group, here."""
    from accel_kit import studies

    run = studies.run_study("scaling", system="cpu", profile="smoke", output_dir=tmp_path_factory.mktemp("one-node"),
                            progress=False, preset="gpt2-debug", device_counts=[2], devices_per_node=2,
                            precision="fp32")
    (rec,) = [r for r in run.records if r["params"]["devices"] == 2]
    assert rec["status"] == "ok" and rec["env"]["hosts"] == [rec["env"]["host"]], rec.get("reason")
    return rec


# Each launcher the job script can name: srun (every rank), torchrun (one per node, meeting at a c10d
# rendezvous on the first node) and MPICH's mpiexec (Hydra, which starts its proxies through Slurm).
@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpiexec"])
def test_slurm_job_script_runs_ddp_across_both_nodes(slurm, one_node, launcher, tmp_path):
    script = _jobscript(tmp_path, "--launcher", launcher, "-p", "preset", "gpt2-debug", "-p", "device_counts", "[2]",
                        "-p", "precision", "fp32")
    assert "#SBATCH --ntasks-per-node=1" in script.read_text()
    status, output = _submit(slurm, script, tmp_path / "outputs")
    assert status == ("COMPLETED", "0:0"), output[-3000:]
    (rec,) = [r for r in _records(tmp_path / "outputs") if r["params"]["devices"] == 2]
    assert rec["status"] == "ok", (rec.get("reason"), rec.get("traceback"), output[-3000:])
    assert rec["env"]["hosts"] == ["node1", "node2"] and rec["env"]["launcher"] == launcher
    assert rec["env"]["rendezvous"].startswith("node1:") and rec["params"]["devices_per_node"] == 1
    assert rec["metrics"]["dp"] == 2
    _assert_same_losses(rec["metrics"]["losses"], one_node["metrics"]["losses"], f"two nodes ({launcher}) against one")
    _assert_inter_node_link(tmp_path / "outputs", launcher, ranks=2)


def _assert_inter_node_link(outputs: Path, launcher: str, ranks: int) -> None:
    """The job's first step measured the link between the nodes (its ring across both hosts), and kept it apart
    from the link within a node, where the predictor finds it for a layout that spans the nodes."""
    from accel_kit.predict.links import link_cache_path, system_link

    kept = json.loads(link_cache_path("cpu", outputs, inter_node=True).read_text())
    assert kept["launcher"] == launcher and kept["nodes"] == 2 and kept["ranks"] == ranks
    assert sorted(set(kept["hosts"])) == ["node1", "node2"] and kept["node_bandwidth_GBps"] > 0
    assert not link_cache_path("cpu", outputs).exists()  # nothing said about the link within a node
    link = system_link("cpu", ranks, root=outputs, devices_per_node=ranks // 2, probe=False)
    assert "on 2 nodes (node1, node2)" in link.source and link.bandwidth_GBps > 0


def test_four_ranks_over_two_nodes_in_every_layout(slurm, tmp_path):
    """4 ranks, 2 on each node, under DDP, FSDP2, tensor parallel 2 and pipeline 2 (srun): each point's layout as
    asked, across both hosts; FSDP trains as DDP does, and tensor parallel as the pipeline (both at dp 2, the same
    global batch), as the single-node tests find (tests/test_parallel.py, tests/test_pipeline.py)."""
    script = _jobscript(tmp_path, "-p", "preset", "gpt2-debug", "-p", "device_counts", "[4]", "-p", "precision",
                        "fp32", "-p", "also", "[{engine: fsdp}, {tp: 2}, {pp: 2}]", devices_per_node="2")
    assert "#SBATCH --ntasks-per-node=2" in script.read_text()
    status, output = _submit(slurm, script, tmp_path / "outputs")
    assert status == ("COMPLETED", "0:0"), output[-3000:]
    recs = {(r["params"]["engine"], r["params"]["tp"], r["params"]["pp"]): r for r in _records(tmp_path / "outputs")}
    assert sorted(recs) == [("ddp", 1, 1), ("ddp", 1, 2), ("ddp", 2, 1), ("fsdp", 1, 1)]
    for (engine, tp, pp), rec in recs.items():
        assert rec["status"] == "ok", (engine, tp, pp, rec.get("reason"), rec.get("traceback"))
        assert rec["env"]["hosts"] == ["node1", "node2"] and rec["metrics"]["dp"] == 4 // (tp * pp)
    loss = {key: rec["metrics"]["losses"] for key, rec in recs.items()}
    _assert_same_losses(loss[("fsdp", 1, 1)], loss[("ddp", 1, 1)], "fsdp against ddp, two nodes")
    _assert_same_losses(loss[("ddp", 2, 1)], loss[("ddp", 1, 2)], "tp 2 against pp 2, two nodes")
    _assert_inter_node_link(tmp_path / "outputs", "srun", ranks=4)


FAULT_TIMEOUT_S = 120  # the fault job's per-point timeout
LONG_STEPS = 150  # its first point's steps: about 10 s of training on 2 cores, time to lose a rank mid-point


@pytest.fixture(scope="module")
def fault_job(slurm, tmp_path_factory):
    """A job whose first point trains long enough to lose a rank mid-point (LONG_STEPS steps of 2 ranks, across both
    nodes), then a short point (``also``: the same at 2 steps); its script and its records' folder."""
    folder = tmp_path_factory.mktemp("fault")
    script = _jobscript(folder, "--no-link-probe", "-p", "preset", "gpt2-debug", "-p", "device_counts", "[2]",
                        "-p", "precision", "fp32",
                        "-p", "steps", str(LONG_STEPS), "-p", "time_budget_s", "600",
                        "-p", "timeout_s", str(FAULT_TIMEOUT_S),
                        "-p", "also", "[{steps: 2}]")
    return script, folder / "outputs"


def _poll(what: str, value, timeout_s: float):
    """``value()``'s first true result, polled every 0.2 s for at most ``timeout_s``; the test fails past it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = value()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s")


def test_a_rank_killed_on_the_second_node_costs_one_point(slurm, fault_job):
    script, outputs = fault_job
    job = slurm.submit(script, _job_env(outputs))
    try:
        # The rank on node2, once it has run a few seconds (torch imported, the group formed): SIGKILL.
        first = _poll("a worker rank on node2", lambda: slurm.worker_pids("node2"), JOB_TIMEOUT_S)
        time.sleep(5)
        assert set(first) & set(slurm.worker_pids("node2")), "the rank ended before it could be killed"
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        long_point = lambda: [r for r in _records(outputs) if r["params"]["steps"] == LONG_STEPS]  # noqa: E731
        (rec,) = _poll("the killed point's record", long_point, FAULT_TIMEOUT_S + 30)
        elapsed_s = time.monotonic() - killed_at
    except BaseException:  # (a failed check: the job cancelled, not waited for)
        slurm.client(["scancel", "--full", str(job)], check=False)
        raise
    status = slurm.wait_job(job, JOB_TIMEOUT_S)
    assert rec["status"] == "error", (rec["status"], rec.get("reason"))
    assert elapsed_s < FAULT_TIMEOUT_S + 10, f"the point ended {elapsed_s:.0f} s after its rank was killed"
    assert status == ("COMPLETED", "0:0"), _job_output(script)[-3000:]
    # The job went on: the next point ran on both nodes, and no rank of either point is left.
    (short,) = [r for r in _records(outputs) if r["params"]["steps"] == 2]
    assert short["status"] == "ok" and short["env"]["hosts"] == ["node1", "node2"], short.get("reason")
    assert slurm.worker_pids("node1") == slurm.worker_pids("node2") == []


def test_a_lost_node_holds_the_job_and_a_resubmit_measures_only_what_is_missing(slurm, fault_job):
    script, outputs = fault_job
    before = _records(outputs)
    assert [r["status"] for r in before] == ["error", "ok"], "runs after the killed-rank test"
    slurm.stop_node("node2")
    job = slurm.submit(script, _job_env(outputs))
    try:
        # Slurm's own decision: the job waits for its two nodes (pending), it does not start on one.
        assert _poll("the job queued", lambda: slurm.job_state(job), 30) == "PENDING"
        time.sleep(3)
        assert slurm.job_state(job) == "PENDING" and _records(outputs) == before
        slurm.start_node("node2")
    except BaseException:  # (a failed check: the job cancelled, not waited for)
        slurm.client(["scancel", "--full", str(job)], check=False)
        raise
    status = slurm.wait_job(job, JOB_TIMEOUT_S)
    output = _job_output(script)
    assert status == ("COMPLETED", "0:0"), output[-3000:]
    after = _records(outputs)
    assert after[:2] == before  # the records written before are intact
    (new,) = after[2:]  # only the failed point measured again; the short one reused
    assert new["params"]["steps"] == LONG_STEPS and new["status"] == "ok", new.get("reason")
    assert new["env"]["hosts"] == ["node1", "node2"] and "1 from earlier runs" in output


SQUATTED_PORT = 29511  # (inside node1's own network namespace: taken by the test alone)


def test_a_rendezvous_port_taken_fails_its_point_in_one_line(slurm, tmp_path):
    """The port a job's points meet at (``-p rendezvous_port``) already taken on the first node: the 2-rank point
    fails in one line, in seconds (its rank 0 cannot host the store; the rank waiting for it is ended), and the
    1-rank point, which needs no rendezvous, runs."""
    listen = (f"import socket, time; s = socket.socket(); s.bind(('', {SQUATTED_PORT})); s.listen(); "
              "print('up', flush=True); time.sleep(600)")
    squat = subprocess.Popen(slurm.in_node("node1", f'exec {sys.executable} -c "{listen}"'), stdout=subprocess.PIPE,
                             text=True)
    try:
        assert squat.stdout.readline().strip() == "up"
        script = _jobscript(tmp_path, "--no-link-probe", "-p", "preset", "gpt2-debug", "-p", "device_counts", "[1, 2]",
                            "-p", "precision", "fp32", "-p", "rendezvous_port", str(SQUATTED_PORT))
        status, output = _submit(slurm, script, tmp_path / "outputs")
    finally:
        squat.kill()
        squat.wait(timeout=30)
    assert status == ("COMPLETED", "0:0"), output[-3000:]
    recs = {r["params"]["devices"]: r for r in _records(tmp_path / "outputs")}
    assert recs[1]["status"] == "ok", recs[1].get("reason")
    failed = recs[2]
    assert failed["status"] == "error" and "\n" not in failed["reason"], failed["reason"]
    assert str(SQUATTED_PORT) in failed["reason"] and "timeout" not in failed["reason"], failed["reason"]
    assert failed["env"]["rendezvous"] == f"node1:{SQUATTED_PORT}"


def test_pbs_script_body_runs_mpiexec_across_both_nodes(slurm, one_node, tmp_path):
    """No PBS server is on the registry: the PBS script runs on the first node with the variables PBS sets
    (PBS_NODEFILE, PBS_O_WORKDIR), and its points start with MPICH's mpiexec over the nodefile's hosts, which
    reaches the second node through an ssh stand-in (there is no sshd in the namespaces)."""
    from accel_kit import cli

    script = tmp_path / "job.pbs.sh"
    assert cli.main(["jobscript", "scaling", "--scheduler", "pbs", "--nodes", "2", "--system", "cpu", "--profile",
                     "smoke", "--devices-per-node", "1", "--out", str(script), "-p", "preset", "gpt2-debug",
                     "-p", "device_counts", "[2]", "-p", "precision", "fp32"]) == 0
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node1\nnode2\n")
    env = dict(os.environ, **_job_env(tmp_path / "outputs"), PBS_NODEFILE=str(nodefile), PBS_O_WORKDIR=str(tmp_path),
               HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=str(slurm.ssh_shim()))
    proc = subprocess.run(slurm.in_node("node1", f"exec bash {script}"), env=env, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (rec,) = [r for r in _records(tmp_path / "outputs") if r["params"]["devices"] == 2]
    assert rec["status"] == "ok", (rec.get("reason"), rec.get("traceback"))
    assert rec["env"]["hosts"] == ["node1", "node2"] and rec["env"]["launcher"] == "mpiexec"
    _assert_same_losses(rec["metrics"]["losses"], one_node["metrics"]["losses"], "PBS body (mpiexec) against one node")
    _assert_inter_node_link(tmp_path / "outputs", "mpiexec", ranks=2)


def test_ctrl_c_takes_a_cluster_down(tmp_path):
    """A session interrupted (SIGINT) while its cluster runs: at exit the harness ends its daemons and removes its
    namespaces, links and scratch folder.

    The child takes SIGINT as a terminal's Ctrl-C reaches Python (KeyboardInterrupt) even where this test's own
    shell ignores it (a job started in the background does), which a child would inherit."""
    scratch = tmp_path / "interrupted"
    scratch.mkdir()
    code = ("import pathlib, signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import cluster; "
            f"c = cluster.Cluster(pathlib.Path({str(scratch)!r})).start(); "
            "print(c.prefix, *[p.pid for p in c.procs.values()], flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prefix, pids = None, []
    try:
        words = proc.stdout.readline().split()  # (its start's waits are bounded: a line, or its exit)
        assert len(words) > 1, proc.communicate(timeout=60)[1][-2000:]
        prefix, pids = words[0], [int(p) for p in words[1:]]
        assert cluster.leftovers(prefix, scratch, pids)  # up, with its namespaces
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
            if prefix:  # (a failure: what the child could not take down, taken down here)
                cluster.remove(prefix, scratch, pids)
    assert cluster.leftovers(prefix, scratch, pids) == []


def _assert_same_losses(losses, reference, what):
    # fp32, the same weights and data: only the all-reduce's summation order may differ (as tests/test_parallel.py)
    assert len(losses) == len(reference) > 0
    for step, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) / abs(b) < 1e-4, f"{what}: step {step}: {a} against {b}"


def test_nothing_is_left():
    """Last: stopped, the cluster leaves no namespace, link, daemon or scratch folder (its fixture's teardown, after
    this test, finds it stopped)."""
    if not _started:
        pytest.skip("no cluster was started in this session (the test checks what the others leave)")
    for c in _started:
        c.stop()  # (idempotent)
        assert c.leftovers() == []
