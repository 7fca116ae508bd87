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
