import json
import subprocess
import sys

import pytest

from accel_kit import cli
from accel_kit.devices.cpu import CPUAdapter

TINY = ["-p", "hidden_size", "64", "-p", "n_heads", "4", "-p", "seq_len", "16", "-p", "batch_sizes", "[2]",
        "-p", "trials", "2", "-p", "warmup", "1", "-p", "measure_peak", "false", "-q"]


def _fail(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith("accel-kit: error:") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_unknown_parameter(capsys):
    assert "unknown parameter 'batch'" in _fail(["run", "microbenchmark", "-p", "batch", "4"], capsys)


def test_wrong_type(capsys):
    assert "parameter 'batch_sizes'" in _fail(["run", "microbenchmark", "-p", "batch_sizes", "four"], capsys)


def test_out_of_range(capsys):
    assert "parameter 'trials'" in _fail(["run", "microbenchmark", "-p", "trials", "-1"], capsys)


def test_unknown_system(capsys):
    assert "unknown system 'tpu'" in _fail(["run", "microbenchmark", "--system", "tpu"], capsys)


def test_unavailable_system(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert "system 'h200'" in _fail(["run", "microbenchmark", "--system", "h200"], capsys)


def test_precision_the_device_lacks(capsys, monkeypatch, out_dir):
    monkeypatch.setattr(CPUAdapter, "supported_precisions", lambda self: ("fp32", "bf16"))
    err = _fail(["run", "microbenchmark", *TINY, "-p", "precisions", "[fp16]"], capsys)
    assert "precision 'fp16' does not run on adapter 'cpu'" in err


def test_run_writes_records(out_dir, capsys):
    assert cli.main(["run", "microbenchmark", *TINY, "-p", "precisions", "[fp32]", "-p", "impls", "[native, hf]"]) == 0
    lines = (out_dir / "microbenchmark" / "cpu.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert len(recs) == 4  # 2 impls x 1 precision x 1 batch x 2 directions
    assert {r["status"] for r in recs} == {"ok"}
    assert (out_dir / "microbenchmark" / "figures" / "microbenchmark_forward.html").exists()


def test_console_script_entry_point(out_dir):
    proc = subprocess.run([sys.executable, "-m", "accel_kit.cli", "run", "microbenchmark", "-p", "nope", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown parameter 'nope'" in proc.stderr


# ----------------------------------------------------------------------------------- jobscript

JOB = ["jobscript", "scaling", "--system", "a100"]


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "--nodes must be at least 1, got 0"),
    (["--nodes", "-2"], "--nodes must be at least 1, got -2"),
    (["--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    (["--nodes", "2", "--walltime", "1:00"], "--walltime must be HH:MM:SS"),
    (["--nodes", "2", "--walltime", "01:75:00"], "--walltime must be HH:MM:SS"),
    (["--nodes", "2", "--walltime", "00:00:00"], "more than zero"),
    (["--nodes", "2", "--scheduler", "lsf"], "argument --scheduler: invalid choice: 'lsf'"),
    (["--nodes", "2", "--profile", "huge"], "unknown profile 'huge' for study 'scaling'"),
    (["--nodes", "2", "-p", "stepz", "3"], "unknown parameter 'stepz' for study 'scaling'"),
    (["--nodes", "2", "-p", "steps", "many"], "parameter 'steps'"),
])
def test_jobscript_bad_values_write_nothing(args, message, capsys, tmp_path):
    out = tmp_path / "job.sh"
    assert message in _fail([*JOB, *args, "--out", str(out)], capsys)
    assert list(tmp_path.iterdir()) == []


def test_jobscript_other_bad_arguments(capsys, tmp_path):
    out = ["--nodes", "1", "--out", str(tmp_path / "job.sh")]
    assert "unknown system 'tpu'" in _fail(["jobscript", "scaling", "--system", "tpu", *out], capsys)
    assert "unknown study 'scalling'" in _fail(["jobscript", "scalling", "--system", "a100", *out], capsys)
    # the script runs `-p launcher ...`, which the single-device microbenchmark does not take
    assert "job scripts are for scaling" in _fail(["jobscript", "microbenchmark", "--system", "a100", *out], capsys)
    assert list(tmp_path.iterdir()) == []


def test_jobscript_writes_a_runnable_script(capsys, tmp_path):
    out = tmp_path / "job.sh"
    argv = [*JOB, "--nodes", "2", "--scheduler", "slurm", "--walltime", "36:00:00", "--out", str(out),
            "-p", "steps", "3", "-p", "data", "/data/it's here"]
    assert cli.main(argv) == 0
    assert out.stat().st_mode & 0o111 and "2 node(s) x 4 devices of a100" in capsys.readouterr().out
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --time=36:00:00" in text
    # the overrides reach `accel-kit run` as the same words, quotes and spaces included
    run_line = next(line for line in text.splitlines() if line.startswith("accel-kit run"))
    words = subprocess.run(["bash", "-c", f"printf '%s\\n' {run_line[len('accel-kit run '):]}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[-6:] == ["-p", "steps", "3", "-p", "data", "/data/it's here"]


def test_usage_errors_are_one_line(capsys):
    assert "the following arguments are required: --system" in _fail(["jobscript", "scaling", "--nodes", "1"], capsys)
    assert "argument --val-fraction: must be in [0, 1)" in _fail(
        ["prepare", "text", "--out", "x", "--val-fraction", "2"], capsys)
