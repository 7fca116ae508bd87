"""How a point's worker processes are started: locally (one process or torchrun, where the fork server
does not start them, ``accel_kit.engine.forkserver``), or across nodes inside a batch job (mpiexec
as on ALCF Polaris, Open MPI's mpirun, srun under Slurm, or torchrun on every node), plus job
scripts.

Inside a job the sweep runner still runs on the first node and starts each point with one
``mpiexec``/``srun`` call; the worker maps the launcher's rank variables to torch's
(RANK, WORLD_SIZE, LOCAL_RANK) and meets its peers at MASTER_ADDR:MASTER_PORT. With the
``torchrun`` launcher that call starts one torchrun per node (``mpiexec --ppn 1`` under PBS,
``srun --ntasks-per-node=1`` under Slurm), and the torchruns meet at a c10d rendezvous on the
first node, as torch's multi-node recipe does; torchrun then sets every rank's variables. The
ranks form the point's mesh (pp x dp x tp, ``accel_kit.engine.layout``) in rank order, so a
tensor-parallel group lies within a node whenever tp divides the devices per node.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from accel_kit.errors import ParameterError

LAUNCHERS = ("local", "mpiexec", "mpirun", "srun", "torchrun")
WORKER = ("-m", "accel_kit.engine.worker")
# A rank (or a node's torchrun) that dies ends its point's other tasks: without it, srun waited for them, and a
# rank on a node that lost its peer hung in a collective until the point's timeout (seen on the two-node test
# cluster, tests/test_cluster.py). MPICH's mpiexec ends every rank when one fails, by default.
SRUN_KILL = ["--kill-on-bad-exit=1"]

# Rank variables of common launchers: (rank, world size, local rank).
_RANK_VARS = [
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # torchrun
    ("PMI_RANK", "PMI_SIZE", "PALS_LOCAL_RANKID"),  # Cray PALS mpiexec (Polaris)
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH hydra
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),  # srun
]


def distributed_env(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world size, local rank) from whichever launcher started this process; (0, 1, 0) alone."""
    env = os.environ if environ is None else environ
    for rank, world, local in _RANK_VARS:
        if rank in env and world in env:
            return int(env[rank]), int(env[world]), int(env.get(local, 0))
    return 0, 1, 0


def free_port() -> int:
    """A port free now (for a rendezvous on another node, whose store this process cannot host); a local
    group's rendezvous is ``local_rendezvous``, which holds its port."""
    with socket.socket() as s:
        s.bind(("", 0))  # every address: a port free on the loopback may be taken on the node's own address
        return s.getsockname()[1]


@contextlib.contextmanager
def local_rendezvous() -> Iterator[dict[str, str]]:
    """The variables that bring local ranks' ``init_process_group`` (env://) together: a TCP store hosted
    here, for as long as the block runs, on a port the kernel picked; the ranks connect to it as clients,
    as torchrun's ranks connect to its agent's store (``TORCHELASTIC_USE_AGENT_STORE``).

    A port picked free beforehand and bound later by rank 0 can be taken meanwhile (by another group, or
    one of gloo's own connections): that group then fails. This one is held from the start.
    """
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    try:
        yield {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    finally:
        del store


def job_scheduler() -> str | None:
    """The batch scheduler whose job this process runs in (``slurm``, ``pbs``), None outside a job."""
    if os.environ.get("SLURM_JOB_ID"):
        return "slurm"
    if os.environ.get("PBS_JOBID") or os.environ.get("PBS_NODEFILE"):
        return "pbs"
    return None


def job_hosts() -> list[str]:
    """Hosts of the current batch job (PBS nodefile or Slurm nodelist); [this host] outside a job."""
    nodefile = os.environ.get("PBS_NODEFILE")
    if nodefile and Path(nodefile).exists():
        return list(dict.fromkeys(Path(nodefile).read_text().split()))
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if nodelist:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    return [socket.gethostname()]


def worker_command(launcher: str, devices: int, nodes: int, *, force_group: bool = False,
                   port: int | None = None, entry: tuple[str, ...] = WORKER) -> tuple[list[str], dict[str, str]]:
    """The command (and extra environment) that starts ``devices`` worker ranks over ``nodes`` nodes.

    ``force_group`` starts even a single local rank under torchrun (engines that initialise
    torch.distributed themselves need its environment). ``port``: where on the first node the ranks of a job's
    point meet (a site that opens only some ports); None: one free there, per point. ``entry``: what each rank
    runs after ``python`` (a point's worker; the link probe's ranks, ``accel_kit.predict.links``).
    """
    per_node = -(-devices // nodes)
    if launcher == "local":
        if nodes > 1:
            raise ValueError(f"{devices} devices need {nodes} nodes: run inside a batch job "
                             "(accel-kit jobscript) with launcher mpiexec or srun")
        if devices == 1 and not force_group:
            return [sys.executable, *entry], {}
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={devices}",
                *entry], {}
    env = {"MASTER_ADDR": job_hosts()[0], "MASTER_PORT": str(port or free_port())}
    if launcher == "torchrun":
        return torchrun_command(devices, nodes, env["MASTER_ADDR"], int(env["MASTER_PORT"]), entry=entry), {}
    if launcher == "mpiexec":
        return ["mpiexec", "-n", str(devices), "--ppn", str(per_node), sys.executable, *entry], env
    if launcher == "mpirun":
        # Open MPI: ranks placed per node by mapping, and only the variables named with -x reach remote ranks.
        return ["mpirun", "-np", str(devices), "--map-by", f"ppr:{per_node}:node", "-x", "MASTER_ADDR",
                "-x", "MASTER_PORT", "-x", "PATH", sys.executable, *entry], env
    if launcher == "srun":
        return ["srun", *SRUN_KILL, f"--nodes={nodes}", f"--ntasks={devices}", f"--ntasks-per-node={per_node}",
                sys.executable, *entry], env
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


def rendezvous_endpoint(cmd: list[str], env: dict[str, str]) -> str | None:
    """Where a point's ranks meet (``host:port``, as ``worker_command`` gave it): torchrun's c10d endpoint, else
    the ranks' MASTER_ADDR:MASTER_PORT; None for a local point (its rendezvous is this machine's)."""
    endpoint = next((word.split("=", 1)[1] for word in cmd if word.startswith("--rdzv_endpoint=")), None)
    if endpoint is None and "MASTER_ADDR" in env:
        endpoint = f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}"
    return endpoint


def torchrun_command(devices: int, nodes: int, host: str, port: int, *, slurm: bool | None = None,
                     entry: tuple[str, ...] = WORKER) -> list[str]:
    """One torchrun per node (started by srun inside a Slurm job, else by mpiexec, one per node), meeting at
    a c10d rendezvous on ``host:port``; each starts its node's share of the ``devices`` ranks.

    ``slurm``: whether to start them with srun; None: inside a Slurm job (``SLURM_JOB_ID``) or not.
    """
    per_node = -(-devices // nodes)
    slurm = job_scheduler() == "slurm" if slurm is None else slurm
    starter = (["srun", *SRUN_KILL, f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"] if slurm
               else ["mpiexec", "-n", str(nodes), "--ppn", "1"])
    return [*starter, sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
            f"--nproc_per_node={per_node}", "--rdzv_backend=c10d", f"--rdzv_endpoint={host}:{port}",
            f"--rdzv_id=accel-kit-{port}", *entry]


PBS_TEMPLATE = """#!/bin/bash
# accel-kit {study} on {nodes} node(s) of {system} ({devices_per_node} devices each), PBS Pro (as on ALCF
# Polaris); each point's processes start with {launcher}. Submit with: qsub {path}{layout}
#PBS -N accel-kit-{study}
#PBS -l select={nodes}{select_gpus}
#PBS -l walltime={walltime}
#PBS -l filesystems=home
#PBS -j oe
#PBS -o {log}
##PBS -A <your project>  # uncomment and set
##PBS -q <queue>{directives}
set -euo pipefail
workdir={workdir}
cd "${{PBS_O_WORKDIR:-$workdir}}"{outputs_lines}
# The environment accel-kit is installed in (jobscript --setup LINE, or the venv jobscript ran from).{setup}{probe}
accel-kit run {study} --system {system} --profile {profile} -p launcher {launcher} -p max_nodes {nodes} -p devices_per_node {devices_per_node}{extra}
"""

SLURM_TEMPLATE = """#!/bin/bash
# accel-kit {study} on {nodes} node(s) of {system} ({devices_per_node} devices each), Slurm; each point's
# processes start with {launcher}. Submit with: sbatch {path}{layout}
#SBATCH --job-name=accel-kit-{study}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks_per_node}
#SBATCH --time={walltime}
#SBATCH --output={log}{gpus}
##SBATCH --account=<your account>  # uncomment and set
##SBATCH --partition=<partition>{directives}
set -euo pipefail
workdir={workdir}
cd "${{SLURM_SUBMIT_DIR:-$workdir}}"{outputs_lines}
# The environment accel-kit is installed in (jobscript --setup LINE, or the venv jobscript ran from).{setup}{probe}
accel-kit run {study} --system {system} --profile {profile} -p launcher {launcher} -p max_nodes {nodes} -p devices_per_node {devices_per_node}{extra}
"""


# A cluster run as an appliance (no batch scheduler: the script runs on its user node) has no script of its
# own here: the system's adapter gives it (its job_launch's template).
SCHEDULERS = {"pbs": PBS_TEMPLATE, "slurm": SLURM_TEMPLATE, "appliance": None}
# How the points of a job start their ranks, and how the script is started.
SCHEDULER_LAUNCHER = {"pbs": "mpiexec", "slurm": "srun", "appliance": "local"}
SUBMIT = {"pbs": "submit with qsub", "slurm": "submit with sbatch", "appliance": "run on the cluster's user node: bash"}
# HH:MM:SS, the form both PBS (-l walltime) and Slurm (--time) accept; hours may pass 24.
_WALLTIME = re.compile(r"(\d+):([0-5]\d):([0-5]\d)")


# A job's wall time when the CLI derives it (``job_walltime``): each point's budget (its timeout, and the grace a
# point past it gets to end), plus the job's own setup before the first point, rounded up, at most MAX_WALLTIME_S.
JOB_SETUP_S = 600  # the environment's activation, the data's preparation, the link probe: minutes, not hours
WALLTIME_STEP_S = 900  # rounded up to a quarter hour: a figure a person reads at a glance
MAX_WALLTIME_S = 24 * 3600  # the longest job most sites' queues take (ALCF Polaris's prod queue: 24 h)


def format_walltime(seconds: float) -> str:
    """``seconds`` as HH:MM:SS, whole seconds rounded up (hours may pass 24)."""
    whole = int(-(-seconds // 1))
    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def job_walltime(points: int, timeout_s: float, *, grace_s: float = 0, peaks: int = 0, peak_timeout_s: float = 0,
                 given: str | None = None) -> tuple[str, list[str]]:
    """The wall time a job of ``points`` points needs at most (``given``, the user's, instead where set), and
    how it was derived: the script's comment lines.

    Each point may run until its ``timeout_s``, then gets ``grace_s`` to end; before the first, the job sets up
    (``JOB_SETUP_S``) and measures ``peaks`` matmul peaks (one per precision its points run in), each bounded by
    ``peak_timeout_s``. The sum is rounded up to ``WALLTIME_STEP_S`` and clipped to ``MAX_WALLTIME_S``: points
    the job does not reach run when the script is submitted again (the run resumes the points recorded).
    """
    total_s = points * (timeout_s + grace_s) + JOB_SETUP_S + peaks * peak_timeout_s
    asked_s = min(-(-total_s // WALLTIME_STEP_S) * WALLTIME_STEP_S, MAX_WALLTIME_S)
    parts = [f"{points} point(s) x ({timeout_s:.0f} s timeout_s + {grace_s:.0f} s to end one past it)",
             f"{JOB_SETUP_S} s setup (environment, data, link probe)"]
    if peaks:
        parts.append(f"{peaks} matmul peak measurement(s) x {peak_timeout_s:.0f} s")
    budgets = " + ".join(parts) + f" = {format_walltime(total_s)}"
    if given:
        return given, _wrapped(f"Wall time {given}, as given (jobscript --walltime); the points' budgets: {budgets}")
    why = f"Wall time {format_walltime(asked_s)} (jobscript --walltime sets another): {budgets}"
    if total_s > MAX_WALLTIME_S:
        why += (f", more than the {format_walltime(MAX_WALLTIME_S)} most sites allow; submit the script again for "
                "the points not reached (the run resumes those recorded)")
    else:
        why += f", rounded up to {WALLTIME_STEP_S // 60} minutes"
    return format_walltime(asked_s), _wrapped(why)


def _wrapped(text: str) -> list[str]:
    """``text`` as a script's comment lines of a readable width, the lines after the first indented."""
    import textwrap

    return textwrap.wrap(text, 110, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def job_log(scheduler: str, path: str) -> str:
    """Where a job script's output goes: beside the script, its name's, absolute (a scheduler resolves a relative
    path against a folder of its own); Slurm's with the job's id (``%j``), so a resubmission keeps the first log."""
    base = os.path.splitext(os.path.abspath(path))[0]
    return f"{base}.%j.log" if scheduler == "slurm" else f"{base}.log"


def _single_quoted(value: str) -> str:
    """``value`` as one shell word in single quotes (a ``'`` inside is closed, escaped, reopened)."""
    return "'" + value.replace("'", "'\\''") + "'"


def check_job(scheduler: str, *, system: str, nodes: int, devices_per_node: int,
              walltime: str | None) -> re.Match | None:
    """The job's scheduler, node count and walltime checked (``render_jobscript``'s first step, and the CLI's
    before it resolves the study's parameters); returns the walltime's match (None for a walltime the CLI will
    derive from the points: ``job_walltime``).

    Raises:
        ParameterError: the first value out of range or malformed.
    """
    if scheduler not in SCHEDULERS:
        raise ParameterError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    if nodes < 1:
        raise ParameterError(f"--nodes must be at least 1, got {nodes}")
    if devices_per_node < 1:  # (a system's YAML cannot say less than 1: this is --devices-per-node)
        raise ParameterError(f"--devices-per-node must be at least 1, got {devices_per_node}")
    if walltime is None:
        return None
    match = _WALLTIME.fullmatch(walltime)
    if not match or not any(int(part) for part in match.groups()):
        raise ParameterError(f"--walltime must be HH:MM:SS (minutes and seconds below 60) and more than zero, "
                             f"got {walltime!r}")
    return match


def render_jobscript(scheduler: str, *, study: str, system: str, nodes: int, devices_per_node: int, profile: str,
                     walltime: str, path: str, overrides: list[tuple[str, str]] | None = None,
                     launcher: str | None = None, setup: tuple[str, ...] = (),
                     directives: tuple[str, ...] = (), tasks_per_node: int | None = None,
                     template: str | None = None, layout: tuple[str, ...] = (), probe_link: bool = True,
                     gpus_per_node: int | None = None, log: str | None = None, outputs: str | None = None) -> str:
    """A PBS or Slurm job script that runs ``study`` on ``nodes`` nodes, or a script for an appliance cluster.

    Args:
        scheduler: ``pbs``, ``slurm``, or ``appliance`` (a cluster run as an appliance: the script runs on
            its user node, ``nodes`` devices at most, ``walltime`` each job's limit; ``template`` required).
        study, system, profile: passed to ``accel-kit run`` inside the job.
        nodes: nodes to request (>= 1).
        devices_per_node: the system's devices per node (>= 1), for the Slurm task count.
        walltime: ``HH:MM:SS``, more than zero.
        path: where the script will be written (named in its comment).
        overrides: ``(name, value)`` parameter overrides, passed on as ``-p name 'value'``.
        launcher: how each point's ranks start (``LAUNCHERS``); None: the scheduler's own.
        setup: shell lines run before ``accel-kit run`` (the system adapter's environment).
        directives: extra scheduler lines, written after the standard ones.
        tasks_per_node: worker processes a node runs (Slurm's tasks); None: one per device.
        template: the system adapter's own script (its job_launch's), formatted with the same fields;
            None: the scheduler's.
        layout: lines saying the points' parallel layouts (written as comments), and with the torchrun
            launcher how each point starts its ranks.
        probe_link: on several nodes, measure the inter-node link first (``accel-kit link``), for the predictor.
        gpus_per_node: the GPUs each node has (the system's ``gpus_per_node``), asked of the scheduler (Slurm's
            ``--gpus-per-node``, PBS's ``ngpus``); None: a system whose devices are not GPUs, none asked.
        log: where the job's output goes (``#SBATCH --output``, ``#PBS -o``); None: ``job_log``'s, beside the
            script.
        outputs: the folder the run's records go under, unless ``ACCEL_KIT_OUTPUT_DIR`` is set when the job
            runs; None: this process's (``accel_kit.paths.output_dir``), absolute.

    Raises:
        ParameterError: any of the above out of range or malformed (a scheduler would reject
            the script, or run it to no purpose, only after it waited in the queue).
    """
    match = check_job(scheduler, system=system, nodes=nodes, devices_per_node=devices_per_node, walltime=walltime)
    if match is None:
        raise ParameterError("a job script needs its walltime (HH:MM:SS)")
    template = template or SCHEDULERS[scheduler]
    if template is None:
        raise ParameterError(f"scheduler {scheduler!r} runs the system adapter's own script, and {system!r} has none")
    launcher = launcher or SCHEDULER_LAUNCHER[scheduler]
    if launcher not in LAUNCHERS:
        raise ParameterError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    extra = "".join(f" -p {shlex.quote(name)} {_single_quoted(value)}" for name, value in overrides or [])
    lines = list(layout)
    if launcher == "torchrun":
        per_point = torchrun_command(nodes * devices_per_node, nodes, "<first node>", 29500,
                                     slurm=scheduler == "slurm")
        lines.append("A point on every node starts as (its port free on the first node, chosen per point): "
                     + " ".join(w if w != sys.executable else "python" for w in per_point[:-2]) + " ...")
    probe = _link_probe(system, nodes, launcher, devices_per_node, tasks_per_node) if probe_link else ""
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ParameterError(f"gpus_per_node must be at least 1, got {gpus_per_node}")
    log = log or job_log(scheduler, path)
    if "{log}" in template and re.search(r"\s", log):  # a #SBATCH or #PBS line ends its value at a space
        raise ParameterError(f"the job's log {log!r} has a space, which a scheduler line cannot carry; "
                             "write the script (--out) to a folder without one")
    hours, minutes, seconds = map(int, match.groups())
    from accel_kit.paths import output_dir, project_root

    root = project_root()
    outputs = os.path.abspath(outputs or output_dir())
    gpus, select_gpus, said = _gpu_request(system, gpus_per_node)
    lines[0:0] = said
    return template.format(study=study, system=system, nodes=nodes, devices_per_node=devices_per_node,
                           profile=profile, walltime=walltime, path=path, launcher=launcher,
                           tasks_per_node=tasks_per_node or devices_per_node,
                           walltime_s=3600 * hours + 60 * minutes + seconds, root=shlex.quote(str(root)),
                           workdir=shlex.quote(os.getcwd()), extra=extra,
                           setup="".join(f"\n{line}" for line in setup), probe=probe,
                           layout="".join(f"\n# {line}" for line in lines),
                           directives="".join(f"\n{line}" for line in directives), log=log,
                           gpus=gpus, select_gpus=select_gpus, outputs=shlex.quote(outputs),
                           outputs_lines=_outputs_lines(study, system, outputs))


def _gpu_request(system: str, gpus_per_node: int | None) -> tuple[str, str, list[str]]:
    """(Slurm's line, PBS's select suffix, the comment lines) that ask a node's GPUs. A GPU system's job asks for
    them: without them a site's scheduler gives the job none (its devices are hidden from it: cgroups,
    CUDA_VISIBLE_DEVICES), and every point fails for want of a device."""
    if not gpus_per_node:
        return "", "", []
    return (f"\n#SBATCH --gpus-per-node={gpus_per_node}", f":ngpus={gpus_per_node}",
            _wrapped(f"The job asks for each node's {gpus_per_node} GPUs (gpus_per_node in "
                     f"params/systems/{system}.yaml): a site gives a job no GPU it did not ask for."))


def _link_probe(system: str, nodes: int, launcher: str, devices_per_node: int, tasks_per_node: int | None) -> str:
    """The script's lines that measure the inter-node link first (several nodes only), for the predictor."""
    if nodes < 2 or launcher == "local":
        return ""
    # As many ranks per node as a point of the whole job runs (torchrun's one task per node starts them all).
    per_node_ranks = devices_per_node if launcher == "torchrun" else tasks_per_node or devices_per_node
    ranks = nodes * per_node_ranks
    return ("\n# The link between the nodes, measured for the predictor (accel-kit predict) and kept beside the "
            "records;\n# the study runs without it where the probe fails (jobscript --no-link-probe leaves it "
            "out)."
            f"\naccel-kit link --system {system} --nodes {nodes} --ranks {ranks} --launcher {launcher} "
            "|| echo 'accel-kit: the inter-node link probe failed; the study runs on' >&2")


def _outputs_lines(study: str, system: str, outputs: str) -> str:
    """The script's lines that name its records' folder. The job's records land where the script says, not in
    whatever folder the job starts from; a folder set at submission (ACCEL_KIT_OUTPUT_DIR in the job's
    environment) still wins."""
    return (f"\n# The run's records go under this folder ({study}/{system}.jsonl there), as does the link's "
            "measurement;\n# an ACCEL_KIT_OUTPUT_DIR set when the job is submitted wins."
            f"\noutputs={shlex.quote(outputs)}"
            '\nexport ACCEL_KIT_OUTPUT_DIR="${ACCEL_KIT_OUTPUT_DIR:-$outputs}"')
