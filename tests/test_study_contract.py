"""The study contract (``accel_kit.studies.Study``): every study declares itself once, and a metric the record
carries is shown in the notebook's table, the report's table and its headline by its declaration alone
(docs/engine.md, "Showing a new metric in the report")."""
from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from accel_kit import metrics, results, studies
from accel_kit.engine.kinds import KIND_MODULES
from accel_kit.studies import Headline, Row, Study


def test_every_study_declares_itself_once():
    for module in KIND_MODULES.values():  # every kind's own metrics declared
        importlib.import_module(module)
    ids = []
    for name in [n for n, module in studies.STUDIES.items() if module.startswith("accel_kit.")]:
        declared = studies.get_study(name)
        assert isinstance(declared, Study) and declared.name == name
        for table in declared.report:
            ids.append(table.id)
            for row in table.rows:
                assert row.derived or row.name in metrics.METRICS, (name, table.id, row.name)
        if declared.headline:
            assert declared.headline.metric in metrics.METRICS, name
    assert len(ids) == len(set(ids)), ids  # one element id per report table


def test_a_module_without_its_declaration_is_one_line(monkeypatch):
    monkeypatch.setitem(studies.STUDIES, "no_declaration", "accel_kit.studies.training")
    with pytest.raises(TypeError, match="declares no STUDY"):
        studies.get_study("no_declaration")
    with pytest.raises(ValueError, match="neither points"):
        Study("x", object, lambda df: df, lambda df: {})


NEW = "nonpad_tokens_per_s"  # the example docs/engine.md walks through


def _record(i: int, system: str, tokens_per_s: float, nonpad: float) -> results.Record:
    return results.Record(
        record_id=f"r{i}", run_id=f"run{i}", timestamp=f"2026-01-0{i}T00:00:00", study="scaling", kind="train",
        system=system, status="ok",
        params={"kind": "train", "point_key": "p1", "preset": "gpt2-debug", "precision": "fp32", "devices": 1,
                "seq_len": 32, "micro_batch_size": 2, "gas": 1, "engine": "ddp", "tp": 1, "pp": 1},
        metrics={"tokens_per_s": tokens_per_s, NEW: nonpad})


def test_a_new_metric_is_shown_by_its_declaration_and_its_studys_alone(monkeypatch):
    from accel_kit import tables
    from accel_kit.report.context import Context
    from accel_kit.report.findings import fastest
    from accel_kit.report.records import RecordSet
    from accel_kit.report.tables import table_ii_scaling
    from accel_kit.studies import scaling

    # 1. Where it is measured: the metric declared with its unit (a kind's ``metrics=(Metric(...),)``).
    monkeypatch.setitem(metrics.METRICS, NEW, metrics.Metric(NEW, "tokens/s", "tokens that are no padding, per s"))
    # 2. The Study declaration: shown in the notebook's table, a row of the report's table, the headline.
    declared = scaling.STUDY
    table_2 = declared.report_table("table-2-scaling")
    monkeypatch.setattr(scaling, "STUDY", replace(
        declared, shown=(*declared.shown, NEW), headline=Headline(NEW, "tokens/s", declared.headline.keys),
        report=(replace(table_2, rows=(*table_2.rows, Row(NEW))),)))

    recs = [_record(1, "a", 100.0, 7777.0), _record(2, "b", 110.0, 3333.0)]
    ctx = Context(RecordSet(recs, []))
    df = ctx.study("scaling")
    readable = tables.readable(studies.get_study("scaling").table(df), df, list(studies.get_study("scaling").shown))
    assert list(readable.frame[tables.header(NEW)]) == ["7,780", "3,330"]  # 3 figures: no spread

    table = table_ii_scaling(ctx).tables[0]
    cells = {key[-1]: cells for key, cells in table.rows}
    assert [c.value for c in cells[tables.header(NEW)]] == [7777.0, 3333.0]

    line = next(f for f in fastest(ctx) if f.startswith("<b>scaling"))
    assert "a 7,780 (noise not measured) against b 3,330 (noise not measured) tokens/s" in line, line
