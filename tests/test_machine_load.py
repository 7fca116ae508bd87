"""accel_kit.machine_load: the machine's load over a timed window, from injected counters (the arithmetic and
the busy flag), from real processes (a child's CPU time is the point's own, a stranger's is others'), and over
the ranks of a group (a sibling rank is not another process)."""
import os
import subprocess
import sys
import time

import pytest
import torch
from ranks import rendezvous, spawn

from accel_kit import machine_load
from accel_kit.machine_load import Sample, fields, is_busy
from accel_kit.engine.worker import end_group

TICK_S = machine_load._TICK_S


def _window(busy_s, own_s, wall_s=10.0, cpus=2, steal_s=0.0, load=(0.5, 1.5)):
    before = Sample(wall_s=100.0, busy_s=1000.0, steal_s=50.0, own_s=20.0, load_1m=load[0], cpus=cpus)
    after = Sample(wall_s=100.0 + wall_s, busy_s=1000.0 + busy_s, steal_s=None if steal_s is None else 50.0 + steal_s,
                   own_s=20.0 + own_s, load_1m=load[1], cpus=cpus)
    return before, after


def test_others_share_and_steal_from_the_counters():
    # 10 s on 2 CPUs: 20 CPU-seconds; the machine ran 15 of them, the point 11, steal 1.
    f = fields(*_window(busy_s=15.0, own_s=11.0, steal_s=1.0))
    assert f["load_others_cpu_pct"] == pytest.approx(20.0) and f["load_steal_pct"] == pytest.approx(5.0)
    assert f["load_avg_1m_before"] == 0.5 and f["load_avg_1m_after"] == 1.5 and f["load_cpu_count"] == 2
    assert f["machine_busy"] is True and f["load_reason"] is None
    # The point's own time given (every rank of the point on this host) replaces this process's.
    assert fields(*_window(busy_s=15.0, own_s=11.0), own_s=15.0)["load_others_cpu_pct"] == 0.0


def test_counters_a_tick_apart_give_no_negative_share_and_no_steal_where_the_kernel_has_none():
    f = fields(*_window(busy_s=10.0, own_s=10.03, steal_s=None))
    assert f["load_others_cpu_pct"] == 0.0 and f["machine_busy"] is False
    assert f["load_steal_pct"] is None  # no steal counter: null, not 0


def test_missing_counters_are_null_with_a_reason():
    before, after = _window(busy_s=15.0, own_s=11.0)
    f = fields(before, Sample(**{**after.__dict__, "busy_s": None}))
    assert f["load_others_cpu_pct"] is None and f["machine_busy"] is None and "CPU times" in f["load_reason"]
    f = fields(before, Sample(**{**after.__dict__, "cpus": None}))
    assert f["load_others_cpu_pct"] is None and f["load_reason"]


def test_a_window_too_short_for_the_counters_ticks_has_no_share():
    # 20 ms on 2 CPUs: 40 ms of CPU time against counters uncertain by 4 ticks (40 ms).
    f = fields(*_window(busy_s=0.04, own_s=0.0, wall_s=0.02))
    assert f["load_others_cpu_pct"] is None and f["machine_busy"] is None and f["load_steal_pct"] is None
    assert "too short" in f["load_reason"] and f["load_window_s"] == pytest.approx(0.02)
    assert fields(*_window(busy_s=0.0, own_s=0.0, wall_s=0.25))["load_others_cpu_pct"] == 0.0  # within 10 points


def test_a_real_point_records_the_machines_load(monkeypatch):
    # A block point through the shared measurement path, each trial 0.1 s longer by a sleep, so its window
    # is one the counters resolve on any machine (the sleep takes no CPU of the point's).
    from accel_kit.engine.block_measure import BlockMeasurement
    from accel_kit.engine.point import BlockPoint
    from accel_kit.engine.worker import run_point

    setup = BlockMeasurement.setup

    def slower(self):
        window = setup(self)
        step = window.iteration
        window.iteration = lambda: (step(), time.sleep(0.1))
        return window

    monkeypatch.setattr(BlockMeasurement, "setup", slower)
    point = BlockPoint(system="cpu", impl="native", precision="fp32", preset="gpt2-debug", seq_len=8, batch_size=1,
                       direction="forward", warmup=1, trials=3, tf32=False, torch_compile=False, noisy_cv=0.5, seed=0)
    res = run_point(point, rank=0, world=1, local_rank=0)
    m = res["metrics"]
    assert res["status"] == "ok" and m["load_window_s"] >= 0.3
    assert m["load_cpu_count"] == os.cpu_count() and isinstance(m["machine_busy"], bool)
    if sys.platform.startswith("linux"):  # psutil reads every counter there
        assert m["load_reason"] is None and 0 <= m["load_others_cpu_pct"] <= 100
        assert m["load_steal_pct"] is None or 0 <= m["load_steal_pct"] <= 100
        assert m["load_avg_1m_before"] >= 0 and m["load_avg_1m_after"] >= 0


def test_busy_threshold_on_two_and_on_many_cpus():
    # 2 CPUs: a quarter of one CPU (the floor over a tenth of two) plus the counters' resolution.
    margin_s = 4 * TICK_S
    assert not is_busy(0.25 * 10 + margin_s - 0.01, 10.0, 2)
    assert is_busy(0.25 * 10 + margin_s + 0.01, 10.0, 2)
    # 64 CPUs: a tenth of them; two busy cores on such a machine are not a busy machine.
    assert not is_busy(2 * 10.0, 10.0, 64) and is_busy(7 * 10.0, 10.0, 64)
    # Steal counts as taken too.
    assert fields(*_window(busy_s=10.0, own_s=10.0, steal_s=4.0))["machine_busy"] is True
    # A window of a few ticks: others' time within the counters' resolution is not a busy machine.
    assert not is_busy(3 * TICK_S, 0.01, 2)


def _spin_code(cpu_s: float, done: str, detach: bool) -> str:
    """A Python process that burns ``cpu_s`` of CPU (bounded by 60 s of wall time), then writes ``done``;
    ``detach``: from a grandchild reparented away from the test (no descendant of it: another process)."""
    fork = "if os.fork(): os._exit(0)\n" if detach else ""
    return ("import os, time\n" + fork + "end = time.monotonic() + 60\n"
            f"while time.process_time() < {cpu_s} and time.monotonic() < end: pass\n"
            f"open({done!r} + '.part', 'w').write(str(time.process_time()))\n"
            f"os.replace({done!r} + '.part', {done!r})\n")  # whole when it appears


def _wait_for(path, timeout_s=90.0):
    end = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
    assert os.path.exists(path), "the spinning process did not finish"
    return float(open(path).read())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, and Linux's counters")
def test_a_child_is_the_points_own_and_another_process_is_others(tmp_path):
    child_done, other_done = str(tmp_path / "child"), str(tmp_path / "other")
    before = machine_load.sample()
    subprocess.run([sys.executable, "-c", _spin_code(0.3, child_done, detach=False)], check=True, timeout=120)
    spun_s = _wait_for(child_done)
    mid = machine_load.sample()
    assert machine_load.own_delta_s(before, mid) >= spun_s - 2 * TICK_S  # the reaped child's time is the point's
    subprocess.run([sys.executable, "-c", _spin_code(0.3, other_done, detach=True)], check=True, timeout=120)
    spun_s = _wait_for(other_done)
    after = machine_load.sample()
    f = fields(mid, after)
    # Others took the stranger's time (and maybe more: this machine is shared). The machine's counters are
    # ticks sampled from what ran, so only half of it is asked for; no bound above.
    others_s = f["load_others_cpu_pct"] / 100 * after.cpus * (after.wall_s - mid.wall_s)
    assert others_s >= spun_s / 2 > 0
    assert 0 <= f["load_others_cpu_pct"] <= 100 and isinstance(f["machine_busy"], bool)


def _ranks_of_one_host(rank, meet, out):
    import torch.distributed as dist

    os.environ.update(meet)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    # 1 s on 2 CPUs; the machine ran 3.5 CPU-seconds, rank 0 one of them and rank 1 two: others 0.5.
    before, after = _window(busy_s=3.5, own_s=1.0 + rank, wall_s=1.0, load=(0.5, 1.0 + 2 * rank))
    got = machine_load.point_fields(before, after, torch.device("cpu"), 2, rank, rank)
    # Two hosts of one rank each: each rank's own time is its host's.
    alone = machine_load.point_fields(before, after, torch.device("cpu"), 2, rank, 0)
    if rank == 0:
        torch.save({"one_host": got, "two_hosts": alone}, out)
    end_group()


@pytest.mark.slow  # two processes joining a gloo group
def test_load_over_the_ranks_of_a_point(tmp_path):
    out = tmp_path / "load.pt"
    with rendezvous(1) as [meet]:
        spawn(_ranks_of_one_host, (meet, str(out)), 2)
    got = torch.load(out)
    one = got["one_host"]
    assert one["load_others_cpu_pct"] == pytest.approx(25.0) and one["machine_busy"] is True
    assert one["load_avg_1m_after"] == pytest.approx(3.0)  # the busiest rank's
    # Each host alone: rank 0's others are 2.5 of 2 CPU-seconds (clamped to the whole), rank 1's 1.5: the max.
    assert got["two_hosts"]["load_others_cpu_pct"] == pytest.approx(100.0)
