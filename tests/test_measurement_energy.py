"""accel_kit.engine.measurement and energy: a block point's FLOPs per joule (or its error), a training point's
tokens per joule, and the energy of several ranks reduced."""
import pytest
import torch
from energy_standins import FakeMeter, source
from ranks import rendezvous, spawn

from accel_kit.devices.power import EnergyWindow
from accel_kit.engine.worker import end_group


def _block_point(**kw):
    from accel_kit.engine.point import BlockPoint

    return BlockPoint(**({"system": "cpu", "impl": "native", "precision": "fp32", "preset": "gpt2-debug",
                          "seq_len": 8, "batch_size": 1, "direction": "forward", "warmup": 1,
                          "trials": 3, "tf32": False, "torch_compile": False, "noisy_cv": 0.05, "seed": 0} | kw))


def test_block_point_records_flops_per_joule_or_an_error(monkeypatch):
    from accel_kit.devices.cpu import CPUAdapter
    from accel_kit.engine.worker import run_point

    monkeypatch.setattr(CPUAdapter, "energy_meter", lambda self, index=0: FakeMeter(100.0))
    res = run_point(_block_point(), rank=0, world=1, local_rank=0)
    m = res["metrics"]
    assert res["status"] == "ok" and m["energy_j"] == 100.0 and m["power_avg_w"] == 50.0
    assert m["flops_per_j"] == pytest.approx(m["flops"] * 3 / 100.0)
    monkeypatch.setattr(CPUAdapter, "energy_meter", lambda self, index=0: FakeMeter(1000.0))  # 500 W of a 100 W part
    res = run_point(_block_point(), rank=0, world=1, local_rank=0)
    assert res["status"] == "error" and "implausible energy" in res["reason"]
    assert res["metrics"]["energy_j"] is None and res["metrics"]["tflops"] > 0 and len(res["times_s"]) == 3


def test_train_point_records_tokens_per_joule(monkeypatch):
    from accel_kit.devices.cpu import CPUAdapter
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.worker import run_point

    monkeypatch.setattr(CPUAdapter, "energy_meter", lambda self, index=0: FakeMeter(64.0))
    point = TrainPoint(system="cpu", preset="gpt2-debug", precision="fp32", micro_batch_size=2, seq_len=16, steps=2,
                       warmup_steps=1)
    res = run_point(point, rank=0, world=1, local_rank=0)
    m = res["metrics"]
    assert res["status"] == "ok" and m["energy_j"] == 64.0 and m["power_avg_w"] == 32.0
    assert m["tokens_per_j"] == pytest.approx(2 * 16 * 2 / 64.0)  # micro-batch x sequence x timed steps


def _reduce_rank(rank, meet, out):
    import os

    import torch.distributed as dist

    from accel_kit.engine.measurement import reduce_energy

    os.environ.update(meet)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cpu = torch.device("cpu")
    host = source(scope="host", rated_power_w=300.0)
    dev = source(rated_power_w=700.0)
    results = {
        # one host counter seen by both ranks: counted once
        "host": reduce_energy(EnergyWindow(100.0 + rank, 2.0 + rank, host), cpu, 2, rank),
        # one counter per device: summed, as their rated powers
        "device": reduce_energy(EnergyWindow(100.0 + rank, 2.0, dev), cpu, 2, rank),
        # a rank without a reading: no figure for the point
        "missing": reduce_energy(EnergyWindow(100.0, 2.0, dev) if rank == 0 else
                                  EnergyWindow(None, 2.0, dev, "no counter"), cpu, 2, rank),
    }
    if rank == 0:
        torch.save({k: (w.energy_j, w.window_s, w.source.rated_power_w, w.reason) for k, w in results.items()}, out)
    end_group()


@pytest.mark.slow  # two processes joining a gloo group
def test_energy_over_ranks(tmp_path):
    out = tmp_path / "energy.pt"
    with rendezvous(1) as [meet]:
        spawn(_reduce_rank, (meet, str(out)), 2)
    got = torch.load(out)
    assert got["host"] == (100.0, 3.0, 300.0, None)
    assert got["device"] == (201.0, 2.0, 1400.0, None)
    assert got["missing"][0] is None and got["missing"][3] == "another rank had no energy reading"

