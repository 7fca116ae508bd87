"""The Cerebras adapter for real, on cstorch's CPU backend: run with the Cerebras environment's Python
(`make test-cerebras`: .venv-cerebras/bin/python -m pytest tests/cerebras); skipped elsewhere.

Every training point runs as in a study, in a worker process of its own (one cstorch backend per
process); the two in-process tests share this process's one CPU backend.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

cstorch = pytest.importorskip("cerebras.pytorch", reason="needs the Cerebras environment: make cerebras, then "
                                                         ".venv-cerebras/bin/python -m pytest tests/cerebras")

import torch  # noqa: E402

from accel_kit import results, studies  # noqa: E402
from accel_kit.engine.point import TrainPoint  # noqa: E402
from accel_kit.engine.sweep import run_worker  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(system="cerebras-cpu", preset="gpt2-debug", micro_batch_size=4, seq_len=32, warmup_steps=1, lr=3e-3)


@pytest.fixture(scope="module")
def text_data(tmp_path_factory) -> str:
    from accel_kit.data import prepare_default_text

    out = tmp_path_factory.mktemp("data") / "pydoc-gpt2"
    prepare_default_text(out, progress=False)
    return str(out)


def _train(**fields) -> dict:
    return run_worker(TrainPoint(**(TINY | fields)), timeout_s=600)


def test_short_training_point_loss_falls(text_data):
    result = _train(precision="bf16", steps=30, data="text", data_path=text_data)
    assert result["status"] == "ok", result.get("reason")
    losses = result["metrics"]["losses"]
    assert len(losses) == 31 and all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, f"loss did not fall: {first:.2f} -> {last:.2f}"
    m = result["metrics"]
    assert m["cstorch_backend"] == "CPU" and m["cstorch_half_dtype"] == "bfloat16" and m["cstorch_mixed_precision"]


def test_same_losses_as_the_eager_step_in_fp32(text_data):
    """cstorch's compiled step (AdamW, schedule, clipping, GAS) trains as the eager step does: same
    initial weights and batches, so the same first loss and nearly the same curve."""
    fields = dict(precision="fp32", steps=5, gas=2, micro_batch_size=2, data="text", data_path=text_data)
    eager = run_worker(TrainPoint(**(TINY | fields | {"system": "cpu"})), timeout_s=600)
    cstorch_run = _train(**fields)
    assert eager["status"] == cstorch_run["status"] == "ok", (eager.get("reason"), cstorch_run.get("reason"))
    ours, theirs = cstorch_run["metrics"]["losses"], eager["metrics"]["losses"]
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    assert ours == pytest.approx(theirs, rel=2e-3)


def test_sparsity_point_masks_hold(text_data):
    result = _train(precision="fp32", steps=6, data="text", data_path=text_data, sparsity=0.75)
    assert result["status"] == "ok", result.get("reason")
    m = result["metrics"]
    # gpt2-debug: 2 blocks x 4 linears, every one pruned to exactly 75 % zeros (magnitude top-k per weight)
    assert m["pruned_layers"] == 8
    assert m["sparsity_layer_min"] == pytest.approx(0.75, abs=1e-3) and m["sparsity_layer_max"] == pytest.approx(
        0.75, abs=1e-3)
    assert m["sparsity_mask_density"] == pytest.approx(0.25, abs=1e-3)
    assert m["sparsity_masked_nonzero"] == 0  # after 7 optimizer steps, no pruned weight came back
    assert m["sparse_execution_kind"] == "dense-zeros" and "cstorch.sparse" in m["sparse_execution"]
    assert m["flops_effective"] < m["flops_dense_equivalent"]
    assert all(math.isfinite(v) for v in m["losses"])


def test_dense_finetuning_after_sparse_steps(text_data):
    result = _train(precision="fp32", steps=3, data="text", data_path=text_data, sparsity=0.75, dense_finetune_steps=3)
    assert result["status"] == "ok", result.get("reason")
    m = result["metrics"]
    assert m["sparsity_masked_nonzero"] == 0 and len(m["finetune_losses"]) == 3
    assert all(math.isfinite(v) for v in m["finetune_losses"])


def test_records_fields(tmp_path):
    run = studies.run_study("gas", system="cerebras-cpu", profile="smoke", output_dir=tmp_path, progress=False,
                            micro_batch_sizes=[2], gas_values=[1, 2])
    recs = list(results.iter_records(run.records_path))
    assert [r["status"] for r in recs] == ["ok", "ok"], [r["reason"] for r in recs]
    for rec in recs:
        m, dev = rec["metrics"], rec["env"]["device"]
        assert dev["adapter"] == "cerebras" and dev["cstorch_backend"] == "CPU"
        assert dev["versions"]["cerebras-pytorch"] == "2.10.0" and dev["versions"]["torch"].startswith("2.4")
        assert rec["env"]["torch"].startswith("2.4")
        assert m["cstorch_backend"] == "CPU" and m["cerebras_pytorch_version"] == "2.10.0"
        # samples/s from our clock and from cstorch's rate tracker, side by side; over the same window
        # and sample count they differ only by the clocks
        assert m["samples_per_s"] > 0 and m["samples_per_s_cstorch"] > 0
        assert m["samples_per_s_same_window"] == pytest.approx(m["samples_per_s_cstorch"], rel=0.1)
        assert m["cstorch_total_samples"] == rec["params"]["micro_batch_size"] * rec["params"]["gas"] * 3
        # no datasheet peak for a CPU backend: no MFU against any CS-2 figure
        assert m["mfu_pct"] is None and "CS-2" not in m["mfu_reason"] and m["cstorch_flops_utilization_pct"] is None
        assert (m["n_layers"], m["n_heads"], m["hidden_size"]) == (2, 4, 64)
        assert rec["device"].startswith("cstorch CPU backend")
    assert [r["params"]["gas"] for r in recs] == [1, 2]
    assert recs[1]["metrics"]["global_batch_size"] == 4


def test_scaling_and_2to4_are_unsupported_with_the_reason(tmp_path):
    run = studies.run_study("scaling", system="cerebras-cpu", profile="smoke", output_dir=tmp_path, progress=False,
                            device_counts=[2], measure_peak=False)
    (rec,) = run.records
    assert rec["status"] == "unsupported" and "num_csx" in rec["reason"] and "CSX" in rec["reason"]
    result = _train(precision="fp32", steps=1, sparsity=0.5, sparsity_pattern="2:4")
    assert result["status"] == "unsupported" and "cstorch.sparse" in result["reason"]


def test_block_microbenchmark_point():
    from accel_kit.studies.microbenchmark import BlockPoint

    point = BlockPoint(system="cerebras-cpu", impl="native", precision="fp32", preset="gpt2-debug",
                       seq_len=32, batch_size=2, direction="forward_backward", warmup=1, trials=3, tf32=False,
                       torch_compile=False, noisy_cv=0.05, seed=0)
    result = run_worker(point, timeout_s=300)
    assert result["status"] == "ok", result.get("reason")
    assert result["metrics"]["tflops"] > 0 and len(result["times_s"]) == 3


def _synthetic_batches(point, vocab_size: int, rank: int):
    """A batch source as the engine hands one to the adapter (``eager.point_batches``): synthetic tokens."""
    from accel_kit.data import SyntheticBatches

    return SyntheticBatches(vocab_size, point.seq_len, point.micro_batch_size, seed=point.seed, rank=rank)


def test_backend_reused_and_masks_are_magnitude_masks():
    """In this process: a second open returns the same backend (a notebook cell run again), and cstorch's
    topk masks are accel-kit's magnitude masks of the same weights."""
    from accel_kit.devices.cerebras import CerebrasOptions
    from accel_kit.devices.cerebras.backend import open_backend
    from accel_kit.devices.cerebras.data import point_input_fn
    from accel_kit.devices.cerebras.executor import StepExecutor
    from accel_kit.devices.cerebras.sparsity import CstorchSparsity
    from accel_kit.models import build_model
    from accel_kit.sparsity import magnitude_mask, prunable_layers

    backend = open_backend(CerebrasOptions(), None)
    assert open_backend(CerebrasOptions(), None) is backend and cstorch.backend() is backend
    with pytest.raises(RuntimeError, match="fresh process"):
        open_backend(CerebrasOptions.model_construct(backend="CSX"), None)

    torch.manual_seed(0)
    model = build_model("gpt2-debug", seq_len=32)
    initial = {name: magnitude_mask(linear.weight.detach().clone(), 0.6) for name, linear in prunable_layers(model)}
    point = TrainPoint(**(TINY | {"precision": "fp32", "steps": 1, "sparsity": 0.6}))
    sparsity = CstorchSparsity(model, point, "CPU")
    cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)
    sparsity.attach(optimizer)
    # masks made at start (no step runs, so nothing to record)
    StepExecutor(cstorch.utils.data.DataLoader(point_input_fn, _synthetic_batches, point, 50257, 1), 1, record=None)
    masks = sparsity.masks()
    assert masks.keys() == initial.keys()
    for name, mask in masks.items():
        # cstorch keeps floor((1 - s) n) weights, accel-kit n - round(s n): the same magnitude order, so
        # cstorch keeps nothing accel-kit prunes, and at most one weight fewer
        assert not (mask & ~initial[name]).any(), name
        assert 0 <= int(initial[name].sum()) - int(mask.sum()) <= 1, name


def test_csx_step_is_traced_and_validated_without_a_cluster(monkeypatch):
    """Backend CSX in validate_only mode: the training step (bf16, GAS 2, sparsity) is traced, lowered and
    validated here, and the point is recorded as skipped, saying nothing was run. (No CS-2 is reached:
    the address is never contacted in this mode.)"""
    monkeypatch.setenv("ACCEL_KIT_CEREBRAS_VALIDATE_ONLY", "true")
    monkeypatch.setenv("ACCEL_KIT_CEREBRAS_MGMT_ADDRESS", "127.0.0.1:1")
    result = run_worker(TrainPoint(**(TINY | {"system": "cs2", "precision": "bf16", "gas": 2, "steps": 2,
                                              "sparsity": 0.9})), timeout_s=600)
    assert result["status"] == "skipped", result.get("traceback") or result.get("reason")
    assert result["reason"].startswith("validate_only: the step was traced and validated, not compiled or run")
    assert result["env"]["device"]["cstorch_backend"] == "CSX"
