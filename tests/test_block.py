"""Block against transformers' GPT2Block (the reference GPT-2 block) and its own plain path."""
import dataclasses

import pytest
import torch
from transformers import GPT2Config
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from accel_kit.models.gpt2 import block as block_mod
from accel_kit.models.gpt2.block import Block, BlockConfig
from numerics import assert_close_sums

CFG = BlockConfig(hidden_size=64, n_heads=4)
LINEARS = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


def _pair():
    torch.manual_seed(0)
    ours = Block(CFG)
    for p in ours.parameters():  # non-trivial LayerNorm affine and biases too
        torch.nn.init.normal_(p, std=0.2)
    hf_cfg = GPT2Config(n_embd=CFG.hidden_size, n_head=CFG.n_heads, n_positions=64,
                        resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0)
    hf_cfg._attn_implementation = "sdpa"  # causal without an explicit mask
    ref = GPT2Block(hf_cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            src = ours.get_parameter(name)
            # GPT-2's Conv1D stores (in, out): our nn.Linear weight transposed.
            p.copy_(src.t() if name.endswith("weight") and name.rsplit(".", 1)[0] in LINEARS else src)
    return ours, ref


def _chain_terms(batch, seq_len, cfg=CFG):
    """Terms summed along the longest path through a block's forward and backward (see numerics.py).

    Forward: LayerNorm (h), qkv (h), scores (head_dim), softmax and attention-weighted values
    (2 T), attention projection (h), LayerNorm (h), MLP up (h), MLP down (4 h); the backward runs
    the same reductions again, and each weight gradient then sums over the batch's tokens.
    """
    h, head_dim = cfg.hidden_size, cfg.hidden_size // cfg.n_heads
    forward = 5 * h + head_dim + 2 * seq_len + cfg.mlp_ratio * h
    return 2 * forward + batch * seq_len


def _fwd_bwd(mod, x, g):
    x = x.detach().clone().requires_grad_(True)
    out = mod(x)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(g)
    return out.detach(), x.grad, {n: p.grad for n, p in mod.named_parameters()}


@pytest.mark.parametrize("T", [16, 7])
def test_matches_transformers_fp32(T):
    ours, ref = _pair()
    x, g = torch.randn(2, T, CFG.hidden_size), torch.randn(2, T, CFG.hidden_size)
    out, gx, gw = _fwd_bwd(ours, x, g)
    out_r, gx_r, gw_r = _fwd_bwd(ref, x, g)
    # Same math, other kernels and summation orders: the bound follows from fp32's eps, the
    # reductions on the way and each tensor's magnitude (numerics.py), not from one CPU.
    n = _chain_terms(2, T)
    assert_close_sums(out, out_r, n_terms=n)
    assert_close_sums(gx, gx_r, n_terms=n)
    for name, grad in gw.items():
        grad_r = gw_r[name]
        if name.endswith("weight") and name.rsplit(".", 1)[0] in LINEARS:
            grad_r = grad_r.t()
        assert_close_sums(grad, grad_r, n_terms=n, msg=name)


@pytest.mark.parametrize("T", [16, 7])
def test_cpu_fast_path_matches_plain_path_bf16(T, monkeypatch):
    ours, _ = _pair()
    fast_cfg = dataclasses.replace(CFG, narrow_linear_fast_path=True)
    ours = Block(fast_cfg).to(torch.bfloat16)
    ours.load_state_dict(_pair()[0].state_dict())
    x = torch.randn(2, T, CFG.hidden_size, dtype=torch.bfloat16)
    g = torch.randn(2, T, CFG.hidden_size, dtype=torch.bfloat16)
    fast = _fwd_bwd(ours, x, g)
    ours.zero_grad(set_to_none=True)
    calls = []
    monkeypatch.setattr(block_mod._NarrowOutputLinear, "apply", lambda *a: calls.append(1) or torch.nn.functional.linear(*a))
    plain = _fwd_bwd(ours, x, g)
    assert len(calls) == 2  # both c_proj layers (out <= in) took the fast path
    plain_cfg_calls = len(calls)
    Block(CFG).to(torch.bfloat16)(x)  # without the flag (the adapter's choice) no layer takes it
    assert len(calls) == plain_cfg_calls
    torch.testing.assert_close(fast[0], plain[0], rtol=0, atol=0)  # same forward kernels
    # Only the c_proj weight and bias gradients are computed differently (NN instead of TN GEMM,
    # row sums): one reduction over the 2 T tokens, accumulated in fp32 by the CPU's bf16 kernels
    # and rounded once to bf16 (numerics.py). Everything else runs the same kernels on the same
    # inputs, and the same bound holds for it a fortiori.
    assert_close_sums(fast[1], plain[1], n_terms=2 * T, accumulate=torch.float32)
    for name in fast[2]:
        assert_close_sums(fast[2][name], plain[2][name], n_terms=2 * T, accumulate=torch.float32, msg=name)


def test_autocast_and_no_grad():
    ours, _ = _pair()
    x = torch.randn(2, 16, CFG.hidden_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(x)
    out.float().sum().backward()
    assert all(p.grad is not None for p in ours.parameters())
    with torch.no_grad():
        assert ours.to(torch.bfloat16)(x.bfloat16()).shape == x.shape
