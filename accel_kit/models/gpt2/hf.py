"""Weight conversion between our GPT and transformers' ``GPT2LMHeadModel``.

GPT-2's ``Conv1D`` stores weights as (in, out); ``nn.Linear`` as (out, in): the four block
projections are transposed on the way, everything else maps by name (``STATE_MAP``, declared to the
shared ``accel_kit.models.common.hf``); the decoder lies under ``transformer.``.
"""
from __future__ import annotations

from accel_kit.models.common.hf import StateMap, from_hf_model, keeping_source_rows, to_hf_model
from accel_kit.models.gpt2.model import GPT, GPTConfig

STATE_MAP = StateMap(prefix="transformer.",
                     transposed=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
                     tied=("lm_head.weight", "wte.weight"))


def hf_config(cfg: GPTConfig):
    """The transformers ``GPT2Config`` of the same shape (dropout as ours, SDPA attention)."""
    from transformers import GPT2Config

    hf = GPT2Config(vocab_size=cfg.padded_vocab_size, n_positions=cfg.seq_len, n_embd=cfg.hidden_size,
                    n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.mlp_ratio * cfg.hidden_size,
                    activation_function="gelu_new", resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                    attn_pdrop=cfg.dropout, tie_word_embeddings=True)
    hf._attn_implementation = "sdpa"
    return hf


def to_hf(model: GPT):
    """A ``GPT2LMHeadModel`` holding a copy of ``model``'s weights."""
    from transformers import GPT2LMHeadModel

    return to_hf_model(model, lambda: GPT2LMHeadModel(hf_config(model.cfg)), STATE_MAP)


def from_hf(hf_model, *, vocab_size: int | None = None) -> GPT:
    """Our GPT holding a copy of a ``GPT2LMHeadModel``'s weights."""
    c = hf_model.config
    cfg = GPTConfig(n_layers=c.n_layer, n_heads=c.n_head, hidden_size=c.n_embd, vocab_size=vocab_size or c.vocab_size,
                    seq_len=c.n_positions, mlp_ratio=(c.n_inner or 4 * c.n_embd) // c.n_embd)
    return from_hf_model(hf_model, lambda: GPT(keeping_source_rows(cfg, c.vocab_size)), STATE_MAP)
