"""accel-kit tune: the layouts it enumerates and why it removes the others, its refusals, Kendall's tau, its
notebook and the report's section (the memory pruning under a real cap: tests/test_tune_memory.py)."""
from pathlib import Path

import pytest

from accel_kit import cli, results, tune
from accel_kit.engine.layout import check_layout
from accel_kit.engine.point import TrainSpec
from accel_kit.systems import load_system
from accel_kit.tune.rank import kendall_tau, ranks
from accel_kit.tune.space import default_layout, enumerate_space

ROOT = Path(__file__).resolve().parent.parent


def _space(preset: str, devices: int = 4, global_batch: int = 8, seq_len: int = 32):
    return enumerate_space(preset, devices=devices, global_batch=global_batch, seq_len=seq_len, precision="fp32",
                           adapter=load_system("cpu").device_adapter())


@pytest.mark.parametrize("preset", ["llama3-debug", "moe-debug", "gpt2-debug"])
def test_every_candidate_is_a_layout_run_takes_and_makes_the_global_batch(preset):
    space = _space(preset)
    assert space.candidates
    for cand in space.candidates:
        lay = cand.layout
        check_layout(TrainSpec(preset=preset, seq_len=32, precision="fp32", **cand.fields()))  # what run checks
        assert lay.devices == 4 and lay.global_batch_size == 8
    assert {c.activation_checkpointing for c in space.candidates} == {False, True}
    assert space.meshes == 3 * 3 ** 4  # engine x tp x pp x cp x ep over the divisors of 4
    assert space.pruned["device count"] == 3 * 3 * sum(4 % (tp * pp * cp) > 0 for tp in (1, 2, 4) for pp in (1, 2, 4)
                                                        for cp in (1, 2, 4))


def test_the_model_and_the_device_decide_what_is_left():
    dense = _space("llama3-debug")
    meshes = {(c.layout.engine, c.layout.tp, c.layout.pp, c.layout.cp, c.layout.ep) for c in dense.candidates}
    assert ("ddp", 2, 1, 1, 1) in meshes and ("ddp", 1, 2, 1, 1) in meshes and ("fsdp", 2, 1, 1, 1) in meshes
    assert not any(m[4] > 1 for m in meshes) and "dense model" in dense.examples["model shape"]
    assert not any(m[3] > 1 for m in meshes) and "CPU" in dense.examples["device"]  # cp: not on a CPU
    assert ("ddp", 4, 1, 1, 1) not in meshes  # tp 4 does not divide llama3-debug's 2 key/value heads
    assert dense.pruned["device count"] and dense.pruned["not built"]
    moe = {(c.layout.engine, c.layout.tp, c.layout.ep) for c in _space("moe-debug").candidates}
    assert ("ddp", 1, 2) in moe and ("fsdp", 1, 4) in moe and not any(tp > 1 for _, tp, _ in moe)
    gpt2 = {c.layout.tp for c in _space("gpt2-debug").candidates}
    assert gpt2 == {1, 2, 4}  # its 4 heads split over 4 ranks
    # A pipeline's micro-batch splits into its chunks: pp 2 keeps only even micro-batches.
    assert all(c.layout.micro_batch_size % 2 == 0 for c in dense.candidates if c.layout.pp == 2)


def test_the_default_is_data_parallel_at_the_systems_micro_batch():
    assert default_layout(4, 32, 4).model_dump(include={"engine", "micro_batch_size", "gas"}) == \
        {"engine": "ddp", "micro_batch_size": 4, "gas": 2}
    assert default_layout(4, 12, 4).micro_batch_size == 3 and default_layout(3, 4, 4) is None


@pytest.mark.parametrize("args, words", [
    (["no-such-model", "--system", "cpu", "--devices", "4"], "no-such-model"),
    (["llama3-debug", "--system", "cpu", "--devices", "3", "--global-batch", "4"], "global batch 4"),
    (["moe-debug", "--system", "cpu", "--devices", "2", "--global-batch", "3"], "global batch 3"),
    (["llama3-debug", "--system", "cpu", "--devices", "4", "--budget-s", "0.1"], "too small for one point"),
    (["llama3-debug", "--system", "cpu", "--devices", "0"], "at least 1"),
])
def test_bad_input_is_one_line_and_status_2(args, words, out_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["tune", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_system_not_here_is_predicted_and_marked_so(capsys):
    assert cli.main(["tune", "llama3-debug", "--system", "h200", "--devices", "8", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "PREDICTIONS ONLY" in out and "datasheet" in out and "device count" in out and "default" in out
    assert "Kendall" not in out and "chosen:" not in out


def test_kendall_tau_counts_ties_as_tau_b():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1 and kendall_tau([1, 2, 3], [3, 2, 1]) == -1
    assert kendall_tau([1, 2, 3], [1, 1, 2]) == pytest.approx(2 / 6 ** 0.5)  # scipy.stats.kendalltau's tau-b
    assert kendall_tau([1, 1], [1, 2]) != kendall_tau([1, 1], [1, 2])  # NaN: no pair untied in both
    assert ranks([5.0, 9.0, 5.0]) == [2, 1, 2]


@pytest.mark.slow
def test_the_notebook_measures_records_a_summary_and_the_report_shows_it(out_dir):
    """notebooks/tune.ipynb under papermill, -p system cpu -p profile smoke: llama3-debug on 2 gloo ranks, the model
    calibrated first (too few records of it), the top configuration and the default measured through the sweep,
    each a record like any study's, then the run's summary record, which the report's tune section shows."""
    import papermill

    from accel_kit import metrics
    from accel_kit.report.context import Context
    from accel_kit.report.page import section_html
    from accel_kit.report.records import collect
    from accel_kit.report.tune_section import tune_section
    from accel_kit.tune.summary import COLUMNS, KIND

    papermill.execute_notebook(str(ROOT / "notebooks" / "tune.ipynb"), str(out_dir / "tune.ipynb"),
                               parameters={"system": "cpu", "profile": "smoke"}, cwd=str(ROOT / "notebooks"),
                               kernel_name="python3", progress_bar=False)
    recs = list(results.iter_records(out_dir / "tune" / "cpu.jsonl"))
    trained = [r for r in recs if r.kind == "train"]
    (summary,) = [r for r in recs if r.kind == KIND]
    assert len(trained) >= 5 and all(r.status == "ok" for r in recs), [(r.kind, r.status, r.reason) for r in recs]
    m = summary.metrics
    assert not metrics.undeclared(m) and summary.params["devices"] == 2
    rows = m["tune_rows"]
    assert len(rows) >= 1 and set(rows[0]) == set(COLUMNS) and any(row["default"] for row in rows)
    assert m["tune_chosen_tokens_per_s"] == max(row["measured_tokens_per_s"] for row in rows)
    assert {row["record_id"] for row in rows} <= {r.record_id for r in trained}
    ctx = Context(collect([out_dir]))
    page = section_html(tune_section(ctx), ctx.cite)
    assert "llama3-debug on 2 x cpu" in page and "chosen: " in page and rows[0]["layout"] in page
    text = "\n".join(c.get("text", "") for cell in nbformat_cells(out_dir / "tune.ipynb") for c in cell)
    assert "measured on cpu" in text and "Kendall's tau" in text and "chosen: " in text


def nbformat_cells(path):
    """The outputs of each code cell of an executed notebook."""
    import nbformat

    return [cell.outputs for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def test_no_tune_run_no_tune_section(out_dir):
    from accel_kit.report.context import Context
    from accel_kit.report.records import RecordSet
    from accel_kit.report.tune_section import tune_section

    assert tune_section(Context(RecordSet([], []))) is None
