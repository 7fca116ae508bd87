"""accel_kit.engine.worker and energy: a training point's tokens per joule, and the energy of several ranks reduced."""
import pytest
import torch
import torch.multiprocessing as mp
from energy_standins import FakeMeter, source

from accel_kit.devices.power import EnergyWindow


def test_train_point_records_tokens_per_joule(monkeypatch):
    from accel_kit.devices.cpu import CPUAdapter
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.worker import measure_point

    monkeypatch.setattr(CPUAdapter, "energy_meter", lambda self, index=0: FakeMeter(64.0))
    point = TrainPoint(system="cpu", preset="gpt2-debug", precision="fp32", micro_batch_size=2, seq_len=16, steps=2,
                       warmup_steps=1)
    res = measure_point(point, 0, 1)
    m = res["metrics"]
    assert res["status"] == "ok" and m["energy_j"] == 64.0 and m["power_avg_w"] == 32.0
    assert m["tokens_per_j"] == pytest.approx(2 * 16 * 2 / 64.0)  # micro-batch x sequence x timed steps


def _reduce_rank(rank, port, out):
    import torch.distributed as dist

    from accel_kit.engine.worker import _reduce_energy

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu = torch.device("cpu")
    host = source(scope="host", rated_power_w=300.0)
    dev = source(rated_power_w=700.0)
    results = {
        # one host counter seen by both ranks: counted once
        "host": _reduce_energy(EnergyWindow(100.0 + rank, 2.0 + rank, host), cpu, 2, rank),
        # one counter per device: summed, as their rated powers
        "device": _reduce_energy(EnergyWindow(100.0 + rank, 2.0, dev), cpu, 2, rank),
        # a rank without a reading: no figure for the point
        "missing": _reduce_energy(EnergyWindow(100.0, 2.0, dev) if rank == 0 else
                                  EnergyWindow(None, 2.0, dev, "no counter"), cpu, 2, rank),
    }
    if rank == 0:
        torch.save({k: (w.energy_j, w.window_s, w.source.rated_power_w, w.reason) for k, w in results.items()}, out)
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes, each importing torch and joining a gloo group
def test_energy_over_ranks(tmp_path):
    from accel_kit.engine.launch import free_port

    out = tmp_path / "energy.pt"
    mp.spawn(_reduce_rank, args=(free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    assert got["host"] == (100.0, 3.0, 300.0, None)
    assert got["device"] == (201.0, 2.0, 1400.0, None)
    assert got["missing"][0] is None and got["missing"][3] == "another rank had no energy reading"

