"""The habana, poptorch and sambaflow adapters without their SDKs.

Two kinds of checks. Here, where no vendor SDK is installed: availability, the one-line error
naming the system, the package and where it comes from, and the layouts, unsupported points
and job scripts. And, against recording stand-ins of the vendor modules
(``tests/vendor_standins.py``): the exact sequence of vendor calls in one training step and
one timed measurement. The stand-ins check the order of the calls each vendor documents, not
the hardware: nothing here ran on a Gaudi, an IPU or an RDU.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accel_kit.timing
from accel_kit import cli
from accel_kit.data import SyntheticBatches
from accel_kit.devices import get_adapter, require_adapter
from accel_kit.errors import ParameterError, UnavailableError
from accel_kit.models import build_model
from accel_kit.systems import load_system
from accel_kit.timing import measure
from accel_kit.engine.eager import programming_model
from accel_kit.engine.point import TrainPoint
from vendor_standins import (Autocast, Calls, habana_factories, install, poptorch_factories,
                             sambaflow_factories)

ROOT = Path(__file__).resolve().parent.parent
VENDOR_SYSTEMS = {"gaudi2": ("habana", "habana_frameworks.torch"), "bow-pod64": ("poptorch", "poptorch"),
                  "sn30": ("sambaflow", "sambaflow")}
VOCAB, SEQ = 97, 16


def _vendor_sdks_absent() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is None for m in ("habana_frameworks", "poptorch", "sambaflow"))


needs_no_sdk = pytest.mark.skipif(not _vendor_sdks_absent(), reason="a vendor SDK is installed here")


@pytest.fixture
def standins(monkeypatch):
    """``standins(factories) -> Calls``: stand-in vendor modules for one test, gone afterwards."""
    installed: list[str] = []

    def _install(make):
        calls = Calls()
        installed.extend(install(monkeypatch, calls, make(calls)))
        return calls
    yield _install
    for name in installed:
        sys.modules.pop(name, None)


@pytest.fixture
def clock(monkeypatch):
    """Records each read of the clock ``accel_kit.timing.measure`` uses, into the calls given."""
    import time
    from types import SimpleNamespace

    def attach(calls: Calls):
        def perf_counter():
            calls.add("clock")
            return time.perf_counter()
        monkeypatch.setattr(accel_kit.timing, "time", SimpleNamespace(perf_counter=perf_counter))
    return attach


def _point(system: str, **fields) -> TrainPoint:
    sysd = load_system(system)
    adapter = get_adapter(sysd.adapter, sysd.options)
    placement = adapter.placement(fields.get("devices", 1))
    values = dict(system=system, preset="gpt2-debug", vocab_size=VOCAB, precision=sysd.default_precision,
                  micro_batch_size=2, seq_len=SEQ, devices_per_node=sysd.devices_per_node, steps=1, warmup_steps=0,
                  processes=placement.processes, replicas=placement.replicas, steps_per_call=placement.steps_per_call,
                  pp=adapter.pipeline_degree(fields.get("pp", 1)))
    return TrainPoint(**(values | fields))


def _model():
    torch.manual_seed(0)
    return build_model("gpt2-debug", vocab_size=VOCAB, seq_len=SEQ)


def _record_model_calls(model, calls: Calls) -> None:
    """Forward and backward of the model itself, in the same record as the vendor calls."""
    model.register_forward_hook(lambda *_: calls.add("forward"))
    next(model.parameters()).register_post_accumulate_grad_hook(lambda _: calls.add("backward"))


def _one_timed_step(trainer, adapter, calls: Calls) -> list[str]:
    """The calls of one measurement of one trainer call, from the first clock-side sync on."""
    start = len(calls)
    measure(trainer.step, adapter.synchronize, warmup=0, trials=1)
    return list(calls[start:])


# ------------------------------------------------------------------------- no SDK: errors and lists

@needs_no_sdk
@pytest.mark.parametrize("system", sorted(VENDOR_SYSTEMS))
def test_missing_sdk_is_one_line_naming_system_package_and_source(system):
    adapter_name, package = VENDOR_SYSTEMS[system]
    with pytest.raises(UnavailableError) as info:
        load_system(system).adapter_instance()
    msg = str(info.value)
    assert "\n" not in msg and f"system {system!r} (adapter {adapter_name})" in msg
    assert f"package {package} from" in msg and "not from PyPI" in msg


@needs_no_sdk
def test_run_on_a_missing_sdk_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "scaling", "--system", "gaudi2"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("accel-kit: error: system 'gaudi2' (adapter habana) is not available here: needs the "
                          "Python package habana_frameworks.torch from Intel Gaudi's software stack")


@pytest.mark.slow  # a papermill kernel: about 6 s
@needs_no_sdk
def test_papermill_on_a_missing_sdk_ends_with_the_one_line(out_dir):
    """papermill exits with its own status (1) when a cell raises; what it prints last, and what the
    failed cell shows, is accel-kit's one line instead of a traceback."""
    import papermill

    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(str(ROOT / "notebooks" / "scaling.ipynb"), str(out_dir / "out.ipynb"),
                                   parameters={"system": "sn30"}, progress_bar=False, kernel_name="python3")
    line = ("accel-kit: error: system 'sn30' (adapter sambaflow) is not available here: needs the Python package "
            "sambaflow from SambaNova's SambaFlow")
    assert info.value.traceback[0].startswith(line) and len(info.value.traceback) == 1
    assert str(info.value).strip().splitlines()[-1].startswith(line)


def test_systems_lists_the_vendor_systems_with_their_state(capsys):
    assert cli.main(["systems"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for system, (adapter, package) in VENDOR_SYSTEMS.items():
        assert system in lines and f" {adapter} " in lines[system]
        if _vendor_sdks_absent():
            assert f"unavailable: needs the Python package {package}" in lines[system]


def test_bad_vendor_option_is_one_line():
    with pytest.raises(ParameterError, match="adapter 'habana' option 'execution_mode'"):
        get_adapter("habana", {"execution_mode": "graph"})
    with pytest.raises(ParameterError, match="adapter 'poptorch' option 'ipu_per_replica'.*known: ipus_per_replica"):
        get_adapter("poptorch", {"ipu_per_replica": 4})


def test_import_accel_kit_and_the_vendor_adapters_imports_no_vendor_sdk():
    code = ("import sys, accel_kit.devices as d;"
            "[d.get_adapter(n).availability() for n in ('habana', 'poptorch', 'sambaflow')];"
            "bad = [m for m in ('poptorch', 'habana_frameworks', 'sambaflow') if m in sys.modules];"
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------------------- layouts and points

def test_placements_map_devices_to_processes_replicas_and_steps():
    assert get_adapter("habana").placement(8) == get_adapter("cpu").placement(8)  # torch's data parallelism
    ipu = get_adapter("poptorch", {"ipus_per_replica": 4, "device_iterations": 8})
    # One process; the pipeline (pp) the system's 4 IPUs a replica, or the point's pp; replicas = devices / pp.
    assert (ipu.placement(16).processes, ipu.pipeline_degree(1), ipu.placement(16).steps_per_call) == (1, 4, 8)
    assert ipu.pipeline_degree(2) == 2 and ipu.placement(16).replicas == 16
    rdu = get_adapter("sambaflow", {"tiles_per_instance": 4})
    assert (rdu.placement(2).processes, rdu.placement(2).replicas) == (4, 4)  # two instances per RDU


def test_points_carry_the_layout_and_its_global_batch():
    from accel_kit.studies import resolve
    from accel_kit.studies.training import make_point
    from accel_kit.devices import PrecisionChoice

    params = resolve("scaling", "full", gas=128)
    p = make_point(params, load_system("bow-pod64"), PrecisionChoice("fp16", "fp16", "test"), devices=16)
    assert (p.ranks, p.dp, p.global_batch_size, p.needs_group) == (1, 4, 1 * 128 * 4, False)
    p = make_point(params.model_copy(update={"gas": 1}), load_system("sn30"), PrecisionChoice("bf16", "bf16", "t"),
                   devices=2)
    assert (p.ranks, p.global_batch_size, p.nodes) == (4, 16 * 4, 1)
    assert p.key() == p.model_copy(update={"processes": None, "replicas": None}).key()  # the layout is not identity


@pytest.mark.parametrize("system, kind, fragment", [
    ("bow-pod64", "block", "one block on a 4-IPU pipeline"),
    ("bow-pod64", "peak", "no eager device"),
    ("sn30", "block", "needs a PEF of its own"),
    ("sn30", "peak", "runs compiled PEFs only"),
])
def test_what_cannot_map_is_unsupported_with_the_reason(system, kind, fragment):
    from types import SimpleNamespace

    sysd = load_system(system)
    adapter = get_adapter(sysd.adapter, sysd.options)
    assert fragment in getattr(adapter, f"unsupported_{kind}")(SimpleNamespace())
    # the worker's way: the kind's registered check asks the adapter's one hook, which asks the kind's method
    from accel_kit.engine.kinds import spec

    assert spec(kind).unsupported(adapter, SimpleNamespace(kind=kind)) == getattr(adapter, f"unsupported_{kind}")(None)


def test_the_block_and_the_peak_run_on_gaudi():
    """Gaudi's block and matmul peak are eager PyTorch on the hpu device: the defaults, nothing unsupported."""
    hpu = get_adapter("habana")
    assert hpu.unsupported("block", None) is None and hpu.unsupported("peak", None) is None


def test_unsupported_training_points_say_why():
    ipu = get_adapter("poptorch", load_system("bow-pod64").options)
    assert "multiple of 4" in ipu.unsupported_train(_point("bow-pod64", devices=2))
    assert "gradient accumulation of at least 5" in ipu.unsupported_train(_point("bow-pod64", preset="gpt2-xl",
                                                                                devices=4, gas=1))
    assert ipu.unsupported_train(_point("bow-pod64", preset="gpt2-xl", devices=4, gas=128)) is None
    assert "DeepSpeed" in ipu.unsupported_train(_point("bow-pod64", devices=4, gas=8, engine="deepspeed"))
    rdu = get_adapter("sambaflow", load_system("sn30").options)
    assert "gradient accumulation" in rdu.unsupported_train(_point("sn30", gas=4))
    assert rdu.unsupported_train(_point("sn30")) is None
    hpu = get_adapter("habana", load_system("gaudi2").options)  # lazy, as the paper's runs
    assert "bf16 autocast" in hpu.unsupported_train(_point("gaudi2", precision="fp16"))
    assert "execution_mode: eager" in hpu.unsupported_train(_point("gaudi2", torch_compile=True))
    assert get_adapter("habana", {"execution_mode": "eager"}).unsupported_train(
        _point("gaudi2", torch_compile=True)) is None
    # a training point through the engine's table of point kinds, as the worker asks
    from accel_kit.engine.kinds import kind_of

    fp16 = _point("gaudi2", precision="fp16")
    assert kind_of(fp16).unsupported(hpu, fp16) == hpu.unsupported_train(fp16)


# ------------------------------------------------------------------------------------ job scripts

@pytest.mark.parametrize("system, scheduler, launcher, expected", [
    ("gaudi2", "pbs", "mpirun", ["export PT_HPU_LAZY_MODE=1", "#PBS -l select=2"]),
    ("gaudi2", "slurm", "mpirun", ["export PT_HPU_LAZY_MODE=1", "#SBATCH --ntasks-per-node=8"]),
    ("bow-pod64", "slurm", "local", ["started by poprun", "Poplar SDK", "#SBATCH --ntasks-per-node=1"]),
    ("sn30", "slurm", "srun", ["export SLURM_MPI_TYPE=pmi2", "##SBATCH --gres=rdu:<n>", "-p timeout_s '21600'",
                               "#SBATCH --ntasks-per-node=16"]),  # two instances per RDU
    ("sn30", "pbs", "mpiexec", ["SambaFlow", "-p timeout_s '21600'"]),
])
def test_jobscripts_use_each_vendors_launch(system, scheduler, launcher, expected, tmp_path, capsys):
    out = tmp_path / "job.sh"
    nodes = "1" if system == "bow-pod64" else "2"
    assert cli.main(["jobscript", "scaling", "--system", system, "--nodes", nodes, "--scheduler", scheduler,
                     "--out", str(out), "-p", "gas", "128" if system == "bow-pod64" else "1"]) == 0
    text = out.read_text()
    run = next(line for line in text.splitlines() if line.startswith("accel-kit run"))
    assert f"--system {system} --profile full -p launcher {launcher} -p max_nodes {nodes}" in run
    for fragment in expected:
        assert fragment in text, fragment
    # the setup lines come before the run, and the user's -p after the adapter's (theirs win)
    assert text.index(expected[0]) < text.index("accel-kit run")
    if system == "sn30":
        assert run.index("-p timeout_s") < run.index("-p gas")
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0  # it parses as shell; not run


def test_open_mpi_launcher_places_ranks_per_node():
    from accel_kit.engine.launch import worker_command

    cmd, env = worker_command("mpirun", 16, 2)
    assert cmd[:5] == ["mpirun", "-np", "16", "--map-by", "ppr:8:node"] and "MASTER_ADDR" in cmd and env


def test_poprun_starts_each_ipu_point(monkeypatch):
    """The sweep runner puts the adapter's launcher before the worker: poprun with the point's replicas."""
    import accel_kit.engine.sweep as sweep

    seen = []

    class Stop(Exception):
        pass

    def popen(cmd, **kwargs):
        seen.append(cmd)
        raise Stop
    monkeypatch.setattr(sweep.subprocess, "Popen", popen)
    # Every point started as a command (a CPU point could otherwise be a fork of a server that an earlier
    # test of this process left running, and not reach Popen).
    monkeypatch.setenv("ACCEL_KIT_FORKSERVER", "0")
    with pytest.raises(Stop):
        sweep.run_worker(_point("bow-pod64", preset="gpt2-xl", devices=16, gas=128), timeout_s=5)
    assert seen[0][:4] == ["poprun", "--num-instances=1", "--num-replicas=4", "--ipus-per-replica=4"]
    assert seen[0][4:7] == [sys.executable, "-m", "accel_kit.engine.worker"]
    with pytest.raises(Stop):  # nothing before a GPU's or a CPU's worker
        sweep.run_worker(_point("cpu", devices=1, precision="fp32"), timeout_s=5)
    assert seen[1][:3] == [sys.executable, "-m", "accel_kit.engine.worker"]
    # a block point (no devices, unsupported on IPUs) starts as a plain worker that records why
    from accel_kit.studies.microbenchmark import BlockPoint

    ipu = get_adapter("poptorch", load_system("bow-pod64").options)
    block = BlockPoint.model_construct(kind="block", system="bow-pod64")
    from accel_kit.engine.kinds import kind_of

    assert ipu.launch_prefix(block, "local") == [] and kind_of(block).unsupported(ipu, block)


# --------------------------------------------------- call order against stand-ins (not the hardware)

@pytest.fixture
def hpu(monkeypatch):
    monkeypatch.setattr(torch, "hpu", None, raising=False)  # the bridge adds torch.hpu; removed after the test
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "x")
    monkeypatch.delenv("PT_HPU_LAZY_MODE")  # unset now, and unset again after the test


@pytest.mark.parametrize("mode, value", [("lazy", "1"), ("eager", "0")])
def test_gaudi_execution_mode_is_set_before_the_bridge_is_imported(standins, hpu, mode, value):
    calls = standins(habana_factories)
    adapter = get_adapter("habana", {"execution_mode": mode})
    assert adapter.availability()
    imports = calls.detail("import habana_frameworks.torch")
    assert len(imports) == 1 and imports[0]["env"].get("PT_HPU_LAZY_MODE") == value


def test_gaudi_refuses_a_contradicting_mode(standins, hpu, monkeypatch):
    standins(habana_factories)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    avail = get_adapter("habana", {"execution_mode": "lazy"}).availability()
    assert not avail and "PT_HPU_LAZY_MODE=0 in the environment contradicts execution_mode 'lazy'" in avail.reason


def test_gaudi_lazy_step_marks_after_backward_and_after_the_optimizer_and_times_after_synchronize(
        standins, hpu, clock, monkeypatch):
    calls = standins(habana_factories)
    monkeypatch.setattr(torch, "autocast", Autocast(calls))
    clock(calls)
    adapter = require_adapter("habana", options={"execution_mode": "lazy"})
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("gaudi2", gas=2)
    model = runtime.prepare_model(_model(), point, torch.device("cpu"))  # the stand-in runs on the host
    _record_model_calls(model, calls)
    trainer = runtime.make_trainer(point, model, SyntheticBatches(VOCAB, SEQ, 2), torch.device("cpu"), world=1)
    assert calls.detail("autocast") == [{"device_type": "hpu", "dtype": torch.bfloat16}]
    assert calls.detail("FusedClipNorm") == [{"max_norm": 1.0}]
    # the engine's step itself, not a copy: Gaudi's trainer replaces only its optimizer, clipping and autocast
    from accel_kit.engine.step import Trainer

    assert isinstance(trainer, Trainer) and trainer.master is None  # fp32 weights, bf16 by autocast
    assert all(getattr(type(trainer), m) is getattr(Trainer, m) for m in ("step", "accumulate", "optimizer_step"))
    micro = ["autocast.enter", "forward", "autocast.exit", "backward", "htcore.mark_step"]
    assert _one_timed_step(trainer, adapter, calls) == [
        "htcore.mark_step", "torch.hpu.synchronize", "clock",  # nothing queued when the clock starts
        *micro, *micro,  # gas 2: mark_step after each backward; backward outside autocast
        "FusedClipNorm.clip_norm", "FusedAdamW.step", "FusedAdamW.zero_grad", "htcore.mark_step",
        "htcore.mark_step", "torch.hpu.synchronize", "clock",  # the clock is read only after synchronize
    ]


def test_gaudi_eager_compiled_step_has_no_mark_step(standins, hpu, clock, monkeypatch):
    calls = standins(habana_factories)
    monkeypatch.setattr(torch, "autocast", Autocast(calls))
    monkeypatch.setattr(torch, "compile", lambda model, backend=None: calls.add("torch.compile", backend=backend)
                        or model)
    clock(calls)
    adapter = require_adapter("habana", options={"execution_mode": "eager"})
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("gaudi2", torch_compile=True)
    model = runtime.prepare_model(_model(), point, torch.device("cpu"))
    _record_model_calls(model, calls)
    trainer = runtime.make_trainer(point, model, SyntheticBatches(VOCAB, SEQ, 2), torch.device("cpu"), world=1)
    assert calls.detail("torch.compile") == [{"backend": "hpu_backend"}]
    assert _one_timed_step(trainer, adapter, calls) == [
        "torch.hpu.synchronize", "clock", "autocast.enter", "forward", "autocast.exit", "backward",
        "FusedClipNorm.clip_norm", "FusedAdamW.step", "FusedAdamW.zero_grad", "torch.hpu.synchronize", "clock"]


def test_gaudi_memory_hccl_and_deepspeed(standins, hpu, monkeypatch):
    calls = standins(habana_factories)
    adapter = require_adapter("habana")
    adapter.reset_peak_memory()
    assert adapter.peak_memory_bytes() == 3 * 2**30 and adapter.total_memory_bytes() == 94 * 2**30
    assert calls[-2:] == ["torch.hpu.reset_peak_memory_stats", "torch.hpu.max_memory_allocated"]
    monkeypatch.setenv("RANK", "3")
    assert adapter.distributed_backend() == "hccl"
    assert calls.detail("hccl registered") == [{"rank": "3"}]  # registered once RANK is set, before the group
    assert adapter.deepspeed_settings()[0] == {"DS_ACCELERATOR": "hpu"}
    assert adapter.describe().device_model == "GAUDI2"


def test_gaudi_deepspeed_marks_after_backward_and_after_step(standins, hpu, monkeypatch):
    """ZeRO goes through DeepSpeed's engine (HPU accelerator); in lazy mode the graph is cut where GaudiTrainer cuts it."""
    from types import ModuleType

    calls = standins(habana_factories)

    class Engine:
        def __call__(self, x, y):
            calls.add("engine.forward")
            return None, torch.tensor(2.0)

        def backward(self, loss):
            calls.add("engine.backward")

        def step(self):
            calls.add("engine.step")
    fake = ModuleType("deepspeed")
    fake.initialize = lambda **kw: (Engine(), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), None,
                                    None)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    monkeypatch.setenv("DS_ACCELERATOR", "x")
    monkeypatch.delenv("DS_ACCELERATOR")
    adapter = require_adapter("habana", options=load_system("gaudi2").options)  # lazy, as the paper's runs
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("gaudi2", engine="deepspeed")
    trainer = runtime.make_trainer(point, _model(), SyntheticBatches(VOCAB, SEQ, 2), torch.device("cpu"), world=1)
    import os
    assert os.environ["DS_ACCELERATOR"] == "hpu"
    start = len(calls)
    trainer.step()
    assert calls[start:] == ["engine.forward", "engine.backward", "htcore.mark_step", "engine.step", "htcore.mark_step"]


def test_ipu_call_order_options_and_one_timed_call(standins, clock):
    calls = standins(poptorch_factories)
    options = {"ipus_per_replica": 2, "device_iterations": 3, "loss_scaling": 512}
    adapter = require_adapter("poptorch", options=options)
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("bow-pod64", devices=4, gas=4, precision="fp16", steps_per_call=3, pp=2)
    assert adapter.unsupported_train(point) is None
    model = runtime.prepare_model(_model(), point, adapter.prepare())
    assert next(model.parameters()).dtype == torch.float16  # model.half(), as Graphcore's GPT-2
    assert calls.detail("BeginBlock") == [{"name": "wte", "ipu_id": 0}, {"name": "block1", "ipu_id": 1},
                                          {"name": "lm_head", "ipu_id": 0}]
    trainer = runtime.make_trainer(point, model, SyntheticBatches(VOCAB, SEQ, 2), adapter.prepare(), world=1)
    (adamw,) = calls.detail("poptorch.optim.AdamW")
    assert adamw["loss_scaling"] == 512 and adamw["accum_type"] == torch.float16 and adamw["max_grad_norm"] == 1.0
    options_set = [(n, d["args"]) for n, d in calls.details if n.startswith("Options.")]
    assert ("Options.replicationFactor", (2,)) in options_set and ("Options.deviceIterations", (3,)) in options_set
    assert ("Options.Training.gradientAccumulation", (4,)) in options_set
    assert ("Options.outputMode", ("Sum",)) in options_set
    assert ("Options.Precision.setPartialsType", (torch.float16,)) in options_set
    assert ("Options.setExecutionStrategy", (("PipelinedExecution", "AutoIncrement"),)) in options_set
    # compiled before any timing, on the first call's batch: micro-batch x gas x replicas x device iterations
    batch = 2 * 4 * 2 * 3
    init = [n for n in calls if not n.startswith(("Options.", "TensorLocationSettings", "BeginBlock"))]
    assert init[-2:] == ["trainingModel", "PoplarExecutor.compile"]
    assert calls.detail("PoplarExecutor.compile") == [{"shape": (batch, SEQ)}]
    assert trainer.samples_per_call == batch
    clock(calls)
    assert _one_timed_step(trainer, adapter, calls) == [
        "clock", "PoplarExecutor.__call__", "PoplarExecutor.setOptimizer", "clock"]  # the host clock around one call
    # the next call's learning rate (3 optimizer steps later) went to the IPUs with setOptimizer
    from accel_kit.engine.step import learning_rate, optim_for_point

    assert calls.detail("PoplarExecutor.setOptimizer")[0]["lr"][0] == learning_rate(3, optim_for_point(point))


def test_ipu_loss_is_the_summed_output_per_micro_batch(standins):
    standins(lambda calls: poptorch_factories(calls, loss_sum=4 * 3 * 2.0))  # Sum over gas 4 x 3 iterations
    adapter = require_adapter("poptorch", options={"ipus_per_replica": 2, "device_iterations": 3})
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("bow-pod64", devices=4, gas=4, precision="fp16", steps_per_call=3, pp=2)
    trainer = runtime.make_trainer(point, runtime.prepare_model(_model(), point, adapter.prepare()),
                                   SyntheticBatches(VOCAB, SEQ, 2), adapter.prepare(), world=1)
    assert trainer.step() == pytest.approx(2.0)


def test_ipu_recomputation_is_poptorchs_checkpoint(standins):
    standins(poptorch_factories)
    adapter = require_adapter("poptorch", options={"ipus_per_replica": 1})
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    model = runtime.prepare_model(_model(), _point("bow-pod64", devices=1, pp=1, activation_checkpointing=True,
                                                   precision="fp16"), adapter.prepare())
    assert model.model.activation_checkpointing is False  # not torch.utils.checkpoint, which PopTorch cannot trace
    assert all(block._forward_hooks for block in model.model.h)


@pytest.mark.parametrize("world", [1, 2])
def test_sn30_compiles_once_then_one_session_run_per_step(standins, clock, tmp_path, monkeypatch, world):
    import accel_kit.devices.sambanova as sn

    calls = standins(sambaflow_factories)

    def run_compile_here(cmd, **kwargs):  # the child process, run in this process against the stand-ins
        calls.add("compile process", cmd=cmd[1:4])
        sn.main(cmd[3:])
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(sn.subprocess, "run", run_compile_here)
    monkeypatch.setenv("RANK", "0")
    adapter = require_adapter("sambaflow", options={"pef_dir": str(tmp_path), "tiles_per_instance": 4})
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("sn30", devices=1, micro_batch_size=2)
    model = runtime.prepare_model(_model(), point, adapter.prepare())
    assert calls.detail("samba.from_torch_model_") == [{"dtype": torch.bfloat16}]
    runtime.make_trainer(point, model, SyntheticBatches(VOCAB, SEQ, 2), adapter.prepare(), world=world)
    compile_at = calls.index("compile process")
    run_phase = [c for c in calls[compile_at:] if not c.startswith("import ")]
    assert run_phase == [
        "compile process",  # the compile phase: python -m accel_kit.devices.sambanova compile SPEC
        "samba.from_torch_model_", "samba.optim.AdamW", "samba.optim.AdamW",
        "samba.from_torch_tensor", "samba.from_torch_tensor", "parse_app_args", "samba.session.compile",
        "utils.trace_graph",  # the run phase loads the PEF just written
    ]
    argv = calls.detail("parse_app_args")[0]["argv"]
    assert argv[:2] == ["compile", "-b"] and argv[argv.index("--num-tiles") + 1] == "4"
    assert ("--data-parallel" in argv) == (world > 1)
    pef = calls.detail("utils.trace_graph")[0]["pef"]
    assert pef.endswith(".pef") and Path(pef).is_file() and pef.startswith(str(tmp_path))
    # a second trainer of the same shape reuses the PEF: no compile
    start = len(calls)
    trainer = runtime.make_trainer(point, runtime.prepare_model(_model(), point, adapter.prepare()),
                                   SyntheticBatches(VOCAB, SEQ, 2), adapter.prepare(), world=world)
    assert "compile process" not in calls[start:] and calls[-1] == "utils.trace_graph"
    clock(calls)
    assert _one_timed_step(trainer, adapter, calls) == [
        "clock", "samba.from_torch_tensor", "samba.from_torch_tensor", "samba.session.run", "samba.to_torch", "clock"]
    (run,) = calls.detail("samba.session.run")
    assert run["sections"] == ["FWD", "BCKWD", "GRADNORM", "OPT"] and run["inputs"] == ["input_ids", "labels"]
    assert set(run["hyperparams"]) == {"lr"}
    assert (run.get("data_parallel"), run.get("reduce_on_rdu")) == ((True, True) if world > 1 else (None, None))


def test_sn30_compile_failure_is_the_points_error(standins, tmp_path, monkeypatch):
    import accel_kit.devices.sambanova as sn

    standins(sambaflow_factories)
    monkeypatch.setattr(sn.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "compiler: operator not supported on RDU\n"))
    adapter = require_adapter("sambaflow", options={"pef_dir": str(tmp_path)})
    runtime = programming_model(adapter)  # what the worker builds and steps the point with
    point = _point("sn30", devices=1)
    with pytest.raises(RuntimeError, match="SambaFlow compile of .* failed \\(exit 1\\): compiler: operator not"):
        runtime.make_trainer(point, runtime.prepare_model(_model(), point, adapter.prepare()),
                             SyntheticBatches(VOCAB, SEQ, 2), adapter.prepare(), world=1)
    assert list(tmp_path.rglob("*.failed"))  # other ranks waiting for the PEF see the failure


def test_compile_phase_is_its_own_process_command():
    from accel_kit.devices.sambanova import compile_command

    assert compile_command(Path("spec.json"))[1:] == ["-m", "accel_kit.devices.sambanova", "compile", "spec.json"]


def test_worker_records_an_ipu_point_by_its_layout(standins):
    """The worker's throughput follows the layout: one process, replicas of 4 IPUs, the global batch over them."""
    from accel_kit.engine.worker import run_point

    calls = standins(poptorch_factories)
    point = _point("bow-pod64", devices=8, gas=4, precision="fp16", micro_batch_size=1, steps=2, warmup_steps=1)
    assert (point.ranks, point.dp) == (1, 2)
    result = run_point(point, rank=0, world=1, local_rank=0)
    assert result["status"] == "ok", result.get("reason")
    m = result["metrics"]
    assert m["global_batch_size"] == 1 * 4 * 2 and m["dp"] == 2 and m["tokens_per_step"] == 8 * SEQ
    assert m["tokens_per_s"] == pytest.approx(8 * SEQ / m["time_median_s"])
    assert m["tokens_per_s_per_device"] == pytest.approx(m["tokens_per_s"] / 8)  # 8 IPUs share the work
    assert m["flops"] == m["flops_per_token"] * 8 * SEQ / 8
    assert m["attention_kernel_ran"] is None and "Poplar lowers attention" in m["attention_kernel_reason"]
    assert m["mem_peak_gib"] is None and m["loss_last"] == pytest.approx(2.0 / (4 * 1))  # the stand-in's sum
    assert calls.count("PoplarExecutor.__call__") == 3  # warm-up and timed calls, each one device iteration
    assert result["env"]["device"]["model"] == "Graphcore IPU (hardware version 2)"


# --------------------------------------------------- Gaudi's execution mode: the release's default, or chosen

@pytest.mark.parametrize("version, mode", [("1.21.0.555", "eager"), ("1.22.1", "eager"), ("1.20.1.97", "lazy"),
                                           ("1.9.0", "lazy"), (None, "eager")])
def test_gaudi_auto_mode_is_the_bridge_releases_default(version, mode, monkeypatch):
    import accel_kit.devices.habana as habana

    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    monkeypatch.setattr(habana, "package_version", lambda *names: version)
    adapter = get_adapter("habana", load_system("gaudi3").options)
    recorded = adapter.math_mode()
    assert recorded["execution_mode"] == mode and recorded["execution_mode_reason"].startswith("auto: ")
    assert adapter.lazy == (mode == "lazy")
    assert f"export PT_HPU_LAZY_MODE={'1' if mode == 'lazy' else '0'}" in "\n".join(adapter.job_launch("pbs").setup)


def test_gaudi_auto_mode_follows_the_environment_and_a_chosen_mode_stands(monkeypatch):
    import accel_kit.devices.habana as habana

    monkeypatch.setattr(habana, "package_version", lambda *names: "1.21.0")
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert get_adapter("habana").math_mode() == {"execution_mode": "lazy",
                                                 "execution_mode_reason": "auto: PT_HPU_LAZY_MODE=1 in the environment"}
    monkeypatch.delenv("PT_HPU_LAZY_MODE")
    # the paper's Gaudi2 runs lazy, as its Optimum Habana did, whatever the release
    assert load_system("gaudi2").options["execution_mode"] == "lazy"
    assert get_adapter("habana", {"execution_mode": "lazy"}).math_mode()["execution_mode"] == "lazy"


# ------------------------------------------------------------------------- parallel layouts on vendors

def test_vendor_adapters_answer_layouts_they_do_not_take_before_allocation():
    """tp, pp and FSDP where a vendor's programming model cannot take them: an unsupported record's reason
    (no SDK needed: the adapters answer from the point)."""
    ipu = get_adapter("poptorch", load_system("bow-pod64").options)
    assert "PopXL, not PopTorch" in ipu.unsupported_train(_point("bow-pod64", preset="gpt2-xl", devices=8, gas=128,
                                                                 tp=2))
    assert "FSDP" in ipu.unsupported_train(_point("bow-pod64", preset="gpt2-xl", devices=4, gas=128, engine="fsdp"))
    cs2 = get_adapter("cerebras", load_system("cs2").options)
    assert "without tensor or pipeline parallelism" in cs2.unsupported_train(_point("cs2", devices=1, tp=2))
    rdu = get_adapter("sambaflow", load_system("sn30").options)
    assert "tiles" in rdu.unsupported_train(_point("sn30", devices=1, pp=2))
    assert "FSDP" in rdu.unsupported_train(_point("sn30", devices=2, engine="fsdp"))
    gaudi = get_adapter("habana", {"execution_mode": "lazy"})
    assert "Megatron-DeepSpeed" in gaudi.unsupported_train(_point("gaudi2", devices=2, tp=2, precision="bf16"))
    assert "eager mode" in gaudi.unsupported_train(_point("gaudi2", devices=2, engine="fsdp", precision="bf16"))
    eager_gaudi = get_adapter("habana", {"execution_mode": "eager"})
    assert eager_gaudi.unsupported_train(_point("gaudi2", devices=2, engine="fsdp", precision="bf16")) is None
    assert all(not a.engine_layouts() for a in (ipu, cs2, rdu)) and gaudi.engine_layouts()


def test_the_ipu_pipeline_is_the_points_pp():
    """On the IPU, pp is the replica's pipeline over its IPUs: the system's 4 where a point asks none (and
    its record says so), the point's own otherwise; the replicas, poprun's words and the stages follow it.
    The engine's own layout checks do not apply (a PopTorch pipeline's micro-batches are its GAS)."""
    from accel_kit.devices import PrecisionChoice
    from accel_kit.engine import sweep
    from accel_kit.studies import resolve
    from accel_kit.studies.training import make_point

    fp16 = PrecisionChoice("fp16", "fp16", "test")
    params = resolve("scaling", "full", gas=128)
    p = make_point(params, load_system("bow-pod64"), fp16, devices=16)
    assert (p.pp, p.dp, p.mesh_label()) == (4, 4, "pp 4 x dp 4 x cp 1 x tp 1")
    p = make_point(params.model_copy(update={"pp": 2}), load_system("bow-pod64"), fp16, devices=16)
    assert (p.pp, p.dp, p.global_batch_size) == (2, 8, 128 * 8)
    ipu = sweep._adapter_of("bow-pod64")
    assert ipu.launch_prefix(p, "local")[2:4] == ["--num-replicas=8", "--ipus-per-replica=2"]
    assert ipu.unsupported_train(p) is None and ipu.pipeline_stages(48, p.pp) == 3
    # A layout the engine would refuse (tp with fp16) is the adapter's to answer, in the record.
    p = make_point(params.model_copy(update={"tp": 2}), load_system("bow-pod64"), fp16, devices=16)
    assert "tp 2" in ipu.unsupported_train(p)
