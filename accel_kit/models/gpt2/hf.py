"""Weight conversion between our GPT and transformers' ``GPT2LMHeadModel``.

GPT-2's ``Conv1D`` stores weights as (in, out); ``nn.Linear`` as (out, in): the four block
projections are transposed on the way, everything else maps by name.
"""
from __future__ import annotations

import torch

from accel_kit.models.gpt2.model import GPT, GPTConfig
from accel_kit.models.init import allocated, transformers_uninitialised

_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_config(cfg: GPTConfig):
    """The transformers ``GPT2Config`` of the same shape (dropout as ours, SDPA attention)."""
    from transformers import GPT2Config

    hf = GPT2Config(vocab_size=cfg.padded_vocab_size, n_positions=cfg.seq_len, n_embd=cfg.hidden_size,
                    n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.mlp_ratio * cfg.hidden_size,
                    activation_function="gelu_new", resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                    attn_pdrop=cfg.dropout, tie_word_embeddings=True)
    hf._attn_implementation = "sdpa"
    return hf


def _hf_key(ours: str) -> str:
    return "lm_head.weight" if ours == "lm_head.weight" else f"transformer.{ours}"


def to_hf(model: GPT):
    """A ``GPT2LMHeadModel`` holding a copy of ``model``'s weights."""
    from transformers import GPT2LMHeadModel

    hf = transformers_uninitialised(lambda: GPT2LMHeadModel(hf_config(model.cfg)))  # every weight copied from ours
    hf_state = hf.state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            key = _hf_key(name)
            value = tensor.t() if name.endswith(_TRANSPOSED) else tensor
            hf_state[key].copy_(value)
    return hf


def from_hf(hf_model, *, vocab_size: int | None = None) -> GPT:
    """Our GPT holding a copy of a ``GPT2LMHeadModel``'s weights."""
    c = hf_model.config
    cfg = GPTConfig(n_layers=c.n_layer, n_heads=c.n_head, hidden_size=c.n_embd, vocab_size=vocab_size or c.vocab_size,
                    seq_len=c.n_positions, mlp_ratio=(c.n_inner or 4 * c.n_embd) // c.n_embd)
    if cfg.padded_vocab_size != c.vocab_size:
        cfg = cfg.replace(pad_vocab_multiple=c.vocab_size)  # keep every embedding row of the source
    model = allocated(lambda: GPT(cfg), hf_model.device)  # no draws: every weight is copied from the source
    hf_state = hf_model.state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            value = hf_state[_hf_key(name)]
            tensor.copy_(value.t() if name.endswith(_TRANSPOSED) else value)
    return model
