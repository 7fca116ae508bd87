"""What a reader sees of the noise: tables for people, error bars, findings that say "within noise", re-runs.

Records are made with ``results.make_record`` (the real schema: per-trial ``times_s``, the metrics),
not by running studies, so these take milliseconds.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from accel_kit import noise, results, studies, tables
from accel_kit.devices.types import PrecisionChoice
from accel_kit.studies import gas, microbenchmark, scaling, seq_length

STEADY = [1.0, 1.0, 1.0, 1.0, 1.0]
NOISY = [1.0, 1.3, 0.75, 1.0, 1.25]  # IQR of the rate: about 20 % of it


def _train(study: str, tokens_per_s: float, times=STEADY, *, run_id="r1", timestamp=None, **params) -> results.Record:
    p = dict(preset="gpt2-small", precision="bf16", precision_requested="auto",
             precision_reason="auto: bf16 (2.2x faster than fp32 here)", devices=1, micro_batch_size=4, gas=1,
             seq_len=1024) | params
    rec = results.make_record(
        study=study, system="cpu", status="ok", run_id=run_id, params=p, times_s=list(times),
        metrics=dict(tokens_per_s=tokens_per_s, samples_per_s=tokens_per_s / p["seq_len"],
                     tokens_per_s_per_device=tokens_per_s, global_batch_size=p["micro_batch_size"] * p["gas"],
                     mfu_measured_pct=12.3456, mem_peak_gib=1.23456, time_cv=0.2, noisy=True, trials=len(times)))
    return dataclasses.replace(rec, timestamp=timestamp) if timestamp else rec


def _gas_records(top=4400.0, times=STEADY):
    return [_train("gas", 3900.123456, NOISY, gas=1), _train("gas", 3968.2, NOISY, gas=2),
            _train("gas", top, times, gas=4)]


def test_gas_table_has_the_paper_columns_rounded_with_a_spread_beside_each_throughput():
    df = results.frame(_gas_records())
    t = tables.readable(gas.table(df), df)
    cols = list(t.frame.columns)
    assert cols == ["GAS", "global batch", "tokens/s", "tokens/s spread", "samples/s", "samples/s spread",
                    "MFU measured (%)", "gain over smallest GAS (x)"]
    # What every row shares is said once; no ids, no column that is empty on every row (reason).
    assert t.shared["precision"] == "bf16" and t.shared["micro-batch"] == "4"
    assert not any("record" in c or "reason" in c for c in cols)
    # 3900.12 with a spread of 780 (the trial rates' IQR, 3120 to 3900): hundreds; the steady point: three digits.
    row = t.frame.iloc[0]
    assert row["tokens/s"] == "3,900" and row["tokens/s spread"] == "800", row.to_dict()
    assert t.frame.iloc[2]["tokens/s"] == "4,400" and t.frame.iloc[2]["MFU measured (%)"] == "12.3"
    assert tables.width_px(t) <= 1400
    assert "interquartile range" in t.footnote and "record_id" in t.footnote


def test_a_gas_table_whose_points_all_failed_has_rows_and_no_gain():
    failed = [results.make_record(study="gas", system="cpu", status="error", run_id="r1", reason="timeout",
                                  params=dict(preset="gpt2-debug", precision="bf16", devices=1, micro_batch_size=1,
                                              gas=g, seq_len=32), metrics={}) for g in (1, 2)]
    df = results.frame(failed)
    t = gas.table(df)  # (it once raised KeyError: no tokens_per_s column at all)
    assert list(t["status"]) == ["error", "error"] and t["gain_vs_smallest_gas"].isna().all()
    assert len(tables.readable(t, df).frame) == 2


def test_the_runs_of_a_point_widen_its_spread():
    earlier = _train("gas", 3700.0, STEADY, gas=4, run_id="r0", timestamp="2020-01-01T00:00:00+00:00")
    df = results.frame(_gas_records(top=4000.0) + [earlier])
    row = noise.with_spread(df).set_index("gas").loc[4]
    assert row["runs"] == 2 and row["tokens_per_s"] == 4000.0  # the latest run is the value shown
    assert (row["tokens_per_s_lo"], row["tokens_per_s_hi"]) == (3700.0, 4000.0)


def _error_bars(fig) -> list:
    """The error bars of every measured trace (a marker trace of points that did not run has none to show)."""
    return [None if tr.error_y.array is None else tuple(tr.error_y.array) + tuple(tr.error_y.arrayminus)
            for tr in fig.data if tr.type == "bar" or "lines" in (tr.mode or "")]


@pytest.mark.parametrize("study, records, x, ticks", [
    (gas, [_train("gas", 100.0 * g, NOISY, gas=g) for g in (1, 2, 4)], "gas", (1, 2, 4)),
    (scaling, [_train("scaling", 100.0 * d, NOISY, devices=d) for d in (1, 2, 4, 8)], "devices", (1, 2, 4, 8)),
    (seq_length, [_train("seq_length", 100.0, NOISY, seq_len=s) for s in (256, 1024, 4096)], "seq_len",
     (256, 1024, 4096)),
])
def test_every_throughput_figure_has_error_bars_swept_ticks_and_the_precision(study, records, x, ticks):
    figs = study.figures(results.frame(records))
    rate_figs = {k: f for k, f in figs.items() if "memory" not in k and "energy" not in k}
    assert rate_figs
    for name, fig in rate_figs.items():
        bars = _error_bars(fig)
        assert bars and all(b is not None and max(b) > 0 for b in bars), name
        assert tuple(fig.layout.xaxis.tickvals) == ticks, name
        assert "bf16" in fig.layout.title.text, name


def test_microbenchmark_bars_have_error_bars():
    recs = [results.make_record(study="microbenchmark", system="cpu", status="ok", run_id="r1", times_s=NOISY,
                                params=dict(impl="native", precision="fp32", batch_size=b, direction="forward",
                                            seq_len=64, preset="gpt2-debug"),
                                metrics=dict(tflops=1.0 + b, trials=5)) for b in (1, 2)]
    fig = microbenchmark.figures(results.frame(recs))["microbenchmark_forward"]
    assert all(b is not None and max(b) > 0 for b in _error_bars(fig))


def test_a_difference_inside_the_noise_is_said_to_be_within_noise():
    # GAS 2 is 1.02x GAS 1, both with a spread near 20 %: not a gain.
    texts = [f["text"] for f in gas.findings(results.frame(_gas_records(top=4420.0, times=NOISY)))]
    assert "GAS 2 against GAS 1: within noise (1.02x; 95 % CI 0.76-1.36 includes 1)" in texts[0], texts[0]
    # 1.13x, but the interval of the ratio of medians takes in 1: within noise too, never "gives 1.13x".
    assert "GAS 4 against GAS 1: within noise (1.13x; 95 % CI" in texts[1] and "gives" not in texts[1], texts[1]


def test_a_difference_whose_interval_excludes_1_is_called_one():
    recs = [_train("gas", 1000.0, [1.0, 1.02, 0.98, 1.0, 1.01], gas=1),
            _train("gas", 1500.0, [1.0, 1.02, 0.98, 1.0, 1.01], gas=4)]
    (finding,) = gas.findings(results.frame(recs))
    assert "GAS 4 gives 1.50x (95 % CI 1.47-1.53) the tokens/s of GAS 1" in finding["text"], finding["text"]
    # One trial, one run: the noise is unknown, so no difference is called either.
    one = [_train("gas", 1000.0, [1.0], gas=1), _train("gas", 1500.0, [1.0], gas=4)]
    text = gas.findings(results.frame(one))[0]["text"]
    assert "not called a difference: its confidence interval cannot be computed (one trial and one run)" in text


def test_a_drop_beyond_its_interval_is_called_one_though_the_spreads_overlap():
    # The notebook's case: GAS 2 at 0.63x GAS 1, each point's IQR wide (about 13 % and 23 %), but the
    # medians of five trials apart: the interval printed is the one the verdict rests on.
    recs = [_train("gas", 1000.0, [1.0, 1.15, 0.9, 1.05, 0.95], gas=1),
            _train("gas", 630.0, [1.0, 1.3, 0.8, 1.1, 0.9], gas=2)]
    (finding,) = gas.findings(results.frame(recs))
    ci = noise.compare(*(noise.Measured.of(r, "tokens_per_s") for _, r in
                         noise.with_spread(results.frame(recs)).sort_values("gas", ascending=False).iterrows()))
    assert ci.real and ci.ci[1] < 1, ci
    assert f"GAS 2 gives 0.63x ({ci.ci_text}) the tokens/s of GAS 1" in finding["text"], finding["text"]


def test_the_interval_is_seeded_and_independent_of_the_record_order():
    a, b = [1.0, 1.2, 0.9, 1.1, 1.05], [0.7, 0.8, 0.75, 0.9, 0.72]
    assert noise.ratio_ci(a, b) == noise.ratio_ci(list(reversed(a)), b) == noise.ratio_ci(a, b)
    assert noise.ratio_ci([1.0], b) is None


def test_rounding_follows_the_spread():
    assert noise.fmt(3221.319133, noise.decimals(250.0)) == "3,200"
    assert noise.fmt(25.166556, noise.decimals(0.13)) == "25.17"
    assert noise.fmt(25.166556, noise.decimals(float("nan"), 25.166556)) == "25.2"


def _train_point(**changes):
    from accel_kit.studies.training import make_point
    from accel_kit.systems import load_system

    params = studies.resolve("gas", "smoke", precision="fp32")
    choice = PrecisionChoice(requested="fp32", precision="fp32", reason="asked")
    return make_point(params, load_system("cpu"), choice, micro_batch_size=1, gas=1, **changes)


def test_a_run_that_measured_nothing_says_so_and_rerun_measures_again(tmp_path, monkeypatch):
    from accel_kit.engine import sweep
    from accel_kit.engine.result import Result

    calls = []
    monkeypatch.setattr(sweep, "run_worker", lambda point, **kw: calls.append(point) or
                        Result(status="ok", metrics={"tokens_per_s": 10.0}, times_s=[1.0, 1.1]))
    path = tmp_path / "gas" / "cpu.jsonl"
    point = _train_point()
    first = sweep.run_sweep("gas", [point], records_path=path, run_id="r1", extra_params={}, timeout_s=5,
                            progress=False)
    again = studies.StudyRun("gas", "cpu", "r2", path.parent,
                             sweep.run_sweep("gas", [point], records_path=path, run_id="r2", extra_params={},
                                             timeout_s=5, progress=False))
    assert len(calls) == 1  # resumed: the recorded point is not measured again
    line = again.reuse_line()
    assert line.startswith("Nothing was measured now: all 1 points were recorded before (")
    assert first[0].timestamp[:10] in line and "rerun = True" in line and "-p rerun true" in line
    assert "accel-kit run gas --system cpu --profile quick --rerun" in line
    fresh = studies.StudyRun("gas", "cpu", "r3", path.parent,
                             sweep.run_sweep("gas", [point], records_path=path, run_id="r3", extra_params={},
                                             timeout_s=5, progress=False, rerun=True))
    assert len(calls) == 2 and fresh.reuse_line() is None
    assert len(list(results.iter_records(path))) == 2  # both runs kept: their range is the point's spread


def test_the_progress_label_is_in_words():
    label = _train_point().label()
    assert "n=" not in label and "mb=" not in label
    assert "1 device, micro-batch 1, GAS 1, sequence 32" in label


def test_the_precision_and_why_read_as_one_short_statement():
    params = dict(precision="fp32", precision_requested="auto",
                  precision_reason="auto: fp32 (bf16 skipped: bf16 53x slower than fp32 on this CPU)")
    assert results.precision_text(params) == "fp32, asked auto. Why: bf16 skipped: bf16 53x slower than fp32 on this CPU"
    assert results.precision_text(dict(precision="bf16", precision_requested="bf16")) == "bf16 (no reason recorded)"


@pytest.mark.parametrize("study, records", [
    ("scaling", [_train("scaling", 100.0 * d, NOISY, devices=d) for d in (1, 2, 4, 8)]),
    ("seq_length", [_train("seq_length", 100.0, NOISY, seq_len=s) for s in (256, 1024, 4096)]),
    ("genslm", [_train("genslm", 100.0, NOISY, seq_len=s, preset="genslm-25m", vocab_size=71) for s in (512, 1024)]),
    ("microbenchmark", [results.make_record(
        study="microbenchmark", system="cpu", status="ok", run_id="r1", times_s=NOISY,
        params=dict(impl="native", precision="fp32", batch_size=b, direction="forward", seq_len=64),
        metrics=dict(tflops=1.0 + b, trials=5, time_cv=0.2, noisy=True)) for b in (1, 2)]),
])
def test_every_study_table_fits_the_page_with_a_spread_beside_its_throughput(study, records):
    module = studies.study_module(study)
    df = results.frame(records)
    t = tables.readable(module.table(df), df)
    cols = list(t.frame.columns)
    rates = [c for c in cols if c in ("tokens/s", "TFLOP/s", "samples/s (mean step)")]
    assert rates and all(cols[cols.index(r) + 1] == f"{r} spread" for r in rates), cols
    assert "record_id" not in cols and "time_cv" not in cols and tables.width_px(t) <= 1400, cols


def test_the_report_findings_call_no_difference_inside_the_noise():
    from accel_kit.report import findings
    from accel_kit.report.context import Context
    from accel_kit.report.records import RecordSet

    recs = [_train("gas", 1000.0, NOISY, gas=1), _train("gas", 1100.0, NOISY, gas=4)]
    twin = [dataclasses.replace(r, record_id=r.record_id[::-1], system="cpu-twin",
                                metrics=dict(r.metrics, tokens_per_s=r.metrics["tokens_per_s"] * 1.05)) for r in recs]
    ctx = Context(RecordSet(recs + twin, []))
    (fastest,) = findings.fastest(ctx)
    assert "no system is faster beyond the noise at any of the 2 points" in fastest and "within noise (1.05x" in fastest
    gains = findings.gas_gain(ctx)
    assert len(gains) == 2 and all("GAS 4 against GAS 1: within noise (1.10x" in g for g in gains), gains


def _sparse(tokens_per_s: float, s: float, times=NOISY, *, run_id="r1", timestamp=None, tokens_per_j=None) -> results.Record:
    """A sparsity record that is both a throughput and a loss-curve run (30 steps, the same batches)."""
    p = dict(sparsity=s, sparsity_pattern="unstructured", steps=30, warmup_steps=10, loss_steps=30,
             loss_warmup_steps=10, sparse_kernels="dense", dense_finetune_steps=0, data=None, presets=["gpt2-small"])
    rec = _train("sparsity", tokens_per_s, times, run_id=run_id, timestamp=timestamp, **p)
    # Loss falls 0.01 a step, the sparse run's by (1 + s/50), with a batch-to-batch wobble the dense run lacks.
    rec.metrics.update(losses=[(3.0 - 0.01 * i) * (1 + s / 50) + 0.01 * (i * 7 % 3) * (s > 0) for i in range(30)],
                       flops_dense_equivalent=1.0, flops_effective=1.0 - s, tokens_per_j=tokens_per_j)
    return rec


def test_sparsity_figures_have_error_bars_from_both_points_and_say_what_they_are():
    from accel_kit.studies import sparsity

    figs = sparsity.figures(results.frame([_sparse(1000.0, 0.0), _sparse(1100.0, 0.5), _sparse(1300.0, 0.9)]))
    speed, gap = figs["sparsity_throughput"], figs["sparsity_loss_gap"]
    (bars,) = [tr for tr in speed.data if tr.type == "bar"]
    up, down = bars.error_y.array, bars.error_y.arrayminus
    # Dense against itself is exactly 1 (no bar); s=0.5: 1.1x, each point's band about 20 % wide, so the
    # ratio's range runs from the sparse low end over the dense high end to the high end over the low end.
    assert up[0] == down[0] == 0 and min(up[1:]) > 0.15 and min(down[1:]) > 0.15, (up, down)
    assert "both points' spreads" in speed.layout.title.text
    assert all(b is not None and max(b) > 0 for b in _error_bars(gap)), _error_bars(gap)
    assert "no trial spread applies" in gap.layout.title.text
    t = sparsity.table(results.frame([_sparse(1000.0, 0.0), _sparse(1100.0, 0.5)]))
    lo, hi = t.iloc[1][["speedup_vs_dense_lo", "speedup_vs_dense_hi"]]
    assert lo < 1.1 < hi and noise.ratio_band(1.0, 2.0, 4.0, 8.0) == (0.125, 0.5)


def test_sparsity_energy_bars_show_the_runs_range_and_one_reading_says_so():
    from accel_kit.studies import sparsity

    once = [_sparse(1000.0, 0.0, tokens_per_j=50.0), _sparse(1100.0, 0.5, tokens_per_j=55.0)]
    fig = sparsity.figures(results.frame(once))["sparsity_energy"]
    assert "one energy reading covers all of a point's trials" in fig.layout.title.text
    assert all(tr.error_y.array is None for tr in fig.data if tr.type == "bar")  # no trial spread of tokens/J
    again = [_sparse(1000.0, 0.0, run_id="r0", timestamp="2020-01-01T00:00:00+00:00", tokens_per_j=46.0),
             _sparse(1100.0, 0.5, run_id="r0", timestamp="2020-01-01T00:00:00+00:00", tokens_per_j=57.0)]
    fig = sparsity.figures(results.frame(once + again))["sparsity_energy"]
    assert all(b is not None and max(b) > 0 for b in _error_bars(fig)), _error_bars(fig)


def _scaling_context(top: float, times=NOISY):
    from accel_kit.report.context import Context
    from accel_kit.report.records import RecordSet

    recs = [_train("scaling", 1000.0, times, devices=1), _train("scaling", top, times, devices=8)]
    return Context(RecordSet(recs, []))


def test_the_scaling_efficiency_finding_calls_a_shortfall_from_ideal_only_beyond_the_noise():
    from accel_kit.report import findings

    # 7,200 tokens/s on 8 devices against the ideal 8,000, both about 20 % wide: within noise.
    (near,) = findings.scaling_efficiency(_scaling_context(7200.0))
    assert "at 8 devices, against ideal scaling: within noise (0.90x; 95 % CI" in near and "includes 1)" in near, near
    assert "below ideal" not in near and "against the ideal 8.00×" in near
    # 4,000 on 8 devices: half the ideal, well beyond both spreads.
    (far,) = findings.scaling_efficiency(_scaling_context(4000.0))
    assert "at 8 devices, below ideal scaling beyond the noise: 0.50x (95 % CI" in far and "(efficiency 50.0 %" in far, far
    # One trial and one run: the noise is unknown, so no shortfall is called.
    (one,) = findings.scaling_efficiency(_scaling_context(7600.0, times=[1.0]))
    assert "not called a difference" in one, one


@pytest.mark.parametrize("section, rates", [
    ("table_ii_scaling", ["tokens/s", "tokens/s per device"]),
    ("table_iii_seq_length", ["tokens/s"]),
    ("table_iv_genslm", ["samples/s", "tokens/s"]),
])
def test_the_reports_tables_have_a_spread_below_each_throughput_and_fit_the_page(section, rates):
    from accel_kit.report import tables as report_tables
    from accel_kit.report.context import Context
    from accel_kit.report.records import RecordSet

    recs = ([_train("scaling", 1000.0 * d, NOISY, devices=d) for d in (1, 2, 4, 8)]
            + [_train("seq_length", 3221.319133, NOISY, seq_len=s) for s in (256, 1024, 4096)]
            + [_train("genslm", 100.0, NOISY, seq_len=s, preset="genslm-25m", vocab_size=71) for s in (512, 1024)])
    for r in recs:
        r.metrics["samples_per_s_mean"] = r.metrics["samples_per_s"]
    # A second system, steady and measured once: its spread cells say the noise was not measured.
    twin = [dataclasses.replace(r, record_id=r.record_id[::-1], system="cpu-twin", times_s=[1.0]) for r in recs]
    ctx = Context(RecordSet(recs + twin, []))
    (table,) = getattr(report_tables, section)(ctx).tables
    names = [key[-1] for key, _ in table.rows]
    for r in rates:
        assert all(names[i + 1] == f"{r} spread" for i, n in enumerate(names) if n == r), names
    first = {key[-1]: cells for key, cells in table.rows if key[-1] in (rates[0], f"{rates[0]} spread")}
    value, spread = first[rates[0]][0], first[f"{rates[0]} spread"][0]
    places = noise.decimals(spread.value)
    assert spread.measured and value.text == noise.fmt(value.value, places), (value, spread)
    assert first[f"{rates[0]} spread"][1].text == "not measured"  # the twin: one trial, one run
    assert tables.width_px(report_tables.text_frame(table)) <= 1400, report_tables.text_frame(table)


@pytest.mark.parametrize("profile, overrides, output_dir", [
    ("smoke", {}, None),
    ("quick", {"micro_batch_sizes": [1, 2], "precision": "bf16", "data": "my corpus"}, "/tmp/my outputs"),
    (None, {"gas_values": [4], "vocab_size": None}, None),
])
def test_the_rerun_hint_is_a_command_the_cli_parses_as_the_same_run(profile, overrides, output_dir):
    import shlex

    from accel_kit import cli

    run = studies.StudyRun("gas", "cerebras-cpu", "r1", Path("/nowhere/gas"), [], profile=profile,
                           overrides=overrides, output_dir=output_dir)
    hint = run.rerun_how()
    command = hint[hint.index("accel-kit run"):].rstrip(")")
    words = shlex.split(command)
    assert words[:2] == ["accel-kit", "run"]
    args = cli.build_parser().parse_args(words[1:])
    assert (args.study, args.system, args.rerun) == ("gas", "cerebras-cpu", True)
    assert args.profile == (profile or "quick") and args.output_dir == output_dir
    # -p values are YAML text: each reads back as the value the run had; a None (the profile's) is left out.
    given = {name: yaml.safe_load(value) for name, value in args.param or []}
    assert given == {k: v for k, v in overrides.items() if v is not None}
