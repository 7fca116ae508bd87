"""A two-node Slurm cluster on this machine, for the tests marked ``cluster`` (tests/test_cluster.py).

Each node is a network namespace (``ip netns``) with its own hostname (a UTS namespace) and its own
``/etc/hosts`` (a private mount namespace, the file bind-mounted from the scratch folder), where a
``slurmd -N nodeK -D`` runs; a veth pair joins it to a bridge in this namespace, whose address, in a
private range (198.18.0.0/15, RFC 2544's benchmarking block), is the controller's: ``slurmctld`` runs
here, beside ``munged``, all three with their state, logs, sockets and key in the scratch folder and
``SLURM_CONF`` pointing to a generated ``slurm.conf``. Traffic stays on those links and the loopback.

Every name the harness makes (namespaces, links) starts with its per-run ``prefix`` (``akc`` and this
process's id), every process it starts is known by its id (the daemons it started, and whatever runs
inside its namespaces, ``ip netns pids``), and ``stop`` ends them by those ids, removes the namespaces,
the bridge and the scratch folder; it runs on success, on failure, and at exit (Ctrl-C). Every wait is
bounded in count and time.

``tests/cluster_setup.sh`` installs the Debian packages (as root, with the registry reachable);
``why_not()`` says why this machine cannot bring a cluster up (the tests skip with it).
"""
from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

PREFIX = "akc"  # the start of every namespace and link name the harness makes
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scontrol", "scancel", "ip",
            "nsenter", "unshare", "mount")
NODES = ("node1", "node2")
# 198.18.0.0/15 (RFC 2544): a block for benchmark networks, routed nowhere; one /24 of it per run.
NETWORK_BLOCK = ipaddress.ip_network("198.18.0.0/15")
UP_TIMEOUT_S = 60  # each daemon's health check: this long at most, polled every POLL_S
POLL_S = 0.5


def why_not() -> str | None:
    """Why this machine cannot bring the cluster up (not root, a binary missing, no namespaces); None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces, slurmd); run as root: sh tests/cluster_setup.sh && make test-cluster"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"needs {', '.join(missing)} (Debian's slurmctld slurmd slurm-client munge mpich): "
                "sh tests/cluster_setup.sh installs them")
    try:
        probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True,
                               timeout=30)
    except subprocess.TimeoutExpired:
        return "unshare --net --uts --mount did not return in 30 s"
    if probe.returncode:
        return f"this machine cannot make namespaces: unshare --net --uts --mount: {probe.stderr.strip()[-200:]}"
    return None


def _run(cmd: list[str], *, timeout_s: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kw)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: status {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _subnet() -> ipaddress.IPv4Network:
    """A /24 of the block that no address of this machine is in (another run's, or the machine's own)."""
    words = _run(["ip", "-o", "-4", "addr", "show"]).stdout.split()
    used = [ipaddress.ip_interface(words[i + 1]).ip for i, w in enumerate(words[:-1]) if w == "inet"]
    subnets = list(NETWORK_BLOCK.subnets(new_prefix=24))
    start = os.getpid() % len(subnets)
    for i in range(len(subnets)):
        net = subnets[(start + i) % len(subnets)]
        if not any(ip in net for ip in used):
            return net
    raise RuntimeError(f"every /24 of {NETWORK_BLOCK} is in use here")


def wait_for(what: str, ready, *, timeout_s: float = UP_TIMEOUT_S, log: Path | None = None):
    """``ready()``'s first true value, polled every POLL_S for at most ``timeout_s``; raises, with the log's tail."""
    for _ in range(int(timeout_s / POLL_S) + 1):
        value = ready()
        if value:
            return value
        time.sleep(POLL_S)
    tail = log.read_text(errors="replace")[-1500:] if log and log.exists() else ""
    raise RuntimeError(f"{what} not within {timeout_s:.0f} s" + (f"; {log}:\n{tail}" if tail else ""))


class Cluster:
    """The cluster: ``start()`` brings it up (each daemon health-checked), ``stop()`` takes everything down."""

    def __init__(self, scratch: Path, *, nodes: tuple[str, ...] = NODES):
        self.scratch, self.nodes = scratch, nodes
        self.prefix = f"{PREFIX}{os.getpid() % 100000}"
        self.procs: dict[str, subprocess.Popen] = {}  # name -> a daemon this harness started
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.net = _subnet()
        hosts = list(self.net.hosts())
        self.addresses = {node: str(hosts[i]) for i, node in enumerate(nodes)}
        self.controller = str(hosts[-1])  # the bridge's address, here
        self.host = socket.gethostname().split(".")[0]
        self.conf = scratch / "slurm.conf"
        self.munge_socket = scratch / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._stopped = False
        self._sigterm_set = False

    # ------------------------------------------------------------------------------------------- bring up
    def start(self) -> "Cluster":
        atexit.register(self.stop)  # Ctrl-C, or a test session that ends without its fixtures' teardown
        # a CI's SIGTERM: exit through atexit as well (signal handlers: the main thread's alone)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            self._sigterm_set = True
        try:
            self._network()
            self._munge()
            self._write_conf()
            self._slurmctld()
            for node in self.nodes:
                self._slurmd(node)
            wait_for("both nodes idle in sinfo", self._all_idle, log=self.scratch / "slurmctld.log")
        except Exception as exc:
            logs = self.logs()
            self.stop()
            raise RuntimeError(f"the cluster did not come up: {exc}\n{logs}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def namespace(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def _network(self) -> None:
        bridge = f"{self.prefix}br"
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        self.links.append(bridge)
        _run(["ip", "addr", "add", f"{self.controller}/{self.net.prefixlen}", "dev", bridge])
        _run(["ip", "link", "set", bridge, "up"])
        for i, node in enumerate(self.nodes, 1):
            ns, outside, inside = self.namespace(node), f"{self.prefix}h{i}", f"{self.prefix}n{i}"
            _run(["ip", "netns", "add", ns])
            self.namespaces.append(ns)
            _run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside])
            self.links.append(outside)  # (its peer goes with it, or with the namespace)
            _run(["ip", "link", "set", inside, "netns", ns])
            _run(["ip", "link", "set", outside, "master", bridge, "up"])
            for cmd in (["ip", "addr", "add", f"{self.addresses[node]}/{self.net.prefixlen}", "dev", inside],
                        ["ip", "link", "set", inside, "up"], ["ip", "link", "set", "lo", "up"]):
                _run(["ip", "netns", "exec", ns, *cmd])
        lines = ["127.0.0.1 localhost", f"{self.controller} {self.host}"]
        lines += [f"{self.addresses[node]} {node}" for node in self.nodes]
        (self.scratch / "hosts").write_text("\n".join(lines) + "\n")

    def in_node(self, node: str, shell: str) -> list[str]:
        """The command that runs ``shell`` (a ``sh -c`` line) on ``node``: in its network namespace, with its
        hostname and its hosts file (a mount namespace of its own, so the host's /etc/hosts is untouched)."""
        hosts = self.scratch / "hosts"
        inner = f"hostname {node} && mount --bind {hosts} /etc/hosts && {shell}"
        # nsenter, not `ip netns exec`, which mounts a /sys of its own, without the cgroup folders slurmd reads.
        return ["nsenter", f"--net=/run/netns/{self.namespace(node)}", "unshare", "--uts", "--mount",
                "--propagation", "private", "sh", "-c", inner]

    def _munge(self) -> None:
        folder = self.munge_socket.parent
        folder.mkdir(mode=0o700)
        key = folder / "munge.key"
        _run(["mungekey", "--create", "--keyfile", str(key)])
        key.chmod(0o400)
        # --force: munged wants its socket's folder open to all (o+x), and a test's scratch folder is private.
        self._daemon("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                                f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
                                f"--seed-file={folder / 'munged.seed'}"])
        wait_for("munged's socket", self.munge_socket.exists, log=folder / "munged.log")

    def _write_conf(self) -> None:
        s = self.scratch
        for sub in ("state", "spool", *(f"spool/{node}" for node in self.nodes)):
            (s / sub).mkdir()
        cpus = len(os.sched_getaffinity(0))
        conf = {
            # (SlurmctldHost: slurmctld wants its own host's name)
            "ClusterName": self.prefix, "SlurmctldHost": f"{self.host}({self.controller})",
            "SlurmctldPort": _free_port(), "SlurmdPort": 6818, "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "AuthInfo": f"socket={self.munge_socket}", "CredType": "cred/munge",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none", "MpiDefault": "none",
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_CPU", "SwitchType": "switch/none",
            "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
            "StateSaveLocation": s / "state", "SlurmdSpoolDir": s / "spool" / "%n",
            "SlurmctldPidFile": s / "slurmctld.pid", "SlurmdPidFile": s / "slurmd-%n.pid",
            "SlurmctldLogFile": s / "slurmctld.log", "SlurmdLogFile": s / "slurmd-%n.log",
            "SlurmctldDebug": "info", "SlurmdDebug": "info", "ReturnToService": 2, "SlurmdTimeout": 30,
            "InactiveLimit": 0, "KillWait": 2,
            # the scheduler every second, not every 30-60 s: a job submitted as the last one ends starts at once
            "SchedulerParameters": "bf_interval=1,sched_interval=1", "MailProg": shutil.which("true"),
            "MessageTimeout": 10, "PlugStackConfig": s / "plugstack.conf",
        }
        (s / "plugstack.conf").write_text("")  # none of the host's SPANK plugins
        lines = [f"{k}={v}" for k, v in conf.items()]
        lines += [f"NodeName={node} NodeAddr={self.addresses[node]} CPUs={cpus} State=UNKNOWN" for node in self.nodes]
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _slurmctld(self) -> None:
        self._daemon("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        wait_for("slurmctld answering", lambda: self._alive() and self.client(["scontrol", "ping"], check=False)
                 .returncode == 0, log=self.scratch / "slurmctld.log")

    def _slurmd(self, node: str) -> None:
        self._daemon(f"slurmd-{node}", self.in_node(node, f"exec slurmd -D -N {node} -f {self.conf}"))

    def stop_node(self, node: str) -> None:
        """A node that is lost: its slurmd ended (by its id) and the node marked down, as slurmctld would mark it
        once the node missed SlurmdTimeout (30 s) of pings."""
        _end(self.procs[f"slurmd-{node}"])
        self.client(["scontrol", "update", f"nodename={node}", "state=down", "reason=stopped by the test"])

    def start_node(self, node: str) -> None:
        """Its slurmd again; the node returns to service when it registers (ReturnToService=2)."""
        self._slurmd(node)
        wait_for(f"{node} idle again", self._all_idle, log=self.scratch / f"slurmd-{node}.log")

    def worker_pids(self, node: str) -> list[int]:
        """The accel-kit worker ranks running on ``node`` (in its namespace: started by this cluster's jobs)."""
        found = []
        for pid in self.pids_in(self.namespace(node)):
            try:
                if b"accel_kit.engine.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:  # ended meanwhile
                pass
        return found

    def _daemon(self, name: str, cmd: list[str]) -> None:
        log = open(self.scratch / f"{name}.out", "wb")
        with log:
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True)

    def _alive(self) -> bool:
        """True while every daemon runs; raises, with its output, at the first that ended (no wait on a dead one)."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                out = (self.scratch / f"{name}.out").read_text(errors="replace")[-800:]
                raise RuntimeError(f"{name} exited with status {proc.returncode}: {out}")
        return True

    def _all_idle(self) -> bool:
        self._alive()
        out = self.client(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(node) == "idle" for node in self.nodes)

    def logs(self, chars: int = 1200) -> str:
        """The tails of the daemons' outputs and logs (a failure's message: stop removes them)."""
        files = sorted(self.scratch.glob("*.out")) + sorted(self.scratch.glob("*.log"))
        return "\n".join(f"== {f.name}:\n{f.read_text(errors='replace')[-chars:]}" for f in files)

    # ------------------------------------------------------------------------------------------- use
    def client(self, cmd: list[str], *, timeout_s: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command (sinfo, sbatch, scontrol) against this cluster."""
        return _run(cmd, timeout_s=timeout_s, check=check, env=self.env)

    def ssh_shim(self) -> Path:
        """A stand-in for ssh (there is no sshd on these nodes): ``shim [-opts] HOST CMD...`` runs CMD on HOST, inside
        its namespaces; MPICH's Hydra starts its proxies with it outside Slurm (HYDRA_LAUNCHER_EXEC)."""
        shim = self.scratch / "ssh-shim"
        nodes = " ".join(self.nodes)
        shim.write_text(f"""#!/bin/sh
# {shim.name}: ssh's interface, a node of this test cluster's namespaces instead of a remote host
while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case " {nodes} " in *" $host "*) ;; *) echo "{shim.name}: unknown host $host" >&2; exit 255;; esac
exec nsenter --net=/run/netns/{self.prefix}-$host unshare --uts --mount --propagation private \
  sh -c 'hostname "$0" && mount --bind {self.scratch / "hosts"} /etc/hosts && exec sh -c "$*"' "$host" "$@"
""")
        shim.chmod(0o755)
        return shim

    def submit(self, script: Path, env: dict[str, str]) -> int:
        """``sbatch`` the script from its folder (its output in job.out there); the job's id."""
        out = _run(["sbatch", "--parsable", f"--chdir={script.parent}", f"--output={script.parent / 'job.out'}",
                    str(script)], env=self.env | env).stdout
        return int(out.strip().split(";")[0])

    def wait_job(self, job: int, timeout_s: float) -> tuple[str, str]:
        """The job's end state and exit code (``COMPLETED``, ``0:0``), polled every POLL_S (``sbatch --wait`` polls
        at growing intervals: it added up to 30 s to a 10 s job); past ``timeout_s`` the job is cancelled and
        this raises."""
        def ended():
            out = self.client(["scontrol", "-o", "show", "job", str(job)], check=False).stdout
            fields = dict(word.split("=", 1) for word in out.split() if "=" in word)
            state = fields.get("JobState", "")
            done = state not in ("", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED")
            return (state, fields.get("ExitCode", "")) if done else None
        try:
            return wait_for(f"job {job} ended", ended, timeout_s=timeout_s)
        except RuntimeError:
            self.client(["scancel", "--full", str(job)], check=False)
            raise

    def job_state(self, job: int) -> str:
        out = self.client(["scontrol", "-o", "show", "job", str(job)], check=False).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word).get("JobState", "")

    def pids_in(self, ns: str) -> list[int]:
        out = _run(["ip", "netns", "pids", ns], check=False).stdout
        return [int(p) for p in out.split()]

    # ------------------------------------------------------------------------------------------- take down
    def stop(self) -> None:
        """End what it started, by process id, and remove its namespaces, links and scratch folder (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._sigterm_set and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.client(["scancel", "--full", "-u", "root"], check=False, timeout_s=15)  # (this cluster's jobs)
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            if name in self.procs:
                _end(self.procs[name])
        for ns in self.namespaces:  # what ran inside (slurmstepd, a job's ranks) is this harness's too
            for _ in range(20):
                pids = self.pids_in(ns)
                if not pids:
                    break
                for pid in pids:
                    with _gone_ok():
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.25)
            _run(["ip", "netns", "del", ns], check=False)
        for link in self.links:
            if _run(["ip", "link", "show", link], check=False).returncode == 0:
                _run(["ip", "link", "del", link], check=False)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this harness's is still here: namespaces, links, live processes, the scratch folder."""
        return leftovers(self.prefix, self.scratch, [p.pid for p in self.procs.values() if p.poll() is None])


def leftovers(prefix: str, scratch: Path, pids: list[int]) -> list[str]:
    """What of the cluster named ``prefix`` is still here: its namespaces and links, which of its daemons' ``pids``
    still run (a reaped one is gone; another process's zombie is not ours to reap), its scratch folder."""
    ours = re.compile(rf"{prefix}(-.+|br|h\d+|n\d+)")  # (the names Cluster gives; not another run's akc12345)
    left = [f"namespace {ns}" for ns in _run(["ip", "netns", "list"]).stdout.split() if ours.fullmatch(ns)]
    links = [line.split(":")[1].strip().split("@")[0] for line in _run(["ip", "-o", "link"]).stdout.splitlines()]
    left += [f"link {link}" for link in links if ours.fullmatch(link)]
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(f"process {pid}")
    left += [f"folder {scratch}"] if scratch.exists() else []
    return left


def remove(prefix: str, scratch: Path, pids: list[int]) -> None:
    """Take down, from outside, a cluster whose own process could not (it was killed before its ``stop``): its
    daemons' process groups (each daemon leads one, ``start_new_session``; slurmctld's slurmscriptd is in its),
    what runs in its namespaces, the namespaces, its links and its scratch folder."""
    for pid in pids:
        with _gone_ok():
            os.killpg(pid, signal.SIGKILL)
    ours = re.compile(rf"{prefix}(-.+|br|h\d+|n\d+)")
    for ns in [ns for ns in _run(["ip", "netns", "list"]).stdout.split() if ours.fullmatch(ns)]:
        for pid in map(int, _run(["ip", "netns", "pids", ns], check=False).stdout.split()):
            with _gone_ok():
                os.kill(pid, signal.SIGKILL)
        _run(["ip", "netns", "del", ns], check=False)
    for line in _run(["ip", "-o", "link"]).stdout.splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if ours.fullmatch(link):
            _run(["ip", "link", "del", link], check=False)
    shutil.rmtree(scratch, ignore_errors=True)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


class _gone_ok:
    """Ignore a process that ended meanwhile."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is ProcessLookupError


def _end(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaped."""
    if proc.poll() is None:
        with _gone_ok():
            proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with _gone_ok():
                proc.kill()
            proc.wait(timeout=grace_s)
