"""A training point's parallel layout, checked before anything runs: data x tensor x pipeline x context parallel,
and expert parallel within the data-parallel ranks.

The devices split as ``pp`` pipeline stages x ``dp`` data-parallel replicas x ``cp`` context-parallel
ranks x ``tp`` tensor-parallel ranks, dp = devices / (tp x pp x cp); a MoE model's routed experts may
be sharded over ``ep`` of the dp ranks (ep divides dp; ``accel_kit.models.moe.parallel``). What the model allows is the
family's to say (its shape's heads and key/value heads, its blocks, whether it has a tensor-parallel
plan, whether its positions can be sharded), checked here; the arithmetic, and what the engine here has built
whatever the model, is the layout's own (``accel_kit.mesh.ParallelLayout.validate_layout``). Every
refusal is one ``ParameterError`` line (the CLI's exit status 2); what depends on the device (whether
its attention kernels take context parallelism) is the adapter's answer, an ``unsupported`` record.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from accel_kit.engine.point import TrainSpec
from accel_kit.errors import ParameterError

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter


def data_rank(point: TrainSpec, rank: int) -> int:
    """Which share of the data ``rank`` trains on: its place along ``dp``. The ranks of one tensor-parallel
    group, of one context-parallel group (each then takes its shard of the sequence) and of one pipeline
    compute on the same micro-batch."""
    return (rank // (point.tp * point.cp)) % point.dp


def stage_blocks(n_blocks: int, pp: int) -> list[range]:
    """The blocks each of ``pp`` pipeline stages runs, in order: ``n_blocks // pp`` each, the first
    ``n_blocks % pp`` stages one more. The remainder goes first because the last stage also computes the
    output projection and the loss (with a 50k-128k vocabulary, a block's worth or more), as the IPU
    adapter spreads its blocks."""
    sizes = [n_blocks // pp + (1 if stage < n_blocks % pp else 0) for stage in range(pp)]
    starts = [sum(sizes[:stage]) for stage in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def check_layout(point: TrainSpec) -> None:
    """Refuse a layout that does not divide, that the model's shape does not allow, or that is not built:
    ``accel-kit run``'s check of every training point, and ``accel-kit predict``'s of what it predicts.

    Raises:
        ParameterError: the first problem, in one line.
    """
    point.validate_layout()  # the layout's own arithmetic and what the engine builds, whatever the model
    if point.cp > 1:
        check_context_parallel(point)
    if point.ep > 1:
        check_expert_parallel(point)
    if point.tp * point.pp > 1:
        _check_shape(point)
    sharded = point.engine == "fsdp" or point.tp * point.pp * point.ep > 1
    if sharded and point.precision == "fp16":
        raise ParameterError("fp16 under fsdp, tp, pp or ep needs a sharded gradient scaler, not built here; "
                             "use bf16 or fp32")
    if sharded and (point.sparsity > 0 or point.torch_compile):
        raise ParameterError("weight sparsity and torch_compile are not built for engine fsdp, tp, pp or ep here")


def _check_shape(point: TrainSpec) -> None:
    from accel_kit.models import family_of, get_config

    cfg = get_config(point.preset, **({"vocab_size": point.vocab_size} if point.vocab_size else {}))
    family, shape = family_of(cfg), family_of(cfg).shape(cfg)
    tp, pp = point.tp, point.pp
    if tp > 1:
        if not family.tensor_parallel:
            raise ParameterError(f"the {family.name} family has no tensor-parallel plan; use tp 1")
        for what, count in (("heads", shape.n_heads), ("key/value heads", shape.n_kv_heads),
                            ("MLP width", shape.ffn_hidden_size)):
            if count % tp:
                raise ParameterError(f"tp {tp} does not divide the {count} {what} of {point.preset}")
    if pp > 1:
        if not family.pipeline_parallel:
            raise ParameterError(f"the {family.name} family's models do not split into pipeline stages here; use pp 1")
        if pp > shape.n_layers:
            raise ParameterError(f"pp {pp} is more stages than the {shape.n_layers} blocks of {point.preset}")


def check_context_parallel(point: TrainSpec) -> None:
    """Refuse a context-parallel layout (cp above 1) that torch's ``context_parallel`` or the engine here
    cannot take; whether the device can is ``unsupported_on_device``'s.

    Raises:
        ParameterError: the first problem, in one line.
    """
    from accel_kit.models import family_of

    cp = point.cp
    if point.seq_len % (2 * cp):
        # torch's load balancing cuts the sequence into 2 x cp chunks and gives rank r chunks r and
        # 2cp - 1 - r, so every rank holds as much of the causal mask as the others.
        raise ParameterError(f"seq_len {point.seq_len} does not split into 2 x cp = {2 * cp} equal chunks "
                             "(torch's load-balanced context-parallel sharding)")
    if point.attention_kernel == "math":
        raise ParameterError("cp needs a fused attention kernel: torch's context_parallel shards the flash, "
                             "memory-efficient and cuDNN SDPA kernels only; use attention_kernel auto, flash "
                             "or efficient")
    if point.sparsity > 0 or point.torch_compile:
        raise ParameterError("weight sparsity and torch_compile are not built for cp here")
    family = family_of(point.preset)
    if not family.context_parallel:
        raise ParameterError(f"the {family.name} family's model does not take its positions as buffers that "
                             "context parallelism can shard; use cp 1")


def check_expert_parallel(point: TrainSpec) -> None:
    """Refuse an expert-parallel layout (ep above 1) that the model or the engine here cannot take.

    Raises:
        ParameterError: the first problem, in one line.
    """
    from accel_kit.models import family_of, get_config

    ep = point.ep
    cfg = get_config(point.preset, **({"vocab_size": point.vocab_size} if point.vocab_size else {}))
    family, shape = family_of(cfg), family_of(cfg).shape(cfg)
    if not shape.n_experts:
        raise ParameterError(f"{point.preset} is a dense model: ep shards a mixture-of-experts model's experts; "
                             "use ep 1")
    if not family.expert_parallel:
        raise ParameterError(f"the {family.name} family has no expert-parallel plan; use ep 1")
    if shape.experts_per_token > shape.n_experts:
        raise ParameterError(f"top-k {shape.experts_per_token} is more experts than the {shape.n_experts} "
                             f"of {point.preset}")
    if shape.n_experts % ep:
        raise ParameterError(f"ep {ep} does not divide the {shape.n_experts} experts of {point.preset}")


def unsupported_on_device(point: TrainSpec, adapter: BaseAdapter) -> str | None:
    """Why the device cannot run the point's layout (recorded as ``unsupported`` before anything is
    allocated); None if it can. Context parallelism: the adapter's ``unsupported_context_parallel``; expert
    parallelism: the engine's own (all-to-alls over torch.distributed), so not where the programming model
    maps a point's layout itself (``engine_layouts``)."""
    if point.cp > 1:
        return adapter.unsupported_context_parallel()
    if point.ep > 1 and not adapter.engine_layouts():
        return (f"ep {point.ep}: expert parallelism is the engine's (all-to-alls through torch.distributed), and "
                f"adapter {adapter.name!r} lays a point out itself")
    return None
