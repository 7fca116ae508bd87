"""Local gloo ranks for the multi-process tests (imported by name: pytest puts tests/ on the path).

``rendezvous(n)``: n groups' rendezvous, each a TCP store this process holds on a port the kernel
picked (``accel_kit.engine.launch.local_rendezvous``, as the sweep runner's groups have). A port
picked free beforehand and bound later by a rank could be taken meanwhile (by another test's group,
or one of gloo's own connections), failing a correct test now and then.

``spawn(fn, args, nprocs)``: ``torch.multiprocessing``'s spawn, from multiprocessing's fork server,
which has imported torch and the worker's modules (the engine's fork server's ``PRELOAD``): a spawned
rank started a fresh interpreter and imported torch, about 3 s of CPU each. Each rank gets the
server's environment, not the test's at the call: what a rank needs comes in its arguments.
"""
from __future__ import annotations

import contextlib
import multiprocessing
from typing import Callable, Iterator

import torch.multiprocessing as mp

from accel_kit.engine.forkserver import PRELOAD
from accel_kit.engine.launch import local_rendezvous


@contextlib.contextmanager
def rendezvous(groups: int) -> Iterator[list[dict[str, str]]]:
    """Each group's variables (MASTER_ADDR, MASTER_PORT, ...) for its ranks' ``os.environ``, held for the block."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(local_rendezvous()) for _ in range(groups)]


def spawn(fn: Callable, args: tuple, nprocs: int) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes forked from a preloaded server; raises if one fails."""
    multiprocessing.set_forkserver_preload(list(PRELOAD))  # (read when the server starts: its first use)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
