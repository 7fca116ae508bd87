"""A training point's parallel layout, checked before anything runs: data x tensor x pipeline x context parallel,
and expert parallel within the data-parallel ranks.

The devices split as ``pp`` pipeline stages x ``dp`` data-parallel replicas x ``cp`` context-parallel
ranks x ``tp`` tensor-parallel ranks, dp = devices / (tp x pp x cp); a MoE model's routed experts may
be sharded over ``ep`` of the dp ranks (ep divides dp; ``accel_kit.models.moe.parallel``). What the model allows is the
family's to say (its shape's heads and key/value heads, its blocks, whether it has a tensor-parallel
plan, whether its positions can be sharded); what the engine here has built is this module's. Every
refusal is one ``ParameterError`` line (the CLI's exit status 2); what depends on the device (whether
its attention kernels take context parallelism) is the adapter's answer, an ``unsupported`` record.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from accel_kit.errors import ParameterError
from accel_kit.mesh import MESH_DIMS, mesh_label

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter
    from accel_kit.engine.point import TrainPoint


def mesh_sizes(point: TrainPoint) -> tuple[int, ...]:
    """The mesh's size along each of ``MESH_DIMS``."""
    return point.pp, point.data_parallel_size, point.cp, point.tp


def mesh_text(point: TrainPoint) -> str:
    """The layout as a record shows it: ``pp 1 x dp 2 x cp 1 x tp 1``."""
    return mesh_label(ep=point.ep, **dict(zip(MESH_DIMS, mesh_sizes(point))))


def data_rank(point: TrainPoint, rank: int) -> int:
    """Which share of the data ``rank`` trains on: its place along ``dp``. The ranks of one tensor-parallel
    group, of one context-parallel group (each then takes its shard of the sequence) and of one pipeline
    compute on the same micro-batch."""
    return (rank // (point.tp * point.cp)) % point.data_parallel_size


def stage_blocks(n_blocks: int, pp: int) -> list[range]:
    """The blocks each of ``pp`` pipeline stages runs, in order: ``n_blocks // pp`` each, the first
    ``n_blocks % pp`` stages one more. The remainder goes first because the last stage also computes the
    output projection and the loss (with a 50k-128k vocabulary, a block's worth or more), as the IPU
    adapter spreads its blocks."""
    sizes = [n_blocks // pp + (1 if stage < n_blocks % pp else 0) for stage in range(pp)]
    starts = [sum(sizes[:stage]) for stage in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def check_layout(point: TrainPoint) -> None:
    """Refuse a layout that does not divide, that the model's shape does not allow, or that is not built.

    Raises:
        ParameterError: the first problem, in one line.
    """
    tp, pp, cp, devices = point.tp, point.pp, point.cp, point.replicas or point.devices
    if devices % (tp * pp * cp):
        raise ParameterError(f"{devices} devices do not split into tp {tp} x pp {pp} x cp {cp} "
                             f"(dp = devices / (tp x pp x cp) must be a whole number)")
    if cp > 1:
        check_context_parallel(point)
    if point.ep > 1:
        check_expert_parallel(point)
    if tp * pp == 1:
        _check_engine(point)
        return
    if point.engine == "deepspeed":
        raise ParameterError(f"engine deepspeed runs data parallelism only here (tp {tp}, pp {pp}); "
                             "use engine ddp or fsdp")
    _check_shape(point)
    _check_engine(point)


def _check_shape(point: TrainPoint) -> None:
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
        if point.micro_batch_size % point.microbatches:
            raise ParameterError(f"micro_batch_size {point.micro_batch_size} does not split into "
                                 f"pp_microbatches {point.microbatches}")


def _check_engine(point: TrainPoint) -> None:
    # Pipeline stages train under engine ddp: their gradients averaged over dp after each step
    # (accel_kit.engine.pipeline). FSDP2 inside a stage and a tensor-parallel stage are not built.
    if point.pp > 1 and point.engine == "fsdp":
        raise ParameterError("engine fsdp with pp above 1 is not built here; use engine ddp with pp")
    if point.pp > 1 and point.tp > 1:
        raise ParameterError("tp and pp together are not built here; use one of them")
    if point.pp_microbatches is not None and point.pp == 1:
        raise ParameterError("pp_microbatches needs pp above 1")
    if point.pp > 1 and point.pp_schedule == "1f1b" and point.microbatches < point.pp:
        # torch's Schedule1F1B: its warm-up runs one forward per later stage before the first backward
        raise ParameterError(f"pp_schedule 1f1b needs pp_microbatches of at least pp {point.pp}, "
                             f"got {point.microbatches}")
    sharded = point.engine == "fsdp" or point.tp * point.pp * point.ep > 1
    if sharded and point.precision == "fp16":
        raise ParameterError("fp16 under fsdp, tp, pp or ep needs a sharded gradient scaler, not built here; "
                             "use bf16 or fp32")
    if sharded and (point.sparsity > 0 or point.torch_compile):
        raise ParameterError("weight sparsity and torch_compile are not built for engine fsdp, tp, pp or ep here")


def check_context_parallel(point: TrainPoint) -> None:
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
    if point.engine == "deepspeed":
        raise ParameterError(f"engine deepspeed runs data parallelism only here (cp {cp}); use engine ddp or fsdp")
    if point.pp > 1:
        raise ParameterError("cp and pp together are not built here; use one of them")
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


def check_expert_parallel(point: TrainPoint) -> None:
    """Refuse an expert-parallel layout (ep above 1) that the model or the engine here cannot take.

    Raises:
        ParameterError: the first problem, in one line.
    """
    from accel_kit.models import family_of, get_config

    ep, dp = point.ep, point.data_parallel_size
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
    if dp % ep:
        raise ParameterError(f"ep {ep} does not divide dp {dp}: the expert-parallel ranks are carved out of the "
                             "data-parallel ones (dp = devices / (tp x pp x cp))")
    if point.engine == "deepspeed":
        raise ParameterError(f"engine deepspeed runs data parallelism only here (ep {ep}); use engine ddp or fsdp")
    for other, degree in (("pp", point.pp), ("cp", point.cp)):
        if degree > 1:
            raise ParameterError(f"ep and {other} together are not built here; use one of them")


def unsupported_on_device(point: TrainPoint, adapter: BaseAdapter) -> str | None:
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
