import json
from pathlib import Path

import pytest
import torch

from accel_kit import results, studies
from accel_kit.studies import microbenchmark

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(hidden_size=64, n_heads=4, seq_len=16, batch_sizes=[1, 2], precisions=["fp32", "bf16"],
            impls=["native"], warmup=1, trials=2)


def _run(**overrides):
    return studies.run_study("microbenchmark", "cpu", "quick", progress=False, **(TINY | overrides))


def test_records_are_complete_and_auditable(out_dir):
    run = _run(measure_peak=True)
    df = run.df()
    assert len(df) == 2 * 2 * 2 and set(df["status"]) == {"ok"}
    assert set(df["direction"]) == {"forward", "forward_backward"}
    # tflops is auditable from the record itself
    assert (df["tflops"] - df["flops"] / df["time_median_s"] / 1e12).abs().max() < 1e-9
    # CPU has no datasheet peak: no datasheet MFU, and the reason is recorded
    assert df["mfu_pct"].isna().all() and df["mfu_reason"].str.contains("no datasheet peak").all()
    assert (df["mfu_measured_pct"] > 0).all() and (df["mfu_measured_pct"] <= 100).all()
    assert (df["mem_peak_gib"] > 0).all()
    rec = run.records[0]
    assert len(rec["times_s"]) == 2 and len(rec["warmup_times_s"]) == 1
    assert rec["params"]["seq_len"] == 16 and rec["params"]["profile"] == "quick"
    assert rec["env"]["device"]["adapter"] == "cpu" and "git" in rec["env"]
    fwd = df[(df.direction == "forward") & (df.batch_size == 2) & (df.precision == "fp32")].iloc[0]
    assert fwd["flops"] == 24 * 2 * 16 * 64**2 + 4 * 2 * 16**2 * 64


def test_fp32_means_fp32(out_dir):
    run = _run(precisions=["fp32"], batch_sizes=[1], directions=["forward"], measure_peak=False)
    assert run.records[0]["env"]["math_mode"]["fp32_matmul_precision"] == "highest"
    assert run.records[0]["params"]["tf32"] is False


def test_failures_are_isolated(out_dir, monkeypatch):
    real = microbenchmark.build_block

    def flaky(impl, cfg, seq_len):
        if flaky.calls == 1:
            flaky.calls += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if flaky.calls == 2:
            flaky.calls += 1
            raise RuntimeError("kernel exploded")
        flaky.calls += 1
        return real(impl, cfg, seq_len)

    flaky.calls = 0
    monkeypatch.setattr(microbenchmark, "build_block", flaky)
    run = _run(precisions=["fp32"], measure_peak=False)
    statuses = [r["status"] for r in run.records]
    assert statuses == ["ok", "oom", "error", "ok"]
    assert "out of memory" in run.records[1]["reason"]
    assert run.records[2]["reason"] == "RuntimeError: kernel exploded"
    assert run.records[1]["metrics"]["flops"] > 0 and "tflops" not in run.records[1]["metrics"]


def test_mfu_above_100_fails_loudly(out_dir, monkeypatch):
    from accel_kit import peaks

    monkeypatch.setattr(peaks, "measure_matmul_peak",
                        lambda adapter, precision: peaks.MeasuredPeak(precision, 1e-9, 64, {64: 1e-9}, 1))
    run = _run(precisions=["fp32"], batch_sizes=[1], directions=["forward"])
    assert run.records[0]["status"] == "error" and "exceeds 100" in run.records[0]["reason"]


def test_table_and_figures_cover_several_systems(out_dir):
    run = _run(measure_peak=False, precisions=["bf16"], batch_sizes=[2])
    # a second system's records in the same folder get their own bars
    other = [dict(r, system="mi250", record_id=r["record_id"] + "x") for r in run.records]
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

    nb_params = {"system": "cpu", "profile": "quick", **{k: v for k, v in TINY.items()}, "measure_peak": False}
    papermill.execute_notebook(str(ROOT / "notebooks" / "microbenchmark.ipynb"), str(out_dir / "out.ipynb"),
                               parameters=nb_params, cwd=str(ROOT / "notebooks"), kernel_name="python3",
                               progress_bar=False)
    argv = ["run", "microbenchmark", "--system", "cpu", "--profile", "quick", "-q", "-p", "measure_peak", "false"]
    for key, value in TINY.items():
        argv += ["-p", key, str(value).replace("'", "")]
    assert cli.main(argv) == 0
    by_run: dict[str, set[str]] = {}
    for rec in results.iter_records(out_dir / "microbenchmark"):
        assert rec["status"] == "ok"
        by_run.setdefault(rec["run_id"], set()).add(json.dumps(rec["params"], sort_keys=True))
    assert len(by_run) == 2
    notebook_points, cli_points = by_run.values()
    assert notebook_points == cli_points and len(notebook_points) == 8  # identical resolved parameters

    # The executed notebook carries each figure as HTML too (HTML export, viewers without plotly's
    # JupyterLab extension), with plotly.js embedded once before them, so it draws offline.
    import nbformat

    outputs = [o for c in nbformat.read(out_dir / "out.ipynb", as_version=4).cells for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 2 and all("plotly-graph-div" in o.data.get("text/html", "") for o in figures)
    first = outputs.index(figures[0])
    assert sum("window.Plotly = Plotly" in o.get("data", {}).get("text/html", "") for o in outputs[:first]) == 1
