import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from sweep_checks import kill_and_resume

from accel_kit import peaks, results, studies
from accel_kit.engine import sweep

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(preset="gpt2-debug", seq_len=16, batch_sizes=[1, 2], precisions=["fp32", "bf16"],
            impls=["native"], warmup=1, trials=2, time_budget_s=None)


def _run(**overrides):
    return studies.run_study("microbenchmark", "cpu", "quick", progress=False, **(TINY | overrides))


@pytest.mark.slow
def test_records_are_complete_and_auditable(out_dir):
    run = _run(measure_peak=True)
    df = run.df()
    assert len(df) == 2 * 2 * 2 and set(df["status"]) == {"ok"}
    assert set(df["direction"]) == {"forward", "forward_backward"}
    # tflops is auditable from the record itself
    # The same two float64 divisions redone: within a few ulps of the recorded value.
    recomputed = df["flops"] / df["time_median_s"] / 1e12
    assert ((df["tflops"] - recomputed).abs() <= 4 * sys.float_info.epsilon * recomputed.abs()).all()
    # CPU has no datasheet peak: no datasheet MFU, and the reason is recorded
    assert df["mfu_pct"].isna().all() and df["mfu_reason"].str.contains("no datasheet peak").all()
    assert (df["mfu_measured_pct"] > 0).all() and df["peak_measured_shape"].notna().all()
    assert (df["mem_peak_gib"] > 0).all()
    rec = run.records[0]
    assert len(rec["times_s"]) == 2 and len(rec["warmup_times_s"]) == 1
    assert rec["params"]["seq_len"] == 16 and rec["params"]["profile"] == "quick"
    assert rec["env"]["device"]["adapter"] == "cpu" and "git" in rec["env"]
    # every record says which precision ran and why
    assert all(r["params"]["precision_reason"] for r in run.records)
    fwd = df[(df.direction == "forward") & (df.batch_size == 2) & (df.precision == "fp32")].iloc[0]
    assert fwd["flops"] == 24 * 2 * 16 * 64**2 + 4 * 2 * 16**2 * 64


def test_auto_precisions_run_fp32_and_say_why(out_dir):
    run = _run(precisions="auto", batch_sizes=[1], directions=["forward"], measure_peak=False)
    ran = [r["params"]["precision"] for r in run.records]
    assert ran[0] == "fp32" and set(ran) <= {"fp32", "fp16", "bf16"}
    assert all("GFLOP/s" in r["params"]["precision_reason"] for r in run.records)


def test_fp32_means_fp32(out_dir):
    run = _run(precisions=["fp32"], batch_sizes=[1], directions=["forward"], measure_peak=False)
    assert run.records[0]["env"]["math_mode"]["fp32_matmul_precision"] == "highest"
    assert run.records[0]["params"]["tf32"] is False


def test_point_that_cannot_fit_is_unsupported_before_allocation(out_dir):
    run = _run(seq_len=100_000_000, precisions=["fp32"], batch_sizes=[1], directions=["forward"],
               measure_peak=False)
    rec = run.records[0]
    assert rec["status"] == "unsupported" and rec["reason"].startswith("does not fit") and "GiB" in rec["reason"]
    assert rec["metrics"]["mem_estimate_gib"] > 100


def test_point_over_its_time_budget_is_skipped_with_the_estimate(out_dir):
    run = _run(preset="gpt2-xl", seq_len=256, precisions=["fp32"], batch_sizes=[4],
               directions=["forward_backward"], time_budget_s=0.001, measure_peak=False)
    rec = run.records[0]
    assert rec["status"] == "skipped" and "time budget" in rec["reason"] and "FLOPs" in rec["reason"]
    # nothing to draw: the notebook says why instead of staying blank
    assert run.figures(save=False) == {}
    assert run.nothing_to_draw().startswith("No figure to draw: none of this run's 1 points has status ok: 1 skipped")


def test_noisy_peak_keeps_the_times_and_flags_the_point(out_dir, monkeypatch):
    # A reference measured while the machine was busy: every point beats it.
    unlucky = peaks.MeasuredPeak("fp32", 1e-9, "64", {"64": 1e-9})
    monkeypatch.setattr(sweep.PeakReference, "measure", lambda self, precision: unlucky)
    # (a budget that no estimate at that "peak" exceeds: the point runs)
    run = _run(precisions=["fp32"], batch_sizes=[1], directions=["forward"], time_budget_s=1e30)
    rec = run.records[0]
    assert rec["status"] == "ok" and len(rec["times_s"]) == 2 and rec["metrics"]["tflops"] > 0
    assert rec["metrics"]["mfu_measured_unreliable"] is True and "unlucky" in rec["metrics"]["mfu_measured_reason"]
    assert rec["metrics"]["peak_remeasured"] is True  # it was measured again before the record was written


@pytest.mark.slow
def test_failures_are_isolated_and_keep_their_traceback(out_dir, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, str(ROOT / "tests"))
    from fault_points import FaultPoint

    # The points that end by themselves get a timeout no busy machine reaches; the hang never ends,
    # so only its timeout ends it, and a short one gives the same record however busy the machine.
    run = dict(records_path=out_dir / "faults.jsonl", run_id="r", extra_params={}, progress=False)
    ending = [FaultPoint(system="cpu", precision="fp32", fault=f) for f in ("ok", "oom", "error", "segfault")]
    recs = sweep.run_sweep("faults", ending, timeout_s=600, **run)
    recs += sweep.run_sweep("faults", [FaultPoint(system="cpu", precision="fp32", fault="hang")], timeout_s=3, **run)
    assert [r["status"] for r in recs] == ["ok", "oom", "error", "error", "error"]
    assert "out of memory" in recs[1]["reason"]
    assert recs[2]["reason"] == "RuntimeError: kernel exploded" and "deep_inside" in recs[2]["traceback"]
    assert "worker exited with status -11" in recs[3]["reason"]
    assert "timeout" in recs[4]["reason"]


def test_resume_key_does_not_depend_on_where_outputs_are(out_dir, tmp_path_factory):
    run = _run(precisions=["fp32"], batch_sizes=[1], directions=["forward"], measure_peak=False)
    moved = tmp_path_factory.mktemp("moved")
    (moved / "microbenchmark").mkdir()
    (moved / "microbenchmark" / "cpu.jsonl").write_bytes((out_dir / "microbenchmark" / "cpu.jsonl").read_bytes())
    again = studies.run_study("microbenchmark", "cpu", "quick", progress=False, output_dir=moved,
                              **(TINY | dict(precisions=["fp32"], batch_sizes=[1], directions=["forward"],
                                             measure_peak=False)))
    assert again.reused == 1 and again.records[0]["record_id"] == run.records[0]["record_id"]


@pytest.mark.slow
def test_kill_and_resume(out_dir):
    """SIGKILL the microbenchmark mid-way; the rerun finishes it with nothing lost, duplicated or corrupt."""
    args = [sys.executable, "-m", "accel_kit.cli", "run", "microbenchmark", "--system", "cpu", "-q", "--no-figures",
            "-p", "preset", "gpt2-debug", "-p", "seq_len", "16", "-p", "batch_sizes", "[1, 2, 3]",
            "-p", "precisions", "[fp32]", "-p", "impls", "[native]", "-p", "measure_peak", "false",
            # 60 trials per point, the four left after the kill (batch 2 and 3) the larger ones: the
            # kill after two records lands mid-sweep even though points start in well under a second
            # (the fork server)
            "-p", "trials", "60", "-p", "time_budget_s", "100000"]  # (the quick budget judges by the first, slow iteration)
    kill_and_resume(args, out_dir / "microbenchmark" / "cpu.jsonl", total=6)


def test_table_and_figures_cover_several_systems(out_dir):
    run = _run(measure_peak=False, precisions=["bf16"], batch_sizes=[2])
    # a second system's records in the same folder get their own bars
    other = [dataclasses.replace(r, system="mi250", record_id=r.record_id + "x") for r in run.records]
    for rec in other:
        results.append_record(run.study_dir / "mi250.jsonl", rec)
    figs = run.figures()
    assert set(figs) == {"microbenchmark_forward", "microbenchmark_forward_backward"}
    names = {trace.name for trace in figs["microbenchmark_forward"].data}
    assert names == {"cpu", "mi250"}
    assert (run.study_dir / "figures" / "microbenchmark_forward.html").exists()
    assert len(run.table()) == 2


@pytest.mark.slow
def test_notebook_and_cli_give_the_same_records(out_dir):
    import papermill

    from accel_kit import cli

    tiny = TINY | {"batch_sizes": [1], "time_budget_s": 600}
    nb_params = {"system": "cpu", "profile": "quick", **tiny, "measure_peak": False}
    papermill.execute_notebook(str(ROOT / "notebooks" / "microbenchmark.ipynb"), str(out_dir / "out.ipynb"),
                               parameters=nb_params, cwd=str(ROOT / "notebooks"), kernel_name="python3",
                               progress_bar=False)
    argv = ["run", "microbenchmark", "--system", "cpu", "--profile", "quick", "-q", "-p", "measure_peak", "false",
            "-p", "impls", "[native]"]
    for key, value in tiny.items():
        if key != "impls":
            argv += ["-p", key, str(value).replace("'", "")]
    # the CLI run resumes the notebook's points (same parameters, same keys): none is run twice
    assert cli.main(argv) == 0
    recs = list(results.iter_records(out_dir / "microbenchmark"))
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs)

    # The executed notebook carries each figure as HTML too (HTML export, viewers without plotly's
    # JupyterLab extension), with plotly.js embedded once before them, so it draws offline.
    import nbformat

    outputs = [o for c in nbformat.read(out_dir / "out.ipynb", as_version=4).cells for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 2 and all("plotly-graph-div" in o.data.get("text/html", "") for o in figures)
    first = outputs.index(figures[0])
    assert sum("window.Plotly = Plotly" in o.get("data", {}).get("text/html", "") for o in outputs[:first]) == 1


@pytest.mark.slow
def test_unknown_papermill_parameter_fails_loudly(out_dir):
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="unknown parameter 'batch_size'"):
        papermill.execute_notebook(str(ROOT / "notebooks" / "microbenchmark.ipynb"), str(out_dir / "out.ipynb"),
                                   parameters={"batch_size": 4}, cwd=str(ROOT / "notebooks"), kernel_name="python3",
                                   progress_bar=False)


def test_every_notebook_declares_exactly_its_studys_parameters():
    import ast

    # (the package's studies: a test's own, registered at import by another test file, has no notebook)
    for study in [name for name, module in studies.STUDIES.items() if module.startswith("accel_kit.")]:
        nb = json.loads((ROOT / "notebooks" / f"{study}.ipynb").read_text())
        cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
        names = [t.id for node in ast.parse("".join(cell["source"])).body if isinstance(node, ast.Assign)
                 for t in node.targets]
        expected = list(studies.NOTEBOOK_NAMES) + studies.parameter_names(study)
        assert sorted(names) == sorted(expected), f"notebooks/{study}.ipynb parameters cell differs from its study"
        assert len(names) == len(set(names))


def test_compiled_is_our_layer_under_torch_compile_with_the_same_flops(monkeypatch):
    import torch

    from accel_kit.engine.point import BlockPoint
    from accel_kit.engine.worker import run_point

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: compiled.append(type(module).__name__) or module)
    point = dict(system="cpu", precision="fp32", preset="gpt2-debug", seq_len=16, batch_size=2,
                 direction="forward_backward", warmup=1, trials=2, tf32=False, torch_compile=False, noisy_cv=0.5,
                 seed=0)
    native = run_point(BlockPoint(impl="native", **point), rank=0, world=1, local_rank=0)
    assert compiled == []
    ours = run_point(BlockPoint(impl="compiled", **point), rank=0, world=1, local_rank=0)
    assert compiled == ["Block"]  # our layer, not transformers'
    assert ours["status"] == native["status"] == "ok"
    assert ours["metrics"]["flops"] == native["metrics"]["flops"] == 3 * 2 * 16 * (24 * 64**2 + 4 * 16 * 64)
