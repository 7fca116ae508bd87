"""The predictor's parallel layouts: the pipeline bubble and the tensor-parallel and FSDP traffic by hand,
the direction each layout moves a prediction, records of each layout predicted with their own, and the
what-if's layout parameters."""
import math
import uuid

import numpy as np
import pytest

from accel_kit import results
from accel_kit.cli import main as cli_main
from accel_kit.errors import ParameterError
from accel_kit.mesh import ParallelLayout
from accel_kit.predict import WhatIfParams, comm, resolve_params, what_if
from accel_kit.predict.predictor import Predictor
from accel_kit.predict.records import shape_of_record
from accel_kit.predict.shape import TERMS, pipeline_bubble, shape_for
from cli_checks import fail_one_line

LINK = comm.Link(1.0, 100.0, "test link")  # 1 GB/s, 100 us per ring step
DEBUG = dict(seq_len=64, precision="bf16")  # and micro-batch 4 (_mb4)


def _mb4(**fields) -> ParallelLayout:
    """A layout at DEBUG's micro-batch of 4."""
    return ParallelLayout(micro_batch_size=4, **fields)


def test_pipeline_bubble_by_hand():
    assert pipeline_bubble(4, 4) == pytest.approx(3 / 7) and pipeline_bubble(1, 8) == 0
    assert pipeline_bubble(2, 8) == pytest.approx(1 / 9)
    assert shape_for("gpt2-debug", _mb4(devices=4, pp=4), **DEBUG).bubble_fraction == pytest.approx(3 / 7)  # m = pp
    assert shape_for("gpt2-debug", _mb4(devices=2, pp=2, pp_microbatches=4), **DEBUG).bubble_fraction == pytest.approx(1 / 5)


def test_tensor_parallel_all_reduces_by_hand():
    two = shape_for("gpt2-debug", _mb4(devices=2, tp=2, gas=3), **DEBUG)
    count, size = two.tensor_parallel_messages()
    # 2 forward + 2 backward per block and micro-batch, each b x s x h activations in bf16
    assert count == 3 * two.n_layers * 4 and size == 4 * 64 * two.hidden * 2
    assert shape_for("gpt2-debug", _mb4(devices=2, tp=2), activation_checkpointing=True, **DEBUG) \
        .tensor_parallel_messages()[0] == two.n_layers * 6  # the recomputed forward's two more
    staged = shape_for("gpt2-debug", _mb4(devices=4, tp=2, pp=2, pp_microbatches=2), **DEBUG).tensor_parallel_messages()
    assert staged == (2 * math.ceil(two.n_layers / 2) * 4, 2 * 64 * two.hidden * 2)  # chunks of 2 on half the blocks
    one_ring = 2 * 1 * 100e-6 + 2 * 1 / 2 * size / 1e9  # a ring all-reduce over 2 ranks, alpha-beta
    assert comm.tensor_parallel_s(count, size, 2, LINK.bandwidth_Bps, LINK.latency_s) == pytest.approx(count * one_ring)
    assert shape_for("gpt2-debug", _mb4(), **DEBUG).tensor_parallel_messages() == (0, 0.0)


def test_fsdp_gathers_twice_per_micro_batch_and_reduce_scatters_once():
    fsdp = shape_for("gpt2-debug", _mb4(devices=4, engine="fsdp", gas=2), **DEBUG)
    gathers, params_bytes, grad_bytes = fsdp.fsdp_messages()
    assert (gathers, params_bytes, grad_bytes) == (4, 2 * fsdp.n_params, 4 * fsdp.n_params)
    by_hand = 4 * (3 * 100e-6 + 3 / 4 * params_bytes / 1e9) + (3 * 100e-6 + 3 / 4 * grad_bytes / 1e9)
    assert comm.fsdp_sync_s(gathers, params_bytes, grad_bytes, 4, 1e9, 100e-6) == pytest.approx(by_hand)
    # one device updates its shard only; its compute is the replica's (the gathered model runs whole)
    ddp = shape_for("gpt2-debug", _mb4(devices=4, gas=2), **DEBUG)
    work, base = dict(zip(TERMS, fsdp.work())), dict(zip(TERMS, ddp.work()))
    assert work["optimizer_params"] == fsdp.n_params // 4 and work["matmul_flops"] == base["matmul_flops"]


def _record(shape, step_s, mem_gib=0.5):
    lay = shape.layout
    params = {"kind": "train", "preset": shape.preset, "seq_len": shape.seq_len,
              "micro_batch_size": lay.micro_batch_size, "gas": lay.gas, "devices": lay.devices,
              "precision": shape.precision, "engine": lay.engine, "tp": lay.tp, "pp": lay.pp,
              "pp_microbatches": lay.pp_microbatches, "pp_schedule": lay.pp_schedule, "point_key": uuid.uuid4().hex[:16]}
    return results.Record(record_id=uuid.uuid4().hex, system="cpu", study="scaling", kind="train", status="ok",
                          run_id="r", params=params,
                          metrics={"step_time_s": step_s, "mem_peak_gib": mem_gib, "attention_kernel_ran": "flash"},
                          env={"device": {"threads": 2}})


RATES = np.zeros(len(TERMS))
RATES[TERMS.index("matmul_flops")] = 1 / 50e9
RATES[TERMS.index("attention_flops")] = 1 / 20e9  # (terms that one model's records can tell apart)
RATES[TERMS.index("layer_launches")] = 2e-3


@pytest.fixture(scope="module")
def single():
    """Single-device records whose step times follow known rates (the compute fit recovers them)."""
    shapes = [shape_for("gpt2-debug", ParallelLayout(micro_batch_size=mb), seq_len=s, precision="bf16") for s, mb in
              ((32, 2), (64, 4), (128, 2), (64, 8))]
    # memory: a 0.2 GiB baseline and 1.2 x the estimate (the memory fit recovers both)
    return [_record(s, float(s.work() @ RATES), 0.2 + 1.2 * s.memory_estimate_bytes() / 2**30) for s in shapes]


def test_each_layout_moves_the_prediction_its_way(single):
    predictor = Predictor("cpu", single, link=LINK)
    ddp = predictor.predict(shape_for("gpt2-debug", _mb4(devices=4), **DEBUG))
    tp = predictor.predict(shape_for("gpt2-debug", _mb4(devices=4, tp=2), **DEBUG))
    # a block's products split over tp: less compute per device, plus all-reduces that overlap nothing
    assert tp.compute_s < ddp.compute_s and tp.tensor_parallel_s > 0
    assert tp.exposed_comm_s >= tp.tensor_parallel_s and ddp.tensor_parallel_s == 0
    assert tp.memory_per_device_gib < ddp.memory_per_device_gib
    # a pipeline idles (pp - 1) / (m + pp - 1) of its step: more chunks, less bubble, more tokens/s
    pp2, pp8 = (predictor.predict(shape_for("gpt2-debug", _mb4(devices=2, pp=2, pp_microbatches=m), **DEBUG))
                for m in (2, 4))
    assert pp2.bubble_s == pytest.approx(pp2.step_time_s * pipeline_bubble(2, 2))  # one device: no dp traffic
    assert pp8.bubble_s < pp2.bubble_s and pp8.tokens_per_s > pp2.tokens_per_s
    # FSDP moves more bytes than DDP's all-reduce (two gathers and a reduce-scatter) and holds less
    fsdp = predictor.predict(shape_for("gpt2-debug", _mb4(devices=4, engine="fsdp"), **DEBUG))
    assert fsdp.comm_s > ddp.comm_s and fsdp.memory_per_device_gib < ddp.memory_per_device_gib
    # the words say the layout, not "data parallelism only"
    assert not any("data parallelism only" in a for p in (ddp, tp, pp2, fsdp) for a in p.assumptions)
    assert any(a.startswith("tensor parallel 2") for a in tp.assumptions)
    assert any("bubble" in a for a in pp2.assumptions)


def test_records_of_each_layout_are_predicted_with_their_own(single):
    # Multi-device records made from the model itself: DDP's all-reduce half exposed, FSDP's traffic 0.8
    # exposed, tensor parallel's all-reduces wholly. Each is predicted from the others exactly, which a tp
    # record read as data parallel (its all-reduces and split compute left out) or an FSDP one fitted
    # with DDP's overlap would not be.
    predictor = Predictor("cpu", single, link=LINK)

    def made(shape, exposure):
        dp_s, tp_s = predictor.comm_s(shape, LINK)
        return _record(shape, (float(shape.work() @ RATES) + tp_s) / (1 - shape.bubble_fraction) + exposure * dp_s)

    multi = [made(shape_for("gpt2-debug", _mb4(devices=2), seq_len=s, precision="bf16"), 0.5)
             for s in (32, 64)]
    multi += [made(shape_for("gpt2-debug", _mb4(devices=2, engine="fsdp"), seq_len=s, precision="bf16"), 0.8) for s in (32, 64)]
    multi += [made(shape_for("gpt2-debug", _mb4(devices=2, tp=2), seq_len=s, precision="bf16"), 0.0)
              for s in (32, 64)]
    multi.append(made(shape_for("gpt2-debug", _mb4(devices=4, tp=2, pp=2), seq_len=64, precision="bf16"), 0.0))
    records = single + multi
    predictor = Predictor("cpu", records, link=LINK)
    for rec in multi:
        shape = shape_of_record(rec)
        pred = predictor.predict(shape, exclude={rec["record_id"]})
        assert pred.step_time_s == pytest.approx(rec["metrics"]["step_time_s"], rel=1e-6), rec["params"]


def test_what_if_takes_the_layout_and_refuses_one_that_does_not_divide(tmp_path, capsys):
    # GPT-2 XL as the paper's A100 tensor-parallel runs shape it (16 heads, which tp 4 divides), in bf16 (tp has no
    # sharded fp16 gradient scaler): what `accel-kit run scaling` runs (params/scaling/full.yaml's ``also``).
    run = what_if("a100", resolve_params("full", {"records": [str(tmp_path)], "tp": 4, "devices": [4, 16],
                                                  "preset": "gpt2-xl-16h", "precision": "bf16"}))
    table = run.table()
    assert list(table["tp"]) == [4, 4] and list(table["dp"]) == [1, 4] and (table["tensor_parallel_s"] > 0).all()
    assert "dp 4 x tp 4 x pp 1 x cp 1, ddp" in run.explain()
    with pytest.raises(ParameterError, match="do not split into tp 2"):
        resolve_params("full", {"tp": 2, "devices": [3]})
    with pytest.raises(SystemExit) as exc:
        cli_main(["predict", "--system", "a100", "--profile", "full", "-p", "pp", "3"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.count("\n") == 0 and "pp 3" in err


@pytest.mark.parametrize("preset, devices, ep", [("qwen3-30b-a3b", 12, 6), ("mixtral-8x7b", 16, 16)])
def test_predict_refuses_an_expert_split_as_run_does(preset, devices, ep, capsys, tmp_path):
    # As a new user tries it: ep 6 divides dp 12 but not Qwen3's 128 experts; ep 16 not Mixtral's 8.
    from accel_kit.models import family_of, get_config

    experts = family_of(preset).shape(get_config(preset)).n_experts
    err = fail_one_line(["predict", "--system", "h200", "--preset", preset, "-p", "devices", f"[{devices}]",
                         "-p", "ep", str(ep), "--records", str(tmp_path)], capsys)
    assert f"ep {ep} does not divide the {experts} experts of {preset}" in err


def test_predict_and_run_refuse_a_layout_in_the_same_words(capsys, tmp_path, out_dir):
    layout = ["-p", "preset", "moe-debug", "-p", "ep", "3"]
    predicted = fail_one_line(["predict", "--system", "cpu", "-p", "devices", "[3]", *layout,
                               "--records", str(tmp_path)], capsys)
    ran = fail_one_line(["run", "scaling", "--system", "cpu", "-p", "device_counts", "[3]", *layout], capsys)
    assert predicted == ran and "ep 3 does not divide the 8 experts of moe-debug" in ran


def test_predict_help_lists_every_parameter(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["predict", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    listed = text.split("a what-if parameter: ", 1)[1].split("; VALUE is YAML", 1)[0].split(", ")
    assert listed == WhatIfParams.parameter_names()
    assert {"ep", "inference_batch_sizes", "inference_input_len", "inference_output_len"} <= set(listed)


def test_a_call_cost_counts_once_per_call_and_fsdp_calls_once_per_unit():
    # On a host whose ranks outnumber its cores each call also waits for a core (Link.call_us): once per call,
    # whatever its ring steps or bytes; FSDP2 calls once per sharded unit, its bytes the same in all.
    bw, lat, call = 1e9, 100e-6, 5e-3
    assert comm.collective_s("all_reduce", 1e6, 4, bw, lat, call) == pytest.approx(
        comm.collective_s("all_reduce", 1e6, 4, bw, lat) + call)
    assert comm.collective_s("all_reduce", 1e6, 1, bw, lat, call) == 0.0  # one rank: no call
    one = comm.fsdp_sync_s(2, 8e6, 16e6, 4, bw, lat)
    units = comm.fsdp_sync_s(2, 8e6, 16e6, 4, bw, lat, units=3)
    steps = 2 * comm.ring_steps("all_gather", 4) + comm.ring_steps("reduce_scatter", 4)  # 2 gathers + 1 scatter
    assert units - one == pytest.approx(2 * steps * lat)  # two more units' latency, no more bytes
    with_calls = comm.fsdp_sync_s(2, 8e6, 16e6, 4, bw, lat, units=3, call_s=call)
    assert with_calls - units == pytest.approx(3 * 3 * call)  # (2 gathers + 1 scatter) x 3 units
    assert comm.tensor_parallel_s(8, 1e4, 2, bw, lat, call) == pytest.approx(
        comm.tensor_parallel_s(8, 1e4, 2, bw, lat) + 8 * call)


def test_the_fit_keeps_the_fastest_of_repeated_shapes(single):
    # A repeat of a shape measured during a spell of the host's slowness (twice as slow) leaves the fit as it was:
    # the fastest repeat of each shape is the one fitted.
    from accel_kit.predict.fits import fit_compute

    slow = [_record(shape_of_record(r), 2 * r.metrics["step_time_s"]) for r in single[:2]]
    clean, disturbed = fit_compute(single), fit_compute(slow + single)
    assert np.allclose(disturbed.rates, clean.rates) and sorted(disturbed.record_ids) == sorted(clean.record_ids)
