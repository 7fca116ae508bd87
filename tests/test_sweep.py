"""The sweep runner: isolation, OOM, frontier, resume after SIGKILL."""
import sys

import pytest
from sweep_checks import kill_and_resume

from accel_kit import studies

TINY = dict(preset="gpt2-debug", vocab_size=128, precision="bf16", micro_batch_size=2, steps=2, warmup_steps=1,
            data="synthetic", measure_peak=False, timeout_s=120)


@pytest.mark.slow
def test_oom_is_recorded_and_longer_sequences_skipped(out_dir):
    # A real out-of-memory: the point's process gets a 0.8 GiB data cap; long sequences exceed it (while
    # the estimate, against the host's memory, still lets them start: micro-batch 4 at 4096 needs ~12 GiB).
    run = studies.run_study("seq_length", "cpu", None, progress=False, seq_lens=[32, 4096, 8192],
                            memory_limit_gib=0.8, **(TINY | {"micro_batch_size": 4, "vocab_size": 50257}))
    statuses = [r["status"] for r in run.records]
    assert statuses == ["ok", "oom", "skipped"], [r.get("reason") for r in run.records]
    assert "allocate" in run.records[1]["reason"]
    assert "memory frontier" in run.records[2]["reason"] and "4096" in run.records[2]["reason"]
    assert run.records[0]["metrics"]["tokens_per_s"] > 0


def test_model_that_cannot_fit_is_unsupported_before_allocation(out_dir):
    run = studies.run_study("seq_length", "cpu", None, progress=False, seq_lens=[1024],
                            **(TINY | {"preset": "genslm-25b", "vocab_size": None}))
    rec = run.records[0]
    assert rec["status"] == "unsupported" and "does not fit" in rec["reason"] and "GiB" in rec["reason"]
    assert rec["metrics"]["mem_estimate_gib"] > 300


@pytest.mark.slow
def test_hang_is_killed_and_recorded(out_dir):
    # A million optimizer steps cannot end within the timeout on any machine, however fast its start
    # (the fork server's is well under a second): only the timeout ends the point.
    run = studies.run_study("gas", "cpu", None, progress=False, gas_values=[1], micro_batch_sizes=[2],
                            **(TINY | {"timeout_s": 2, "micro_batch_size": None, "steps": 10**6}))
    assert run.records[0]["status"] == "error" and "timeout" in run.records[0]["reason"]


def test_records_carry_the_resolved_point(out_dir):
    run = studies.run_study("gas", "cpu", None, progress=False, gas_values=[2], micro_batch_sizes=[2], seq_len=32,
                            **(TINY | {"micro_batch_size": None}))
    rec = run.records[0]
    assert rec["status"] == "ok"
    p, m = rec["params"], rec["metrics"]
    assert p["gas"] == 2 and p["micro_batch_size"] == 2 and p["engine"] == "ddp" and p["data"] == "synthetic"
    assert m["global_batch_size"] == 4 and m["dp"] == 1
    assert m["tokens_per_s"] == pytest.approx(4 * 32 / m["step_time_s"])
    assert m["flops"] / m["step_time_s"] / 1e12 == pytest.approx(m["tflops_per_device"])
    assert len(rec["times_s"]) == 2 and len(rec["warmup_times_s"]) == 1
    assert m["loss_first"] > 0 and m["loss_last"] > 0
    # The worker started with the CPU adapter's allocator settings, and the record says so.
    assert "glibc.malloc.trim_threshold" in rec["env"]["device"]["glibc_tunables"]


@pytest.mark.slow
def test_kill_and_resume(out_dir):
    """SIGKILL a sweep mid-way; the rerun finishes it with no lost, duplicated or corrupt record."""
    args = [sys.executable, "-m", "accel_kit.cli", "run", "gas", "--system", "cpu", "--profile", "quick", "-q",
            "--no-figures", "-p", "gas_values", "[1, 2, 3]", "-p", "micro_batch_sizes", "[1, 2]", "-p", "seq_len",
            "32", "-p", "vocab_size", "128", "-p", "data", "synthetic", "-p", "measure_peak", "false",
            "-p", "precision", "fp32",  # fixed: auto re-probes per run (and fp32 is fast on every CPU kind)
            # The points run micro-batch-major: the two recorded before the kill are the two smallest
            # (GAS 1 and 2 at micro-batch 1), the four left hold 5/6 of the steps' work, each a fork, a
            # model built and 8 optimizer steps (over 100 ms): the kill, a poll (20 ms) after the second
            # record, lands mid-sweep although points start in well under a second (the fork server).
            "-p", "steps", "8"]
    kill_and_resume(args, out_dir / "gas" / "cpu.jsonl", total=6)
