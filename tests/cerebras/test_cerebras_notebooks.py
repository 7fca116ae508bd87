"""A study notebook through papermill, then the CLI, on system cerebras-cpu, from the Cerebras environment."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cerebras.pytorch", reason="needs the Cerebras environment: make cerebras, then "
                                               ".venv-cerebras/bin/python -m pytest tests/cerebras")

from accel_kit import results  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_papermill_and_cli_on_cerebras_cpu(out_dir):
    import papermill

    # An explicit precision: `auto` is resolved by a timed probe in each run, and on a busy machine two runs
    # may resolve it differently, which would make the CLI's points new ones instead of resumed ones.
    params = {"system": "cerebras-cpu", "profile": "smoke", "seq_lens": [16, 32], "measure_peak": False,
              "precision": "fp32"}
    papermill.execute_notebook(str(ROOT / "notebooks" / "seq_length.ipynb"), str(out_dir / "out.ipynb"),
                               parameters=params, cwd=str(ROOT / "notebooks"), kernel_name="python3",
                               progress_bar=False)
    recs = list(results.iter_records(out_dir / "seq_length" / "cerebras-cpu.jsonl"))
    assert [r["status"] for r in recs] == ["ok", "ok"], [r["reason"] for r in recs]
    assert all(r["env"]["device"]["cstorch_backend"] == "CPU" for r in recs)
    # The CLI with the same parameters resumes the notebook's points: same records, none run twice.
    out = subprocess.run([sys.executable, "-m", "accel_kit.cli", "run", "seq_length", "--system", "cerebras-cpu",
                          "--profile", "smoke", "-q", "--no-figures", "-p", "seq_lens", "[16, 32]",
                          "-p", "measure_peak", "false", "-p", "precision", "fp32"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "2 records (2 ok, 2 from earlier runs)" in out.stdout
