"""A step's communication by the alpha-beta model of ring collectives: data parallelism's gradient
sync (DDP, ZeRO-1), FSDP's gathers and reduce-scatter, tensor parallelism's activation all-reduces,
expert parallelism's all-to-alls.

A ring collective over ``n`` ranks moves its message in ``n - 1`` (reduce-scatter, all-gather)
or ``2 (n - 1)`` (all-reduce = reduce-scatter + all-gather) steps of ``1/n`` of the message
each. Each step costs the link latency ``alpha`` plus its bytes over the link bandwidth
``beta``. The bytes each rank sends, as a multiple of the message, are the "bus bandwidth"
factors nccl-tests uses to turn a measured time into a bandwidth comparable with the link:
all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n. So a collective's time is

    t = steps * alpha + factor * message_bytes / bandwidth

and ZeRO stage 1's reduce-scatter of gradients plus all-gather of updated weights costs the
same bytes as one all-reduce (its saving is memory, not traffic). An all-to-all (expert parallelism's
dispatch and combine) runs as ``n - 1`` pairwise exchanges, each rank sending the ``1/n`` of its message
meant for one peer in each: nccl-tests' all-to-all factor (n-1)/n, with routing taken as uniform (the
busiest rank's share is the load imbalance's, which a record measures and this model does not).

Where a host runs more ranks than it has cores (a CPU's gloo processes), every collective call also costs
``call_s``: a rank that waits on its peers sleeps, and when their data arrives it runs again only once the
scheduler frees a core for it, so each call waits about a time slice of the ranks that are computing. That
wait is per call, not per ring step or byte (measured on 2 cores: 5-7 ms for a 1 KiB all-reduce of 4 ranks
that compute between calls, against 1-2 ms idle), and a link probed on such a host measures it
(``accel_kit.predict.links``); elsewhere it is 0.
"""
from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def bus_factor(collective: str, n: int) -> float:
    """Bytes each rank sends per byte of message (nccl-tests' busbw factor)."""
    _check(collective, n)
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


def ring_steps(collective: str, n: int) -> int:
    """Latency-bound steps of the ring algorithm (each pays ``alpha`` once)."""
    _check(collective, n)
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


def collective_s(collective: str, message_bytes: float, n: int, bandwidth_Bps: float, latency_s: float,
                 call_s: float = 0.0) -> float:
    """Seconds for one ring ``collective`` of ``message_bytes`` over ``n`` ranks (0 on one rank); ``call_s``: the
    wait each call costs on a host whose ranks outnumber its cores."""
    if bandwidth_Bps <= 0 or latency_s < 0 or message_bytes < 0 or call_s < 0:
        raise ValueError("bandwidth must be positive, latency, call cost and message size non-negative")
    if n == 1:
        return 0.0
    return ring_steps(collective, n) * latency_s + bus_factor(collective, n) * message_bytes / bandwidth_Bps + call_s


def gradient_sync_s(grad_bytes: float, n: int, bandwidth_Bps: float, latency_s: float, *, zero1: bool,
                    call_s: float = 0.0) -> float:
    """One optimizer step's data-parallel traffic: an all-reduce of the gradients (DDP), or for
    ZeRO-1 a reduce-scatter of the gradients plus an all-gather of the updated weights."""
    if not zero1:
        return collective_s("all_reduce", grad_bytes, n, bandwidth_Bps, latency_s, call_s)
    return (collective_s("reduce_scatter", grad_bytes, n, bandwidth_Bps, latency_s, call_s)
            + collective_s("all_gather", grad_bytes, n, bandwidth_Bps, latency_s, call_s))


def fsdp_sync_s(gathers: int, param_bytes: float, grad_bytes: float, n: int, bandwidth_Bps: float,
                latency_s: float, *, units: int = 1, call_s: float = 0.0) -> float:
    """One optimizer step's FSDP traffic over ``n`` data-parallel ranks: ``gathers`` all-gathers of the
    parameters (``param_bytes`` in all) and one reduce-scatter of the gradients (``grad_bytes``), each issued
    as one call per sharded unit (``units``: FSDP2 gathers and reduces a unit's parameters together), so the
    latency and the call cost count per unit and the bytes once."""
    def per_unit(collective: str, message: float) -> float:
        return units * collective_s(collective, message / units, n, bandwidth_Bps, latency_s, call_s)

    return gathers * per_unit("all_gather", param_bytes) + per_unit("reduce_scatter", grad_bytes)


def tensor_parallel_s(count: int, message_bytes: float, n: int, bandwidth_Bps: float, latency_s: float,
                      call_s: float = 0.0) -> float:
    """One optimizer step's tensor-parallel traffic: ``count`` all-reduces of ``message_bytes`` over ``n`` ranks."""
    return count * collective_s("all_reduce", message_bytes, n, bandwidth_Bps, latency_s, call_s) if count else 0.0


def expert_parallel_s(count: int, message_bytes: float, n: int, bandwidth_Bps: float, latency_s: float,
                      call_s: float = 0.0) -> float:
    """One optimizer step's expert-parallel traffic: ``count`` all-to-alls of ``message_bytes`` (each rank's
    token copies) over ``n`` ranks."""
    return count * collective_s("all_to_all", message_bytes, n, bandwidth_Bps, latency_s, call_s) if count else 0.0


@dataclass(frozen=True)
class Link:
    """The link a ring crosses: bandwidth per direction per rank, latency per step, and where they come from;
    ``call_us``: what each collective call waits beyond them on a host whose ranks outnumber its cores."""

    bandwidth_GBps: float
    latency_us: float
    source: str
    call_us: float = 0.0

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    @property
    def call_s(self) -> float:
        return self.call_us * 1e-6


def fit_link(sizes_bytes: list[float], times_s: list[float], n: int, collective: str = "all_reduce",
             source: str = "measured") -> Link:
    """Alpha and beta from measured collective times at several message sizes (least squares on
    t = steps * alpha + factor * bytes / bw); a non-positive slope or intercept is clamped."""
    import numpy as np

    if len(sizes_bytes) < 2 or len(sizes_bytes) != len(times_s):
        raise ValueError("fit_link needs at least two (size, time) pairs")
    x = np.asarray(sizes_bytes, dtype=float) * bus_factor(collective, n)
    A = np.stack([np.full_like(x, ring_steps(collective, n)), x], axis=1)
    (alpha, inv_bw), *_ = np.linalg.lstsq(A, np.asarray(times_s, dtype=float), rcond=None)
    inv_bw = max(float(inv_bw), 1e-15)
    return Link(bandwidth_GBps=1 / inv_bw / 1e9, latency_us=max(float(alpha), 0.0) * 1e6, source=source)


def _check(collective: str, n: int) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    if n < 1:
        raise ValueError(f"a collective needs at least one rank, got {n}")
