"""Random initialisation by parameter name, drawn where the model lives (issue 40; torchtitan's way).

A model is made on the meta device (shapes only: no memory, no draws), allocated where it runs in the
precision it runs in (``to_empty``; a sharded model allocates only its rank's shards), its non-parameter
buffers computed there (``reset_buffers``), then each parameter drawn by its family's rule (``InitRule``:
parameter name -> ``Init``). Every parameter draws from a generator of its own, seeded from one seed and its
name, so its values depend neither on the order parameters are drawn in, nor on the threads drawing them, nor
on how the model is laid out: a sharded rank draws a parameter's whole tensor (one at a time) and keeps its
slice, which holds the values one process's model holds there.

The one seed is drawn from torch's default generator (``draw_seed``): ``torch.manual_seed(s)`` before a build
still decides its weights. The draws are fp32 in fixed chunks of ``CHUNK`` elements, cast into a 16-bit
parameter: a bf16 build holds the fp32 build's weights rounded to bf16 (and torch's CPU normal_ is vectorised
for fp32 only: 2x the bf16 rate). A small thread pool draws several parameters at once (torch's ops release
the GIL); a chunk's draw is one thread's.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

CHUNK = 1 << 22  # elements per fp32 draw: 16 MB of scratch per thread for a 16-bit parameter
DRAW_DTYPE = torch.float32


@dataclass(frozen=True)
class Init:
    """How one parameter starts: N(0, std^2) where ``std`` > 0, else every element ``fill``."""

    std: float = 0.0
    fill: float = 0.0


ONES, ZEROS = Init(fill=1.0), Init(fill=0.0)
InitRule = Callable[[str], Init]  # a parameter's qualified name (as named_parameters gives it) -> its Init


def draw_seed() -> int:
    """One draw from torch's default (CPU) generator: the seed of every parameter's own generator."""
    return int(torch.randint(0, 2**62, (), device="cpu").item())


def parameter_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for parameter ``name`` (the same in every process and Python version)."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def reset_buffers(module: nn.Module) -> None:
    """Compute the non-parameter buffers after ``to_empty`` (a non-persistent buffer loads from nowhere): a module
    with a ``reset_buffers`` method computes its own and its children's, others hand on to their children."""
    reset = getattr(module, "reset_buffers", None)
    if reset is not None:
        reset()
        return
    for child in module.children():
        reset_buffers(child)


def allocate(model: nn.Module, device: torch.device | str) -> nn.Module:
    """A meta-device model's tensors made on ``device`` (in their dtypes; a sharded parameter's local shard
    only), its buffers computed, its parameters not yet written."""
    # swapped in place, not replaced by new Parameter objects: a parameter two modules hold (a tied embedding and
    # output projection) stays one
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    with torch.no_grad():
        reset_buffers(model)
    return model


def allocated(make: Callable[[], nn.Module], device: torch.device | str) -> nn.Module:
    """``make()``'s module made on the meta device and allocated on ``device``, its buffers computed, its parameters
    not written: for a model whose weights are copied in at once (a conversion)."""
    with torch.device("meta"):
        model = make()
    return allocate(model, device)


def _fill(flat: torch.Tensor, init: Init, generator: torch.Generator) -> None:
    """``flat`` (1-D, contiguous) drawn in fp32 chunks of ``CHUNK`` from ``generator``, cast where it is not fp32."""
    if not init.std:
        flat.fill_(init.fill)
        return
    scratch = None if flat.dtype == DRAW_DTYPE else torch.empty(min(CHUNK, flat.numel()), dtype=DRAW_DTYPE,
                                                                 device=flat.device)
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start:start + CHUNK]
        if scratch is None:
            part.normal_(0.0, init.std, generator=generator)
        else:
            part.copy_(scratch[:part.numel()].normal_(0.0, init.std, generator=generator))


def _is_dtensor(param: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch before 2.5 (the Cerebras environment's 2.4): no public DTensor, nothing sharded
        return False
    return isinstance(param, DTensor)


@torch.no_grad()  # grad mode is per thread: each pool thread's draws need it off
def _draw(model: nn.Module, name: str, param: torch.Tensor, init: Init, seed: int) -> None:
    """Parameter ``name`` drawn whole from its own generator; a sharded one (DTensor) keeps its local slice, and a
    module that reordered the rows of its parameters for a layout (``init_layout``) gets them in that order."""
    sharded = _is_dtensor(param)
    local = param.to_local() if sharded else param
    owner = model.get_submodule(name.rpartition(".")[0])
    layout = getattr(owner, "init_layout", None)
    generator = torch.Generator(device=local.device).manual_seed(parameter_seed(seed, name))
    if not sharded and layout is None:
        _fill(param.view(-1), init, generator)
        return
    full = torch.empty(param.shape, dtype=param.dtype, device=local.device)
    _fill(full.view(-1), init, generator)
    if layout is not None:
        full = layout(full)
    if sharded:  # each rank cuts its own slice of the same whole tensor: no communication
        from torch.distributed.tensor import distribute_tensor

        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(full)


def init_parameters(model: nn.Module, rule: InitRule, seed: int, *, threads: int | None = None) -> None:
    """Every parameter of ``model`` (a tied one once, under its first name) drawn by ``rule`` from ``seed``, the
    largest first, on ``threads`` threads (torch's intra-op threads by default)."""
    params = sorted(model.named_parameters(), key=lambda item: -item[1].numel())
    with ThreadPoolExecutor(max_workers=threads or torch.get_num_threads()) as pool:
        list(pool.map(lambda item: _draw(model, item[0], item[1], rule(item[0]), seed), params))


def initialised(make: Callable[[], nn.Module], rule: InitRule) -> nn.Module:
    """``make()``'s module on the current default device in the default dtype, initialised by ``rule`` from a
    seed drawn now; on the meta device, the shape alone (nothing drawn, the default generator untouched)."""
    device = torch.get_default_device()
    with torch.device("meta"):
        model = make()
    if device == torch.device("meta"):
        return model
    init_parameters(allocate(model, device), rule, draw_seed())
    return model


def transformers_uninitialised(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()``'s transformers module made without random draws (transformers' ``no_init_weights``: torch's init
    functions and its own ``init_weights`` skipped), for a model whose weights are copied in at once; its buffers
    are computed, and a model's tied weights tied (which ``init_weights`` would have done)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():
        model = make()
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model
