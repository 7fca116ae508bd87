"""benchmarks/energy_check.py (the energy section of benchmarks/gpu_check.sh): what it prints, from records with a
figure and from the records the sweep runner writes on this machine (every one with the energy fields)."""
import importlib.util
from pathlib import Path

import pytest

from accel_kit import energy

ROOT = Path(__file__).resolve().parent.parent


def _energy_check():
    spec = importlib.util.spec_from_file_location("energy_check", ROOT / "benchmarks" / "energy_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check


@pytest.mark.slow  # three points through the sweep runner, each in a process of its own
def test_every_record_has_the_energy_fields(out_dir):
    """Through the sweep runner on this machine: measured points and points that never ran alike."""
    from accel_kit import studies

    run = studies.run_study("microbenchmark", "cpu", "quick", progress=False, preset="gpt2-debug", seq_len=8,
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
    printed = _energy_check().lines(out_dir)
    assert len(printed) == 3 and "unsupported: does not fit" in printed[1]
    for line, rec in ((printed[0], run.records[0]), (printed[2], train.records[0])):
        why = rec["metrics"]["energy_reason"]
        assert (f"energy not recorded: {why}" in line) if why else ("J/token" in line and "J over" in line)


def test_energy_check_prints_joules_per_token(tmp_path):
    """The gpu_check energy section's printout, from records with a figure (as an NVIDIA GPU gives)."""
    from accel_kit import results

    check = _energy_check()
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

