"""A kind of work and a study added from outside accel_kit, registered at runtime, run end to end on the CPU.

``tests/inference_points.py`` registers an offline-generation kind and an inference study (the shape
``docs/engine.md`` gives); nothing in the worker, the sweep runner or the fork server names them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from accel_kit import metrics, results
from accel_kit.engine import kinds
from accel_kit.errors import ParameterError

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def registered(monkeypatch):
    """The kind's module importable here and in the worker processes (tests/ on both paths), then imported."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(TESTS))
    import inference_points

    return inference_points


def test_a_kind_and_a_study_registered_at_runtime_run_through_the_sweep(registered, tmp_path):
    from accel_kit.studies import run_study

    # gpt2-debug has 256 positions: prompt 254 + 3 new tokens exceed them (the kind's own check says so)
    run = run_study(registered.NAME, "cpu", profile=None, output_dir=tmp_path, progress=False,
                    prompt_lens=[4, 8, 254])
    by_len = {rec["params"]["prompt_len"]: rec for rec in run.records}
    assert [by_len[n]["status"] for n in (4, 8, 254)] == ["ok", "ok", "unsupported"], [r["reason"] for r in run.records]
    assert "exceed the 256 positions" in by_len[254]["reason"]
    for n in (4, 8):
        rec = by_len[n]
        assert rec["kind"] == registered.KIND and rec["study"] == registered.NAME
        found = rec["metrics"]
        assert found["generated_tokens_per_s"] > 0 and found["tflops_per_device"] > 0
        assert found["generated_tokens_valid"] is True
        assert len(rec["times_s"]) == 2 and rec["env"]["point_start"] in ("forkserver", "exec")
        assert not metrics.undeclared(found), metrics.undeclared(found)  # the kind declared its own
    assert metrics.unit("generated_tokens_per_s") == "tokens/s"
    # the more tokens each step runs over, the more FLOPs a call counts (the kind's exact formula)
    assert by_len[8]["metrics"]["flops"] > by_len[4]["metrics"]["flops"]

    # results.load's flat columns, the study's table and figure, as for the built-in studies
    df = results.load(run.records_path)
    assert {"prompt_len", "generated_tokens_per_s", "kind"} <= set(df.columns)
    assert list(run.table()["status"]) == ["ok", "ok", "unsupported"]
    assert set(run.figures(save=False)) == {"inference_rate"}

    again = run_study(registered.NAME, "cpu", profile=None, output_dir=tmp_path, progress=False,
                      prompt_lens=[4, 8, 254])
    assert again.reused == 3  # resumed by each point's key: nothing measured twice


def test_the_kind_gives_the_worker_its_point_and_the_fork_server_its_module(registered):
    spec = kinds.spec(registered.KIND)
    point = kinds.load_point({"kind": registered.KIND, "system": "cpu", "precision": "fp32", "preset": "gpt2-debug",
                              "batch_size": 1, "prompt_len": 4, "new_tokens": 2})
    assert isinstance(point, registered.GenerationPoint)
    assert spec.preload_for(point)[0] == "inference_points"  # imported by the server before its forks
    longer = point.model_copy(update={"prompt_len": 8})
    assert point.frontier().key == longer.frontier().key and longer.frontier().length == 8


def test_a_kind_no_module_registers_is_one_line():
    with pytest.raises(ParameterError, match="unknown point kind 'nope'"):
        kinds.spec("nope")
    with pytest.raises(ParameterError, match="registers no such kind"):
        kinds.spec("accel_kit.metrics:Metric")


def test_a_new_kind_needs_nothing_of_the_adapters():
    """The adapter's one hook asks a kind's method where the adapter has one, else answers None; a vendor's
    programming model answers a method only the eager model has (a new kind's), as eager does."""
    from types import SimpleNamespace

    from accel_kit.devices import BaseAdapter, ProgrammingModel, get_adapter

    class NoGeneration(BaseAdapter):
        def unsupported_offline_generation(self, point):
            return "this device does not generate"

    assert BaseAdapter().unsupported("offline_generation", None) is None
    assert NoGeneration().unsupported("offline_generation", None) == "this device does not generate"
    assert NoGeneration().unsupported("inference_points:offline_generation", None) is None  # not a method name
    rdu = get_adapter("sambaflow")
    assert "PEF" in rdu.unsupported("block", None) and rdu.unsupported("block", None) == rdu.unsupported_block(None)

    eager = SimpleNamespace(make_generate_step=lambda point: ("eager", point))

    class Vendor(ProgrammingModel):
        def make_block_step(self, point, module, x, grad_out):
            return "vendor"

    model = Vendor(BaseAdapter(), eager)
    assert model.make_generate_step("p") == ("eager", "p")
    assert model.make_block_step(None, None, None, None) == "vendor"
    with pytest.raises(AttributeError):
        model.make_nothing  # noqa: B018  (neither has it)
