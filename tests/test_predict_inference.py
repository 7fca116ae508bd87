"""The inference predictor: on records whose times follow the model exactly it recovers the rates and predicts
exactly (leave-one-out too); on records of a real tiny inference run it predicts finite, positive TTFT and TPOT,
with a held-out error, and the what-if shows it."""
import dataclasses
import math
import uuid

import numpy as np
import pytest

from accel_kit import results, studies
from accel_kit.predict import load_records, resolve_params, what_if
from accel_kit.predict.inference import (TPOT_TERMS, TTFT_TERMS, InferencePredictor, error_summary, fit_inference,
                                         generation_shape, held_out, shape_of_record)

# Seconds per unit of each term: a prefill at 20 GFLOP/s with 1 ms per layer and 5 ms per call; a decode step at
# 10 GB/s and 40 GFLOP/s with 0.5 ms per layer.
TTFT_RATES = np.array([1 / 20e9, 1e-3, 5e-3])
TPOT_RATES = np.array([1 / 10e9, 1 / 40e9, 5e-4])
POINTS = [("gpt2-debug", 1, 8, 4), ("gpt2-debug", 4, 16, 4), ("gpt2-debug", 8, 8, 8), ("llama3-debug", 2, 16, 4),
          ("gpt2-small", 1, 8, 4), ("gpt2-small", 4, 32, 8), ("llama3-small", 2, 8, 4)]


def _record(system: str, shape, ttft_s: float, tpot_s: float | None, threads: int = 2) -> results.Record:
    """A generate record as the kind writes it (the counts the family gives, times from the rates)."""
    return results.Record(**{"record_id": uuid.uuid4().hex, "system": system, "study": "inference", "kind": "generate",
            "status": "ok", "run_id": "r",
            "params": {"kind": "generate", "preset": shape.preset, "precision": shape.precision,
                       "batch_size": shape.batch_size, "input_len": shape.input_len, "output_len": shape.output_len,
                       "point_key": uuid.uuid4().hex[:16]},
            "metrics": {"ttft_s": ttft_s, "tpot_s": tpot_s, "n_layers": shape.n_layers,
                        "prefill_flops": shape.prefill_flops,
                        "decode_flops": shape.decode_flops_per_step * (shape.output_len - 1),
                        "decode_bytes": shape.decode_bytes_per_step * (shape.output_len - 1)},
            "env": {"device": {"threads": threads}}})


def _exact_records(system: str = "cpu") -> list[results.Record]:
    shapes = [generation_shape(p, batch_size=b, input_len=t, output_len=n, precision="fp32") for p, b, t, n in POINTS]
    return [_record(system, s, float(s.ttft_work() @ TTFT_RATES), float(s.tpot_work() @ TPOT_RATES)) for s in shapes]


def test_the_fit_recovers_the_rates_when_times_follow_the_model():
    records = _exact_records()
    fit = fit_inference(records)
    assert len(TTFT_TERMS) == len(TTFT_RATES) and len(TPOT_TERMS) == len(TPOT_RATES)
    assert fit.ttft_rates == pytest.approx(TTFT_RATES, rel=1e-6)
    assert fit.tpot_rates == pytest.approx(TPOT_RATES, rel=1e-6)
    assert fit.ttft_rms < 1e-9 and fit.tpot_rms < 1e-9
    # A generation not among the records (another preset, batch and lengths) is predicted exactly
    shape = generation_shape("llama3-small", batch_size=16, input_len=64, output_len=32, precision="fp32")
    pred = InferencePredictor("cpu", records).predict(shape)
    assert pred.ttft_s == pytest.approx(float(shape.ttft_work() @ TTFT_RATES), rel=1e-6)
    assert pred.tpot_s == pytest.approx(float(shape.tpot_work() @ TPOT_RATES), rel=1e-6)
    assert pred.output_tokens_per_s == pytest.approx(16 * 32 / (pred.ttft_s + 31 * pred.tpot_s))


def test_leave_one_out_is_exact_when_times_follow_the_model_and_other_systems_are_ignored():
    records = _exact_records() + [dataclasses.replace(r, record_id=uuid.uuid4().hex, metrics=dict(r.metrics, ttft_s=9.0))
                                  for r in _exact_records("other")][:2]
    df = held_out(records, ["cpu"])
    assert len(df) == len(POINTS) and df["predicted_ttft_s"].notna().all() and df["predicted_tpot_s"].notna().all()
    assert df["ttft_error"].abs().max() < 1e-6 and df["tpot_error"].abs().max() < 1e-6
    summary = error_summary(df)
    assert list(summary["system"]) == ["cpu", "all"] and summary.iloc[-1]["predicted"] == len(POINTS)


def test_a_point_run_twice_is_left_out_whole_and_judged_by_the_median_of_its_runs():
    records = _exact_records()
    twice = dataclasses.replace(records[0], record_id=uuid.uuid4().hex, metrics=dict(records[0].metrics))
    twice["metrics"]["ttft_s"] *= 3  # a noisy second run of the first point: the median of the two
    df = held_out(records + [twice], ["cpu"])
    row = df[df["runs"] == 2].iloc[0]
    assert len(df) == len(POINTS)
    assert row["measured_ttft_s"] == pytest.approx(2 * records[0]["metrics"]["ttft_s"])
    assert row["predicted_ttft_s"] == pytest.approx(records[0]["metrics"]["ttft_s"], rel=1e-6)  # neither run seen


def test_records_of_another_precision_or_thread_count_are_not_fitted_on():
    records = _exact_records()
    shape = generation_shape("gpt2-debug", batch_size=1, input_len=8, output_len=4, precision="bf16")
    with pytest.raises(ValueError, match="no other ok bf16 generate records of cpu"):
        InferencePredictor("cpu", records).predict(shape)
    with pytest.raises(ValueError, match="at 7 host thread"):
        InferencePredictor("cpu", records).predict(shape_of_record(records[0]), threads=7)


def test_an_output_of_one_token_has_a_ttft_but_no_tpot():
    shape = generation_shape("gpt2-debug", batch_size=1, input_len=8, output_len=1, precision="fp32")
    assert shape.tpot_work() is None
    pred = InferencePredictor("cpu", _exact_records()).predict(shape)
    assert pred.tpot_s is None and pred.output_tokens_per_s == pytest.approx(1 / pred.ttft_s)


# ------------------------------------------------------------------ real records made here

@pytest.fixture(scope="module")
def generate_records(tmp_path_factory):
    """Offline-generation records of a real tiny run: gpt2-debug, batch 1 and 2, prompts of 4 and 8, 3 new tokens;
    no serving, no reference, no peak or bandwidth measurement (the predictor reads times and counts)."""
    out = tmp_path_factory.mktemp("predict-inference")
    studies.run_study("inference", "cpu", "smoke", output_dir=out, progress=False, presets=["gpt2-debug"],
                      batch_sizes=[1, 2], input_lens=[4, 8], output_lens=[3], trials=2, hf_reference=False,
                      measure_peak=False, measure_bandwidth=False, concurrencies=[], timeout_s=120)
    return out


@pytest.mark.slow  # four real generate points, a worker process each
def test_real_records_give_finite_positive_predictions_and_a_held_out_error(generate_records, capsys):
    records = load_records([generate_records])
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 4
    for rec in ok:  # the counts the predictor computes for a generation are the ones the kind recorded
        p = rec["params"]
        assert generation_shape(p["preset"], batch_size=p["batch_size"], input_len=p["input_len"],
                                output_len=p["output_len"], precision=p["precision"]) == shape_of_record(rec)
    df = held_out(records, ["cpu"])
    assert len(df) == 4 and df["predicted_ttft_s"].notna().all()
    assert (df["predicted_ttft_s"] > 0).all() and (df["predicted_tpot_s"] > 0).all()
    assert all(math.isfinite(e) for e in list(df["ttft_error"]) + list(df["tpot_error"]))
    print(error_summary(df).to_string())  # the error, for the log; no bound tuned to this CPU
    run = what_if("cpu", resolve_params("smoke", {"records": [str(generate_records)], "devices": [1],
                                                  "inference_batch_sizes": [1, 4], "inference_input_len": 16,
                                                  "inference_output_len": 8}))
    table = run.inference()
    assert list(table["batch_size"]) == [1, 4] and (table["basis"] == "records").all()
    assert (table["ttft_s"] > 0).all() and (table["tpot_s"] > 0).all() and (table["output_tokens_per_s"] > 0).all()
    assert "4/4 points predicted" in run.inference_summary()
    # accel-kit predict prints them, and succeeds on inference records alone (no training record to predict from)
    from accel_kit import cli

    assert cli.main(["predict", "--system", "cpu", "--profile", "smoke", "--preset", "gpt2-debug",
                     "--records", str(generate_records), "-p", "devices", "[1]"]) == 0
    out = capsys.readouterr().out
    assert "greedy generation, input 128 / output 128 tokens:" in out and "4/4 points predicted" in out


def test_the_what_if_says_so_without_generate_records(tmp_path):
    run = what_if("cpu", resolve_params("smoke", {"records": [str(tmp_path)], "devices": [1]}))
    assert run.inference().empty and "no ok generate records of cpu" in run.inference_summary()
