"""Pipeline parallelism (issue 21): the stage split, and GPipe, 1F1B and pipeline x data parallel training
as one process (and DDP) do, for both families; and tensor x data parallel (tp 2 x dp 2) as DDP does.

The multi-process test runs the worker's own ``run_point`` in four spawned gloo processes on the CPU,
fp32: first two pipelines of two side by side (ranks 0-1 GPT-2's points, ranks 2-3 Llama's, each pair a
process group of its own), then the four together for pp 2 x dp 2 and, last, tp 2 x dp 2.
"""
import copy
import json
import os

import pytest
import torch
import torch.distributed as dist

from accel_kit.engine.layout import check_layout, stage_blocks
from accel_kit.engine.pipeline import split_stage, tied_parameters
from accel_kit.errors import ParameterError
from accel_kit.models import family_of, get_config
from accel_kit.models.gpt2.model import GPTConfig
from accel_kit.engine.worker import end_group
from ranks import rendezvous, spawn
from test_parallel import SEQ, VOCAB, _assert_same_losses, _losses, _point

PRESETS = ("gpt2-debug", "llama3-debug")


def test_blocks_split_evenly_the_first_stages_taking_the_remainder():
    assert stage_blocks(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_blocks(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert stage_blocks(2, 2) == [range(0, 1), range(1, 2)]


@pytest.mark.parametrize("preset, pp", [("gpt2-debug", 2), ("llama3-debug", 2), ("gpt2-5-blocks", 3)])
def test_the_stages_chained_compute_the_model(preset, pp):
    if preset == "gpt2-5-blocks":  # a middle stage needs three blocks or more; the debug presets have two
        cfg = GPTConfig(n_layers=5, n_heads=4, hidden_size=32, vocab_size=97, seq_len=SEQ)
    else:
        cfg = get_config(preset, **({"vocab_size": VOCAB[preset]} if VOCAB[preset] else {}))
    family = family_of(cfg)
    torch.manual_seed(0)
    model = family.build(cfg)
    idx = torch.randint(0, 97, (2, SEQ))
    expected, _ = model(idx)
    # both families tie the output projection to the embedding: one parameter, found by identity
    tied = tied_parameters(model, family)
    assert len(tied) == 1 and tied[0].dim() == 2
    stages = [split_stage(copy.deepcopy(model), family, stage, pp) for stage in range(pp)]
    parts = family.pipeline_stages(model)
    blocks = [len(getattr(stage.model, parts.blocks)) for stage in stages]
    assert blocks == [len(r) for r in stage_blocks(len(getattr(model, parts.blocks)), pp)]
    # the first stage alone holds the embedding, the last alone the head; each keeps one copy of the tied weight
    assert [getattr(s.model, parts.embedding[0]) is not None for s in stages] == [True] + [False] * (pp - 1)
    assert [getattr(s.model, parts.head[-1]) is not None for s in stages] == [False] * (pp - 1) + [True]
    assert sum(p.numel() for s in stages for p in s.parameters()) == \
        sum(p.numel() for p in model.parameters()) + tied[0].numel()
    x = idx
    for stage in stages:
        x = stage(x)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)  # the same operations in the same order


@pytest.mark.parametrize("fields, message", [
    ({"devices": 2, "pp": 2, "engine": "fsdp"}, "engine fsdp with pp above 1 is not built"),
    ({"devices": 4, "pp": 2, "tp": 2}, "tp and pp together are not built"),
    ({"devices": 2, "pp": 2, "pp_microbatches": 3}, "micro_batch_size 4 does not split into pp_microbatches 3"),
    ({"devices": 2, "pp": 2, "pp_schedule": "1f1b", "pp_microbatches": 1},
     "pp_schedule 1f1b needs pp_microbatches of at least pp 2, got 1"),
    ({"devices": 2, "pp": 2, "precision": "fp16"}, "fp16 under fsdp, tp, pp or ep"),
])
def test_pipeline_layouts_not_built_answer_in_one_line(fields, message):
    with pytest.raises(ParameterError, match=message):
        check_layout(_point(**fields))


def test_pipeline_layouts_pass():
    for fields in ({"devices": 2, "pp": 2}, {"devices": 4, "pp": 2, "pp_schedule": "1f1b", "pp_microbatches": 4},
                   {"preset": "llama3-debug", "devices": 2, "pp": 2, "gas": 2}):
        check_layout(_point(**fields))
    assert _point(devices=4, pp=2).dp == 2


_GRAD_NORMS: list[float] = []  # this process's, appended to by the trainers _record_grad_norms patches


def _record_grad_norms() -> None:
    """Append the global gradient norm clipping uses at each step to ``_GRAD_NORMS`` (one process's, DDP's, a
    pipeline's): the losses cannot show a wrong one, since AdamW's update hardly changes when every
    gradient is scaled alike. Patches once per process."""
    from accel_kit.engine.pipeline import PipelineTrainer
    from accel_kit.engine.step import Trainer

    if getattr(Trainer.clip_gradients, "records", False):
        return
    pipeline_norm = PipelineTrainer.squared_grad_norm

    def clip(self, params, max_norm):
        _GRAD_NORMS.append(torch.nn.utils.clip_grad_norm_(params, max_norm).item())

    def squared(self, params):
        squares = pipeline_norm(self, params)
        _GRAD_NORMS.append(squares.sqrt().item())
        return squares

    clip.records = True
    Trainer.clip_gradients, PipelineTrainer.squared_grad_norm = clip, squared


def _run(point, *args) -> dict:
    """``run_point``'s result with the gradient norms its steps clipped with (``_record_grad_norms``)."""
    from accel_kit.engine.worker import run_point

    _record_grad_norms()
    start = len(_GRAD_NORMS)
    result = run_point(point, *args)
    return result.model_dump() | {"grad_norms": _GRAD_NORMS[start:]}


def _groups(rank, jobs, out_dir):
    """Run this rank's jobs, each ``(point, rendezvous, rank in its group, group size)``, in order; a group's rank 0
    writes its results (as the worker's rank 0 writes the record)."""
    torch.set_num_threads(1)
    results = []
    for index, (point, meet, group_rank, size) in enumerate(jobs[rank]):
        os.environ.update(meet)
        result = _run(point, group_rank, size, group_rank)
        end_group()
        if group_rank == 0:
            results.append([index, result])
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(results, f, default=str)


@pytest.mark.slow
def test_pipelines_train_as_one_process_and_ddp(tmp_path, monkeypatch):
    from accel_kit.engine.pipeline import PipelineTrainer
    from accel_kit.engine.step import Trainer

    torch.set_num_threads(1)
    for cls, name in ((Trainer, "clip_gradients"), (PipelineTrainer, "squared_grad_norm")):
        monkeypatch.setattr(cls, name, getattr(cls, name))  # put back after the test (_record_grad_norms)
    single = {(preset, gas): _run(_point(preset, gas=gas), 0, 1, 0) for preset in PRESETS for gas in (1, 2)}
    # gpipe; 1f1b over 4 chunks a micro-batch and 2 micro-batches a step; DDP at dp 2 (pp 2 x dp 2's reference)
    pairs = {preset: [_point(preset, 2, pp=2), _point(preset, 2, pp=2, pp_schedule="1f1b", pp_microbatches=4, gas=2),
                      _point(preset, 2)] for preset in PRESETS}
    fours = {preset: _point(preset, 4, pp=2) for preset in PRESETS}
    groups = []  # (point, the ranks of its group), in each rank's order
    for first, preset in zip((0, 2), PRESETS):  # two pipelines side by side, each in a group of its own
        groups += [(point, [first, first + 1]) for point in pairs[preset]]
    # ... then tensor x data parallel, tp 2 x dp 2 under ddp, last: in torch 2.13's gloo a process group
    # started after a tensor-parallel one's teardown aborts (the worker never meets this: each point has
    # processes of its own), so it is one point, Llama's (GQA: its key/value heads sharded too); GPT-2's
    # tensor parallelism is tested at dp 1 in tests/test_parallel.py.
    tp_dp = _point(PRESETS[1], 4, tp=2)
    groups += [(point, [0, 1, 2, 3]) for point in [fours[preset] for preset in PRESETS] + [tp_dp]]
    with rendezvous(len(groups)) as meets:
        jobs: list[list] = [[] for _ in range(4)]
        for (point, members), meet in zip(groups, meets):
            for group_rank, rank in enumerate(members):
                jobs[rank].append((point, meet, group_rank, len(members)))
        spawn(_groups, (jobs, str(tmp_path)), 4)
    results = {}
    for rank in (0, 2):
        for index, result in json.loads((tmp_path / f"{rank}.json").read_text()):
            results[(rank, index)] = result
    for first, preset in zip((0, 2), PRESETS):
        gpipe, one_f_one_b, ddp = (results[(first, i)] for i in range(3))
        four = results[(0, 3 + PRESETS.index(preset))]
        # pp 2 x dp 2 trains on dp 2's data: DDP at dp 2 is its one-pipeline reference (rank 0's replica's
        # losses, as recorded)
        for run, reference, what in ((gpipe, single[(preset, 1)], "pp 2 gpipe against one process"),
                                     (one_f_one_b, single[(preset, 2)], "pp 2 1f1b gas 2 against one process"),
                                     (four, ddp, "pp 2 x dp 2 against ddp at dp 2")):
            _assert_same_losses(_losses(run), _losses(reference), f"{preset} {what}")
            _assert_same_losses(run["grad_norms"], reference["grad_norms"], f"{preset} {what}: gradient norms")
        assert [(r["metrics"]["dp"], r["metrics"]["mesh"]) for r in (gpipe, four)] == [
            (1, "pp 2 x dp 1 x cp 1 x tp 1"), (2, "pp 2 x dp 2 x cp 1 x tp 1")]
    tp_dp, llama_ddp = results[(0, 3 + len(PRESETS))], results[(2, 2)]
    _assert_same_losses(_losses(tp_dp), _losses(llama_ddp), "llama tp 2 x dp 2 against ddp at dp 2")
    assert (tp_dp["metrics"]["dp"], tp_dp["metrics"]["mesh"]) == (2, "pp 1 x dp 2 x cp 1 x tp 2")
    # The gradient reductions the engine issues itself are timed (its dp all-reduce under ddp with tp, a
    # pipeline's tied-weight sum); DDP's own overlap its backward and are not.
    for run in (tp_dp, results[(0, 0)]):
        assert 0 < run["metrics"]["grad_sync_s"] and 0 < run["metrics"]["grad_sync_pct"] < 100, run["metrics"]
    assert "grad_sync_s" not in llama_ddp["metrics"]
