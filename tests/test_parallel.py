"""Parallel layouts (issue 21, first phase): the parameters and their checks, the fused rows regrouped per
tensor-parallel shard, and FSDP2 and tensor parallelism training as DDP and one process do.

The multi-process test runs the worker's own ``run_point`` (the path ``accel-kit run`` takes in each rank)
in two spawned gloo processes on the CPU, fp32.
"""
import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from accel_kit.engine.layout import check_layout, data_rank
from accel_kit.engine.point import TrainPoint
from accel_kit.errors import ParameterError
from accel_kit.models.family import group_rows_by_shard
from accel_kit.engine.worker import end_group
from cli_checks import fail_one_line
from ranks import rendezvous, spawn

SEQ, STEPS = 16, 6
VOCAB = {"gpt2-debug": 97, "llama3-debug": None}  # gpt2-debug's 50257-row embedding is most of its time


def _point(preset="gpt2-debug", devices=1, **fields):
    return TrainPoint(**{"system": "cpu", "preset": preset, "vocab_size": VOCAB.get(preset),
                         "precision": "fp32", "micro_batch_size": 4, "seq_len": SEQ, "devices": devices,
                         "steps": STEPS, "warmup_steps": 0} | fields)


def test_resume_keys_unchanged_at_the_default_layout():
    # The keys this point had before tp, pp, pp_microbatches, pp_schedule, cp and ep existed (computed at commit
    # 227567e): a record measured then resumes as the same point.
    fields = dict(system="cpu", preset="gpt2-debug", precision="fp32", micro_batch_size=2, seq_len=16, devices=2)
    assert TrainPoint(**fields).key() == "0552ec7a343ab16d"
    assert TrainPoint(**fields).frontier_key() == "ad469254ee92c1dc"
    assert TrainPoint(**fields, engine="deepspeed").key() == "a6b32a26e7f7844a"
    others = {TrainPoint(**fields, **change).key() for change in
              ({}, {"tp": 2}, {"engine": "fsdp"}, {"pp": 2}, {"pp": 2, "pp_schedule": "1f1b"}, {"cp": 2},
               {"ep": 2})}
    assert len(others) == 7


@pytest.mark.parametrize("fields, message", [
    ({"devices": 3, "tp": 2}, "3 devices do not split into tp 2 x pp 1"),
    ({"devices": 3, "tp": 3}, "tp 3 does not divide the 4 heads of gpt2-debug"),
    ({"preset": "llama3-debug", "devices": 4, "tp": 4}, "tp 4 does not divide the 2 key/value heads"),
    ({"devices": 4, "pp": 4}, "pp 4 is more stages than the 2 blocks"),
    ({"devices": 2, "tp": 2, "engine": "deepspeed"}, "engine deepspeed runs data parallelism only"),
    ({"devices": 2, "engine": "fsdp", "precision": "fp16"}, "fp16 under fsdp"),
    ({"devices": 2, "pp_microbatches": 2}, "pp_microbatches needs pp above 1"),
])
def test_bad_layouts_answer_in_one_line(fields, message):
    with pytest.raises(ParameterError, match=message):
        check_layout(_point(**fields))


def test_good_layouts_pass_and_place_the_data():
    point = _point(devices=4, tp=2, engine="fsdp")
    check_layout(point)
    assert point.dp == 2 and point.global_batch_size == 4 * 2
    # the two ranks of a tensor-parallel group train on one micro-batch; the groups on their own
    assert [data_rank(point, rank) for rank in range(4)] == [0, 0, 1, 1]


def test_the_cli_refuses_a_bad_layout(capsys, out_dir):
    err = fail_one_line(["run", "scaling", "--system", "cpu", "-p", "preset", "gpt2-debug",
                         "-p", "device_counts", "[3]", "-p", "tp", "3"], capsys)
    assert "tp 3 does not divide the 4 heads" in err


def test_fused_rows_regrouped_per_shard():
    # [q; k; v] of widths 4, 2, 2 over 2 shards: shard r must hold q's, k's and v's r-th halves, in that order.
    linear = nn.Linear(3, 8)
    q, k, v = (t.clone() for t in linear.weight.detach().split([4, 2, 2]))
    bias_q, bias_k, bias_v = (t.clone() for t in linear.bias.detach().split([4, 2, 2]))
    group_rows_by_shard(linear, [4, 2, 2], 2)
    for r, shard in enumerate(linear.weight.detach().chunk(2)):
        torch.testing.assert_close(shard, torch.cat([q[2 * r:2 * r + 2], k[r:r + 1], v[r:r + 1]]), rtol=0, atol=0)
    for r, shard in enumerate(linear.bias.detach().chunk(2)):
        expected = torch.cat([bias_q[2 * r:2 * r + 2], bias_k[r:r + 1], bias_v[r:r + 1]])
        torch.testing.assert_close(shard, expected, rtol=0, atol=0)


def _ranks(rank, world, points, meets, out):
    from accel_kit.engine.worker import run_point

    torch.set_num_threads(1)
    results = []
    for point, meet in zip(points, meets):  # one process group per point, as each worker has its own
        os.environ.update(meet)
        results.append(run_point(point, rank, world, rank).model_dump())
        end_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, default=str)


def _losses(result):
    assert result["status"] == "ok", (result.get("reason"), result.get("traceback"))
    return result["metrics"]["losses"]


def _assert_same_losses(losses, reference, what):
    # fp32 with the same weights and data: the layouts differ only in summation order (the all-reduces'
    # and the shards' partial sums), a few fp32 roundings per step, ~1e-7 relative, amplified over 6 AdamW
    # steps of a tiny model; the bar of 1e-4 leaves a wide margin.
    assert len(losses) == len(reference) == STEPS
    for step, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) / abs(b) < 1e-4, f"{what}: step {step}: {a} against {b}"


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["gpt2-debug", "llama3-debug"])
def test_fsdp_and_tensor_parallel_train_as_ddp_and_one_process(preset, tmp_path):
    from accel_kit.engine.worker import run_point

    torch.set_num_threads(1)
    single = _losses(run_point(_point(preset), 0, 1, 0))
    # DDP and FSDP at dp 2, then tensor parallel 2 at dp 1 (one process group each, in this order: a
    # process group started after a tensor-parallel one's teardown aborts in torch 2.13's gloo, which the
    # worker never meets, since each point has processes of its own)
    points = [_point(preset, 2), _point(preset, 2, engine="fsdp"), _point(preset, 2, tp=2)]
    if preset == "gpt2-debug":
        points[2:2] = [_point(preset, 2, precision="bf16"), _point(preset, 2, precision="bf16", engine="fsdp")]
    out = tmp_path / "results.json"
    with rendezvous(len(points)) as meets:
        spawn(_ranks, (2, points, meets, str(out)), 2)
    results = dict(zip([(p.engine, p.tp, p.precision) for p in points], json.loads(out.read_text())))
    ddp, fsdp, tp = (results[key] for key in [("ddp", 1, "fp32"), ("fsdp", 1, "fp32"), ("ddp", 2, "fp32")])
    _assert_same_losses(_losses(fsdp), _losses(ddp), "fsdp against ddp")
    assert ddp["env"]["hosts"] == [socket.gethostname()]  # every rank's host, gathered (here, one machine)
    _assert_same_losses(_losses(tp), single, "tp 2 against one process")
    assert [(r["metrics"]["dp"], r["metrics"]["mesh"]) for r in (fsdp, tp)] == [
        (2, "pp 1 x dp 2 x cp 1 x tp 1"), (1, "pp 1 x dp 1 x cp 1 x tp 2")]
    if preset == "gpt2-debug":
        # bf16: FSDP's policy casts the fp32 shards per forward, DDP holds bf16 weights with fp32 masters;
        # both start from the same bf16-rounded weights, so the first step's loss agrees to bf16's rounding
        # (8 bits: 2^-8); later ones drift apart by the reductions' precision (FSDP's are fp32), so only
        # their being finite (a non-finite loss is a failed point) is checked.
        ddp16, fsdp16 = _losses(results[("ddp", 1, "bf16")]), _losses(results[("fsdp", 1, "bf16")])
        assert abs(fsdp16[0] - ddp16[0]) / ddp16[0] < 2 ** -8
