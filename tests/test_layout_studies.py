"""The studies, full profiles and job scripts with parallel layouts (issue 21): what points they expand to
(without running them), like-with-like scaling efficiency, the layout in tables, and the job script's text.

One test runs a real study: scaling on two gloo ranks at tp 2 and under FSDP, through the CLI (slow).
"""
import json
import subprocess

import pandas as pd
import pytest

from accel_kit import cli, studies
from accel_kit.engine.launch import worker_command
from accel_kit.errors import ParameterError
from accel_kit.studies.training import all_points, layout_label, unresolved_precision
from accel_kit.systems import load_system
from cli_checks import fail_one_line


def _configs(study, system, profile="full", **overrides):
    """(preset, precision, layout) -> its device counts (scaling) or (devices, seq_len) (sequence length)."""
    points = all_points(studies.resolve(study, profile, **overrides), load_system(system), unresolved_precision)
    out: dict[tuple, list] = {}
    for p in points:
        out.setdefault((p.preset, p.precision, layout_label(p)), []).append(
            p.devices if study == "scaling" else (p.devices, p.seq_len))
    return out


def test_full_scaling_profile_carries_the_papers_a100_layouts_and_llama_fsdp():
    counts = [1, 2, 4, 8, 16, 32, 64]
    a100 = _configs("scaling", "a100")
    assert a100 == {("gpt2-xl", "fp16", "ddp"): counts,
                    ("gpt2-xl-16h", "bf16", "ddp"): counts,
                    ("gpt2-xl-16h", "bf16", "ddp, tp 2"): counts[1:],  # tp 2 from 2 devices on
                    ("gpt2-xl-16h", "bf16", "ddp, tp 4"): counts[2:],
                    ("llama3.1-8b", "bf16", "ddp"): counts,
                    ("llama3.1-8b", "bf16", "fsdp"): counts,
                    ("qwen3-30b-a3b", "bf16", "fsdp, ep 8"): counts[3:],  # experts over 8 ranks: from 8 on
                    ("mixtral-8x7b", "bf16", "fsdp, ep 8"): counts[3:]}
    # The A100 layouts are the A100's only; the Llama and MoE points run everywhere.
    assert set(_configs("scaling", "h100")) == {("gpt2-xl", "bf16", "ddp"), ("llama3.1-8b", "bf16", "ddp"),
                                                ("llama3.1-8b", "bf16", "fsdp"), ("qwen3-30b-a3b", "bf16", "fsdp, ep 8"),
                                                ("mixtral-8x7b", "bf16", "fsdp, ep 8")}


def test_full_seq_length_profile_runs_table_iiis_a100_row_on_four_devices():
    lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    a100 = _configs("seq_length", "a100")
    assert a100[("gpt2-xl-16h", "bf16", "ddp, tp 4")] == [(4, n) for n in lengths]
    assert a100[("gpt2-xl", "fp16", "ddp")] == [(1, n) for n in lengths]
    assert a100[("llama3.1-8b", "bf16", "fsdp")] == [(8, 8192)]
    assert ("gpt2-xl-16h", "bf16", "ddp, tp 4") not in _configs("seq_length", "cs2")


def test_layouts_given_to_a_study_and_refused_in_one_line():
    smoke = dict(profile="smoke", preset="gpt2-debug", precision="fp32")
    [p] = all_points(studies.resolve("scaling", device_counts=[2], tp=2, **smoke), load_system("cpu"),
                     unresolved_precision)
    assert (p.tp, p.dp, p.engine) == (2, 1, "ddp")
    # A device count the layout does not divide is one line (the study's own layout is not thinned out).
    with pytest.raises(ParameterError, match="1 devices do not split into tp 2 x pp 1"):
        all_points(studies.resolve("scaling", device_counts=[1, 2], tp=2, **smoke), load_system("cpu"))
    with pytest.raises(ParameterError, match=r"also\[0\]\[stages\]': Extra inputs"):
        studies.resolve("scaling", also=[{"tp": 2, "stages": 2}], **smoke)
    with pytest.raises(ParameterError, match=r"also\[0\]\[systems\]': unknown system 'a10'"):
        all_points(studies.resolve("scaling", also=[{"tp": 2, "systems": ["a10"]}], **smoke), load_system("cpu"))
    with pytest.raises(ParameterError, match=r"also\[0\]': its layout \(tp 4, pp 1, cp 1, ep 1\) divides none"):
        all_points(studies.resolve("scaling", also=[{"tp": 4}], **smoke), load_system("cpu"), unresolved_precision)


def _records(rows):
    """Training records as the studies' tables read them (results.load's flat columns)."""
    base = dict(system="cpu", preset="gpt2-debug", precision="fp32", seq_len=32, status="ok", reason=None,
                timestamp="2026-12-01T00:00:00+00:00")
    return pd.DataFrame([base | {"record_id": f"r{i}"} | row for i, row in enumerate(rows)])


def test_scaling_efficiency_compares_each_layout_with_its_own_smallest_count():
    df = _records([
        {"devices": 1, "tokens_per_s": 100.0},  # a record from before the layout fields: data parallel
        {"devices": 2, "engine": "ddp", "tp": 1, "pp": 1, "tokens_per_s": 180.0},
        {"devices": 2, "engine": "ddp", "tp": 2, "pp": 1, "tokens_per_s": 120.0},
        {"devices": 4, "engine": "ddp", "tp": 2, "pp": 1, "tokens_per_s": 216.0},
    ])
    t = studies.study_module("scaling").table(df).set_index(["layout", "devices"])
    assert t.loc[("ddp", 2), "scaling_efficiency_pct"] == pytest.approx(90.0)  # 180 / 2 against 100 / 1
    # tp 2 against tp 2 at 2 devices (not against one device): 216 / 4 against 120 / 2
    assert t.loc[("ddp, tp 2", 2), "speedup"] == 1.0
    assert t.loc[("ddp, tp 2", 4), "scaling_efficiency_pct"] == pytest.approx(90.0)
    # The table for people names the layout as a column where it varies.
    from accel_kit import tables

    scaling = studies.study_module("scaling")
    readable = tables.readable(scaling.table(df), df, scaling.SHOWN)
    assert list(readable.frame["layout"]) == ["ddp", "ddp", "ddp, tp 2", "ddp, tp 2"]


def test_seq_length_keeps_layouts_apart():
    df = _records([{"devices": 4, "seq_len": 64, "tp": 1, "tokens_per_s": 10.0},
                   {"devices": 4, "seq_len": 64, "tp": 4, "tokens_per_s": 12.0}])
    t = studies.study_module("seq_length").table(df)
    assert list(t["layout"]) == ["ddp", "ddp, tp 4"] and list(t["tokens_per_s"]) == [10.0, 12.0]


def test_torchrun_across_nodes_meets_at_a_rendezvous(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cmd, env = worker_command("torchrun", 16, 4)
    assert cmd[:5] == ["mpiexec", "-n", "4", "--ppn", "1"] and env == {}  # one torchrun per node
    assert {"--nnodes=4", "--nproc_per_node=4", "--rdzv_backend=c10d"} <= set(cmd)
    assert any(w.startswith("--rdzv_endpoint=") for w in cmd) and cmd[-2:] == ["-m", "accel_kit.engine.worker"]
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    cmd, _ = worker_command("torchrun", 8, 2)
    assert cmd[:5] == ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert "--nproc_per_node=4" in cmd


def test_jobscript_says_the_layout_and_starts_torchrun_per_node(capsys, tmp_path):
    out = tmp_path / "job.sh"
    argv = ["jobscript", "scaling", "--system", "a100", "--nodes", "4", "--scheduler", "slurm", "--launcher",
            "torchrun", "--out", str(out), "-p", "preset", "gpt2-xl-16h", "-p", "precision", "bf16", "-p", "tp", "2",
            "-p", "device_counts", "[8, 16]", "-p", "also", "[]"]
    assert cli.main(argv) == 0
    text = out.read_text()
    assert "#   gpt2-xl-16h bf16: ddp, tp 2 (tp 2, pp 1) on 8 (dp 4), 16 (dp 8) devices" in text
    assert "#SBATCH --ntasks-per-node=1" in text and "-p launcher torchrun -p max_nodes 4" in text
    assert "srun --kill-on-bad-exit=1 --nodes=4 --ntasks=4 --ntasks-per-node=1 python -m torch.distributed.run " \
           "--nnodes=4 --nproc_per_node=4 --rdzv_backend=c10d" in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0  # the shell reads it
    # The full profile under PBS: the paper's A100 layouts, each over the counts it divides.
    assert cli.main(["jobscript", "scaling", "--system", "a100", "--nodes", "16", "--out", str(out)]) == 0
    assert "#   gpt2-xl-16h bf16: ddp, tp 4 (tp 4, pp 1) on 4 (dp 1), 8 (dp 2)," in out.read_text()
    out.unlink()
    # A layout the model cannot take fails before anything is written; a vendor's own launcher keeps it.
    assert "tp 2 does not divide the 25 heads of gpt2-xl" in fail_one_line(
        ["jobscript", "scaling", "--system", "a100", "--nodes", "4", "--out", str(out), "-p", "tp", "2",
         "-p", "device_counts", "[4]"], capsys)
    assert "--launcher does not apply" in fail_one_line(
        ["jobscript", "scaling", "--system", "bow-pod64", "--nodes", "1", "--launcher", "torchrun", "--out",
         str(out)], capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_scaling_runs_tp_2_on_two_gloo_ranks(tmp_path):
    """`accel-kit run scaling -p device_counts '[2]' -p tp 2`: an ok record whose layout columns are right.
    One point of two ranks (forked from the fork server: seconds); FSDP and tensor parallelism
    training as DDP and one process do is tests/test_parallel.py's, through the same worker path."""
    argv = ["run", "scaling", "--system", "cpu", "--profile", "smoke", "--output-dir", str(tmp_path), "-q",
            "--no-figures", "-p", "preset", "gpt2-debug", "-p", "vocab_size", "97", "-p", "precision", "fp32",
            "-p", "seq_len", "16", "-p", "data", "synthetic", "-p", "device_counts", "[2]", "-p", "tp", "2"]
    assert cli.main(argv) == 0
    [record] = [json.loads(line) for line in (tmp_path / "scaling" / "cpu.jsonl").read_text().splitlines()]
    assert record["status"] == "ok", record.get("reason")
    assert (record["params"]["engine"], record["params"]["tp"], record["params"]["devices"]) == ("ddp", 2, 2)
    m = record["metrics"]
    assert (m["dp"], m["mesh"], m["global_batch_size"]) == (1, "pp 1 x dp 1 x cp 1 x tp 2", 2)
    assert m["tokens_per_s"] > 0 and m["tokens_per_s_per_device"] == pytest.approx(m["tokens_per_s"] / 2)
