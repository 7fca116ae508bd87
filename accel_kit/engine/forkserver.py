"""Points started from a preloaded interpreter: multiprocessing's fork server, one per environment.

``import torch`` alone takes seconds, and every point runs in a process of its own (a crash, an
out-of-memory or a hang costs that point only). A fork server is a Python process that has
imported torch and the worker's modules, touched no device and started no thread pool; each
point's rank is a ``fork()`` of it that calls ``accel_kit.engine.worker.main``. Isolation stays as
with a fresh interpreter: one process per rank in a session of its own (a timeout kills its whole
process group), its memory cap (RLIMIT_DATA), its output in a file whose tail goes into the
record, and only the runner appends records.

The standard machinery does the serving: the server is ``multiprocessing.forkserver``'s loop
(``main``: preload, fork on request, report each child's pid and exit status, exit once its
"alive" pipe closes), each rank a ``multiprocessing`` Process started through it, and the runner
waits on the ranks' sentinels (``multiprocessing.connection.wait``). What this module adds, each
for a reason the standard machinery does not cover:

- Several servers, keyed by environment (``server_key``). multiprocessing has one forkserver per
  process, started with the runner's own ``os.environ`` at its first use; what a fork cannot
  change is read at the server's start: the C allocator's settings (``GLIBC_TUNABLES``, from the
  adapter's ``worker_env()``), the CPU ISA overrides (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``),
  ``PYTHONPATH`` and the interpreter. So each server is started here with its point's environment
  (``ForkServer._start``), and servers are keyed by the interpreter, the working directory and the
  whole environment except what the child applies itself: ``OMP_NUM_THREADS``
  (``torch.set_num_threads`` in the child, as OpenMP read the variable when it loaded in the
  server) and accel-kit's own ``ACCEL_KIT_*`` variables, which accel-kit reads when called, never at
  import (and pytest's ``PYTEST_CURRENT_TEST``, which names each test in turn). The child's
  ``os.environ`` is the point's exact environment.
- A point's own modules. multiprocessing's server imports its preload list once, at its start;
  what only some points import (transformers' layers, seconds) is named by the point
  (``Point.preload_modules``), and a server lacking one is replaced by one that preloads it too,
  kept for later points (the one replaced is closed once no point of it runs).
- A health check (``ForkServer.status``): a server whose preload failed (multiprocessing skips an
  ``ImportError`` only) is found at its start and its key's points start in a fresh interpreter.
- The rank's process: a session of its own, killed as a group (multiprocessing kills one pid); it
  dies with the server (PR_SET_PDEATHSIG: multiprocessing's server exits without killing its
  children); and it drops its copy of the server's "alive" pipe (multiprocessing hands one to every
  child, which would keep the server, and so the rank, alive after the runner's SIGKILL).
- The child does not re-run the runner's ``__main__`` (multiprocessing's ``spawn.prepare`` would
  import a notebook kernel's or the CLI's main module in every point) and keeps the server's
  ``sys.path``, which the point's ``PYTHONPATH`` made, as a fresh interpreter's would be.

Measured for this choice (2-core EPYC shared with other jobs, load average 4-7): a bare target's start
to its first instruction through a warm server, 20 alternating rounds, medians: this module's Process
0.040 s, ``torch.distributed.elastic.multiprocessing.start_processes`` (start_method="forkserver",
multiprocessing's one server preloaded alike) 0.088 s, 2.2x; elastic would also re-run the runner's
``__main__`` in every rank, kill one pid and not the rank's group, key nothing by environment and poll
for exits once a second. Through ``run_worker`` (``benchmarks/point_start.py``'s probe, start to first
step, two runners side by side, 30 alternating rounds): 0.055 s and 0.033 s in two runs, against
0.048 s and 0.034 s for the home-made fork server that this module replaces (1.14x and 0.98x).

Which points take this path (``forkable``): the points whose ranks all run on this node with no
launcher of their own (no mpiexec/srun, no vendor ``launch_prefix``, no extra launcher environment):
one rank, or a local group of ranks that torchrun would otherwise start. All others keep the fresh
interpreter (``accel_kit.engine.launch.worker_command``). ``ACCEL_KIT_FORKSERVER=0`` starts every
point in a fresh interpreter; records say which path started a point in ``env.point_start``
(``forkserver`` or ``exec``).

A local group is one fork per rank, each with the variables torchrun gives its ranks (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, and
``OMP_NUM_THREADS=1`` where it is unset, as torchrun sets it for several ranks). Their rendezvous is
a TCP store hosted by the runner on a port the kernel picked (``local_group``), as torchrun's agent
hosts one (``TORCHELASTIC_USE_AGENT_STORE``): no rank has to bind a port chosen in advance, which
another process could take meanwhile. The group fails as torchrun's does: the first rank to exit
with an error has the others' process groups killed, and its exit code is the point's.

Lifetime: a server starts on a runner's first point of its key and lives as long as the runner
(at most ``MAX_SERVERS`` at once, the least recently used closed first). It exits when its "alive"
pipe closes, which the kernel does when the runner dies, even by SIGKILL; its points die with it.
A timeout or an interrupt of the runner's wait (a Ctrl-C in a notebook) kills the point's groups.
(A runner SIGKILLed mid-point leaves its ranks to PR_SET_PDEATHSIG: a helper process a rank started
is not killed with it, as multiprocessing's server kills no child when it exits.)
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import gc
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import connection, context, forkserver as mp_forkserver, popen_forkserver, reduction
from multiprocessing import resource_tracker, spawn, util
from pathlib import Path
from typing import Iterable, Iterator, Sequence

SWITCH = "ACCEL_KIT_FORKSERVER"  # "0": every point in a fresh interpreter
MAX_SERVERS = 2  # each holds torch's memory (a few hundred MiB); tests change PYTHONPATH now and then
#: Variables the child applies itself, so they are not part of a server's key.
CHILD_APPLIED = ("OMP_NUM_THREADS",)
CHILD_APPLIED_PREFIX = "ACCEL_KIT_"
#: Variables that nothing reads at import and that change from call to call: not part of a server's key
#: either (pytest sets PYTEST_CURRENT_TEST to each test's id; with it, every test started a server of its own).
#: The child still gets the point's value: its ``os.environ`` is the point's exact environment.
KEY_IGNORED = ("PYTEST_CURRENT_TEST",)
#: Imported before any fork: what the worker imports for every point kind (no device is touched).
PRELOAD = ("torch", "torch.distributed",
           # imported by a model's first build on the meta device (count_params): seconds, and no thread
           "torch._dynamo",
           "accel_kit.engine.forkserver",  # the ranks' entry point (``_rank_main``)
           "accel_kit.engine.worker", "accel_kit.engine.point", "accel_kit.peaks",
           "accel_kit.systems", "accel_kit.devices.cpu", "accel_kit.results",
           "accel_kit.models", "accel_kit.data", "accel_kit.timing", "accel_kit.energy", "accel_kit.flops",
           "accel_kit.sparsity", "accel_kit.precision", "accel_kit.atomic", "accel_kit.engine.attention",
           "accel_kit.engine.step", "accel_kit.engine.eager",
           # the engine's measurement path where it has these modules (a missing one is skipped)
           "accel_kit.engine.kinds", "accel_kit.engine.result", "accel_kit.engine.measurement")
# Not here: each kind's own module (``accel_kit.engine.kinds.KIND_MODULES``) and what only some points import
# (transformers' layers, seconds): the kind's registration names them (``KindSpec.preload_for``) and the
# server imports them before forking its first point of the kind, once per server.
WAIT_SLICE_S = 0.2  # the longest a runner waits on its point's ranks before checking for signals
_PR_SET_PDEATHSIG = 1
#: What the child's ``spawn.prepare`` is not given: the runner's main module (re-run in every child) and
#: its ``sys.path``/``sys.argv`` (the server's path follows the point's PYTHONPATH; the worker sets argv).
_PREPARATION_LEFT_OUT = ("init_main_from_name", "init_main_from_path", "sys_path", "sys_argv")


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether points may start from a fork server (``ACCEL_KIT_FORKSERVER`` is not ``0``)."""
    env = os.environ if environ is None else environ
    return env.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def forkable(launcher: str, nodes: int, launch_prefix: list[str], extra_env: dict[str, str]) -> bool:
    """Whether a point may start from a fork server: its ranks (one, or a group) on this node, no launcher."""
    return launcher == "local" and nodes == 1 and not launch_prefix and not extra_env


@contextlib.contextmanager
def local_group(ranks: int, env: dict[str, str]) -> Iterator[list[dict[str, str]]]:
    """Each rank's environment for a group of ``ranks`` on this node, their rendezvous held for the block
    (``accel_kit.engine.launch.local_rendezvous``)."""
    from accel_kit.engine.launch import local_rendezvous

    with local_rendezvous() as rendezvous:
        shared = rendezvous | {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0"}
        if ranks > 1 and not env.get("OMP_NUM_THREADS"):
            shared["OMP_NUM_THREADS"] = "1"  # torchrun's default for several ranks: the same measurement
        yield [env | shared | {"RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(ranks)]


@dataclass
class Finished:
    """How a point's process ended: its exit code (None: killed at the timeout) and where its output is."""

    returncode: int | None
    output: bytes


class ServerGone(RuntimeError):
    """The fork server ended (or never answered) before the point did."""


# ----------------------------------------------------------------------------- the runner's side


def server_key(env: dict[str, str], cwd: str | None = None) -> tuple:
    """What a server's preloaded state depends on: the interpreter, the directory, the environment it starts with."""
    kept = tuple(sorted((k, v) for k, v in env.items()
                        if k not in CHILD_APPLIED and k not in KEY_IGNORED and not k.startswith(CHILD_APPLIED_PREFIX)))
    return sys.executable, cwd or os.getcwd(), kept


class _RankPopen(popen_forkserver.Popen):
    """multiprocessing's forkserver Popen, started through one of this module's servers (multiprocessing's
    own goes to its one global server), its child given less to prepare (``_PREPARATION_LEFT_OUT``)."""

    def __init__(self, process_obj, server: ForkServer):
        self._server = server
        super().__init__(process_obj)

    def _launch(self, process_obj) -> None:  # popen_forkserver.Popen._launch, but for the two differences
        prep_data = {k: v for k, v in spawn.get_preparation_data(process_obj._name).items()
                     if k not in _PREPARATION_LEFT_OUT}
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = self._server.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)  # the child's sentinel of its parent, as multiprocessing keeps it
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        # The server answers with the child's pid once it has forked it, which a new server does only after its
        # preload: an import that hangs there would hold this read (and the sweep) for good, so it is bounded.
        if not connection.wait([self.sentinel], self._server.start_timeout_s):
            raise ServerGone(f"the fork server forked nothing within {self._server.start_timeout_s:.0f} s")
        self.pid = mp_forkserver.read_signed(self.sentinel)


class _Rank(context.ForkServerProcess):
    """A Process forked by ``server`` (the server is not part of what the child unpickles)."""

    def __init__(self, server: ForkServer, **kwargs):
        super().__init__(**kwargs)
        self._server = server

    def _Popen(self, process_obj):  # (BaseProcess.start calls self._Popen(self))
        return _RankPopen(process_obj, self._server)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_server"}


class ForkServer(mp_forkserver.ForkServer):
    """One of multiprocessing's fork servers, started with a point's environment and ``modules`` preloaded."""

    def __init__(self, env: dict[str, str], modules: Sequence[str] = PRELOAD, *, start_timeout_s: float = 300):
        """Start the server with ``env`` (the point's environment; the child-applied variables left out)
        and check that it forks (``status``); raises ServerGone where it does not."""
        super().__init__()
        self.start_timeout_s = start_timeout_s
        self.modules = tuple(dict.fromkeys(modules))
        self.set_forkserver_preload(list(self.modules))
        self.proc: subprocess.Popen | None = None
        self.running, self.retired, self._running_lock = 0, False, threading.Lock()
        self._start(env)
        try:
            self.ready = self.status(timeout_s=start_timeout_s)
        except ServerGone as exc:
            status = self.proc.poll()
            if status is None:  # still in its preload (an import that hangs): closing its pipe would not end it
                self.proc.kill()
            self.close()
            raise ServerGone(f"the fork server did not start (exit status {status}): {exc}") from exc

    def _start(self, env: dict[str, str]) -> None:
        """``ensure_running``'s start of multiprocessing's server loop, but with ``env`` (ensure_running
        starts it with this process's ``os.environ``) and in a session of its own (a terminal's Ctrl-C goes to
        the runner, whose exit closes the alive pipe)."""
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # every holder of alive_w keeps the server up
            cmd = (f"from multiprocessing.forkserver import main; "
                   f"main({listener.fileno()}, {alive_r}, {list(self._preload_modules)!r})")
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", cmd], env={k: v for k, v in env.items() if k not in CHILD_APPLIED},
                    pass_fds=[listener.fileno(), alive_r], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    start_new_session=True)
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
        self._forkserver_address, self._forkserver_alive_fd, self._forkserver_pid = address, alive_w, self.proc.pid

    def ensure_running(self) -> None:
        """(called by ``connect_to_new_process``) A server that ended is reported, not restarted behind the
        caller's back: its points died with it (``server_for`` starts another)."""
        if self.proc is None or self._forkserver_alive_fd is None or self.proc.poll() is not None:
            raise ServerGone("the fork server has ended")

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.proc is not None and self.proc.poll() is None

    def status(self, *, timeout_s: float = 60) -> dict:
        """The server's state: its threads, whether a device was initialised (seen from a fork of it), its
        preloaded modules. Raises ServerGone where no fork of it answers within ``timeout_s``."""
        reader, writer = connection.Pipe(duplex=False)
        with reader:
            probe = _Rank(self, target=_report_status, args=(writer, self.modules))
            try:
                probe.start()  # (returns once the server forked it: after its preload)
            except (OSError, EOFError) as exc:
                raise ServerGone(f"the fork server is gone: {exc}") from exc
            finally:
                writer.close()
            try:
                report = reader.recv() if reader.poll(timeout_s) else None
            except EOFError:
                report = None
            probe.join(timeout_s)
        if report is None:
            raise ServerGone("a fork of the server did not report")
        return report | {"threads": len(os.listdir(f"/proc/{self.proc.pid}/task"))}

    def run(self, argv: list[str], *, envs: Sequence[dict[str, str]], output: Path, timeout_s: float,
            memory_limit_bytes: int | None = None) -> Finished:
        """Fork one child per environment in ``envs`` (a point's ranks; one for a single process), each
        running ``worker.main(argv)``; wait at most ``timeout_s`` for all of them. Their output goes to
        ``output``.

        At the timeout (or if this call is interrupted, e.g. a Ctrl-C) every child's process group is
        killed, and so are the others' once one child exits with an error (whose code is returned).
        Raises ServerGone if the server ends before every child's exit is known.
        """
        with self._running_lock:
            self.running += 1
        ranks: list[_Rank] = []
        try:
            for env in envs:
                request = {"argv": argv, "env": env, "cwd": os.getcwd(), "output": str(output),
                           "memory_limit_bytes": memory_limit_bytes, "server": self.proc.pid}
                rank = _Rank(self, target=_rank_main, args=(request,), name=f"rank-{env.get('RANK', '0')}")
                try:
                    rank.start()
                except (OSError, EOFError) as exc:
                    raise ServerGone(f"the fork server is gone: {exc}") from exc
                ranks.append(rank)
            codes, timed_out = self._wait(ranks, timeout_s)
        finally:
            _kill_groups(ranks)  # (interrupted, or a rank not started: those still running)
            self._release()
        failed = [code for code in codes if code]
        text = output.read_bytes() if output.exists() else b""
        return Finished(None if timed_out else (failed[0] if failed else 0), text)

    def _wait(self, ranks: list[_Rank], timeout_s: float) -> tuple[list[int], bool]:
        """Every rank's exit code, in the order they ended (first the first failure's); whether the timeout hit."""
        deadline = time.monotonic() + timeout_s
        running = {rank.sentinel: rank for rank in ranks}
        codes: list[int] = []
        timed_out = False
        while running:
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                _kill_groups(running.values())
                timed_out = True
            # In slices: a signal (a Ctrl-C, a notebook's interrupt) delivered to another of this
            # process's threads does not wake this wait, and Python raises KeyboardInterrupt only
            # when the main thread comes back to run bytecode; a wait of the whole timeout held a
            # Ctrl-C back for up to that long.
            for sentinel in connection.wait(list(running), WAIT_SLICE_S if timed_out else
                                            max(min(left, WAIT_SLICE_S), 0.001)):
                code = running.pop(sentinel).exitcode
                if code == 255 and self._ended():  # multiprocessing's code for a server gone before the rank
                    raise ServerGone("the fork server ended before the point did")
                codes.append(code)
                if code:  # as torchrun: one rank failed, the group is done
                    _kill_groups(running.values())
        return codes, timed_out

    def _ended(self) -> bool:
        try:
            self.proc.wait(timeout=5)  # (its pipes close as it exits, a moment before it can be reaped)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _release(self) -> None:
        with self._running_lock:
            self.running -= 1
            done = self.retired and not self.running
        if done:
            self.close()

    def retire(self) -> None:
        """Close the server once no point of it runs (now where none does)."""
        with self._running_lock:
            self.retired = True
            done = not self.running
        if done:
            self.close()

    def close(self) -> None:
        """Close the alive pipe: the server exits, and its points with it."""
        if self._forkserver_alive_fd is not None:
            os.close(self._forkserver_alive_fd)
            self._forkserver_alive_fd = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a server that hangs on exit is killed
                self.proc.kill()
                self.proc.wait()
        if self._forkserver_address:
            with contextlib.suppress(OSError):
                os.unlink(self._forkserver_address)
            self._forkserver_address = None


def _kill_groups(ranks: Iterable[_Rank]) -> None:
    """SIGKILL the process group of every rank whose exit is not known yet (its helpers die too)."""
    for rank in list(ranks):
        if rank._popen is None or rank.exitcode is not None:  # (not started; or reaped: its pid may be reused)
            continue
        try:
            os.killpg(rank.pid, signal.SIGKILL)  # the rank leads its own session and group
        except ProcessLookupError:  # killed before its setsid: its group is still the server's
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank.pid, signal.SIGKILL)


_servers: collections.OrderedDict[tuple, ForkServer] = collections.OrderedDict()
_servers_lock = threading.Lock()
_failed: set[tuple] = set()  # (key, modules) whose server did not start: their points exec, without a retry each


def server_for(env: dict[str, str], preload: Sequence[str] = ()) -> ForkServer:
    """The running server of ``env``'s key that has imported ``preload`` (beyond ``PRELOAD``), started now if
    there is none: with the modules of the key's server so far and ``preload`` (that one retired). The least
    recently used servers beyond MAX_SERVERS are retired.

    Raises ServerGone where such a server failed to start (once per process: later calls fail at once).
    """
    key = server_key(env)
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is not None and not server.alive():
            server.retire()
            server = None
        known = server.modules if server is not None else PRELOAD
        if server is None or not set(preload) <= set(known):
            modules = tuple(dict.fromkeys((*known, *preload)))
            try:
                if (key, modules) in _failed:
                    raise ServerGone("this environment's fork server did not start earlier")
                started = ForkServer(env, modules)
            except ServerGone:
                _failed.add((key, modules))
                if server is not None:  # the one without these modules still serves the key's other points
                    _servers[key] = server
                raise
            if server is not None:
                server.retire()
            server = started
        _servers[key] = server
        while len(_servers) > MAX_SERVERS:
            _servers.popitem(last=False)[1].retire()
        return server


def shutdown() -> None:
    """Close every fork server of this process (also run at exit)."""
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].close()


def discard(server: ForkServer) -> None:
    """Forget a server that failed (the next point starts another)."""
    with _servers_lock:
        for key, known in list(_servers.items()):
            if known is server:
                del _servers[key]
    server.close()


def _forget_in_child() -> None:
    """In a fork of the runner (multiprocessing, say): its copies of the alive pipes closed, the servers
    left to the runner (a copy held open would keep a server alive after the runner's death)."""
    global _servers_lock
    _servers_lock = threading.Lock()
    for server in _servers.values():
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
    _servers.clear()


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_in_child)


# ----------------------------------------------------------------------------- in a fork of the server


def preload(names: Sequence[str] = PRELOAD) -> None:
    """Import ``names`` as a server does at its start (``multiprocessing.forkserver.main``: one that this
    environment cannot import is skipped), for an interpreter to compare a server with."""
    for name in names:
        with contextlib.suppress(ImportError):
            __import__(name)


def _report_status(conn: connection.Connection, modules: Sequence[str]) -> None:
    import torch

    conn.send({"pid": os.getppid(), "initialized": _initialized_backends(torch),
               "modules": sorted(name for name in modules if name in sys.modules)})
    conn.close()


def _initialized_backends(torch) -> list[str]:
    """torch's backend modules that the server initialised (each that has ``is_initialized``: every device
    backend's, and torch.distributed's process group), named without naming any device. Asked in a fork, so
    a backend's "bad fork" (its parent initialised it) counts too."""
    names = []
    for name in sorted(dir(torch)):
        backend = getattr(torch, name, None)
        probes = [getattr(backend, attr, None) for attr in ("is_initialized", "_is_in_bad_fork")]
        if name.startswith("_") or not callable(probes[0]):
            continue
        try:
            if any(callable(probe) and probe() for probe in probes):
                names.append(name)
        except Exception:  # noqa: BLE001 - a backend this build cannot ask: not initialised by us
            pass
    return names


def _rank_main(request: dict) -> None:
    """A rank's process (a fork of the server, run by multiprocessing's bootstrap, which reports an
    exception's traceback and a SystemExit's code): become the point's process, run the worker."""
    os.setsid()
    # What the server imported is the collector's permanent generation here: the worker's collection before it
    # ends its process group (worker.end_group) scans only what the point made (about 0.2 s less a group point).
    gc.freeze()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the server gone (even SIGKILLed): this point goes too
    if os.getppid() != request["server"]:  # it went before the line above
        os._exit(1)
    # Its copy of the alive pipe closed: only the runner keeps the server (and so this rank) alive. A point
    # that starts forkserver processes of its own gets a server of its own, as in a fresh interpreter.
    server = mp_forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = server._forkserver_address = None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    limit = request.get("memory_limit_bytes")
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        # OpenMP read OMP_NUM_THREADS when torch loaded in the server (started without it): set here.
        torch.set_num_threads(int(threads))
    import random

    # A fresh interpreter seeds these from the OS; a fork would repeat the server's state in every point.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    from accel_kit.engine.worker import __file__ as worker_file, main

    sys.argv = [worker_file, *request["argv"]]
    sys.exit(main(request["argv"]) or 0)
