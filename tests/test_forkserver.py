"""Points started from a preloaded interpreter (accel_kit.engine.forkserver), through the sweep runner.

Each check compares the fork server's child with a fresh interpreter per point
(ACCEL_KIT_FORKSERVER=0) where a figure depends on the machine (thread counts, the CPU ISA).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import pytest

from accel_kit.engine import forkserver, sweep
from accel_kit.engine.point import Point

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


class Probe(Point):
    """Reports what its process sees, or sleeps (writing its pid, and a grandchild's, to ``pid_file``)."""

    kind: str = "test_forkserver:Probe"
    action: Literal["report", "sleep", "spawn_and_sleep"] = "report"
    pid_file: str = ""

    def label(self) -> str:
        return self.action

    def measure(self, *_context) -> dict:  # (rank, world), or a measurement context: unused
        import torch

        if self.action != "report":
            pids = [os.getpid(), os.getppid()]
            if self.action == "spawn_and_sleep":  # a helper process in the point's group
                pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]).pid)
            Path(self.pid_file).write_text(json.dumps(pids))
            time.sleep(3600)
        before = len(os.listdir("/proc/self/task"))
        x = torch.randn(1 << 22)
        for _ in range(20):  # parallel regions: OpenMP starts its threads now
            x = x.exp().log()
        return {"status": "ok", "metrics": {
            "num_threads": torch.get_num_threads(), "pool_threads": len(os.listdir("/proc/self/task")) - before,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES"), "parent": os.getppid(), "cwd": os.getcwd(),
            "finite": bool(torch.isfinite(x).all()), "tabnanny_loaded": "tabnanny" in sys.modules}}


class PreloadingProbe(Probe):
    """A probe that names a module beyond the server's PRELOAD (as an hf block point names transformers')."""

    kind: str = "test_forkserver:PreloadingProbe"

    def preload_modules(self) -> tuple[str, ...]:
        return ("tabnanny",)  # a small module nothing else here imports


class FailingPreloadProbe(Probe):
    """A probe that names a module whose import raises (not an ImportError): its server cannot start."""

    kind: str = "test_forkserver:FailingPreloadProbe"

    def preload_modules(self) -> tuple[str, ...]:
        return ("raises_at_import",)  # written by the test that uses this probe


class GroupProbe(Point):
    """A point of ``world`` gloo ranks: each all-reduces its rank and reports torchrun's variables, or
    (``fail_rank``) exits with status 3 at once while the others wait in the all-reduce for it."""

    kind: str = "test_forkserver:GroupProbe"
    world: int = 2
    fail_rank: int = -1
    pid_dir: str = ""

    @property
    def ranks(self) -> int:
        return self.world

    @property
    def needs_group(self) -> bool:
        return True

    def measure(self, ctx) -> dict:
        import torch
        import torch.distributed as dist

        if self.pid_dir:
            Path(self.pid_dir, str(ctx.rank)).write_text(str(os.getpid()))
        if ctx.rank == self.fail_rank:
            os._exit(3)
        total = torch.tensor([float(ctx.rank)])
        dist.all_reduce(total)
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")
        return {"status": "ok", "metrics": {"rank_sum": total.item(), "num_threads": torch.get_num_threads(),
                                            "env": {name: os.environ.get(name) for name in names}}}


@pytest.fixture(scope="module")
def _servers_closed_after_the_module():
    """The module's tests share their fork servers (one key: this PYTHONPATH), closed after the last."""
    yield
    forkserver.shutdown()


@pytest.fixture
def probe_path(monkeypatch, _servers_closed_after_the_module):
    """The child imports this module by name: tests/ on its path (and on ours)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(TESTS))


def _run(point: Point, monkeypatch, *, fork: bool, timeout_s: float = 120, **kw) -> dict:
    monkeypatch.setenv(forkserver.SWITCH, "1" if fork else "0")
    result = sweep.run_worker(point, timeout_s=timeout_s, **kw)
    assert result["env"]["point_start"] == ("forkserver" if fork else "exec"), result
    return result


def _gone(pid: int, within_s: float = 60) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _read_pids(pid_file: Path) -> list[int] | None:
    """The pids a sleeping probe wrote; None where it did not get that far."""
    try:
        return json.loads(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return None


@pytest.mark.slow
def test_thread_count_and_env_as_a_fresh_interpreter(probe_path, monkeypatch):
    point = Probe(system="cpu", precision="fp32")
    for threads in (1, None):
        forked = _run(point, monkeypatch, fork=True, cpu_threads=threads)["metrics"]
        fresh = _run(point, monkeypatch, fork=False, cpu_threads=threads)["metrics"]
        assert forked["finite"] and fresh["finite"]
        # torch.set_num_threads in the child: torch's count, and the threads its parallel regions started.
        for field in ("num_threads", "pool_threads", "omp_num_threads", "glibc_tunables", "cpu_capability", "cwd"):
            assert forked[field] == fresh[field], (threads, field, forked, fresh)
        if threads:
            assert forked["num_threads"] == threads and forked["omp_num_threads"] == str(threads)
    # The allocator settings, read at exec: in the server's own start environment.
    assert "glibc.malloc.trim_threshold" in forked["glibc_tunables"]
    # (glibc parses the variable in place at exec, cutting it at the colons: look at the raw bytes)
    server_env = Path(f"/proc/{forked['parent']}/environ").read_bytes()
    assert b"\0GLIBC_TUNABLES=" in b"\0" + server_env and b"glibc.malloc.trim_threshold=" in server_env


@pytest.mark.slow
def test_server_starts_no_thread_pool_and_no_device(probe_path):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    status = forkserver.server_for(env).status()
    # no device backend (and no process group) initialised before a fork; torch.cpu says it always is
    assert set(status["initialized"]) <= {"cpu"}, status["initialized"]
    # Reference interpreters that import the same modules: one stops there, one runs a parallel region.
    code = ("import os, sys, torch\n"
            "from accel_kit.engine.forkserver import preload\n"
            "preload()\n"
            "if sys.argv[1] == '1': torch.randn(1 << 22).exp()\n"
            "print(len(os.listdir('/proc/self/task')))")
    # (the two side by side: each counts only its own threads)
    procs = [subprocess.Popen([sys.executable, "-c", code, touch], env=env, stdout=subprocess.PIPE, text=True)
             for touch in ("0", "1")]
    outputs = [proc.communicate()[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    counts = [int(out) for out in outputs]
    untouched, touched = counts
    if touched == untouched:
        pytest.skip("a parallel region starts no thread on this machine: the check cannot tell")
    assert status["threads"] <= untouched < touched


def test_a_points_own_modules_are_imported_by_the_server_before_its_fork(probe_path, monkeypatch):
    plain = _run(Probe(system="cpu", precision="fp32"), monkeypatch, fork=True)["metrics"]
    preloading = _run(PreloadingProbe(system="cpu", precision="fp32"), monkeypatch, fork=True)["metrics"]
    later = _run(Probe(system="cpu", precision="fp32"), monkeypatch, fork=True)["metrics"]
    # not in the server before the point that names it; in its fork (before the point ran any code)
    assert not plain["tabnanny_loaded"] and preloading["tabnanny_loaded"]
    # a server that preloads it too took the key's place, and serves its later points; the one without it closed
    assert preloading["parent"] != plain["parent"] and later["parent"] == preloading["parent"]
    assert later["tabnanny_loaded"] and _gone(plain["parent"])


@pytest.mark.slow
def test_a_server_whose_preload_fails_is_not_used_and_its_points_exec(probe_path, monkeypatch, tmp_path):
    (tmp_path / "raises_at_import.py").write_text('raise RuntimeError("at import")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    env = dict(os.environ)
    plain = forkserver.server_for(env)
    for _ in range(2):  # the second fails at once: no server is started again for each point
        with pytest.raises(forkserver.ServerGone):
            forkserver.server_for(env, ("raises_at_import",))
    assert forkserver.server_for(env) is plain and plain.alive()  # the key's other points keep theirs
    # through the runner: the point starts in a fresh interpreter (which imports only what it uses)
    result = sweep.run_worker(FailingPreloadProbe(system="cpu", precision="fp32"), timeout_s=120)
    assert result["status"] == "ok" and result["env"]["point_start"] == "exec", result


def test_a_server_whose_preload_hangs_is_given_up_at_its_start_timeout(monkeypatch, tmp_path):
    (tmp_path / "hangs_at_import.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    with pytest.raises(forkserver.ServerGone, match="forked nothing within 2 s"):
        forkserver.ForkServer(dict(os.environ), (*forkserver.PRELOAD, "hangs_at_import"), start_timeout_s=2)
    # given up at its bound (not the import's 600 s), the hung server killed rather than waited for
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_cpu_isa_override_starts_another_server(probe_path, monkeypatch):
    point = Probe(system="cpu", precision="fp32")
    first = _run(point, monkeypatch, fork=True)["metrics"]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    imitated = _run(point, monkeypatch, fork=True)["metrics"]
    fresh = _run(point, monkeypatch, fork=False)["metrics"]
    assert imitated["parent"] != first["parent"]  # another server, started with the variable
    assert imitated["cpu_capability"] == fresh["cpu_capability"] == "DEFAULT"
    # The same key again reuses its server.
    assert _run(point, monkeypatch, fork=True)["metrics"]["parent"] == imitated["parent"]


@pytest.mark.slow
def test_failures_keep_output_and_timeout_kills_the_group(probe_path, monkeypatch, tmp_path):
    from fault_points import FaultPoint

    error = _run(FaultPoint(system="cpu", precision="fp32", fault="error"), monkeypatch, fork=True)
    assert error["status"] == "error" and "deep_inside" in error["traceback"]
    crash = _run(FaultPoint(system="cpu", precision="fp32", fault="segfault"), monkeypatch, fork=True)
    assert crash["status"] == "error" and "worker exited with status -11" in crash["reason"]
    pid_file = tmp_path / "pids.json"
    hang = Probe(system="cpu", precision="fp32", action="spawn_and_sleep", pid_file=str(pid_file))
    # Only the timeout ends the point (it sleeps an hour). Its pids are known once it has reached its
    # sleep, a second or so after the fork: where a busy machine has not got it there within the
    # timeout, the point (killed all the same) runs again with a longer one, instead of failing.
    for timeout_s in (5, 30, 120):
        pid_file.unlink(missing_ok=True)
        timed_out = _run(hang, monkeypatch, fork=True, timeout_s=timeout_s)
        assert timed_out["status"] == "error" and "timeout" in timed_out["reason"]
        pids = _read_pids(pid_file)
        if pids:
            break
    assert pids, "the point did not reach its sleep within even a 120 s timeout"
    child, server, helper = pids
    assert _gone(child) and _gone(helper)
    assert not _gone(server, within_s=0)  # the server stays for the next point


@pytest.mark.slow
def test_records_say_which_path_started_the_point(probe_path, monkeypatch, tmp_path):
    from fault_points import FaultPoint

    for switch, start in (("1", "forkserver"), ("0", "exec")):
        monkeypatch.setenv(forkserver.SWITCH, switch)
        recs = sweep.run_sweep("faults", [FaultPoint(system="cpu", precision="fp32", fault="ok")],
                               records_path=tmp_path / f"{start}.jsonl", run_id="r", extra_params={},
                               timeout_s=120, progress=False)
        assert recs[0]["status"] == "ok" and recs[0]["env"]["point_start"] == start
        assert recs[0]["env"]["system"]["id"] == "cpu"  # the runner's own env fields still added


@pytest.mark.slow
def test_a_local_group_of_ranks_forks_as_torchrun_would_start_it(probe_path, monkeypatch):
    point = GroupProbe(system="cpu", precision="fp32")
    forked = _run(point, monkeypatch, fork=True)
    torchrun = _run(point, monkeypatch, fork=False)  # the fresh interpreters' path: torchrun --standalone
    assert forked["status"] == torchrun["status"] == "ok", (forked, torchrun)
    assert forked["metrics"] == torchrun["metrics"]  # torchrun's variables, its one thread a rank, the rendezvous
    assert forked["metrics"]["rank_sum"] == 1.0 and forked["metrics"]["num_threads"] == 1
    assert forked["metrics"]["env"] == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                                        "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_a_rank_that_fails_ends_its_group_with_its_status(probe_path, monkeypatch, tmp_path):
    # Rank 1 exits with status 3 while rank 0 waits for it in an all-reduce: the group is killed then,
    # long before the timeout (a point left to its timeout would say "timeout" instead).
    point = GroupProbe(system="cpu", precision="fp32", fail_rank=1, pid_dir=str(tmp_path))
    result = _run(point, monkeypatch, fork=True, timeout_s=600)
    assert result["status"] == "error" and "worker exited with status 3" in result["reason"], result
    assert _gone(int((tmp_path / "0").read_text()))


RUNNER = """
import json, os, signal, sys, time
# Ctrl-C raises KeyboardInterrupt here, as in a terminal or a notebook's kernel, whatever this process
# inherited: a shell's background job (make test run with &, nohup) starts with SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
from accel_kit.engine import sweep
from test_forkserver import Probe
try:
    sweep.run_worker(Probe(system="cpu", precision="fp32", action="sleep", pid_file={pid_file!r}), timeout_s=600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    time.sleep(600)  # a notebook's kernel lives on after a Ctrl-C
"""


def _start_runner(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    pid_file = tmp_path / "pids.json"
    script = RUNNER.format(tests=str(TESTS), pid_file=str(pid_file))
    env = dict(os.environ, **{forkserver.SWITCH: "1"})
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the runner's point did not start"
        time.sleep(0.05)
    return proc, pid_file


@pytest.mark.slow
def test_runner_sigkill_leaves_no_server_or_point(probe_path, tmp_path):
    proc, pid_file = _start_runner(tmp_path)
    child, server = json.loads(pid_file.read_text())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _gone(server) and _gone(child)


@pytest.mark.slow
def test_interrupt_kills_the_point_and_exit_closes_the_server(probe_path, tmp_path):
    proc, pid_file = _start_runner(tmp_path)
    child, server = json.loads(pid_file.read_text())
    os.kill(proc.pid, signal.SIGINT)  # what a notebook's interrupt sends its kernel
    assert proc.stdout.readline().strip() == "interrupted"
    assert _gone(child)
    assert not _gone(server, within_s=0)  # kept for the runner's lifetime
    proc.terminate()
    proc.wait()
    assert _gone(server)


def test_consecutive_tests_share_a_server():
    # pytest names each test in PYTEST_CURRENT_TEST; nothing reads it at import, so it is not in the key
    # (else every test that runs a point would wait for a server of its own).
    env = dict(os.environ, PYTEST_CURRENT_TEST="tests/a.py::test_a (call)")
    next_test = env | {"PYTEST_CURRENT_TEST": "tests/b.py::test_b (setup)"}
    assert forkserver.server_key(env) == forkserver.server_key(next_test)
    assert forkserver.server_key(env) != forkserver.server_key(env | {"ATEN_CPU_CAPABILITY": "default"})
