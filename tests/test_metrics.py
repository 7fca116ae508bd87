"""The record schema: every metric a real record carries is declared once (accel_kit.metrics), with its
unit in its name; records of the older schema still load, in the current shape."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from accel_kit import SCHEMA_VERSION, energy, metrics, results
from accel_kit.engine.point import BlockPoint, TrainPoint
from accel_kit.engine.worker import run_point

DEVICES = Path(__file__).resolve().parent.parent / "accel_kit" / "devices"

# A unit and the name ending that says it (a metric in that unit is named so).
SUFFIX = {"s": "_s", "GiB": "_gib", "%": "_pct", "W": "_w", "J": "_j"}


def test_names_carry_their_units():
    for m in metrics.METRICS.values():
        if m.unit in SUFFIX:
            assert m.name.endswith(SUFFIX[m.unit]), f"{m.name} is in {m.unit}: its name should end in {SUFFIX[m.unit]}"
        if m.name.endswith("_per_s"):
            assert m.unit.endswith("/s"), m.name


def _measured(point) -> dict:
    """The point's metrics as the sweep records them (the energy fields filled in), measured in this process."""
    result = run_point(point, rank=0, world=1, local_rank=0)
    assert result["status"] == "ok", result.get("reason")
    return energy.fill_missing(result["metrics"], point.ENERGY_WORK, "ok", None)


def _check_load(found: dict) -> None:
    """The machine's load over the window (accel_kit.machine_load): shares within 0..100, a flag either way."""
    others = found["load_others_cpu_pct"]
    if sys.platform.startswith("linux"):  # psutil reads every counter there: a share, or a window too short
        # for the kernel's ticks (a tiny point's; test_machine_load times one the counters resolve)
        assert (others is not None and found["load_reason"] is None) or "too short" in found["load_reason"]
    assert found["load_window_s"] > 0
    assert others is None or 0 <= others <= 100
    assert found["load_steal_pct"] is None or 0 <= found["load_steal_pct"] <= 100
    assert isinstance(found["machine_busy"], bool) or (others is None and found["machine_busy"] is None)
    assert found["load_cpu_count"] >= 1
    assert all(found[k] is None or found[k] >= 0 for k in ("load_avg_1m_before", "load_avg_1m_after"))


def test_a_training_record_carries_declared_metrics_only():
    point = TrainPoint(system="cpu", preset="gpt2-debug", vocab_size=64, precision="fp32", micro_batch_size=2,
                       seq_len=16, steps=2, warmup_steps=1, sparsity=0.5, dense_finetune_steps=1)
    found = _measured(point)
    assert not metrics.undeclared(found), metrics.undeclared(found)
    assert found[TrainPoint.RATE_METRIC] > 0  # the kind's achieved rate is where the kind says
    _check_load(found)


def test_a_block_record_carries_declared_metrics_only():
    point = BlockPoint(system="cpu", impl="native", precision="fp32", preset="gpt2-debug",
                       seq_len=16, batch_size=2, direction="forward_backward", warmup=1, trials=2, tf32=False,
                       torch_compile=False, noisy_cv=0.5, seed=0)
    found = _measured(point)
    assert not metrics.undeclared(found), metrics.undeclared(found)
    assert found[BlockPoint.RATE_METRIC] > 0
    _check_load(found)


def _dict_keys(tree: ast.AST) -> set[str]:
    return {k.value for node in ast.walk(tree) if isinstance(node, ast.Dict)
            for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def vendor_figures() -> set[str]:
    """The keys of every dict literal a vendor runtime builds for the record: in a device package's
    ``metrics`` module, and in functions named ``extra_metrics`` or ``rate_tracker`` under accel_kit/devices/."""
    keys = set()
    for path in DEVICES.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if path.name == "metrics.py":
            keys |= _dict_keys(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in {"extra_metrics", "rate_tracker"}:
                keys |= _dict_keys(node)
    return keys


def test_vendor_runtimes_report_declared_metrics():
    import accel_kit.devices.cerebras  # noqa: F401  (its package declares cstorch's figures)

    keys = vendor_figures()
    assert {"cstorch_backend", "samples_per_s_cstorch"} <= keys, "the vendor figures were not found"
    assert not metrics.undeclared(keys), metrics.undeclared(keys)


def test_a_name_declared_twice_must_agree():
    metrics.declare(metrics.METRICS["tokens_per_s"])  # the same again: fine
    with pytest.raises(ValueError, match="declared twice"):
        metrics.declare(metrics.Metric("tokens_per_s", "tokens/h", "another unit"))


def test_records_name_their_kind_and_old_ones_load(tmp_path):
    rec = results.make_record(study="gas", system="cpu", status="ok", params={}, run_id="r", metrics={})
    assert rec.schema_version == SCHEMA_VERSION == 2 and rec.kind == "train"
    assert results.make_record(study="microbenchmark", system="cpu", status="ok", params={}, run_id="r").kind == "block"
    old = {k: v for k, v in rec.to_dict().items() if k != "kind"} | {"schema_version": 1, "study": "microbenchmark"}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps(rec.to_dict()) + "\n")
    df = results.load(path)
    assert list(df["kind"]) == ["block", "train"]
    assert [r.kind for r in results.iter_records(path)] == ["block", "train"]


@pytest.mark.parametrize("name", ["tokens_per_s", "mfu_pct", "mem_peak_gib"])
def test_unit_lookup(name):
    assert metrics.unit(name) in {"tokens/s", "%", "GiB"}
