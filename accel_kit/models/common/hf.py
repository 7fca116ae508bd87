"""Our models' weights under transformers' names, and back: the one mapping every family's ``hf.py`` declares.

A family's model stores most weights as transformers' model of the architecture does, under the same names
below its decoder's prefix (``model.``, GPT-2's ``transformer.``); what differs is declared in a
``StateMap``: weights fused here that are several there (stacked by rows: the RoPE families' ``qkv_proj`` and
``gate_up_proj``, ``rotary_fused``), names that differ (the MoE family's router), weights stored transposed
there (GPT-2's ``Conv1D``). From it come both directions, for a whole model or one block, and the copies
into a transformers model (``to_hf_model``) and into ours (``from_hf_model``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, TypeVar

import torch
from torch import nn

from accel_kit.models.family import PaddedVocab, layer_output
from accel_kit.models.init import allocated, transformers_uninitialised

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Fused:
    """One of our weights (``ours``, a name suffix) that is transformers' ``parts`` stacked by rows: each part's
    name suffix and its rows, in row order."""

    ours: str
    parts: tuple[tuple[str, int], ...]


def rotary_fused(q_width: int, kv_width: int, ffn_hidden_size: int) -> tuple[Fused, ...]:
    """The fused projections of ``RotaryAttention`` and ``SwiGLU``: ``qkv_proj`` is q_proj, k_proj, v_proj,
    ``gate_up_proj`` gate_proj then up_proj (``ffn_hidden_size``: the dense MLP's width)."""
    return (Fused("self_attn.qkv_proj.weight", (("self_attn.q_proj.weight", q_width),
                                                ("self_attn.k_proj.weight", kv_width),
                                                ("self_attn.v_proj.weight", kv_width))),
            Fused("mlp.gate_up_proj.weight", (("mlp.gate_proj.weight", ffn_hidden_size),
                                              ("mlp.up_proj.weight", ffn_hidden_size))))


@dataclass(frozen=True)
class StateMap:
    """How our state dict's names map onto a transformers model's.

    ``prefix``: where transformers keeps the decoder (every name but ``beside``'s); ``fused``: our weights
    that are several there; ``renamed``: (ours, theirs) parts of a name; ``transposed``: name suffixes stored
    (in, out) there; ``tied``: (the output projection, the embedding), for a source whose state has no
    output projection of its own (tied to the embedding)."""

    prefix: str
    fused: tuple[Fused, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    transposed: tuple[str, ...] = ()
    beside: tuple[str, ...] = ("lm_head.weight",)
    tied: tuple[str, str] = ("lm_head.weight", "embed_tokens.weight")

    def _theirs(self, name: str) -> str:
        for ours, theirs in self.renamed:
            name = name.replace(ours, theirs)
        return name

    def _fused(self, name: str) -> Fused | None:
        return next((f for f in self.fused if name.endswith(f.ours)), None)

    def layer_names(self, state: State) -> State:
        """``state`` (one block's, or a whole model's) under transformers' names within the decoder (no
        prefix): each fused weight split into its parts (views, no copies)."""
        out = {}
        for name, tensor in state.items():
            fused = self._fused(name)
            if fused is None:
                out[self._theirs(name)] = tensor.t() if name.endswith(self.transposed) else tensor
                continue
            stem = self._theirs(name.removesuffix(fused.ours))
            pieces = tensor.split([rows for _, rows in fused.parts])
            out.update({stem + part: piece for (part, _), piece in zip(fused.parts, pieces)})
        return out

    def to_hf(self, state: State) -> State:
        """Our model's state dict under the transformers model's names."""
        return {name if name in self.beside else self.prefix + name: t for name, t in self.layer_names(state).items()}

    def from_hf(self, hf_state: State, names: list[str]) -> State:
        """Our model's tensors ``names`` from a transformers model's state dict, the split parts concatenated."""
        out = {}
        for name in names:
            fused = self._fused(name)
            if fused is not None:
                stem = self._hf_name(name.removesuffix(fused.ours))
                out[name] = torch.cat([hf_state[stem + part] for part, _ in fused.parts])
                continue
            key = self._hf_name(name)
            if key not in hf_state and name == self.tied[0]:
                key = self._hf_name(self.tied[1])
            out[name] = hf_state[key].t() if name.endswith(self.transposed) else hf_state[key]
        return out

    def _hf_name(self, name: str) -> str:
        theirs = self._theirs(name)
        return theirs if name in self.beside else self.prefix + theirs


def copy_state(module: nn.Module, state: State) -> nn.Module:
    """``module`` with ``state``'s tensors copied into its own, by name."""
    own = module.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)
    return module


def to_hf_model(model: nn.Module, make_hf: Callable[[], nn.Module], state_map: StateMap) -> nn.Module:
    """transformers' model (``make_hf``) holding a copy of ``model``'s weights: made without draws, as every
    weight is copied from ours."""
    return copy_state(transformers_uninitialised(make_hf), state_map.to_hf(model.state_dict()))


def from_hf_model(hf_model: nn.Module, make: Callable[[], nn.Module], state_map: StateMap) -> nn.Module:
    """Our model (``make``) holding a copy of a transformers model's weights, on its device: no draws, every
    weight is copied from the source."""
    model = allocated(make, hf_model.device)
    return copy_state(model, state_map.from_hf(hf_model.state_dict(), list(model.state_dict())))


PaddedConfig = TypeVar("PaddedConfig", bound=PaddedVocab)  # a family's config dataclass


def keeping_source_rows(cfg: PaddedConfig, source_vocab_size: int) -> PaddedConfig:
    """``cfg`` (``vocab_size`` the tokenizer's) with the embedding padded to the source's rows where they are
    more (``pad_vocab_multiple``): every embedding row of the source kept."""
    return cfg if cfg.padded_vocab_size == source_vocab_size else replace(cfg, pad_vocab_multiple=source_vocab_size)


class RotaryLayer(nn.Module):
    """transformers' decoder layer of a RoPE architecture as a ``(B, T, h) -> (B, T, h)`` module.

    The decoder layer takes its RoPE cos/sin from the caller (the whole model computes them once per
    forward); this computes them with the architecture's rotary embedding each call, as the whole model
    would for one layer. SDPA attention, causal (no mask given)."""

    def __init__(self, layer: nn.Module, rotary_emb: nn.Module):
        super().__init__()
        self.layer, self.rotary_emb = layer, rotary_emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)[None]  # (1, T)
        return layer_output(self.layer(x, position_embeddings=self.rotary_emb(x, positions), position_ids=positions))
