"""The Cerebras adapter's parts that need no cerebras-pytorch: options, what is unsupported and why,
how a point is launched, and the one-line error where the Cerebras environment is missing.
(Its training runs for real in tests/cerebras/, with the Cerebras environment's Python.)"""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from accel_kit.devices import get_adapter
from accel_kit.devices.cerebras import CerebrasOptions
from accel_kit.errors import ParameterError, UnavailableError
from accel_kit.systems import load_system
from accel_kit.engine.point import TrainPoint

HAVE_CSTORCH = importlib.util.find_spec("cerebras") is not None and \
    importlib.util.find_spec("cerebras.pytorch") is not None


def _point(system="cerebras-cpu", **fields) -> TrainPoint:
    return TrainPoint(**({"system": system, "preset": "gpt2-debug", "precision": "bf16", "micro_batch_size": 2,
                          "seq_len": 32} | fields))


@pytest.mark.skipif(HAVE_CSTORCH, reason="cerebras-pytorch is installed in this Python")
def test_missing_environment_is_one_line_saying_what_to_install_and_how():
    with pytest.raises(UnavailableError) as info:
        load_system("cerebras-cpu").adapter_instance()
    msg = str(info.value)
    assert "\n" not in msg and "cerebras-pytorch" in msg and "make cerebras" in msg and "cerebras-cpu" in msg
    out = subprocess.run([sys.executable, "-m", "accel_kit.cli", "run", "gas", "--system", "cerebras-cpu", "-q"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("accel-kit: error: ") and "make cerebras" in out.stderr


def test_systems_name_their_backend():
    assert get_adapter("cerebras", load_system("cerebras-cpu").options).backend_type == "CPU"
    cs2 = get_adapter("cerebras", load_system("cs2").options)
    assert cs2.backend_type == "CSX" and cs2.options.num_csx == 1
    assert cs2.supported_precisions() == ("fp32", "fp16", "bf16")
    assert get_adapter("cerebras", {"backend": "CPU"}).supported_precisions() == ("fp32", "bf16")


def test_options_from_yaml_and_environment():
    env = {"ACCEL_KIT_CEREBRAS_NUM_CSX": "2", "ACCEL_KIT_CEREBRAS_MOUNT_DIRS": "/data:/home/me/accel-kit",
           "ACCEL_KIT_CEREBRAS_COMPILE_ONLY": "true", "ACCEL_KIT_CEREBRAS_MGMT_ADDRESS": "10.0.0.1:443"}
    opts = CerebrasOptions.from_sources({"backend": "CSX", "num_csx": 1, "python_paths": ["/x"]}, env)
    assert (opts.num_csx, opts.compile_only, opts.mgmt_address) == (2, True, "10.0.0.1:443")  # environment wins
    assert opts.mount_dirs == ["/data", "/home/me/accel-kit"] and opts.python_paths == ["/x"]


@pytest.mark.parametrize("options, match", [
    ({"backend": "CPU", "mgmt_address": "x"}, "mgmt_address applies to backend CSX only"),
    ({"backend": "CSX", "compile_only": True, "validate_only": True}, "exclude each other"),
    ({"backend": "TPU"}, "backend"),
    ({"backend": "CSX", "clutser": 1}, "clutser"),
    ({"backend": "CSX", "num_csx": 0}, "num_csx"),
])
def test_bad_options_are_one_line_errors(options, match):
    with pytest.raises(ParameterError, match=match) as info:
        CerebrasOptions.from_sources(options, {})
    assert "\n" not in str(info.value)


def test_what_the_programming_model_cannot_run_and_why():
    cpu = get_adapter("cerebras", {"backend": "CPU"})
    csx = get_adapter("cerebras", {"backend": "CSX", "num_csx": 2})
    assert cpu.unsupported_train(_point()) is None and csx.unsupported_train(_point(system="cs2")) is None
    assert "num_csx" in cpu.unsupported_train(_point(devices=2))  # scaling needs a cluster
    assert csx.unsupported_train(_point(system="cs2", devices=2)) is None
    assert "lends 2" in csx.unsupported_train(_point(system="cs2", devices=4))
    assert "cstorch.sparse" in cpu.unsupported_train(_point(sparsity=0.5, sparsity_pattern="2:4"))
    assert cpu.unsupported_train(_point(sparsity=0.9, dense_finetune_steps=4)) is None
    assert "second run" in csx.unsupported_train(_point(system="cs2", sparsity=0.9, dense_finetune_steps=4))
    assert "cstorch.compile" in cpu.unsupported_train(_point(torch_compile=True))
    assert "eager" in cpu.unsupported_train(_point(engine="deepspeed"))


def test_matmul_peak_runs_on_the_host_backend_only():
    from accel_kit.engine.kinds import load_point

    point = load_point({"kind": "peak", "system": "cerebras-cpu", "precision": "fp32", "shapes": [(256, 256, 256)]})
    assert get_adapter("cerebras", {"backend": "CPU"}).unsupported_peak(point) is None
    assert "compiled step" in get_adapter("cerebras", {"backend": "CSX"}).unsupported_peak(point)


def test_block_points_it_cannot_run():
    from accel_kit.studies.microbenchmark import BlockPoint

    block = dict(system="cerebras-cpu", impl="native", preset="gpt2-debug", seq_len=32,
                 batch_size=2, direction="forward", warmup=1, trials=1, tf32=False, torch_compile=False,
                 noisy_cv=0.05, seed=0)
    cpu, csx = get_adapter("cerebras", {"backend": "CPU"}), get_adapter("cerebras", {"backend": "CSX"})
    assert cpu.unsupported_block(BlockPoint(**block, precision="bf16")) is None
    assert "does not run on the cstorch CPU backend" in cpu.unsupported_block(BlockPoint(**block, precision="fp16"))
    assert csx.unsupported_block(BlockPoint(**block, precision="fp16")) is None
    assert "cstorch.compile" in cpu.unsupported_block(BlockPoint(**(block | {"torch_compile": True}),
                                                                 precision="fp32"))


def test_the_cs2_sparse_execution_is_a_kind_the_device_declares():
    from accel_kit.sparsity.execution import EXECUTION_KINDS, SparseExecution, declare_kind, known_kinds

    assert "csx" not in EXECUTION_KINDS  # sparsity/ names no device
    # declared by the Cerebras adapter's cstorch sparsity (imported with cerebras-pytorch); the same
    # declaration again is a no-op, another meaning of the name an error
    assert declare_kind("csx", "zeros skipped by the CS-2", kernel=True) == "csx" and "csx" in known_kinds()
    with pytest.raises(ValueError, match="declared already"):
        declare_kind("csx", "something else", kernel=True)
    with pytest.raises(ValueError, match="built in"):
        declare_kind("csr", "CSR", kernel=True)
    execution = SparseExecution("csx", "every pruned layer", kernel="CS-2 sparse weight streaming")
    assert execution.label == "zeros skipped by the CS-2" and execution.describe().startswith("CS-2 sparse")
    with pytest.raises(ValueError, match="kernel name"):
        SparseExecution("csx", "every pruned layer")


def test_one_client_drives_every_cs2_of_a_point():
    # Data parallel systems start a rank per device (a group of ranks); a Cerebras point is one process,
    # with one data-parallel replica per CS-2 (the adapter's placement, which make_point puts in the point).
    placement = get_adapter("cerebras", {"backend": "CSX"}).placement(2)
    assert (placement.processes, placement.replicas) == (1, 2)
    point = _point(system="cs2", devices=2, processes=placement.processes, replicas=placement.replicas)
    assert (point.ranks, point.nodes, point.needs_group) == (1, 1, False) and point.dp == 2
    cpu = _point(system="cpu", devices=2, devices_per_node=8)
    assert (cpu.ranks, cpu.nodes, cpu.needs_group) == (2, 1, True)


def test_no_cs2_figure_for_a_cpu_backend_run():
    from accel_kit import peaks

    desc = get_adapter("cerebras", {"backend": "CPU"}).describe()
    assert desc.device_model.startswith("cstorch CPU backend on ") and desc.extra["cstorch_backend"] == "CPU"
    metrics = peaks.mfu_metrics(0.01, desc.device_model, "bf16", None)
    assert metrics["mfu_pct"] is None and "no datasheet peak" in metrics["mfu_reason"]


def test_cs2_jobscript_is_a_user_node_script(tmp_path, capsys):
    from accel_kit import cli

    out = tmp_path / "job.sh"
    assert cli.main(["jobscript", "scaling", "--system", "cs2", "--nodes", "2", "--walltime", "02:00:00",
                     "--out", str(out), "-p", "device_counts", "[1, 2]"]) == 0
    assert "run on the cluster's user node" in capsys.readouterr().out
    text = out.read_text()
    assert "#PBS" not in text and "#SBATCH" not in text and "mpiexec" not in text
    assert "export ACCEL_KIT_CEREBRAS_NUM_CSX=2" in text and "ACCEL_KIT_CEREBRAS_JOB_TIME_SEC=7200" in text
    assert "accel-kit run scaling --system cs2 --profile full -p launcher local -p max_nodes 1" in text
    assert ".venv-cerebras/bin/activate" in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    # a batch scheduler's script would start a rank per CS-2: refused, in one line, before writing
    with pytest.raises(SystemExit):
        cli.main(["jobscript", "scaling", "--system", "cs2", "--nodes", "2", "--scheduler", "pbs",
                  "--out", str(tmp_path / "pbs.sh")])
    assert "runs job scripts with --scheduler appliance, not 'pbs'" in capsys.readouterr().err
    assert not (tmp_path / "pbs.sh").exists()


def test_the_appliance_script_is_the_adapters_own():
    from accel_kit.devices.cerebras.jobscript import APPLIANCE_TEMPLATE
    from accel_kit.engine.launch import render_jobscript

    launch = get_adapter("cerebras", load_system("cs2").options).job_launch("appliance")
    assert launch.template == APPLIANCE_TEMPLATE
    fields = dict(study="scaling", system="cs2", nodes=2, devices_per_node=1, profile="full", walltime="00:30:00",
                  path="job.sh")
    assert "ACCEL_KIT_CEREBRAS_JOB_TIME_SEC=1800" in render_jobscript("appliance", template=launch.template, **fields)
    # the engine holds no appliance script of its own: without the adapter's, a one-line error
    with pytest.raises(ParameterError, match="adapter's own script") as info:
        render_jobscript("appliance", **fields)
    assert "\n" not in str(info.value)
