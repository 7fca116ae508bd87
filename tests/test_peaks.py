import pytest

from accel_kit import peaks
from accel_kit.devices import get_adapter


@pytest.mark.parametrize("model, precision, expected", [
    ("NVIDIA A100-SXM4-40GB", "bf16", 312.0),
    ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "bf16", 989.4),
    ("AMD Instinct MI250X / MI250", "fp16", 181.05),
])
def test_datasheet_lookup(model, precision, expected):
    peak, source = peaks.datasheet_peak_tflops(model, precision)
    assert peak == expected
    assert "datasheet" in source.lower()


def test_every_entry_has_a_source():
    for entry in peaks.DATASHEET:
        assert entry.source and entry.tflops


def test_tf32_uses_tensor_core_peak():
    assert peaks.datasheet_peak_tflops("NVIDIA A100-SXM4-40GB", "fp32", tf32=True)[0] == 156.0


def test_unknown_device_has_no_peak_and_says_why():
    peak, reason = peaks.datasheet_peak_tflops("Intel(R) Xeon(R) Processor", "bf16")
    assert peak is None and "no datasheet peak" in reason
    assert peaks.mfu_pct(1.0, None) is None


def test_missing_precision_says_why():
    peak, reason = peaks.datasheet_peak_tflops("Gaudi2", "fp32")
    assert peak is None and "fp32" in reason


def test_mfu():
    assert peaks.mfu_pct(156.0, 312.0) == pytest.approx(50.0)
    with pytest.raises(peaks.MFUError, match="exceeds 100"):
        peaks.mfu_pct(400.0, 312.0)


def test_measure_matmul_peak_cpu_includes_workload_shapes():
    measured = peaks.measure_matmul_peak(get_adapter("cpu"), "fp32", sizes=(64, 128), shapes=((32, 64, 192),),
                                         warmup=1, trials=2)
    assert measured.tflops > 0
    assert set(measured.per_shape_tflops) == {"64", "128", "32x64x192"}
    assert measured.best_shape in measured.per_shape_tflops
    assert measured.tflops == max(measured.per_shape_tflops.values())


def test_measured_peak_stops_growing_past_the_product_time_limit():
    # With a 1 ms limit, 64 runs, and 4096 (predicted ~1000x longer) is never started.
    measured = peaks.measure_matmul_peak(get_adapter("cpu"), "fp32", sizes=(64, 4096), shapes=((4096, 4096, 4096),),
                                         max_product_s=1e-3, warmup=0, trials=1)
    assert set(measured.per_shape_tflops) == {"64"}
    assert measured.skipped == ["4096", "4096x4096x4096"]


def test_measured_mfu_above_100_is_flagged_not_an_error():
    low = peaks.MeasuredPeak("fp32", 0.1, "64", {"64": 0.1})
    metrics = peaks.mfu_measured(0.15, low)
    assert metrics["mfu_measured_pct"] == pytest.approx(150.0)
    assert metrics["mfu_measured_unreliable"] is True and "unlucky" in metrics["mfu_measured_reason"]
    assert "mfu_measured_unreliable" not in peaks.mfu_measured(0.05, low)
    assert peaks.mfu_measured(0.05, None)["mfu_measured_pct"] is None
    better = peaks.MeasuredPeak("fp32", 0.2, "128", {"128": 0.2})
    assert low.best_of(better) is better and better.best_of(low) is better and low.best_of(None) is low
