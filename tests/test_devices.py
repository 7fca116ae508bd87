import subprocess
import sys

import pytest
import torch

from accel_kit.devices import ADAPTERS, DeviceAdapter, get_adapter, require_adapter
from accel_kit.errors import ParameterError, UnavailableError
from accel_kit.systems import load_system, system_ids

PROTOCOL_METHODS = ["availability", "torch_device", "synchronize", "supported_precisions", "reset_peak_memory",
                    "peak_memory_bytes", "total_memory_bytes", "distributed_backend", "describe", "math_mode",
                    "set_tf32"]


def _check_protocol(adapter):
    assert isinstance(adapter, DeviceAdapter)
    for name in PROTOCOL_METHODS:
        assert callable(getattr(adapter, name))
    assert adapter.availability()
    adapter.synchronize()
    assert set(adapter.supported_precisions()) <= {"fp32", "fp16", "bf16"}
    desc = adapter.describe()
    assert desc.adapter == adapter.name and desc.device_model and desc.device_count >= 1
    adapter.reset_peak_memory()
    x = torch.ones(1024, 1024, device=adapter.torch_device())
    adapter.synchronize()
    assert adapter.peak_memory_bytes() >= x.numel() * x.element_size()
    assert adapter.distributed_backend() in ("gloo", "nccl")


def test_cpu_adapter_protocol():
    adapter = get_adapter("cpu")
    _check_protocol(adapter)
    assert adapter.total_memory_bytes() > 2**30
    assert "fp32_matmul_precision" in adapter.math_mode()


def test_cpu_peak_memory_window_sees_allocation():
    adapter = get_adapter("cpu")
    adapter.reset_peak_memory()
    before = adapter.peak_memory_bytes()
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    big.add_(1)
    import time
    time.sleep(0.05)
    assert adapter.peak_memory_bytes() >= before + 48 * 2**20
    del big


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.cuda), reason="no NVIDIA GPU")
def test_cuda_adapter_protocol():
    _check_protocol(get_adapter("cuda"))


@pytest.mark.rocm
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.hip), reason="no AMD GPU / ROCm build")
def test_rocm_adapter_protocol():
    _check_protocol(get_adapter("rocm"))


def test_unavailable_adapters_say_why():
    for name in ("cuda", "rocm"):
        avail = get_adapter(name).availability()
        if not avail:
            assert avail.reason
            with pytest.raises(UnavailableError, match=name):
                require_adapter(name)


def test_unknown_adapter():
    with pytest.raises(ParameterError, match="unknown device adapter 'tpu'"):
        get_adapter("tpu")


def test_systems_parse_and_name_known_adapters():
    assert {"cpu", "a100", "h100", "h200", "mi250"} <= set(system_ids())
    for sid in system_ids():
        system = load_system(sid)
        assert system.adapter in ADAPTERS and system.default_precision in system.precisions


def test_unknown_system():
    with pytest.raises(ParameterError, match="unknown system 'tpu7'.*known: .*a100"):
        load_system("tpu7")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_unavailable_system_one_line():
    with pytest.raises(UnavailableError) as info:
        load_system("a100").adapter_instance()
    msg = str(info.value)
    assert "a100" in msg and "\n" not in msg


def test_import_never_loads_vendor_sdks():
    code = ("import sys, accel_kit, accel_kit.devices, accel_kit.studies;"
            "accel_kit.devices.get_adapter('cpu');"
            "bad = [m for m in ('poptorch', 'habana_frameworks', 'cerebras', 'sambaflow', 'deepspeed') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
