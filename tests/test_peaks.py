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


def test_measure_matmul_peak_cpu():
    measured = peaks.measure_matmul_peak(get_adapter("cpu"), "fp32", sizes=(64, 128), warmup=1, trials=2)
    assert measured.tflops > 0
    assert measured.best_size in (64, 128)
    assert measured.tflops == max(measured.per_size_tflops.values())
