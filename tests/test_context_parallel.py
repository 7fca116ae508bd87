"""Context parallelism (``cp``, issue 21): what can be checked on a CPU, where torch's ring attention does not run.

torch's ``context_parallel`` takes CUDA's fused SDPA kernels only, so here a cp point is ``unsupported``
(the CPU adapter's reason) and nothing below runs ring attention. What is checked: the layout's
parameters and refusals, the worker's answer before anything is allocated, the families' position
buffers (a shard of the sequence with its sharded positions computes its rows of the whole sequence
wherever attention does not mix positions), and, in two gloo processes, the trainer under torch's own
``context_parallel`` (its in-place sharding of tokens, targets and positions, the cp loss and gradient
averaging) with attention replaced by a position-local stand-in: it trains as one process does.
"""
import json
import os

import pytest
import torch
import torch.distributed as dist

from accel_kit.engine.layout import check_layout, data_rank
from accel_kit.engine.point import TrainPoint
from accel_kit.errors import ParameterError
from accel_kit.engine.worker import end_group
from cli_checks import fail_one_line
from ranks import rendezvous, spawn

SEQ, STEPS = 16, 4
VOCAB = {"gpt2-debug": 97, "llama3-debug": None}
PRESETS = ("gpt2-debug", "llama3-debug")


def _point(preset="gpt2-debug", devices=2, cp=2, **fields):
    return TrainPoint(**{"system": "cpu", "preset": preset, "vocab_size": VOCAB.get(preset), "precision": "fp32",
                         "micro_batch_size": 2, "seq_len": SEQ, "devices": devices, "cp": cp, "steps": STEPS,
                         "warmup_steps": 0} | fields)


@pytest.mark.parametrize("fields, message", [
    ({"devices": 3}, "3 devices do not split into tp 1 x pp 1 x cp 2"),
    ({"seq_len": 18}, r"seq_len 18 does not split into 2 x cp = 4 equal chunks"),
    ({"engine": "deepspeed"}, r"engine deepspeed runs data parallelism only here \(cp 2\)"),
    ({"devices": 4, "pp": 2}, "cp and pp together are not built"),
    ({"attention_kernel": "math"}, "cp needs a fused attention kernel"),
    ({"sparsity": 0.5}, "weight sparsity and torch_compile are not built for cp"),
    ({"torch_compile": True}, "weight sparsity and torch_compile are not built for cp"),
])
def test_bad_context_parallel_layouts_answer_in_one_line(fields, message):
    with pytest.raises(ParameterError, match=message) as info:
        check_layout(_point(**fields))
    assert "\n" not in str(info.value)


def test_a_transformers_model_is_refused_cp(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=64).save_pretrained(tmp_path)
    with pytest.raises(ParameterError, match="the hf family's model does not take its positions as buffers"):
        check_layout(_point(f"hf:{tmp_path}"))


def test_context_parallel_layout_places_the_data():
    point = _point(devices=4)
    check_layout(point)
    assert point.dp == 2 and point.global_batch_size == 2 * 2
    assert point.mesh_label() == "pp 1 x dp 2 x cp 2 x tp 1"
    # the ranks of one cp group (innermost but for tp) share a micro-batch, each taking its sequence shard
    assert [data_rank(point, rank) for rank in range(4)] == [0, 0, 1, 1]
    wide = _point(devices=8, tp=2, engine="fsdp")
    check_layout(wide)
    assert wide.mesh_label() == "pp 1 x dp 2 x cp 2 x tp 2"
    assert [data_rank(wide, rank) for rank in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_the_sequence_length_study_takes_cp():
    from accel_kit import studies
    from accel_kit.studies.training import all_points
    from accel_kit.systems import load_system

    points = all_points(studies.resolve("seq_length", "smoke", cp=2, devices=2), load_system("cpu"))
    assert {(p.cp, p.devices, p.dp) for p in points} == {(2, 2, 1)}


def test_the_cli_refuses_a_sequence_cp_cannot_split(capsys, out_dir):
    err = fail_one_line(["run", "seq_length", "--system", "cpu", "-p", "preset", "gpt2-debug", "-p", "devices", "2",
                         "-p", "cp", "2", "-p", "seq_lens", "[18]"], capsys)
    assert "seq_len 18 does not split into 2 x cp = 4 equal chunks" in err


def test_a_cpu_cp_point_is_unsupported_before_anything_runs():
    from accel_kit.engine.worker import run_point

    # rank 0 of 2 on its own: the check comes before the process group (which would wait for rank 1)
    result = run_point(_point(), 0, 2, 0)
    assert result["status"] == "unsupported", result
    assert "context parallelism does not run on a CPU" in result["reason"]
    assert "_scaled_dot_product_flash_attention_for_cpu" in result["reason"]
    assert not dist.is_initialized()


def test_the_adapters_say_where_context_parallelism_runs():
    from accel_kit.devices.accelerator import AcceleratorAdapter
    from accel_kit.devices.base import BaseAdapter
    from accel_kit.devices.cuda import CUDAAdapter
    from accel_kit.devices.rocm import ROCmAdapter

    assert CUDAAdapter().unsupported_context_parallel() is None  # the device type's kernels, no GPU asked
    assert ROCmAdapter().unsupported_context_parallel() is None  # a ROCm build's torch.cuda, the same aten ops
    xpu = AcceleratorAdapter()
    xpu.configure({"device_type": "xpu"})
    assert "does not run on xpu" in xpu.unsupported_context_parallel()
    # an adapter that says nothing (a vendor's programming model) is refused, not assumed to run it
    assert "not known to run on adapter 'base'" in BaseAdapter().unsupported_context_parallel()


def _position_local_attention(q, k, v):
    """A stand-in for causal attention that mixes no positions: each output row from its own q, k and v
    (q and k carry RoPE, so Llama's positions still count), shaped as SDPA's output (B, nh, T, hd)."""
    groups = q.shape[1] // k.shape[1]
    return v.repeat_interleave(groups, dim=1) + q * k.repeat_interleave(groups, dim=1)


def _patch_attention(setattr_):
    """Every family's attention (the shared ``SelfAttention.forward``) calls the stand-in instead of
    ``causal_attention`` (``setattr_``: monkeypatch's)."""
    import accel_kit.models.common.attention as attention

    setattr_(attention, "causal_attention", _position_local_attention)


def _head_tail_indices(seq_len, cp, rank):
    """The positions torch's load-balanced sharding gives ``rank``: chunks rank and 2cp - 1 - rank of 2cp."""
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])


@pytest.mark.parametrize("preset", PRESETS)
def test_positions_are_buffers_that_shard_with_the_sequence(preset, monkeypatch):
    from accel_kit.models import build_model, family_of

    _patch_attention(monkeypatch.setattr)
    torch.manual_seed(0)
    family = family_of(preset)
    model = build_model(preset, seq_len=SEQ, **({"vocab_size": VOCAB[preset]} if VOCAB[preset] else {}))
    buffers = family.position_buffers(model)
    assert buffers and all(t.shape[dim] == SEQ for t, dim in buffers)
    if preset == "gpt2-debug":  # the learned table read at 0 .. T-1, as the arange it replaces
        assert torch.equal(model.position_ids, torch.arange(SEQ))
    idx = torch.randint(0, model.lm_head.out_features, (2, SEQ))
    full, _ = model(idx)
    originals = [t.clone() for t, _ in buffers]
    for rank in range(2):  # each rank of cp 2: its tokens and its positions, sharded in place as CP does
        where = _head_tail_indices(SEQ, 2, rank)
        for (t, dim), original in zip(buffers, originals):
            shard = original.index_select(dim, where)
            t.resize_(shard.shape).copy_(shard)
        shard_logits, _ = model(idx[:, where])
        torch.testing.assert_close(shard_logits, full[:, where], rtol=1e-5, atol=1e-6)
    for (t, _), original in zip(buffers, originals):
        t.resize_(original.shape).copy_(original)
    # and positions matter: the shard read at 0 .. T/2 - 1 (an arange, not its own) computes other rows
    wrong, _ = model(idx[:, _head_tail_indices(SEQ, 2, 1)])
    assert not torch.allclose(wrong, full[:, _head_tail_indices(SEQ, 2, 1)], atol=1e-3)


def _cp_ranks(rank, world, meet, out):
    from accel_kit.engine.eager import point_batches
    from accel_kit.engine.parallel import parallel_trainer
    from accel_kit.engine.step import Trainer, optim_for_point
    from accel_kit.models import build_model, family_of

    torch.set_num_threads(1)
    _patch_attention(setattr)  # in this spawned process only
    os.environ.update(meet)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results, trained = {}, []
    for preset in PRESETS:
        point = _point(preset, gas=2)  # two micro-batches a step: the positions are put back between them
        overrides = {"seq_len": SEQ} | ({"vocab_size": VOCAB[preset]} if VOCAB[preset] else {})

        def model(preset=preset, overrides=overrides):  # this family's, also once the loop has moved on
            torch.manual_seed(0)
            return build_model(preset, **overrides)

        results[preset] = {}
        # engine ddp (the gradients all-reduced over dp x cp) for both; FSDP over the flattened dp x cp mesh
        # for GPT-2's
        for engine in ("ddp", "fsdp") if preset == "gpt2-debug" else ("ddp",):
            cp_model, lengths = model(), []
            vocab = cp_model.lm_head.out_features
            # what the model is given: the rank's shard, T / cp tokens (not the whole sequence, which would
            # train as one process too)
            cp_model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
            layout = point.model_copy(update={"engine": engine})
            trainer = parallel_trainer(layout, cp_model, point_batches(point, vocab, data_rank(point, rank)),
                                       torch.device("cpu"), optim_for_point(point), family_of(preset))
            results[preset][engine] = {
                "losses": [trainer.step() for _ in range(STEPS)], "lengths": lengths,
                "positions_restored": all(t.shape[d] == SEQ for t, d in trainer.position_buffers)}
        trained.append((preset, point, model, vocab))
    del trainer, cp_model  # the reducer lets go of the group first (worker.end_group says why)
    end_group()
    # one process on the whole sequence, the reference: each rank trains one family's, side by side
    preset, point, model, vocab = trained[rank]
    single = Trainer(model(), iter(point_batches(point, vocab, 0)), torch.device("cpu"), "fp32", point.gas,
                     optim_for_point(point))
    results[preset]["single"] = [single.step() for _ in range(STEPS)]
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)


@pytest.mark.slow
def test_the_trainer_under_torchs_context_parallel_trains_as_one_process(tmp_path):
    out = tmp_path / "results.json"
    with rendezvous(1) as [meet]:
        spawn(_cp_ranks, (2, meet, str(out)), 2)
    ranks = [json.loads((tmp_path / f"results.json.{rank}").read_text()) for rank in range(2)]
    results = {preset: ranks[0][preset] | {"single": ranks[rank][preset]["single"]}
               for rank, preset in enumerate(PRESETS)}
    for preset in PRESETS:
        single = results[preset]["single"]
        for engine in ("ddp", "fsdp") if preset == "gpt2-debug" else ("ddp",):
            cp = results[preset][engine]
            assert cp["lengths"] == [SEQ // 2] * (STEPS * 2)  # every micro-batch sharded
            assert cp["positions_restored"]
            # fp32, the same weights and data: each shard's loss mean and the gradients' dp x cp average are
            # the whole sequence's up to summation order (~1e-7 relative); the bar of 1e-4 is the margin
            assert len(cp["losses"]) == len(single) == STEPS
            for step, (a, b) in enumerate(zip(cp["losses"], single)):
                assert abs(a - b) / abs(b) < 1e-4, f"{preset} {engine} step {step}: cp 2 {a}, one process {b}"
