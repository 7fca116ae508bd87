"""The what-if predictor: collective formulas by hand, the fit on records with a known answer,
and the held-out error and memory estimate on records made here by real runs."""
import math
import uuid

import numpy as np
import pytest

from accel_kit import results, studies
from accel_kit.cli import main as cli_main
from accel_kit.predict import comm, held_out, load_records, resolve_params, what_if
from accel_kit.predict.heldout import error_summary
from accel_kit.predict.nnls import nnls_relative
from accel_kit.predict.predictor import Predictor
from accel_kit.mesh import ParallelLayout
from accel_kit.predict.shape import TERMS, shape_for


# ------------------------------------------------------------------ collectives, by hand

def test_bus_factors_match_nccl_tests_definitions():
    assert comm.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert comm.bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert comm.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert comm.bus_factor("all_reduce", 1) == 0.0


def test_ring_all_reduce_time_by_hand():
    # 1 GB over 4 ranks at 100 GB/s, 5 us per step: 2*3 steps * 5 us + 2*3/4 * 1e9 / 1e11 s.
    t = comm.collective_s("all_reduce", 1e9, 4, 100e9, 5e-6)
    assert t == pytest.approx(6 * 5e-6 + 1.5 * 1e-2)
    assert comm.collective_s("all_reduce", 1e9, 1, 100e9, 5e-6) == 0.0


def test_zero1_moves_the_bytes_of_one_all_reduce():
    ddp = comm.gradient_sync_s(3e9, 16, 25e9, 1e-5, zero1=False)
    zero = comm.gradient_sync_s(3e9, 16, 25e9, 1e-5, zero1=True)
    assert zero == pytest.approx(ddp)


def test_fit_link_recovers_alpha_and_beta():
    sizes = [1e4, 1e5, 1e6, 1e7]
    times = [comm.collective_s("all_reduce", s, 2, 2e9, 50e-6) for s in sizes]
    link = comm.fit_link(sizes, times, 2)
    assert link.bandwidth_GBps == pytest.approx(2.0, rel=1e-6)
    assert link.latency_us == pytest.approx(50.0, rel=1e-6)


# ------------------------------------------------------------------ the solver and the shape, by hand

def test_nnls_recovers_known_coefficients_and_leaves_out_a_term_that_does_not_pay():
    rng = np.random.default_rng(0)
    work = rng.uniform(1, 10, size=(8, 3))
    true = np.array([2.0, 0.0, 5.0])
    coefs, rms = nnls_relative(work, work @ true, penalty=0.03)
    # float64 least squares: the error is bounded by the unit roundoff times the rows' condition number.
    scaled = work / (work @ true)[:, None]
    tol = 100 * np.finfo(np.float64).eps * np.linalg.cond(scaled)
    assert coefs[1] == 0.0  # the subset without it fits exactly, so the extra term cannot pay for itself
    assert coefs[[0, 2]] == pytest.approx(true[[0, 2]], rel=tol) and rms < tol
    with pytest.raises(ValueError, match="no non-negative fit"):
        nnls_relative(np.zeros((3, 2)), np.ones(3), penalty=0.03)


def test_gradient_bytes_follow_the_precision_the_model_is_held_in():
    # fp32: 4 bytes; bf16 holds the model (so its gradients) in bf16; fp16 autocasts an fp32 model
    # under DDP, while DeepSpeed's fp16 mode holds the model in fp16.
    expected = {("fp32", "ddp"): 4, ("fp32", "deepspeed"): 4, ("fp16", "ddp"): 4, ("fp16", "deepspeed"): 2,
                ("bf16", "ddp"): 2, ("bf16", "deepspeed"): 2}
    for (precision, engine), per in expected.items():
        shape = shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2, devices=2, engine=engine), seq_len=64, precision=precision)
        assert shape.grad_bytes() == per * shape.n_params, (precision, engine)


# ------------------------------------------------------------------ the fit, on a known answer

def _record(system, study, shape, step_s, mem_gib, threads=2):
    return results.Record(**{"record_id": uuid.uuid4().hex, "system": system, "study": study, "status": "ok",
            "kind": "train", "run_id": "r", "params": {"kind": "train", "preset": shape.preset, "seq_len": shape.seq_len,
                       "micro_batch_size": shape.layout.micro_batch_size, "gas": shape.layout.gas,
                       "devices": shape.layout.devices,
                       "precision": shape.precision, "engine": "ddp", "point_key": uuid.uuid4().hex[:16]},
            "metrics": {"step_time_s": step_s, "mem_peak_gib": mem_gib, "attention_kernel_ran": "flash"},
            "env": {"device": {"threads": threads}}})


def test_leave_one_out_is_exact_when_times_follow_the_model():
    # Times made from known rates (a matmul rate, a per-launch cost, an optimizer cost): every
    # record must be predicted from the others to within rounding, at every seq, micro-batch and GAS.
    rates = np.zeros(len(TERMS))
    rates[TERMS.index("matmul_flops")] = 1 / 50e9
    rates[TERMS.index("layer_launches")] = 2e-3
    rates[TERMS.index("optimizer_params")] = 1e-9
    records = []
    for seq, mb, gas in [(64, 2, 1), (128, 2, 1), (256, 2, 1), (128, 1, 2), (128, 4, 4), (64, 4, 2)]:
        shape = shape_for("gpt2-debug", ParallelLayout(micro_batch_size=mb, gas=gas), seq_len=seq, precision="bf16")
        # A runtime baseline of 0.4 GiB, an allocator holding 1.5x the live peak, and half a micro-batch's
        # working set more under GAS: the memory terms must recover all three.
        mem = float(shape.memory_work() @ np.array([0.4 * 2**30, 1.5, 0.5])) / 2**30
        records.append(_record("cpu", "synthetic", shape, float(shape.work() @ rates), mem))
    df = held_out(records, ["cpu"])
    assert len(df) == 6 and df["predicted_step_s"].notna().all()
    assert df["step_error"].abs().max() < 1e-6
    assert df["mem_error"].abs().max() < 1e-6
    summary = error_summary(df)
    assert summary.iloc[-1]["predicted"] == 6


def test_a_point_run_several_times_is_judged_by_the_median_of_its_runs():
    # Three runs of one point (noisy: 0.9, 1.0 and 1.6 s) and two other points on the line t = 1e-3 s/token.
    shapes = [shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2), seq_len=s, precision="bf16") for s in (64, 128, 256)]
    records = [_record("cpu", "seq_length", s, s.tokens_per_step_per_device * 1e-3, 0.5) for s in shapes[1:]]
    key = uuid.uuid4().hex[:16]
    for factor in (0.9, 1.0, 1.6):
        rec = _record("cpu", "seq_length", shapes[0], shapes[0].tokens_per_step_per_device * 1e-3 * factor, 0.5)
        rec["params"]["point_key"] = key
        records.append(rec)
    # The same key in another study is another point (two studies can run one shape).
    other = _record("cpu", "gas", shapes[1], shapes[1].tokens_per_step_per_device * 1e-3, 0.5)
    other["params"]["point_key"] = key
    df = held_out(records + [other], ["cpu"])
    assert len(df) == 4 and sorted(df["runs"]) == [1, 1, 1, 3]
    row = df[df["runs"] == 3].iloc[0]
    assert row["measured_step_s"] == pytest.approx(shapes[0].tokens_per_step_per_device * 1e-3)
    assert row["run_spread"] == pytest.approx(0.6)
    assert row["step_error"] == pytest.approx(0, abs=1e-6)  # the other points' line, none of its own runs
    summary = error_summary(df)
    assert summary.iloc[-1]["points"] == 4 and summary.iloc[-1]["run_spread_mean"] == pytest.approx(0.6)


def test_a_model_with_records_of_its_own_is_fitted_on_them_alone():
    # gpt2-debug runs at 1e-3 s/token; another preset of the same system erratically (no rate fits it).
    # With three records of its own, a gpt2-debug point is predicted from those alone, not from a fit
    # across both models.
    mine = [shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2), seq_len=s, precision="bf16") for s in (64, 128, 256, 512)]
    other = [shape_for("gpt2-small", ParallelLayout(micro_batch_size=1), seq_len=s, precision="bf16") for s in (64, 128, 256)]
    records = ([_record("cpu", "seq_length", s, s.tokens_per_step_per_device * 1e-3, 0.5) for s in mine]
               + [_record("cpu", "genslm", s, s.tokens_per_step_per_device * 3e-3 * f, 0.5)
                  for s, f in zip(other, (1.0, 1.6, 0.7))])
    df = held_out(records, ["cpu"])
    ours = df[df["study"] == "seq_length"]
    assert len(ours) == 4 and ours["step_error"].abs().max() < 1e-6


def test_exposed_communication_fitted_from_multi_device_records(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(tmp_path))
    link = comm.Link(1.0, 100.0, "test link")
    one = [shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2), seq_len=s, precision="bf16") for s in (32, 64, 128)]
    records = [_record("cpu", "seq_length", s, s.tokens_per_step_per_device * 1e-4, 0.5) for s in one]
    two = shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2, devices=2), seq_len=64, precision="bf16")
    comm_s = comm.gradient_sync_s(two.grad_bytes(), 2, link.bandwidth_Bps, link.latency_s, zero1=False)
    records.append(_record("cpu", "scaling", two, two.tokens_per_step_per_device * 1e-4 + 0.5 * comm_s, 0.5))
    pred = Predictor("cpu", records, link=link).predict(
        shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2, devices=4), seq_len=64, precision="bf16"))
    assert pred.basis == "records"
    assert pred.exposed_comm_s == pytest.approx(0.5 * pred.comm_s, rel=1e-3)
    assert pred.scaling_efficiency < 1
    assert any("median over 1 multi-device" in line for line in pred.inputs)


def test_a_system_without_records_is_predicted_from_its_datasheet_and_says_so(tmp_path):
    run = what_if("a100", resolve_params("full", {"records": [str(tmp_path)]}))
    assert [p.basis for p in run.predictions] == ["datasheet"] * 4
    text = run.explain()
    assert "NOT fitted to this system's training records" in text and "assumed" in text
    assert "unchecked" in run.held_out_summary()
    # GPT-2 XL at 8192 with micro-batch 1: about 50 GiB of weights, optimizer state and activations.
    assert run.predictions[0].fits is False
    # More devices, more tokens/s, but each one less efficient once gradients cross nodes.
    tps = [p.tokens_per_s for p in run.predictions]
    assert tps == sorted(tps) and run.predictions[-1].scaling_efficiency < run.predictions[1].scaling_efficiency


def test_cli_predict_rejects_an_unknown_parameter(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["predict", "--system", "a100", "--preset", "gpt2-xl", "-p", "device", "8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown parameter 'device'" in err


# ------------------------------------------------------------------ real records made here

@pytest.fixture(scope="module")
def cpu_records(tmp_path_factory):
    """Dense training records from real tiny runs: three sequence lengths, and GAS 1/2 at two micro-batches.

    Without the matmul peak measurement of each run (seconds each): the predictor reads step times and
    memory peaks, never the records' measured-peak MFU."""
    out = tmp_path_factory.mktemp("predict")
    tiny = dict(output_dir=out, progress=False, precision="fp32", data="synthetic", measure_peak=False)
    studies.run_study("seq_length", "cpu", "smoke", **tiny)
    studies.run_study("gas", "cpu", "smoke", **tiny)
    return out


@pytest.mark.slow  # the real runs of cpu_records: minutes on a small machine
def test_held_out_on_real_records(cpu_records):
    df = held_out(load_records([cpu_records]), ["cpu"])
    assert set(df["study"]) == {"seq_length", "gas"} and len(df) == 7
    predicted = df.dropna(subset=["predicted_step_s"])
    assert len(predicted) == 7 and (predicted["predicted_step_s"] > 0).all()
    assert all(math.isfinite(e) for e in predicted["step_error"])
    # The memory estimate with the fitted baseline and allocator terms, against the measured peak of a record it
    # never saw. The error is printed for the record; the bound only catches a broken estimate.
    print(error_summary(df).to_string())
    assert predicted["mem_error"].abs().max() < 0.3


@pytest.mark.slow  # the real runs of cpu_records, and a link probe over two processes
def test_what_if_on_real_records_lists_inputs_and_error(cpu_records):
    run = what_if("cpu", resolve_params("smoke", {"records": [str(cpu_records)], "precision": "fp32"}))
    assert [p.basis for p in run.predictions] == ["records", "records"]
    assert run.predictions[0].memory_per_device_gib > 0.1  # the baseline of a Python + torch process
    assert "leave-one-out" in run.held_out_summary()
    assert "what_if_held_out" in run.figures()


def test_the_step_shape_of_a_llama_preset_comes_from_its_family():
    from accel_kit.models import family_of, get_config

    shape = shape_for("llama3-debug", ParallelLayout(micro_batch_size=2, gas=2), seq_len=64, precision="bf16")
    cfg = get_config("llama3-debug", seq_len=64)
    terms = family_of(cfg).flop_terms(cfg, 64)
    assert shape.flops_per_step_per_device == 2 * 64 * 2 * terms.total()
    work = dict(zip(TERMS, shape.work()))
    assert work["attention_flops"] == 2 * 64 * 2 * terms.attention * 3
    assert shape.memory_estimate_bytes() > 0 and shape.grad_bytes() == shape.n_params * 2


def test_a_record_across_nodes_is_held_out_over_the_inter_node_link(tmp_path):
    # A 2-rank point at one device a node (a job's -p devices_per_node 1) crossed the nodes: its leave-one-out
    # prediction takes the inter-node link kept beside the records, and says why not where none was measured.
    import json

    from accel_kit.predict.links import link_cache_path

    one = [shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2), seq_len=s, precision="bf16") for s in (32, 64, 128)]
    records = [_record("cpu", "seq_length", s, s.tokens_per_step_per_device * 1e-4, 0.5) for s in one]
    two = shape_for("gpt2-debug", ParallelLayout(micro_batch_size=2, devices=2), seq_len=64, precision="bf16")
    across = _record("cpu", "scaling", two, two.tokens_per_step_per_device * 1e-4 * 1.5, 0.5)
    across["params"]["devices_per_node"] = 1
    records.append(across)

    def row():
        df = held_out(records, ["cpu"], link_root=str(tmp_path), probe=False)
        return df[df["record_id"] == across["record_id"]].iloc[0]

    assert "no measured inter-node link" in row()["why_not"]
    path = link_cache_path("cpu", tmp_path, inter_node=True)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"node_bandwidth_GBps": 1.0, "latency_us": 50.0, "source": "measured: test"}))
    assert row()["predicted_step_s"] > 0
