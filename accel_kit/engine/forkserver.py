"""Points started from a preloaded interpreter: a fork server per environment.

``import torch`` alone takes seconds, and every point runs in a process of its own (a crash, an
out-of-memory or a hang costs that point only). A fork server is a Python process that has
imported torch and the worker's modules, touched no device and started no thread pool; each
point is a ``fork()`` of it that calls ``accel_kit.engine.worker.main``. Isolation stays as with a
fresh interpreter: one process per point in a session of its own (a timeout kills its whole
process group), its memory cap (RLIMIT_DATA), its output in a file whose tail goes into the
record, and only the runner appends records.

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

What a fork cannot change is read at the server's start: the C allocator's settings
(``GLIBC_TUNABLES``, from the adapter's ``worker_env()``), the CPU ISA overrides
(``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``), ``PYTHONPATH`` and the interpreter. So servers
are keyed by the interpreter, the working directory and the whole environment except what the
child applies itself: ``OMP_NUM_THREADS`` (``torch.set_num_threads`` in the child, as OpenMP read
the variable when it loaded in the server) and accel-kit's own ``ACCEL_KIT_*`` variables, which
accel-kit reads when called, never at import (and pytest's ``PYTEST_CURRENT_TEST``, which names each test
in turn). The child's ``os.environ`` is the point's exact
environment.

Lifetime: a server starts on a runner's first point of its key and lives as long as the runner
(at most ``MAX_SERVERS`` at once, the least recently used closed first). It exits when its control
socket closes, which the kernel does when the runner dies, even by SIGKILL; it kills its running
points' process groups first. A point's child dies with the server (PR_SET_PDEATHSIG), and the
runner's end of a point's report socket closing (a timeout, a Ctrl-C in a notebook) kills that
point's group.

Protocol (Unix SOCK_SEQPACKET sockets, one JSON message per packet): the runner sends a request
with the point's report socket attached (SCM_RIGHTS) on the control socket; the server answers on
the report socket ``{"pid": N}`` once forked and ``{"exit": code}`` once reaped (code as
``Popen.returncode``: negative for a signal). The runner shutting its end of the report socket
asks the server to kill the point's process group.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

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
_MAX_PACKET = 1 << 20
WAIT_SLICE_S = 0.2  # the longest a runner waits on its point's report before checking for signals
_PR_SET_PDEATHSIG = 1


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


class ForkServer:
    """One fork server process and the runner's end of its control socket."""

    def __init__(self, env: dict[str, str], *, start_timeout_s: float = 300):
        """Start the server with ``env`` (the point's environment; the child-applied variables left out)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {k: v for k, v in env.items() if k not in CHILD_APPLIED}
        # A session of its own: a terminal's Ctrl-C goes to the runner, whose exit closes the control socket.
        self.proc = subprocess.Popen([sys.executable, "-m", "accel_kit.engine.forkserver", str(theirs.fileno())],
                                     env=server_env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.control, self.lock = ours, threading.Lock()
        ours.settimeout(start_timeout_s)
        try:
            self.ready = json.loads(ours.recv(_MAX_PACKET) or b"null")
        except (OSError, ValueError):
            self.ready = None
        if not self.ready:
            self.close()
            raise ServerGone(f"the fork server did not start (exit status {self.proc.poll()})")
        ours.settimeout(None)

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.proc.poll() is None

    def status(self) -> dict:
        """The server's own state (threads, whether a device was initialised): for tests."""
        report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with report:
            self._send({"op": "status"}, theirs)
            report.settimeout(60)
            return json.loads(report.recv(_MAX_PACKET))

    def run(self, argv: list[str], *, envs: Sequence[dict[str, str]], output: Path, timeout_s: float,
            memory_limit_bytes: int | None = None, preload: Sequence[str] = ()) -> Finished:
        """Fork one child per environment in ``envs`` (a point's ranks; one for a single process), each
        running ``worker.main(argv)``; wait at most ``timeout_s`` for all of them. Their output goes to
        ``output``.

        ``preload``: modules the server imports before these forks (kept for later points), beyond ``PRELOAD``.

        At the timeout (or if this call is interrupted, e.g. a Ctrl-C) every child's process group is
        killed, and so are the others' once one child exits with an error (whose code is returned).
        Raises ServerGone if the server ends before every child's exit is known.
        """
        reports: list[socket.socket] = []
        try:
            for env in envs:
                report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                reports.append(report)
                self._send({"op": "run", "argv": argv, "env": env, "cwd": os.getcwd(), "output": str(output),
                            "memory_limit_bytes": memory_limit_bytes, "preload": list(preload)}, theirs)
            codes, timed_out = self._wait(reports, timeout_s)
        finally:
            for report in reports:  # (closed early, e.g. interrupted: the server kills those groups)
                report.close()
        failed = [code for code in codes if code]
        text = output.read_bytes() if output.exists() else b""
        return Finished(None if timed_out else (failed[0] if failed else 0), text)

    @staticmethod
    def _wait(reports: list[socket.socket], timeout_s: float) -> tuple[list[int], bool]:
        """Every child's exit code, in the order they ended (first the first failure's); whether the timeout hit."""
        deadline = time.monotonic() + timeout_s
        running, codes, killed = set(reports), [], set()

        def kill(which) -> None:  # ask the server to kill these groups; their exits are still reported
            for report in set(which) - killed:
                report.shutdown(socket.SHUT_WR)
                killed.add(report)

        timed_out = False
        while running:
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                kill(running)
                timed_out = True
            # In slices: a signal (a Ctrl-C, a notebook's interrupt) delivered to another of this
            # process's threads does not wake this wait, and Python raises KeyboardInterrupt only
            # when the main thread comes back to run bytecode; a wait of the whole timeout held a
            # Ctrl-C back for up to that long.
            ready, _, _ = select.select(list(running), [], [],
                                        WAIT_SLICE_S if timed_out else max(min(left, WAIT_SLICE_S), 0.001))
            for report in ready:
                msg = report.recv(_MAX_PACKET)
                if not msg:
                    raise ServerGone("the fork server ended before the point did")
                code = json.loads(msg).get("exit")
                if code is None:  # {"pid": N}: forked
                    continue
                running.discard(report)
                codes.append(code)
                if code:  # as torchrun: one rank failed, the group is done
                    kill(running)
        return codes, timed_out

    def _send(self, request: dict, report: socket.socket) -> None:
        try:
            with self.lock:
                socket.send_fds(self.control, [json.dumps(request).encode()], [report.fileno()])
        except OSError as exc:
            raise ServerGone(f"the fork server is gone: {exc}") from exc
        finally:
            report.close()  # the server holds its own copy now

    def close(self) -> None:
        """Close the control socket: the server kills its points and exits."""
        self.control.close()
        try:
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a server that hangs on exit is killed
            self.proc.kill()
            self.proc.wait()


_servers: collections.OrderedDict[tuple, ForkServer] = collections.OrderedDict()
_servers_lock = threading.Lock()
_failed: set[tuple] = set()  # keys whose server did not start: their points exec, without a retry each


def server_for(env: dict[str, str]) -> ForkServer:
    """The running server of ``env``'s key, started now if there is none (the oldest closed beyond MAX_SERVERS).

    Raises ServerGone where that key's server failed to start (once per process: later calls fail at once).
    """
    key = server_key(env)
    with _servers_lock:
        if key in _failed:
            raise ServerGone("this environment's fork server did not start earlier")
        server = _servers.pop(key, None)
        if server is not None and not server.alive():
            server.close()
            server = None
        if server is None:
            try:
                server = ForkServer(env)
            except ServerGone:
                _failed.add(key)
                raise
        _servers[key] = server
        while len(_servers) > MAX_SERVERS:
            _servers.popitem(last=False)[1].close()
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
    """In a fork of the runner (multiprocessing, say): its copies of the control sockets closed, the servers
    left to the runner (a copy held open would keep a server alive after the runner's death)."""
    global _servers_lock
    _servers_lock = threading.Lock()
    for server in _servers.values():
        server.control.close()
    _servers.clear()


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_in_child)


# ----------------------------------------------------------------------------- the server's side


_loaded: list[str] = []  # what this server has imported: PRELOAD, then the requests' preloads


def preload(names: Sequence[str] = PRELOAD) -> None:
    """Import ``names`` (``PRELOAD``: what a server does before its first fork), skipping what this
    environment lacks."""
    for name in names:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - one this environment cannot import: the child imports (and reports) it
            pass
        _loaded.append(name)


def _self_status() -> dict:
    import torch

    return {"threads": len(os.listdir("/proc/self/task")), "pid": os.getpid(),
            "initialized": _initialized_backends(torch), "modules": sorted(_loaded)}


def _initialized_backends(torch) -> list[str]:
    """torch's backend modules already initialised here (each that has ``is_initialized``: every device
    backend's, and torch.distributed's process group), named without naming any device."""
    names = []
    for name in sorted(dir(torch)):
        probe = getattr(getattr(torch, name, None), "is_initialized", None)
        if callable(probe) and not name.startswith("_"):
            try:
                if probe():
                    names.append(name)
            except Exception:  # noqa: BLE001 - a backend this build cannot ask: not initialised by us
                pass
    return names


def serve(control_fd: int) -> None:
    """The server's loop: fork a child per request, report its pid and exit code, kill on request or EOF."""
    # Python's own handlers would turn a stray SIGINT into a traceback; the control socket governs the exit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    preload()
    control.sendall(json.dumps(_self_status()).encode())
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, report socket)
    by_report: dict[int, int] = {}  # report fd -> pidfd
    while True:
        ready, _, _ = select.select([control, *children, *by_report], [], [])
        # The control socket last: a request opens descriptors, which may reuse the number of one reaped here.
        for fd in sorted(ready, key=lambda fd: fd is control):
            if fd is control:
                if not _take_request(control, children, by_report):
                    _kill_all(children)
                    return
            elif isinstance(fd, int) and fd in children:
                _reap(fd, children, by_report)
            elif fd in by_report:  # the runner shut its end: a timeout or an interrupt
                pid = children[by_report.pop(fd)][0]
                _killpg(pid)


def _take_request(control: socket.socket, children: dict, by_report: dict) -> bool:
    msg, fds, _, _ = socket.recv_fds(control, _MAX_PACKET, 1)
    if not msg:
        return False
    report = socket.socket(fileno=fds[0]) if fds else None
    request = json.loads(msg)
    if report is None:
        return True
    if request["op"] == "status":
        with report:
            report.sendall(json.dumps(_self_status()).encode())
        return True
    preload(request.get("preload", ()))  # (modules only: importing them touches no device, starts no thread)
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(request, server, [control, report, *by_report], list(children))
    pidfd = os.pidfd_open(pid)
    children[pidfd] = (pid, report)
    by_report[report.fileno()] = pidfd
    _send_quiet(report, {"pid": pid})
    return True


def _reap(pidfd: int, children: dict, by_report: dict) -> None:
    pid, report = children.pop(pidfd)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    by_report.pop(report.fileno(), None)
    _send_quiet(report, {"exit": os.waitstatus_to_exitcode(status)})
    report.close()


def _kill_all(children: dict) -> None:
    for pidfd, (pid, report) in list(children.items()):
        _killpg(pid)
        os.waitpid(pid, 0)
        report.close()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session and group: its helpers die too
    except ProcessLookupError:
        pass


def _send_quiet(report: socket.socket, message: dict) -> None:
    try:
        report.sendall(json.dumps(message).encode())
    except OSError:  # the runner closed its end already (interrupted): nobody to tell
        pass


def _child(request: dict, server: int, sockets: list, fds: list[int]) -> None:
    """In the forked child: become the point's process, run the worker, never return."""
    code = 1
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the server gone (even SIGKILLed): this point goes too
        if os.getppid() != server:  # it went before the line above
            os._exit(1)
        for sock in sockets:
            if isinstance(sock, int):
                os.close(sock)
            else:
                sock.close()
        for fd in fds:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        code = _run_worker_in_child(request)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the traceback goes to the point's output, as a fresh worker's would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_worker_in_child(request: dict) -> int:
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
    return main(request["argv"]) or 0


if __name__ == "__main__":
    serve(int(sys.argv[1]))
