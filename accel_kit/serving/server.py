"""An OpenAI-compatible server on the loopback, as a process with a bounded lifetime.

``Server`` starts an engine's server (``transformers serve`` or vLLM's OpenAI API server) in a
session of its own, waits for its ``/health`` with a bounded wait, and stops it (the whole process
group: SIGTERM, then SIGKILL after a grace period) when its ``with`` block ends, an exception or a
KeyboardInterrupt included. Its output goes to a log file whose tail is the reason when it dies.

The port: a given port is checked free first (one line when it is taken); else the kernel picks one
(a socket bound to port 0, closed just before the server binds it: the window is a few milliseconds,
and a server that then fails to bind dies at start with its log tail, never silently).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from accel_kit.errors import ParameterError

Engine = Literal["transformers", "vllm"]
HOST = "127.0.0.1"
#: the make target that builds each engine's environment, named when it is missing
INSTALL_HINT = {"transformers": "make install (the serving extra: pip install -e '.[serving]')",
                "vllm": "make vllm"}
#: the environment vLLM on a CPU runs from (make vllm): it pins its own torch and transformers
VLLM_VENV = Path(os.environ.get("ACCEL_KIT_VLLM_VENV") or Path(__file__).resolve().parents[2] / ".venv-vllm")
LOG_TAIL_LINES = 30
#: GiB of host memory vLLM's CPU backend holds for its KV cache (VLLM_CPU_KVCACHE_SPACE overrides it)
VLLM_CPU_KV_CACHE_GIB = 1
STOP_GRACE_S = 10.0


class ServerDied(RuntimeError):
    """The server process ended (at start or mid-run); the message is its log tail."""


def _die_with_parent() -> None:
    """In the server's child, before exec: SIGKILL when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a point killed for its timeout (its process group, which the server's own session is
    not in) leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def port_taken(port: int, host: str = HOST) -> bool:
    """Whether something already listens on ``host:port`` (or the port cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def pick_port(port: int | None, host: str = HOST) -> int:
    """``port`` if it is free (a ParameterError when taken), else one the kernel picks."""
    if port is not None:
        if port_taken(port, host):
            raise ParameterError(f"server port {port} is already taken on {host}: choose another or leave it unset")
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def vllm_python() -> Path | None:
    """The Python of the vLLM environment (make vllm), or None where it is not built."""
    python = VLLM_VENV / "bin" / "python"
    return python if python.exists() else None


def check_engine(engine: str) -> None:
    """A ParameterError naming the make target when ``engine``'s server is not installed."""
    import importlib.util

    if engine == "transformers":
        missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
        if missing:
            raise ParameterError(f"engine transformers: transformers serve needs {', '.join(missing)}, not installed: "
                                 f"{INSTALL_HINT['transformers']}")
    elif engine == "vllm":
        if vllm_python() is None and importlib.util.find_spec("vllm") is None:
            raise ParameterError(f"engine vllm is not installed (no {VLLM_VENV}/bin/python, no vllm module): "
                                 f"{INSTALL_HINT['vllm']}")
    else:
        raise ParameterError(f"engine {engine!r} is not known; known: transformers, vllm")


def server_command(engine: Engine, model_dir: Path, port: int, *, dtype: str, max_model_len: int,
                   device: str = "cpu") -> list[str]:
    """The command line of ``engine``'s server for ``model_dir`` on the loopback."""
    if engine == "transformers":
        # the CLI of the interpreter that runs accel-kit, so the server uses the same transformers and torch
        cli = Path(sys.executable).with_name("transformers")
        exe = [str(cli)] if cli.exists() else [shutil.which("transformers") or "transformers"]
        return [*exe, "serve", str(model_dir), "--host", HOST, "--port", str(port), "--device", device,
                "--dtype", dtype, "--log-level", "warning"]
    python = vllm_python() or Path(sys.executable)
    # the module, not the `vllm` script: vllm-cpu's script asks for the distribution "vllm" by name and fails
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", HOST, "--port", str(port), "--load-format", "dummy", "--dtype", dtype,
            "--max-model-len", str(max_model_len),
            # on a CPU, eager: its torch.compile warm-up takes minutes on a small machine; a GPU keeps its graphs
            *(["--enforce-eager"] if device == "cpu" else [])]


@dataclass
class Server:
    """One engine's server for one model folder; a context manager that starts, health-checks and stops it."""

    engine: Engine
    model_dir: Path
    log_path: Path
    dtype: str = "float32"
    max_model_len: int = 256
    port: int | None = None
    start_timeout_s: float = 120.0
    device: str = "cpu"  # transformers serve's --device (vLLM's build decides its own)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    start_s: float | None = None  # start to healthy, seconds

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def model_name(self) -> str:
        """The name requests give as ``model``: both engines serve a folder under its path."""
        return str(self.model_dir)

    def __enter__(self) -> "Server":
        check_engine(self.engine)
        self.port = pick_port(self.port)
        cmd = server_command(self.engine, self.model_dir, self.port, dtype=self.dtype, max_model_len=self.max_model_len,
                             device=self.device)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log_path, "wb") as log:
            # a session of its own: the whole group (uvicorn, vLLM's engine core) is stopped together
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=self._environment(),
                                         preexec_fn=_die_with_parent)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        if self.engine == "vllm" and vllm_python() is not None:
            env.pop("PYTHONPATH", None)  # its own environment: none of the main one's packages in front of its own
        if self.engine == "vllm" and self.device == "cpu":
            # vLLM on a CPU reserves its KV cache from host memory, by default 92 % of it (--gpu-memory-utilization),
            # and refuses to start when less is free (a shared machine): a fixed size instead, settable
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(VLLM_CPU_KV_CACHE_GIB))
        return env

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ServerDied(f"{self.engine} server not healthy after {self.start_timeout_s:.0f} s; log tail:\n"
                         f"{self.log_tail()}")

    def check_alive(self, wait_s: float = 0.0) -> None:
        """A ServerDied with the log tail when the server has exited (or exits within ``wait_s``: a request cut off
        may be the server dying, which the kernel reports a moment later)."""
        if self.proc is not None and wait_s > 0:
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerDied(f"{self.engine} server exited with status {self.proc.returncode}; log tail:\n"
                             f"{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``STOP_GRACE_S``; returns once no process
        of the group is left (vLLM's engine core and workers are the leader's children, in its group)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            if _group_gone(proc, wait_s):
                break
        if proc.poll() is None:
            proc.wait(timeout=5.0)


def _group_gone(proc: subprocess.Popen, wait_s: float) -> bool:
    """Whether the group ``proc`` leads has no process left within ``wait_s`` (the leader reaped meanwhile)."""
    deadline = time.monotonic() + wait_s
    while True:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)

def vllm_cpu_reason() -> str | None:
    """Why vLLM cannot serve on this machine's CPU, or None where it may: its CPU backend needs AVX-512 or
    AVX2 on x86 (torch's capability probe), and its environment (make vllm)."""
    try:
        import torch

        cap = torch.backends.cpu.get_cpu_capability()
    except Exception as e:  # noqa: BLE001 - a probe that fails is a reason, not a crash
        return f"cannot probe the CPU's vector capability: {e}"
    if cap not in ("AVX512", "AVX2"):
        return f"vllm-cpu needs AVX2 or AVX-512 on x86; this CPU's capability is {cap}"
    if vllm_python() is None:
        return f"the vLLM environment is not built ({INSTALL_HINT['vllm']})"
    return None

