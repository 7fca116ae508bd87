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


# ------------------------------------------------------------------ the devices people run on now

@pytest.mark.parametrize("model, precision, device, expected", [
    ("NVIDIA B200", "bf16", "NVIDIA B200 (HGX, 1,000 W)", 2250.0),
    ("NVIDIA B200", "fp8", "NVIDIA B200 (HGX, 1,000 W)", 4500.0),
    ("NVIDIA H100 80GB HBM3", "fp8", "NVIDIA H100 SXM", 1978.9),
    ("AMD Instinct MI300X", "bf16", "AMD MI300X", 1307.4),
    ("AMD Instinct MI325X", "bf16", "AMD MI325X", 1307.4),  # not the MI300X entry, though the figure is the same
    ("AMD Instinct MI355X", "bf16", "AMD MI355X", 2516.6),  # the dense figure, not the sparse 5,033
    ("AMD Instinct MI355X", "fp8", "AMD MI355X", 5033.2),
    ("GAUDI3", "bf16", "Intel Gaudi 3", 1835.0),
    ("HL-325L", "bf16", "Intel Gaudi 3", 1835.0),
    ("GAUDI2", "bf16", "Intel Gaudi2", 432.0),  # Gaudi2 and Gaudi 3 apart
    ("Intel(R) Data Center GPU Max 1550", "bf16", "Intel Data Center GPU Max 1550 (per stack)", 419.4),
])
def test_current_devices_find_their_own_entry(model, precision, device, expected):
    assert peaks.lookup_datasheet(model).device == device
    assert peaks.datasheet_peak_tflops(model, precision)[0] == expected


def test_names_that_contain_another_devices_name_find_no_wrong_entry():
    assert peaks.lookup_datasheet("NVIDIA GB200") is None  # B200's figures are the 1,000 W HGX part's
    assert peaks.lookup_datasheet("AMD Instinct MI350X") is None  # MI355X's figures are at its higher clock
    assert peaks.lookup_datasheet("NVIDIA H200").device == "NVIDIA H200"
    assert peaks.lookup_datasheet("NVIDIA H100 PCIe").device == "NVIDIA H100 PCIe"


def test_every_entry_cites_a_source_and_uses_known_keys():
    for entry in peaks.DATASHEET:
        assert len(entry.source) > 20 and any(w in entry.source.lower() for w in ("datasheet", "white paper",
                                                                                  "product brief", "peak"))
        assert set(entry.tflops) <= set(peaks.DATASHEET_KEYS), entry.device
        assert all(v > 0 for v in entry.tflops.values())


def test_no_entry_is_a_sparse_figure():
    """Where a vendor publishes both, the table holds the dense figure (half the 2:4-sparse one) and says so."""
    for entry in peaks.DATASHEET:
        for key, sparse in entry.sparse_tflops.items():
            assert key in entry.tflops, (entry.device, key)
            assert entry.tflops[key] == pytest.approx(sparse / 2, rel=2e-3), (entry.device, key)
        if entry.sparse_tflops:
            text = (entry.source + " " + entry.note).lower()
            assert "dense" in text or "half" in text, entry.device
    # the figures that have been mistaken for dense ones elsewhere
    assert peaks.datasheet_peak_tflops("NVIDIA B200", "bf16")[0] < 4500.0
    assert peaks.datasheet_peak_tflops("AMD Instinct MI355X", "bf16")[0] < 5000.0


def test_apple_gpus_have_no_datasheet_mfu_but_a_measured_one():
    peak, reason = peaks.datasheet_peak_tflops("Apple M3 Max", "fp16")
    assert peak is None and "Apple publishes no" in reason
    measured = peaks.MeasuredPeak("fp16", 10.0, "4096", {"4096": 10.0})
    metrics = peaks.mfu_metrics(4.0, "Apple M3 Max", "fp16", measured.to_dict())
    assert metrics["mfu_pct"] is None and "Apple publishes no" in metrics["mfu_reason"]
    assert metrics["mfu_measured_pct"] == pytest.approx(40.0)


# --- memory bandwidth and MBU

@pytest.mark.parametrize("model, expected", [
    ("NVIDIA A100-SXM4-40GB", 1555.0),
    ("NVIDIA A100-SXM4-80GB", 2039.0),
    ("NVIDIA A100 80GB PCIe", 1935.0),
    ("NVIDIA H100 80GB HBM3", 3350.0),
    ("NVIDIA H200", 4800.0),
    ("AMD Instinct MI250X / MI250", 1638.4),  # per GCD: half the package's 3,276.8
    ("AMD Instinct MI300X", 5300.0),
    ("Gaudi2", 2450.0),
])
def test_datasheet_bandwidth(model, expected):
    gbps, source = peaks.datasheet_bandwidth_gbps(model)
    assert gbps == expected and source


def test_bandwidth_of_an_unnamed_variant_or_unknown_device_says_why():
    gbps, reason = peaks.datasheet_bandwidth_gbps("NVIDIA A100")
    assert gbps is None and "1555" in reason and "2039" in reason  # every variant named
    gbps, reason = peaks.datasheet_bandwidth_gbps("Intel(R) Xeon(R) Processor")
    assert gbps is None and "no datasheet memory bandwidth" in reason


def test_every_entry_with_a_bandwidth_has_its_source():
    for entry in peaks.DATASHEET:
        assert all(gbps > 0 and source for _, gbps, source in entry.memory_gbps)


def test_mbu_above_100_of_the_datasheet_is_an_error():
    assert peaks.mbu_pct(2400.0, 4800.0) == pytest.approx(50.0)
    assert peaks.mbu_pct(1.0, None) is None
    with pytest.raises(peaks.MBUError, match="exceeds 100"):
        peaks.mbu_pct(5000.0, 4800.0)
    with pytest.raises(peaks.MBUError):
        peaks.mbu_metrics(5000.0, "NVIDIA H200", None)


def test_mbu_metrics_both_ways():
    measured = peaks.MeasuredBandwidth(10.0, "copy 1MiB", {"copy 1MiB": 10.0}).to_dict()
    m = peaks.mbu_metrics(12.0, "Intel(R) Xeon(R) Processor", measured)
    assert m["mbu_pct"] is None and "no datasheet" in m["mbu_reason"]
    assert m["mbu_measured_pct"] == pytest.approx(120.0) and m["mbu_measured_unreliable"]
    m = peaks.mbu_metrics(2000.0, "NVIDIA H200", None)
    assert m["mbu_pct"] == pytest.approx(2000 / 48) and m["mbu_measured_pct"] is None and m["mbu_measured_reason"]


def test_measure_memory_bandwidth_cpu():
    measured = peaks.measure_memory_bandwidth(get_adapter("cpu"), sizes_mib=(8,), warmup=1, trials=2)
    assert set(measured.per_kernel_gbps) == {"copy 8MiB", "triad 8MiB"}
    assert measured.gbps == max(measured.per_kernel_gbps.values()) > 0
    assert peaks.MeasuredBandwidth(**measured.to_dict()) == measured


def test_bandwidth_point_runs_as_a_kind(tmp_path):
    import json

    from accel_kit.engine import kinds, worker
    from accel_kit.engine.point import BandwidthPoint

    assert kinds.spec("bandwidth").point_cls is BandwidthPoint
    point = tmp_path / "point.json"
    point.write_text(json.dumps({"kind": "bandwidth", "system": "cpu", "precision": "fp32", "sizes_mib": [4]}))
    assert worker.main(["--point", str(point), "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["status"] == "ok" and peaks.MeasuredBandwidth(**result["payload"]).gbps > 0
