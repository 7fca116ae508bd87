"""The model families, one line each, and the lookups every caller uses: a preset's family and config.

Adding a family: its folder under ``accel_kit/models/`` (see ``docs/model-families.md``) and one
line in ``FAMILIES``. Preset names are unique across families. A family whose presets are files
(``hf:PATH``, any transformers causal LM) is in ``FILE_FAMILIES``, by the prefix that names it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from accel_kit.errors import ParameterError
from accel_kit.models.family import Family
from accel_kit.models.gpt2 import FAMILY as GPT2
from accel_kit.models.hf import FAMILY as HF
from accel_kit.models.init import allocate, draw_seed, init_parameters
from accel_kit.models.llama import FAMILY as LLAMA
from accel_kit.models.moe import FAMILY as MOE

FAMILIES: dict[str, Family] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "moe": MOE,
}
# prefix -> family: "hf:path/to/config.json" (no named presets; transformers imported only when one is used)
FILE_FAMILIES: dict[str, Family] = {HF.prefix: HF}


def _presets() -> dict[str, tuple[Family, object]]:
    table: dict[str, tuple[Family, object]] = {}
    for family in FAMILIES.values():
        for name, cfg in family.presets.items():
            if name in table:
                raise RuntimeError(f"preset {name!r} is in two families: {table[name][0].name} and {family.name}")
            table[name] = (family, cfg)
    return table


_TABLE = _presets()
PRESETS: dict[str, object] = {name: cfg for name, (_, cfg) in _TABLE.items()}  # every family's, in family order


def family_of(preset_or_config: str | object) -> Family:
    """The family of a preset name, or of a config (by its type)."""
    if isinstance(preset_or_config, str):
        # a file preset's family by its prefix alone: its file is read where its config is asked for
        return _file_family(preset_or_config) or _entry(preset_or_config)[0]
    for family in _all_families():
        if isinstance(preset_or_config, family.config_type):
            return family
    raise TypeError(f"{type(preset_or_config).__name__} is the config of no registered model family")


def _all_families() -> list[Family]:
    return list(FAMILIES.values()) + list(FILE_FAMILIES.values())


def _file_family(preset: str) -> Family | None:
    return next((f for prefix, f in FILE_FAMILIES.items() if preset.startswith(prefix)), None)


def family_of_model(model: nn.Module) -> Family:
    """The family of a built model, found through any wrapper (DDP, FSDP, torch.compile): the module that
    holds a registered family's config as ``cfg``."""
    for module in model.modules():
        cfg = getattr(module, "cfg", None)
        if cfg is not None and any(isinstance(cfg, f.config_type) for f in _all_families()):
            return family_of(cfg)
    raise TypeError(f"{type(model).__name__} holds no model of a registered family (no .cfg of one)")


def _entry(preset: str) -> tuple[Family, object]:
    """The family and base config of a preset name, or of a file preset (its file read and checked)."""
    family = _file_family(preset)
    if family is not None:
        return family, family.load(preset)
    try:
        return _TABLE[preset]
    except KeyError:
        raise ParameterError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}, "
                             f"or {', '.join(p + 'PATH' for p in FILE_FAMILIES)} (a config.json)") from None


def preset_digest(preset: str) -> str | None:
    """A digest of the file a file preset (``hf:PATH``) names, None for a named preset: what a resume key
    holds besides the preset's name, so that a changed file is a new point."""
    family = _file_family(preset)
    return family.digest(preset) if family is not None else None


def check_preset(preset: str, where: str = "preset") -> None:
    """A one-line ParameterError naming parameter ``where`` when ``preset`` is no preset (a file preset's
    file is read and its shape checked)."""
    try:
        _entry(preset)
    except ParameterError as exc:
        raise ParameterError(f"parameter {where!r}: {exc}") from None


def get_config(preset: str, **overrides: object) -> object:
    """The preset's config with ``overrides`` (those its family allows; None leaves a field as it is)."""
    family, cfg = _entry(preset)
    return family.with_overrides(cfg, **overrides)


@contextmanager
def building_on(device: torch.device | str, dtype: torch.dtype = torch.float32) -> Iterator[None]:
    """Tensors created inside are made on ``device``, floating ones in ``dtype`` (the default dtype, restored
    after): a model built inside is built where it runs, in the precision it runs in.

    Why not build on the host and ``.to(device, dtype)``: that allocates the whole model on the host in
    fp32 first (Llama 3.1 8B: 32 GB, over 80 s on an H200's host, against 0.4 s built on the GPU) and then
    a second copy. Built here, a family's model is made on the meta device, each parameter allocated once,
    on the device, in ``dtype``, and drawn there by name (``accel_kit.models.init``); a transformers model
    (the ``hf`` family, a reference) is made here as transformers makes it.

    What a family computes in fp32 on purpose (RoPE tables: ``rope_tables`` asks for fp32 explicitly) stays
    fp32, where ``.to(dtype)`` would have cast it; the model casts the tables to the activations' dtype at
    use, so the values it computes with are the same. Parameters (RMSNorm's ones included) are in ``dtype``.
    The draws are fp32 whatever ``dtype``: a 16-bit build holds the same seed's fp32 build rounded.

    The default dtype is process-wide: nothing else should create tensors on another thread meanwhile
    (a point's worker builds its model on its one thread; the draws' pool threads create none).
    """
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def materialize(preset_or_config: str | object, *, device: torch.device | str, dtype: torch.dtype = torch.float32,
                activation_checkpointing: bool = False, **overrides: object) -> nn.Module:
    """A preset's (or a config's) model built on ``device`` in ``dtype``, randomly initialised as its family does
    (seed the generator first): no host copy, no fp32 copy of a 16-bit model (``building_on``).

    A training point whose precision keeps fp32 weights (fp32, fp16 under autocast, bf16's master weights,
    FSDP's and DeepSpeed's mixed precision) asks for fp32 here and casts afterwards as it trains; inference
    and the microbenchmark ask for their compute dtype."""
    cfg = _config(preset_or_config, overrides)
    with building_on(device, dtype):
        return family_of(cfg).build(cfg, activation_checkpointing=activation_checkpointing)


def _config(preset_or_config: str | object, overrides: dict[str, object]) -> object:
    return get_config(preset_or_config, **overrides) if isinstance(preset_or_config, str) else preset_or_config


def build_model(preset: str, *, activation_checkpointing: bool = False, device: torch.device | str | None = None,
                dtype: torch.dtype = torch.float32, **overrides: object) -> nn.Module:
    """Instantiate a preset, randomly initialised as its family does, on ``device`` (the host by default) in
    ``dtype`` (``materialize``)."""
    return materialize(preset, device=device or "cpu", dtype=dtype, activation_checkpointing=activation_checkpointing,
                       **overrides)


def build_deferred(preset_or_config: str | object, *, dtype: torch.dtype = torch.float32, activation_checkpointing: bool = False,
                   **overrides: object) -> nn.Module:
    """The model on the meta device in ``dtype``, its initialisation pending: the seed is drawn now, where
    ``materialize`` would draw it. Lay it out first (``fully_shard``, ``parallelize_module``: on meta tensors they
    allocate nothing), then ``materialize_deferred`` allocates each rank's shards and draws them, which hold what
    ``materialize`` from the same seed holds there (torchtitan's order: meta, parallelise, ``to_empty``, init)."""
    cfg = _config(preset_or_config, overrides)
    family = family_of(cfg)
    if not family.init_by_name:
        raise ValueError(f"the {family.name} family initialises its models itself: build it where it runs")
    with building_on("meta", dtype):
        model = family.build(cfg, activation_checkpointing=activation_checkpointing)
    model.pending_init_seed = draw_seed()
    return model


def is_deferred(model: nn.Module) -> bool:
    """Whether ``model`` came from ``build_deferred`` and is not materialised yet."""
    return hasattr(model, "pending_init_seed")


def materialize_deferred(model: nn.Module, device: torch.device | str) -> nn.Module:
    """A ``build_deferred`` model (sharded or not) allocated on ``device`` and drawn (``accel_kit.models.init``)."""
    seed = model.pending_init_seed
    del model.pending_init_seed
    init_parameters(allocate(model, device), family_of_model(model).init_rule(model.cfg), seed)
    return model


def count_params(preset: str, **overrides: object) -> int:
    """Parameter count without allocating memory (the model is built on the meta device)."""
    cfg = get_config(preset, **overrides)
    with torch.device("meta"):
        return family_of(cfg).build(cfg).num_params()


def count_active_params(preset: str, **overrides: object) -> int:
    """Parameters a token multiplies (``count_params`` less the routed experts beyond its top-k); equal to
    ``count_params`` for a dense model."""
    cfg = get_config(preset, **overrides)
    return count_params(preset, **overrides) - family_of(cfg).inactive_weight_count(cfg)
