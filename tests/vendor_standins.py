"""Recording stand-ins of the vendor modules the habana, poptorch and sambaflow adapters import.

They record which vendor calls an adapter makes and in which order, so a test can hold the
adapter to the order its vendor documents. They compute nothing the vendor stacks compute
and say nothing about the hardware: a passing test means "these calls, in this order", not
"this runs on a Gaudi, an IPU or an RDU".

``install(monkeypatch, calls, factories)`` puts an import hook first on ``sys.meta_path``:
importing a stand-in module runs its factory then (not before), so a test can also check
what was set before an import (Habana's execution mode).
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path
from typing import Callable

import torch


class Calls(list):
    """The calls seen, in order: names (``self``) and, alongside, each call's details."""

    def __init__(self) -> None:
        super().__init__()
        self.details: list[tuple[str, dict]] = []

    def add(self, call: str, /, **details) -> None:
        self.append(call)
        self.details.append((call, details))

    def detail(self, call: str) -> list[dict]:
        return [d for n, d in self.details if n == call]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, factories: dict[str, Callable[[types.ModuleType], None]], calls: Calls):
        self.factories, self.calls = factories, calls

    def find_spec(self, name, path=None, target=None):
        if name in self.factories:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        self.calls.add(f"import {module.__name__}", env=dict(os.environ))
        module.__path__ = []
        self.factories[module.__name__](module)


def install(monkeypatch, calls: Calls, factories: dict[str, Callable[[types.ModuleType], None]]) -> list[str]:
    """Make the stand-in modules importable for one test; returns their names (the caller's fixture
    removes them from ``sys.modules`` afterwards, so no later test finds a vendor SDK)."""
    monkeypatch.setattr(sys, "meta_path", [_Finder(factories, calls), *sys.meta_path])
    for name in factories:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return list(factories)


# --------------------------------------------------------------------------------------- Habana

class HPU:
    """``torch.hpu`` as the Habana bridge adds it, recording what timing and memory use."""

    def __init__(self, calls: Calls):
        self.calls = calls

    def is_available(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.calls.add("torch.hpu.synchronize")

    def reset_peak_memory_stats(self) -> None:
        self.calls.add("torch.hpu.reset_peak_memory_stats")

    def max_memory_allocated(self) -> int:
        self.calls.add("torch.hpu.max_memory_allocated")
        return 3 * 2**30

    def memory_stats(self) -> dict:
        return {"Limit": 94 * 2**30, "InUse": 0, "MaxInUse": 0}

    def get_device_name(self) -> str:
        return "GAUDI2"

    def device_count(self) -> int:
        return 8


def habana_factories(calls: Calls) -> dict[str, Callable]:
    def package(module):
        pass

    def bridge(module):  # importing the real bridge adds torch.hpu
        torch.hpu = HPU(calls)

    def core(module):
        module.mark_step = lambda device_str="", sync=False: calls.add("htcore.mark_step")

    def optimizers(module):
        class FusedAdamW(torch.optim.AdamW):
            def step(self, closure=None):
                calls.add("FusedAdamW.step")
                return super().step(closure)

            def zero_grad(self, set_to_none: bool = True):
                calls.add("FusedAdamW.zero_grad")
                return super().zero_grad(set_to_none=set_to_none)

        module.FusedAdamW = FusedAdamW

    def normalization(module):
        class FusedClipNorm:
            def __init__(self, params, max_norm):
                self.max_norm = max_norm
                calls.add("FusedClipNorm", max_norm=max_norm)

            def clip_norm(self, params):
                calls.add("FusedClipNorm.clip_norm")
                torch.nn.utils.clip_grad_norm_(params, self.max_norm)

        module.FusedClipNorm = FusedClipNorm

    def hccl(module):
        calls.add("hccl registered", rank=os.environ.get("RANK"))

    return {"habana_frameworks": package, "habana_frameworks.torch": bridge, "habana_frameworks.torch.core": core,
            "habana_frameworks.torch.hpex": package, "habana_frameworks.torch.hpex.optimizers": optimizers,
            "habana_frameworks.torch.hpex.normalization": normalization,
            "habana_frameworks.torch.distributed": package, "habana_frameworks.torch.distributed.hccl": hccl}


class Autocast:
    """``torch.autocast`` recording its device type, dtype and where it is entered and left."""

    def __init__(self, calls: Calls):
        self.calls = calls

    def __call__(self, device_type, dtype=None, **kwargs):
        self.calls.add("autocast", device_type=device_type, dtype=dtype)
        calls = self.calls

        class _Ctx:
            def __enter__(self):
                calls.add("autocast.enter")

            def __exit__(self, *exc):
                calls.add("autocast.exit")
        return _Ctx()


# -------------------------------------------------------------------------------------- PopTorch

class Recorder:
    """An object whose every method call is recorded by its dotted name; calls chain."""

    def __init__(self, calls: Calls, path: str):
        self._calls, self._path = calls, path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Recorder(self._calls, f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        self._calls.add(self._path, args=args, kwargs=kwargs)
        return self


class PoplarExecutor:
    """What ``poptorch.trainingModel`` returns: a call runs the whole step on the IPUs (here: records it)."""

    def __init__(self, calls: Calls, model, options, optimizer, loss_sum: float):
        self.calls, self.model, self.options, self.optimizer, self.loss_sum = calls, model, options, optimizer, loss_sum
        calls.add("trainingModel")

    def compile(self, x, y):
        self.calls.add("PoplarExecutor.compile", shape=tuple(x.shape))

    def __call__(self, x, y):
        self.calls.add("PoplarExecutor.__call__", shape=tuple(x.shape))
        replicas = self.replicas()
        return torch.full((replicas,), self.loss_sum, dtype=torch.float16)  # OutputMode.Sum: one per replica

    def replicas(self) -> int:
        factors = [d["args"][0] for name, d in self.calls.details if name == "Options.replicationFactor"]
        return factors[-1] if factors else 1

    def setOptimizer(self, optimizer):  # noqa: N802 (PopTorch's name)
        self.calls.add("PoplarExecutor.setOptimizer", lr=[g["lr"] for g in optimizer.param_groups])


def poptorch_factories(calls: Calls, loss_sum: float = 2.0) -> dict[str, Callable]:
    def poptorch(module):
        module.__version__ = "stand-in"
        module.ipuHardwareIsAvailable = lambda num_ipus=1: True
        module.ipuHardwareVersion = lambda: 2
        module.Options = lambda: Recorder(calls, "Options")
        module.TensorLocationSettings = lambda: Recorder(calls, "TensorLocationSettings")
        module.ReductionType = types.SimpleNamespace(Mean="Mean", Sum="Sum")
        module.OutputMode = types.SimpleNamespace(Sum="Sum", All="All", Final="Final")
        module.AutoStage = types.SimpleNamespace(AutoIncrement="AutoIncrement", SameAsIpu="SameAsIpu")
        module.PipelinedExecution = lambda stage: ("PipelinedExecution", stage)

        def begin_block(layer, user_id=None, ipu_id=None):
            calls.add("BeginBlock", name=user_id, ipu_id=ipu_id)
            return layer
        module.BeginBlock = begin_block
        module.identity_loss = lambda loss, reduction: loss
        module.recomputationCheckpoint = lambda out: out

        def training_model(model, options=None, optimizer=None):
            return PoplarExecutor(calls, model, options, optimizer, loss_sum)
        module.trainingModel = training_model

        class AdamW(torch.optim.AdamW):
            def __init__(self, params, lr, betas, eps, **vendor):
                calls.add("poptorch.optim.AdamW", lr=lr, eps=eps, **vendor)
                super().__init__(params, lr=lr, betas=betas, eps=eps)
        module.optim = types.SimpleNamespace(AdamW=AdamW)

    return {"poptorch": poptorch}


# ------------------------------------------------------------------------------------- SambaFlow

def sambaflow_factories(calls: Calls, loss: float = 2.5) -> dict[str, Callable]:
    def package(module):
        module.__version__ = "stand-in"

    def samba(module):
        module.from_torch_model_ = lambda model: calls.add("samba.from_torch_model_", dtype=next(model.parameters()).dtype)

        def from_torch_tensor(tensor, name=None, batch_dim=None):
            calls.add("samba.from_torch_tensor", name=name, dtype=tensor.dtype, shape=tuple(tensor.shape))
            return types.SimpleNamespace(tensor=tensor, name=name)
        module.from_torch_tensor = from_torch_tensor

        def to_torch(value):
            calls.add("samba.to_torch")
            return value
        module.to_torch = to_torch

        class AdamW:
            def __init__(self, params, **kwargs):
                calls.add("samba.optim.AdamW", **kwargs)
                self.params = list(params)
        module.optim = types.SimpleNamespace(AdamW=AdamW)

        def compile_(model, inputs, optims, name, config_dict, init_output_grads):
            calls.add("samba.session.compile", name=name, init_output_grads=init_output_grads)
            pef = Path(config_dict["output_folder"]) / name / f"{name}.pef"
            pef.parent.mkdir(parents=True, exist_ok=True)
            pef.write_text("stand-in PEF")

        def run(input_tensors, output_tensors, hyperparam_dict, section_types, **kwargs):
            calls.add("samba.session.run", inputs=[t.name for t in input_tensors], hyperparams=hyperparam_dict,
                      sections=section_types, **kwargs)
            return [torch.full((1,), loss)]
        module.session = types.SimpleNamespace(compile=compile_, run=run)

    def utils(module):
        def trace_graph(model, inputs, optims, pef="", init_output_grads=True, **kwargs):
            calls.add("utils.trace_graph", pef=pef, inputs=[t.name for t in inputs], optimizers=len(optims))
            return ["loss"]
        module.trace_graph = trace_graph
        sys.modules["sambaflow.samba"].utils = module

    def argparser(module):
        def parse_app_args(argv):
            calls.add("parse_app_args", argv=list(argv))
            ap = argparse.ArgumentParser()
            ap.add_argument("command")
            ap.add_argument("-b", type=int)
            ap.add_argument("--pef-name")
            ap.add_argument("--output-folder")
            ap.add_argument("--num-tiles", type=int)
            ap.add_argument("--data-parallel", action="store_true")
            ap.add_argument("-ws", type=int)
            args, _ = ap.parse_known_args(argv)
            return args
        module.parse_app_args = parse_app_args

    return {"sambaflow": package, "sambaflow.samba": samba, "sambaflow.samba.utils": utils,
            "sambaflow.samba.utils.argparser": argparser}
