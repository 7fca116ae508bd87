"""Energy per token: the readers (RAPL against a fake powercap tree, Zeus and HLML against fake libraries),
the plausibility check, the null-with-reason path on this machine, and the fields in every record."""
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from accel_kit import energy
from accel_kit.devices import get_adapter, power
from accel_kit.devices.power import rapl
from accel_kit.devices.power import ENERGY_COUNTER, Counter, CounterMeter, EnergySource, EnergyWindow
from accel_kit.timing import measure

ROOT = Path(__file__).resolve().parent.parent
MAX_UJ = 262_143_328_850  # a real package's max_energy_range_uj (about 262 kJ)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _zone(root: Path, name: str, label: str, energy_uj: int, *, limits_uw=(), max_uj=MAX_UJ) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    for k, (kind, uw) in enumerate(limits_uw):
        (zone / f"constraint_{k}_name").write_text(kind + "\n")
        (zone / f"constraint_{k}_power_limit_uw").write_text(f"{uw}\n")
    return zone


def _powercap(root: Path) -> tuple[Path, Path]:
    """Laid out as the kernel's /sys/class/powercap: two sockets, their sub-zones, and zones that must be ignored."""
    (root / "intel-rapl").mkdir(parents=True)  # the control type
    (root / "intel-rapl" / "enabled").write_text("1\n")
    p0 = _zone(root, "intel-rapl:0", "package-0", MAX_UJ - 1_000_000,
               limits_uw=[("long_term", 200_000_000), ("short_term", 250_000_000)])
    p1 = _zone(root, "intel-rapl:1", "package-1", 5_000_000,
               limits_uw=[("long_term", 200_000_000), ("short_term", 250_000_000)])
    _zone(root, "intel-rapl:0:0", "core", 123)  # a sub-zone: counted inside its package already
    _zone(root, "intel-rapl:0:1", "dram", 456)
    _zone(root, "intel-rapl:2", "psys", 789)  # the platform zone of client CPUs overlaps the packages
    _zone(root, "intel-rapl-mmio:0", "package-0", 1)  # the MMIO interface repeats package-0
    return p0, p1


def _set(zone: Path, uj: int) -> None:
    (zone / "energy_uj").write_text(f"{uj}\n")


# ---- RAPL -------------------------------------------------------------------------------------------

def test_rapl_sums_packages_and_handles_wrap_around(tmp_path):
    p0, p1 = _powercap(tmp_path)
    clock = Clock()
    meter = power.rapl_meter(tmp_path, clock=clock)
    assert isinstance(meter, CounterMeter)
    src = meter.source
    assert src.counter.startswith("RAPL package-0 + package-1") and "psys" not in src.counter
    assert src.method == ENERGY_COUNTER and src.scope == "host" and src.rated_power_w == 500.0
    meter.start()
    clock.now += 1.0
    _set(p0, 2_000_000)  # wrapped at max_energy_range_uj: 1 J before the wrap + 2 J after it
    _set(p1, 9_000_000)  # 4 J
    meter.poll()
    clock.now += 1.0
    _set(p0, 4_000_000)  # 2 J
    window = meter.stop()
    assert window.reason is None and window.energy_j == pytest.approx(9.0) and window.window_s == pytest.approx(2.0)
    fields = energy.energy_fields(window, work="tokens", amount=900)
    assert fields["energy_j"] == pytest.approx(9.0) and fields["power_avg_w"] == pytest.approx(4.5)
    assert fields["tokens_per_j"] == pytest.approx(100.0) and fields["energy_reason"] is None
    assert fields["energy_method"] == "energy_counter" and "powercap" in fields["energy_source"]


def test_rapl_read_too_rarely_to_rule_out_a_second_wrap_has_no_figure(tmp_path):
    p0, _ = _powercap(tmp_path)
    clock = Clock()
    meter = power.rapl_meter(tmp_path, clock=clock)
    meter.start()
    clock.now += MAX_UJ / 1e6 / 250  # one range at the package's rated 250 W: at 1.5 x it could have wrapped twice
    _set(p0, 1_000)
    window = meter.stop()
    assert window.energy_j is None and "more than once" in window.reason


def test_rapl_needs_package_zones_and_read_access(tmp_path, monkeypatch):
    assert "does not exist" in power.rapl_meter(tmp_path / "absent").reason
    (tmp_path / "empty").mkdir()
    assert "no RAPL package zone" in power.rapl_meter(tmp_path / "empty").reason
    _powercap(tmp_path / "tree")
    real = rapl._read_int

    def denied(path):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(rapl, "_read_int", denied)
    meter = power.rapl_meter(tmp_path / "tree")
    assert meter.source is None and "root only" in meter.reason


def test_rapl_without_power_limits_records_and_says_the_bound_is_unchecked(tmp_path):
    _zone(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = power.rapl_meter(tmp_path)
    assert meter.source.rated_power_w is None and "not checked" in meter.source.rated_power_source


def test_this_machine_records_null_with_the_reason():
    """No /sys/class/powercap here (nor hwmon): the CPU adapter's window is None with why, never 0."""
    if Path("/sys/class/powercap").exists():
        pytest.skip("this machine exposes powercap")
    meter = get_adapter("cpu").energy_meter()
    timing = measure(lambda: None, lambda: None, warmup=1, trials=2, meter=meter)
    fields = energy.energy_fields(timing.energy, work="tokens", amount=10)
    assert fields["energy_j"] is None and fields["tokens_per_j"] is None and fields["power_avg_w"] is None
    assert "/sys/class/powercap does not exist" in fields["energy_reason"]
    assert set(energy.FIELDS) <= set(fields)


# ---- counters that go backwards ----------------------------------------------------------------------

def _source(**kw) -> EnergySource:
    return EnergySource(**({"counter": "fake", "library": "test", "method": ENERGY_COUNTER} | kw))


def test_counter_without_a_range_that_goes_backwards_has_no_figure():
    values = iter([50.0, 60.0, 10.0])
    clock = Clock()
    meter = CounterMeter([Counter("fake counter", lambda: next(values))], _source(), clock)
    meter.start()
    clock.now += 2
    meter.poll()
    clock.now += 2
    window = meter.stop()
    assert window.energy_j is None and "went backwards" in window.reason and window.window_s == 4


# ---- plausibility ------------------------------------------------------------------------------------

def test_plausibility():
    src = _source(rated_power_w=700.0, rated_power_source="NVML limit", min_window_s=1.0)
    ok = energy.energy_fields(EnergyWindow(2000.0, 4.0, src), work="flops", amount=4e15)
    assert ok["power_avg_w"] == 500.0 and ok["flops_per_j"] == 2e12 and ok["energy_rated_power_w"] == 700.0
    with pytest.raises(energy.ImplausibleEnergy, match="above 1.5 x the rated 700 W"):
        energy.energy_fields(EnergyWindow(4400.0, 4.0, src), work="flops", amount=1.0)  # 1100 W
    with pytest.raises(energy.ImplausibleEnergy, match="negative"):
        energy.energy_fields(EnergyWindow(-1.0, 4.0, src), work="tokens", amount=1.0)
    zero = energy.energy_fields(EnergyWindow(0.0, 4.0, src), work="tokens", amount=1.0)
    assert zero["energy_j"] is None and "did not advance" in zero["energy_reason"]
    short = energy.energy_fields(EnergyWindow(20.0, 0.05, src), work="tokens", amount=1.0)
    assert short["energy_j"] is None and "shorter than the 1 s" in short["energy_reason"]
    unknown = energy.energy_fields(EnergyWindow(9000.0, 4.0, _source()), work="tokens", amount=1.0)
    assert unknown["energy_j"] == 9000.0  # no rated power known: only the sign is checked


# ---- measure(): the meter covers the timed trials only -----------------------------------------------

class RecordingMeter:
    source = None

    def __init__(self, events):
        self.events = events

    def start(self):
        self.events.append("start")

    def poll(self):
        self.events.append("poll")

    def stop(self):
        self.events.append("stop")
        return EnergyWindow(None, 0.0, None, "recording only")


def test_meter_brackets_the_timed_trials_not_the_warmup():
    events = []
    t = measure(lambda: events.append("fn"), lambda: events.append("sync"), warmup=2, trials=3,
                meter=RecordingMeter(events))
    warm = ["sync", "fn", "sync"] * 2
    trial = ["sync", "fn", "sync"]
    assert events == warm + ["sync", "start"] + trial + ["poll"] + trial + ["poll"] + trial + ["stop"]
    assert t.energy.reason == "recording only"


# ---- Zeus (NVIDIA / AMD) against a fake library ----------------------------------------------------------

class FakeGPUs:
    def __init__(self, energy_mj, counter=True):
        self.energy_mj, self.counter = energy_mj, counter

    def __len__(self):
        return 1

    def supports_get_total_energy_consumption(self, i):
        return self.counter

    def get_total_energy_consumption(self, i):
        return next(self.energy_mj)

    def get_name(self, i):
        return "NVIDIA H200"

    def get_power_management_limit_constraints(self, i):
        return (200_000, 700_000)

    def get_instant_power_usage(self, i):
        return 300_000


def _fake_zeus(monkeypatch, gpus):
    """A stand-in for zeus's documented API (get_gpus, ZeusMonitor.begin_window/end_window, Measurement)."""
    class Measurement:
        def __init__(self, time, gpu_energy):
            self.time, self.gpu_energy = time, gpu_energy

    class ZeusMonitor:
        def __init__(self, gpu_indices=None, cpu_indices=None):
            self.gpu_indices, self.open = gpu_indices, {}
            self.power_monitor = None

        def begin_window(self, key, sync_execution=True):
            assert sync_execution is False  # the adapter synchronises
            self.open[key] = gpus.get_total_energy_consumption(0) / 1e3

        def end_window(self, key, sync_execution=True):
            start = self.open.pop(key)
            return Measurement(2.5, {i: gpus.get_total_energy_consumption(i) / 1e3 - start for i in self.gpu_indices})

    zeus = types.ModuleType("zeus")
    device = types.ModuleType("zeus.device")
    device.get_gpus = lambda: gpus
    monitor = types.ModuleType("zeus.monitor")
    monitor.ZeusMonitor = ZeusMonitor
    zeus.device, zeus.monitor = device, monitor
    for name, mod in {"zeus": zeus, "zeus.device": device, "zeus.monitor": monitor}.items():
        monkeypatch.setitem(sys.modules, name, mod)


def test_zeus_meter_reads_the_gpu_counter(monkeypatch):
    _fake_zeus(monkeypatch, FakeGPUs(iter([1_000_000, 2_250_000])))
    meter = get_adapter("cuda").energy_meter(0)
    assert meter.source.method == ENERGY_COUNTER and meter.source.rated_power_w == 700.0
    assert "nvmlDeviceGetTotalEnergyConsumption" in meter.source.counter and "H200" in meter.source.counter
    meter.start()
    window = meter.stop()
    assert window.energy_j == pytest.approx(1250.0) and window.window_s == 2.5
    fields = energy.energy_fields(window, work="tokens", amount=1e6)
    assert fields["power_avg_w"] == pytest.approx(500.0) and fields["tokens_per_j"] == pytest.approx(800.0)
    assert "zeus" in fields["energy_source"]


def test_zeus_meter_counter_reset_and_missing_gpu(monkeypatch):
    _fake_zeus(monkeypatch, FakeGPUs(iter([5_000_000, 1_000])))
    meter = get_adapter("rocm").energy_meter(0)
    assert "amdsmi_get_energy_count" in meter.source.counter
    meter.start()
    window = meter.stop()
    assert window.energy_j is None and "went backwards" in window.reason
    assert "zeus sees 1 GPU(s), not GPU 3" in get_adapter("cuda").energy_meter(3).reason


def test_without_zeus_or_nvml_the_reason_says_what_to_install(monkeypatch):
    for name in ("zeus", "zeus.device", "zeus.monitor", "pynvml"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    reason = get_adapter("cuda").energy_meter(0).reason
    assert "neither zeus" in reason and "accel-kit[energy]" in reason and "nvidia-ml-py" in reason
    reason = get_adapter("rocm").energy_meter(0).reason
    assert "zeus is not installed" in reason and "amdsmi_get_energy_count" in reason


def _fake_pynvml(monkeypatch, readings_mj, *, supported=True):
    mod = types.ModuleType("pynvml")
    mod.opened = []
    mod.nvmlInit = lambda: None

    def by_uuid(uuid):
        mod.opened.append(uuid)
        return "handle"

    def energy(handle):
        if not supported:
            raise RuntimeError("NVMLError_NotSupported: Not Supported")
        return next(readings_mj)

    mod.nvmlDeviceGetHandleByUUID = by_uuid
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.nvmlDeviceGetPowerManagementLimitConstraints = lambda h: [200_000, 700_000]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_nvml_meter_without_zeus(monkeypatch):
    mod = _fake_pynvml(monkeypatch, iter([1, 10_000, 1_010_000]))
    meter = power.nvml_meter(1, uuid=lambda: "58c0a2c5-0000-1111-2222-333344445555")
    assert mod.opened == ["GPU-58c0a2c5-0000-1111-2222-333344445555"]  # the torch device's GPU, not NVML's index 1
    assert meter.source.rated_power_w == 700.0 and "nvidia-ml-py" in meter.source.library
    meter.start()
    assert meter.stop().energy_j == pytest.approx(1000.0)
    _fake_pynvml(monkeypatch, iter([]), supported=False)
    assert "NotSupported" in power.nvml_meter(0, uuid=lambda: "GPU-x").reason  # GPUs before Volta have no counter


def test_real_zeus_with_a_fake_gpu(monkeypatch):
    """Where the extra is installed: our meter against zeus's own ZeusMonitor, its GPU layer faked."""
    gpu_module = pytest.importorskip("zeus.device.gpu")
    pytest.importorskip("zeus.monitor")
    monkeypatch.setattr(gpu_module, "_gpus", FakeGPUs(iter([1_000_000, 3_000_000])))
    meter = power.zeus_gpu_meter(0, api="NVML nvmlDeviceGetTotalEnergyConsumption")
    assert isinstance(meter, power.ZeusMeter), getattr(meter, "reason", "")
    meter.start()
    window = meter.stop()
    assert window.energy_j == pytest.approx(2000.0) and window.window_s >= 0


# ---- Gaudi (habana-pyhlml) against a fake library ------------------------------------------------------

def _fake_pyhlml(monkeypatch, readings_mj):
    mod = types.ModuleType("pyhlml")
    mod.hlmlInit = lambda: None
    mod.hlmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    mod.hlmlDeviceGetName = lambda h: b"HL-225"
    mod.hlmlDeviceGetTotalEnergyConsumption = lambda h: next(readings_mj)
    mod.hlmlDeviceGetPowerManagementDefaultLimit = lambda h: 600_000
    monkeypatch.setitem(sys.modules, "pyhlml", mod)


def test_hlml_meter_reads_millijoules(monkeypatch):
    _fake_pyhlml(monkeypatch, iter([7, 10_000, 25_000, 40_000]))  # the first read checks the call works
    meter = power.hlml_meter(0)
    assert meter.source.rated_power_w == 600.0 and "HL-225" in meter.source.counter
    meter.start()
    meter.poll()
    window = meter.stop()
    assert window.energy_j == pytest.approx(30.0)


def test_hlml_driver_reload_and_missing_library(monkeypatch):
    _fake_pyhlml(monkeypatch, iter([7, 10_000, 500]))
    meter = power.hlml_meter(0)
    meter.start()
    assert "went backwards" in meter.stop().reason
    monkeypatch.setitem(sys.modules, "pyhlml", None)
    assert "habana-pyhlml is not installed" in power.hlml_meter(0).reason


# ---- in the points' records -------------------------------------------------------------------------

class FakeMeter:
    """A meter whose window reads ``joules`` over ``seconds`` (what a device with a counter would give)."""

    def __init__(self, joules, seconds=2.0, rated_w=100.0):
        self.joules, self.seconds = joules, seconds
        self.source = _source(rated_power_w=rated_w, rated_power_source="test")

    def start(self):
        pass

    def poll(self):
        pass

    def stop(self):
        return EnergyWindow(self.joules, self.seconds, self.source)


def _block_point(**kw):
    from accel_kit.studies.microbenchmark import BlockPoint

    return BlockPoint(**({"system": "cpu", "impl": "native", "precision": "fp32", "hidden_size": 32, "n_heads": 2,
                          "mlp_ratio": 4, "seq_len": 8, "batch_size": 1, "direction": "forward", "warmup": 1,
                          "trials": 3, "tf32": False, "torch_compile": False, "noisy_cv": 0.05, "seed": 0} | kw))


def test_block_point_records_flops_per_joule_or_an_error(monkeypatch):
    from accel_kit.devices.cpu import CPUAdapter
    from accel_kit.studies.microbenchmark import measure_block

    monkeypatch.setattr(CPUAdapter, "energy_meter", lambda self, index=0: FakeMeter(100.0))
    res = measure_block(_block_point())
    m = res["metrics"]
    assert res["status"] == "ok" and m["energy_j"] == 100.0 and m["power_avg_w"] == 50.0
    assert m["flops_per_j"] == pytest.approx(m["flops"] * 3 / 100.0)
    monkeypatch.setattr(CPUAdapter, "energy_meter", lambda self, index=0: FakeMeter(1000.0))  # 500 W of a 100 W part
    res = measure_block(_block_point())
    assert res["status"] == "error" and "implausible energy" in res["reason"]
    assert res["metrics"]["energy_j"] is None and res["metrics"]["tflops"] > 0 and len(res["times_s"]) == 3


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


def test_every_record_has_the_energy_fields(out_dir):
    """Through the sweep runner on this machine: measured points and points that never ran alike."""
    from accel_kit import studies

    run = studies.run_study("microbenchmark", "cpu", "quick", progress=False, hidden_size=32, n_heads=2, seq_len=8,
                            batch_sizes=[1, 100_000_000], precisions=["fp32"], directions=["forward"],
                            impls=["native"], warmup=1, trials=2, measure_peak=False, time_budget_s=None)
    assert [r["status"] for r in run.records] == ["ok", "unsupported"]
    for rec in run.records:
        m = rec["metrics"]
        assert set(energy.FIELDS) | {"flops_per_j"} <= set(m)
        assert (m["energy_j"] is None) == (m["flops_per_j"] is None) == (m["energy_reason"] is not None)
        assert m["energy_j"] is None or m["energy_j"] > 0  # a figure, or null with the reason: never 0
    assert "not measured: the point ended unsupported" in run.records[1]["metrics"]["energy_reason"]
    measured = run.records[0]["metrics"]["energy_j"] is not None
    assert energy.table_columns(run.df(), "flops") == (["flops_per_j", "power_avg_w", "energy_j"] if measured else [])
    train = studies.run_study("scaling", "cpu", "quick", progress=False, preset="gpt2-debug", device_counts=[1],
                              precision="fp32", micro_batch_size=2, seq_len=16, steps=2, warmup_steps=1,
                              data="synthetic", measure_peak=False, time_budget_s=None)
    m = train.records[0]["metrics"]
    assert train.records[0]["status"] == "ok" and set(energy.FIELDS) | {"tokens_per_j"} <= set(m)
    assert (m["energy_j"] is None) == (m["tokens_per_j"] is None) == (m["energy_reason"] is not None)
    # what benchmarks/gpu_check.sh's energy section prints, here on this machine's records
    import importlib.util

    spec = importlib.util.spec_from_file_location("energy_check", ROOT / "benchmarks" / "energy_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    printed = check.lines(out_dir)
    assert len(printed) == 3 and "unsupported: does not fit" in printed[1]
    for line, rec in ((printed[0], run.records[0]), (printed[2], train.records[0])):
        why = rec["metrics"]["energy_reason"]
        assert (f"energy not recorded: {why}" in line) if why else ("J/token" in line and "J over" in line)


def test_energy_check_prints_joules_per_token(tmp_path):
    """The gpu_check energy section's printout, from records with a figure (as an NVIDIA GPU gives)."""
    import importlib.util

    from accel_kit import results

    spec = importlib.util.spec_from_file_location("energy_check", ROOT / "benchmarks" / "energy_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    src = "NVML nvmlDeviceGetTotalEnergyConsumption, GPU 0 (NVIDIA H200); zeus 0.16.0 ZeusMonitor; energy counter"
    block = {"flops": 1e12, "tokens_per_s": 1e5, "time_median_s": 0.02, "trials": 200, "energy_j": 2000.0,
             "energy_window_s": 4.0, "power_avg_w": 500.0, "flops_per_j": 1e14, "energy_source": src}
    train = {"tokens_per_s": 4e4, "tokens_per_step": 16384, "trials": 10, "energy_j": 2457.6, "energy_window_s": 4.1,
             "power_avg_w": 600.0, "tokens_per_j": 66.67, "energy_source": src}
    for study, params, metrics in (
            ("microbenchmark", {"impl": "native", "precision": "bf16", "batch_size": 64, "seq_len": 1024,
                                "direction": "forward_backward"}, block),
            ("scaling", {"preset": "gpt2-xl", "precision": "bf16", "devices": 1, "micro_batch_size": 16}, train)):
        results.append_record(tmp_path / study / "h200.jsonl", results.make_record(
            study=study, system="h200", status="ok", params=params, run_id="r", metrics=metrics))
    micro, scaling = check.lines(tmp_path)
    assert "2000.0 J over 4.00 s, 500 W average, 1e+05 GFLOP/J" in micro
    assert f"{2000.0 / (64 * 1024 * 200):.3g} J/token" in micro and "(NVML" in micro
    assert "66.7 tokens/J, 0.015 J/token" in scaling  # 2457.6 J over 10 steps of 16384 tokens


# ---- several ranks -------------------------------------------------------------------------------------

def _reduce_rank(rank, port, out):
    import torch.distributed as dist

    from accel_kit.engine.worker import _reduce_energy

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu = torch.device("cpu")
    host = _source(scope="host", rated_power_w=300.0)
    dev = _source(rated_power_w=700.0)
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


def test_energy_over_ranks(tmp_path):
    from accel_kit.engine.launch import free_port

    out = tmp_path / "energy.pt"
    mp.spawn(_reduce_rank, args=(free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    assert got["host"] == (100.0, 3.0, 300.0, None)
    assert got["device"] == (201.0, 2.0, 1400.0, None)
    assert got["missing"][0] is None and got["missing"][3] == "another rank had no energy reading"


# ---- figures ------------------------------------------------------------------------------------------

def _rows(**per_j):
    import pandas as pd

    return pd.DataFrame([{"system": s, "preset": "gpt2-debug", "precision": "bf16", "devices": n, "status": "ok",
                          "timestamp": f"2026-01-01T00:00:0{n}", "tokens_per_s": 1000.0 * n,
                          "tokens_per_s_per_device": 1000.0, "mfu_measured_pct": 40.0, "global_batch_size": 8 * n,
                          "tokens_per_j": per_j.get(s), "power_avg_w": 300.0 if per_j.get(s) else None,
                          "energy_j": 50.0 if per_j.get(s) else None}
                         for s in ("h200", "cpu") for n in (1, 2)])


def test_training_figures_show_tokens_per_joule_beside_tokens_per_second():
    from accel_kit.studies import scaling

    figs = scaling.figures(_rows(h200=3.5))
    assert set(figs) == {"scaling_throughput", "scaling_energy"}
    traces = {t.name: list(t.y) for t in figs["scaling_energy"].data}
    assert traces == {"h200": [3.5, 3.5]}  # the CPU read no energy: left out, not drawn at 0
    assert "tokens / J" in figs["scaling_energy"].layout.yaxis.title.text
    assert list(scaling.table(_rows(h200=3.5)).columns).count("tokens_per_j") == 1
    none = _rows()
    assert set(scaling.figures(none)) == {"scaling_throughput"} and "tokens_per_j" not in scaling.table(none)


def test_microbenchmark_figures_show_flops_per_joule():
    import pandas as pd

    from accel_kit.studies import microbenchmark

    df = pd.DataFrame([{"system": "h200", "impl": "native", "precision": "bf16", "batch_size": b,
                        "direction": "forward_backward", "status": "ok", "timestamp": "t", "seq_len": 1024,
                        "tflops": 600.0, "flops_per_j": 1.2e12, "power_avg_w": 500.0, "energy_j": 2500.0}
                       for b in (16, 64)])
    figs = microbenchmark.figures(df)
    assert set(figs) == {"microbenchmark_forward_backward", "microbenchmark_forward_backward_energy"}
    assert list(figs["microbenchmark_forward_backward_energy"].data[0].y) == [1200.0, 1200.0]  # GFLOP / J
