"""A point's process start: a fork of the preloaded interpreter against a fresh interpreter, side by side.

Times start-to-first-step through the real runner path (``accel_kit.engine.sweep.run_worker``,
as every study calls it): from the runner's call to the first instruction of the point's first
step, a tiny matmul run by a probe point kind (``StartProbe``) that reports when it began (the
host's wall clock, shared by both processes). Rounds alternate the two paths (the fork server,
``ACCEL_KIT_FORKSERVER=0`` for a fresh interpreter), so a slow spell of a shared machine falls on
both; prints each path's median, the ratio, and the whole call of a tiny real training point
(gpt2-debug, one timed step) both ways, at one rank and as two DDP ranks over gloo (forks of the
server with a rendezvous the runner holds, against torchrun starting two fresh interpreters). The
fork server's own start is paid once per runner and environment, before the first round, and
printed apart.

    python benchmarks/point_start.py              # 7 rounds
    python benchmarks/point_start.py --rounds 11
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout

from accel_kit.engine.point import Point  # noqa: E402

PATHS = {"forkserver": "1", "exec": "0"}


class StartProbe(Point):
    """A point whose measurement is one small matmul; reports the wall-clock time its step began."""

    kind: str = "point_start:StartProbe"

    def label(self) -> str:
        return "start probe"

    def measure(self, *_context) -> dict:  # (rank, world), or a measurement context: unused
        started_at_s = time.time()
        import torch

        x = torch.ones(64, 64)
        return {"status": "ok", "metrics": {"first_step_at_s": started_at_s, "sum": float((x @ x).sum())}}


def _timed(point: Point, path: str) -> tuple[float, dict]:
    from accel_kit.engine.sweep import run_worker

    os.environ["ACCEL_KIT_FORKSERVER"] = PATHS[path]
    began_s = time.time()
    result = run_worker(point, timeout_s=600)
    if result["status"] != "ok" or result["env"]["point_start"] != path:
        raise SystemExit(f"{path}: {result['status']} via {result['env'].get('point_start')}: {result.get('reason')}")
    return began_s, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="rounds of both paths (default 7)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    # The point kind is imported by name in the point's process: this folder on its path.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    from accel_kit.engine import forkserver
    from accel_kit.engine.point import TrainPoint
    from point_start import StartProbe as Probe  # the importable name, as the child resolves the kind

    probe = Probe(system="cpu", precision="fp32")
    train = TrainPoint(system="cpu", preset="gpt2-debug", vocab_size=128, precision="fp32", micro_batch_size=2,
                       seq_len=32, steps=1, warmup_steps=0)
    two_ranks = train.model_copy(update={"devices": 2, "devices_per_node": 2})
    began_s = time.time()
    _timed(probe, "forkserver")  # starts the server
    print(f"fork server start and its first point: {time.time() - began_s:.2f} s (once per runner and environment)")
    start_s: dict[str, list[float]] = {p: [] for p in PATHS}
    train_s: dict[str, list[float]] = {p: [] for p in PATHS}
    group_s: dict[str, list[float]] = {p: [] for p in PATHS}
    for rnd in range(args.rounds):
        order = list(PATHS) if rnd % 2 == 0 else list(reversed(PATHS))
        for path in order:
            began_s, result = _timed(probe, path)
            start_s[path].append(result["metrics"]["first_step_at_s"] - began_s)
            began_s, _ = _timed(train, path)
            train_s[path].append(time.time() - began_s)
            began_s, _ = _timed(two_ranks, path)
            group_s[path].append(time.time() - began_s)
    forkserver.shutdown()
    print(f"{args.rounds} rounds, alternating; medians (min-max)")
    for name, figures in (("start to first step", start_s), ("tiny training point, whole call", train_s),
                          ("the same as two DDP ranks, whole call", group_s)):
        cells = [f"{p} {statistics.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})" for p, v in figures.items()]
        ratio = statistics.median(figures["exec"]) / statistics.median(figures["forkserver"])
        print(f"  {name}: {'; '.join(cells)}; exec / forkserver = {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
