"""tune's memory pruning holds up under a real cap: every configuration the memory model removes fails (or would
exceed the cap) when it runs with each process capped at ``memory_limit_gib``, and the least memory-hungry one it
keeps (of torch's own engines) runs within the same cap. Two tiny cases of gpt2-debug (fp32, seq 512, global
batch 4, cap 1.5 GiB): on one device the micro-batch decides, on two the layout does (tensor parallelism keeps the
whole replica's logits on each rank, where data parallelism and a pipeline split them)."""
from pathlib import Path

import pytest

from accel_kit import results, tune
from accel_kit.mesh import ParallelLayout
from accel_kit.studies.training import make_point, resolve_precision, run_points
from accel_kit.systems import load_system
from accel_kit.tune.space import Candidate

CAP_GIB = 1.5  # the GPT-2 vocabulary's fp32 logits: micro-batch 4 peaks near 1.9 GiB, micro-batch 2 near 1.1
BASE = {"preset": "gpt2-debug", "seq_len": 512, "global_batch": 4, "precision": "fp32", "steps": 1,
        "warmup_steps": 0, "timeout_s": 120}


def _run(params, candidates, records_path: Path):
    system = load_system("cpu")
    choice = resolve_precision(params, system)
    return run_points("tune", params, system, [make_point(params, system, choice, **c.fields()) for c in candidates],
                      records_path=records_path, run_id=results.new_run_id(), profile=None, progress=False)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    """What tune's own calibration gives the memory model: uncapped single-device records at three micro-batches
    (the peaks fit the runtime's baseline and the estimate's multiple, and hold each other out for the margin)."""
    root = tmp_path_factory.mktemp("tune-memory")
    params = tune.resolve_params(None, BASE | {"devices": 1})
    records = _run(params, [Candidate(ParallelLayout(micro_batch_size=b), False) for b in (1, 2, 4)],
                   root / "calibration" / "cpu.jsonl")
    assert [r.status for r in records] == ["ok"] * 3, [r.reason for r in records]
    return root, records


@pytest.mark.slow
@pytest.mark.parametrize("devices, removed_words", [(1, "mb 4"), (2, "tp 2")])
def test_what_the_memory_model_removes_fails_under_the_cap(calibration, devices, removed_words):
    root, records = calibration
    params = tune.resolve_params(None, BASE | {"devices": devices, "memory_limit_gib": CAP_GIB})
    plan = tune.plan("cpu", params, records=records, output_dir=root)
    removed = [r.candidate for r in plan.removed]
    assert removed and all(removed_words in c.label() for c in removed), [c.label() for c in removed]
    assert plan.space.pruned["memory"] == len(removed)

    # The leanest data-parallel or model-parallel layout torch runs itself: DeepSpeed's engine brings a runtime of
    # its own (about 0.5 GiB more than the DDP records' baseline at this size), which single-device records do not see.
    leanest = min((r for r in plan.ranked if r.candidate.layout.engine != "deepspeed"),
                  key=lambda r: r.prediction.memory_per_device_gib).candidate
    path = root / f"capped-{devices}" / "cpu.jsonl"
    capped = _run(params, [leanest, *removed], path)
    assert capped[0].status == "ok", capped[0].reason  # the cap itself leaves room for what the model keeps
    for cand, rec in zip(removed, capped[1:]):
        peak = rec.metrics.get("mem_peak_gib")
        assert rec.status != "ok" or peak > CAP_GIB, (cand.label(), rec.status, peak)
    assert all(r.params["memory_limit_gib"] == CAP_GIB for r in capped)
