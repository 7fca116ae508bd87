"""One identity of a point (``results.point_key_of``): two presets, or two sequence lengths, in one folder are
separate rows of every table (the study's, the readable one, the report's) and separate lines or bar groups of
every figure; a spread widens only over runs of the same key; a busy machine is said where it was.

Records are made with ``results.make_record`` (the real schema), stored with ``params.point_key`` as the sweep
stores it, so these take milliseconds.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from accel_kit import noise, results, tables
from accel_kit.studies import gas, microbenchmark

NOISY = [1.0, 1.3, 0.75, 1.0, 1.25]
STEADY = [1.0, 1.01, 0.99, 1.0, 1.02]


def _key(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def _gas(tokens_per_s: float, *, gas_steps: int, seq_len: int, times=STEADY, run_id="r1", timestamp=None,
         metrics=None) -> results.Record:
    p = dict(kind="train", preset="gpt2-debug", precision="fp32", devices=1, micro_batch_size=1, gas=gas_steps,
             seq_len=seq_len, engine="ddp", tp=1, pp=1, cp=1, steps=2, profile="smoke")
    p["point_key"] = _key({k: v for k, v in p.items() if k != "profile"})
    rec = results.make_record(study="gas", system="cpu", status="ok", run_id=run_id, params=p, times_s=list(times),
                              metrics=dict(tokens_per_s=tokens_per_s, samples_per_s=tokens_per_s / seq_len,
                                           global_batch_size=gas_steps, trials=len(times)) | (metrics or {}))
    return dataclasses.replace(rec, timestamp=timestamp) if timestamp else rec


def _block(tflops: float, *, preset: str, batch_size: int, direction: str, run_id="r1") -> results.Record:
    p = dict(kind="block", impl="native", precision="fp32", batch_size=batch_size, direction=direction, seq_len=32,
             preset=preset, warmup=1, trials=5)
    p["point_key"] = _key(p)
    return results.make_record(study="microbenchmark", system="cpu", status="ok", run_id=run_id, params=p,
                               times_s=NOISY, metrics=dict(tflops=tflops, trials=5))


def _two_presets() -> list[results.Record]:
    return [_block(1.0 + b + (10 if preset == "llama3-debug" else 0), preset=preset, batch_size=b, direction=d,
                   run_id=preset)
            for preset in ("gpt2-debug", "llama3-debug") for b in (1, 2) for d in ("forward", "forward_backward")]


def _two_lengths() -> list[results.Record]:
    return [_gas(1000.0 * g * (2 if s == 64 else 1), gas_steps=g, seq_len=s, run_id=f"s{s}")
            for s in (32, 64) for g in (1, 2)]


def test_an_old_record_keeps_a_key_of_its_own_and_load_always_fills_the_column(tmp_path):
    new = _gas(1.0, gas_steps=1, seq_len=32)
    old = results.make_record(study="gas", system="cpu", status="ok", run_id="r0", params=dict(gas=2, seq_len=32),
                              metrics={})
    assert results.point_key_of(new) == new.params["point_key"]
    def read(rec):  # as a records file gives it back
        return results.Record.from_dict(json.loads(json.dumps(rec.to_dict())))

    assert results.point_key_of(read(old)) == results.point_key_of(read(read(old)))  # the same every read
    for rec in (new, old):
        results.append_record(tmp_path / "gas" / "cpu.jsonl", rec)
    df = results.load(tmp_path)
    assert df["point_key"].notna().all() and df["point_key"].nunique() == 2


def test_two_presets_in_one_folder_are_eight_rows_and_their_spreads_stay_apart():
    df = results.frame(_two_presets())
    t = microbenchmark.table(df)
    assert len(t) == 8 and sorted(set(t["preset"])) == ["gpt2-debug", "llama3-debug"]
    r = tables.readable(t, df)
    assert len(r.frame) == 8 and "preset" in r.frame.columns
    assert "runs of a point" not in r.footnote  # each point ran once: nothing widened across the two models
    spread = noise.with_spread(df)
    assert (spread["runs"] == 1).all() and len(spread) == 8


def test_two_presets_are_two_bar_groups_in_the_microbenchmark_figure():
    fig = microbenchmark.figures(results.frame(_two_presets()))["microbenchmark_forward"]
    names = {tr.name for tr in fig.data}
    assert any("gpt2-debug" in n for n in names) and any("llama3-debug" in n for n in names), names
    assert "interquartile range" in fig.layout.title.text  # the error bars say what they are


def test_two_sequence_lengths_are_separate_gas_rows_gains_lines_and_findings():
    df = results.frame(_two_lengths())
    t = gas.table(df)
    assert len(t) == 4 and list(t["gain_vs_smallest_gas"]) == [1.0, 2.0, 1.0, 2.0]
    r = tables.readable(t, df)
    assert len(r.frame) == 4 and list(r.frame["sequence (tokens)"]) == ["32", "32", "64", "64"]
    fig = gas.figures(df)["gas_tokens_per_s"]
    assert len([tr for tr in fig.data if "lines" in (tr.mode or "")]) == 2
    texts = [f["text"] for f in gas.findings(df)]
    assert len(texts) == 2 and "sequence 32" in texts[0] and "sequence 64" in texts[1], texts
    assert all("2.00x (95 % CI" in text for text in texts), texts


def test_a_rerun_widens_only_its_own_points_spread():
    earlier = _gas(900.0, gas_steps=1, seq_len=32, run_id="r0", timestamp="2020-01-01T00:00:00+00:00")
    spread = noise.with_spread(results.frame(_two_lengths() + [earlier])).set_index(["seq_len", "gas"])
    assert spread.loc[(32, 1), "runs"] == 2 and spread.loc[(32, 1), "tokens_per_s_lo"] == 900.0
    assert (spread.drop(index=(32, 1))["runs"] == 1).all()
    assert len(spread.loc[(32, 1), "tokens_per_s_samples"]) == 10  # every trial of both runs


def test_two_sequence_lengths_are_separate_rows_of_the_reports_figure_6_table():
    from accel_kit.report import figures
    from accel_kit.report.context import Context
    recs = _two_lengths()
    ctx = Context(collect_from(recs))
    (table,) = figures.figure_6_gas(ctx).tables
    assert "seq len" in table.row_headers
    tokens = [(key, cells) for key, cells in table.rows if key[-1] == "tokens/s"]
    assert len(tokens) == 4 and len({key[:-1] for key, _ in tokens}) == 4
    spreads = [cells[0] for key, cells in table.rows if key[-1] == "tokens/s spread"]
    assert len(spreads) == 4 and all(c.measured for c in spreads)  # the notebook's spread, in the report too


def collect_from(recs: list[results.Record]):
    from accel_kit.report.records import RecordSet

    return RecordSet(recs, [])


def test_a_busy_point_is_marked_in_its_row_and_in_its_finding():
    busy = dict(machine_busy=True, load_others_cpu_pct=37.2)
    recs = [_gas(1000.0, gas_steps=1, seq_len=32, metrics=dict(machine_busy=False, load_others_cpu_pct=1.0)),
            _gas(2000.0, gas_steps=2, seq_len=32, metrics=busy)]
    df = results.frame(recs)
    r = tables.readable(gas.table(df), df)
    assert list(r.frame[tables.BUSY_HEADER]) == ["", "busy (37 %)"]
    assert tables.BUSY_NOTE in r.footnote
    (finding,) = gas.findings(df)
    assert noise.BUSY_NOTE in finding["text"], finding["text"]
    # Records from before the reading: nothing shown.
    quiet = results.frame(_two_lengths())
    r = tables.readable(gas.table(quiet), quiet)
    assert tables.BUSY_HEADER not in r.frame.columns and "busy" not in r.footnote
    assert not any(noise.BUSY_NOTE in f["text"] for f in gas.findings(quiet))


def test_a_reason_shared_by_many_cells_is_one_whole_note_under_the_report_table():
    from accel_kit.report import figures
    from accel_kit.report.context import Context
    from accel_kit.report.render import Citations

    why = ("no energy reading: RAPL is not readable on this machine: a virtual machine, a container without it, "
           "or a CPU without RAPL")
    recs = _two_lengths()
    for rec in recs:
        rec.metrics.update(tokens_per_j=None, energy_reason=why)
    ctx = Context(collect_from(recs))
    (table,) = figures.figure_6_gas(ctx).tables
    page = table.html(Citations(ctx.records.by_id))
    assert page.count(why) - page.count(f'title="not measured: {why}') == 1  # said once, whole, under the table
    assert 'class="table-notes"' in page


def test_the_report_marks_a_busy_point_and_says_what_the_mark_means():
    from accel_kit.report import figures
    from accel_kit.report.cells import BUSY_MARK, BUSY_NOTE
    from accel_kit.report.context import Context

    recs = _two_lengths()
    recs[1].metrics.update(machine_busy=True, load_others_cpu_pct=40.0)
    (table,) = figures.figure_6_gas(Context(collect_from(recs))).tables
    marked = [cells[0].text for key, cells in table.rows if key[-1] == "tokens/s" and BUSY_MARK in cells[0].text]
    assert len(marked) == 1 and BUSY_NOTE.split(":")[0] in table.caption
    (quiet,) = figures.figure_6_gas(Context(collect_from(_two_lengths()))).tables
    assert BUSY_MARK not in quiet.caption
