"""The generic torch.accelerator adapter (accel_kit/devices/accelerator.py) where torch has no accelerator.

This project's torch is a CPU build: ``torch.accelerator.current_accelerator()`` is None, so the adapter
must say it is unavailable and why. What the adapter finds from the backend (collective, fused
AdamW, autocast) is checked as the pure functions it is made of; nothing here ran on an xpu or mps.
"""
from __future__ import annotations

import pytest
import torch

from accel_kit.devices import ADAPTERS, get_adapter
from accel_kit.devices.accelerator import (AcceleratorAdapter, autocast_available, collective_backend,
                                           fused_adamw_available)
from accel_kit.devices.cuda import CUDAAdapter
from accel_kit.devices.rocm import ROCmAdapter
from accel_kit.errors import ParameterError, UnavailableError

no_accelerator = pytest.mark.skipif(torch.accelerator.current_accelerator() is not None,
                                    reason="this torch has an accelerator backend")


@no_accelerator
def test_without_an_accelerator_it_is_unavailable_and_says_why():
    avail = get_adapter("accelerator").availability()
    assert not avail and "current_accelerator() is None" in avail.reason and "\n" not in avail.reason
    pinned = get_adapter("accelerator", {"device_type": "xpu"}).availability()
    assert not pinned and pinned.reason.endswith("the system needs xpu")
    with pytest.raises(UnavailableError, match="built for no accelerator"):
        get_adapter("accelerator").torch_device()


def test_a_torch_built_for_another_backend_or_without_a_device_says_so(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("xpu"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert get_adapter("accelerator", {"device_type": "mps"}).availability().reason == \
        "this torch's accelerator is xpu, not mps"
    assert get_adapter("accelerator").availability().reason == \
        "no xpu device is visible (torch.accelerator.is_available() is False)"
    # found from the backend, not configured: the device type and its collective
    adapter = get_adapter("accelerator")
    assert adapter.torch_device(1) == torch.device("xpu", 1) and adapter.distributed_backend() == "xccl"


def test_collective_is_the_one_torch_registers_for_the_backend_else_gloo():
    assert collective_backend("cuda") == "nccl"
    assert collective_backend("xpu") == "xccl"
    assert collective_backend("mps") == "gloo"
    # hpu: Habana's bridge registers hccl for it when imported; without the bridge torch knows none
    assert collective_backend("hpu", {"cuda": "nccl", "hpu": "hccl"}) == "hccl"
    assert collective_backend("hpu", {"cuda": "nccl"}) == "gloo"
    assert collective_backend("no-such-backend") == "gloo"


def test_fused_adamw_and_autocast_come_from_torch():
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    assert fused_adamw_available("cuda") and fused_adamw_available("xpu")
    assert not fused_adamw_available("no-such-backend")
    assert all(fused_adamw_available(t) for t in _get_fused_kernels_supported_devices())
    assert autocast_available("cpu") == torch.amp.is_autocast_available("cpu")


def test_bad_device_type_option_is_one_line():
    with pytest.raises(ParameterError, match="option 'device_type'.*'tpux' is not a torch device type"):
        get_adapter("accelerator", {"device_type": "tpux"})
    with pytest.raises(ParameterError, match="option 'mode'"):
        get_adapter("accelerator", {"mode": "x"})


def test_cuda_and_rocm_are_the_generic_adapter_pinned_to_cuda():
    assert ADAPTERS["accelerator"].endswith(":AcceleratorAdapter")
    assert issubclass(CUDAAdapter, AcceleratorAdapter) and issubclass(ROCmAdapter, CUDAAdapter)
    cuda = get_adapter("cuda")
    assert cuda.backend() == "cuda" and cuda.distributed_backend() == "nccl" and cuda.fused_optimizer()
    # what they keep of their own: the build checks, TF32 and the 2:4 kernels
    for own in ("availability", "set_tf32", "math_mode", "sparse_kernel", "energy_meter"):
        assert own in vars(CUDAAdapter)
    for inherited in ("synchronize", "reset_peak_memory", "peak_memory_bytes", "distributed_backend", "wrap_ddp",
                      "fused_optimizer", "prepare"):
        assert inherited not in vars(CUDAAdapter) and inherited not in vars(ROCmAdapter)


NEW_SYSTEMS = {"b200": "cuda", "mi300x": "rocm", "mi355x": "rocm", "gaudi3": "habana", "max1550": "accelerator",
               "mps": "accelerator"}


def test_the_current_systems_load_and_list_why_each_is_unavailable_here(capsys):
    from accel_kit import cli
    from accel_kit.peaks import datasheet_peak_tflops
    from accel_kit.systems import load_system

    for sid, adapter in NEW_SYSTEMS.items():
        system = load_system(sid)
        assert system.adapter == adapter and system.devices_per_node >= 1
        assert system.interconnect is None or "datasheet" in system.interconnect.source or \
            "white paper" in system.interconnect.source
        peak, why = datasheet_peak_tflops(system.device_model, "bf16")
        assert (peak is not None) == (sid != "mps"), (sid, why)  # Apple alone publishes no peak
    assert load_system("max1550").options == {"device_type": "xpu"}
    assert cli.main(["systems"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for sid, adapter in NEW_SYSTEMS.items():
        assert f" {adapter} " in lines[sid]
        if not get_adapter(adapter, load_system(sid).options).availability():
            assert "unavailable: " in lines[sid]
