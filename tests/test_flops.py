import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from accel_kit import flops
from accel_kit.models.gpt2 import flops as gpt2_flops


def test_block_forward_matches_hand_count():
    b, s, h = 8, 1024, 1600
    assert gpt2_flops.block_flops(b, s, h) == 24 * b * s * h**2 + 4 * b * s**2 * h
    # GPT-2 XL block, batch 8: 503_316_480_000 (linears) + 53_687_091_200 (attention)
    assert gpt2_flops.block_flops(b, s, h) == 557_003_571_200


def test_backward_is_twice_forward():
    fwd = gpt2_flops.block_flops(4, 128, 256)
    assert gpt2_flops.block_flops(4, 128, 256, direction="forward_backward") == 3 * fwd


def test_bad_direction():
    with pytest.raises(ValueError, match="direction"):
        gpt2_flops.block_flops(1, 1, 1, direction="backward_only")


def test_gpt_per_token_matches_megatron_and_palm():
    L, h, s, V = 48, 1600, 1024, 50257
    per_token = gpt2_flops.gpt_flops_per_token(L, h, s, V)
    # Megatron-LM: 72 b s L h^2 (1 + s/(6h) + V/(12 h L)) per step, divided by b*s tokens.
    megatron = 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    # Two float64 evaluations of the same formula, a dozen operations each: a few ulps apart at most.
    assert per_token == pytest.approx(megatron, rel=16 * torch.finfo(torch.float64).eps)
    # PaLM: 6N + 12 L H Q T with N = 12 L h^2 (non-embedding matmul weights), no LM head.
    palm = 6 * 12 * L * h**2 + 12 * L * h * s
    assert gpt2_flops.gpt_flops_per_token(L, h, s, V, include_lm_head=False) == palm


def test_tflops():
    assert flops.tflops(2e12, 2.0) == 1.0
    with pytest.raises(ValueError):
        flops.tflops(1.0, 0.0)


def _hf_block(h, heads, s, attn):
    cfg = GPT2Config(n_embd=h, n_head=heads, n_positions=s, resid_pdrop=0, attn_pdrop=0, embd_pdrop=0)
    cfg._attn_implementation = attn
    return GPT2Block(cfg, layer_idx=0)


def test_against_torch_flop_counter_eager_attention():
    # With eager attention every product is a visible mm/bmm, so FlopCounterMode sees all the work.
    b, s, h, heads = 2, 64, 128, 4
    block = _hf_block(h, heads, s, "eager")
    x = torch.randn(b, s, h, requires_grad=True)
    with FlopCounterMode(display=False) as fwd_counter:
        out = block(x)
        out = out[0] if isinstance(out, tuple) else out
    with FlopCounterMode(display=False) as bwd_counter:
        out.sum().backward()
    # FLOP counts are integers from the shapes alone (no rounding, no CPU dependence): exact.
    expected_fwd = gpt2_flops.block_flops(b, s, h)
    assert fwd_counter.get_total_flops() == expected_fwd
    # Backward: input gradients and weight gradients, each as costly as the forward products.
    assert bwd_counter.get_total_flops() == 2 * expected_fwd


def test_native_block_matmuls_match_counter():
    # Our block's linears, counted by torch (the CPU flash-attention kernel is not counted by
    # FlopCounterMode, so compare the matmul part: 24 b s h^2).
    from accel_kit.models.gpt2.block import Block, BlockConfig

    b, s, h = 2, 32, 128
    block = Block(BlockConfig(h, 4))
    with FlopCounterMode(display=False) as counter:
        block(torch.randn(b, s, h))
    counted = counter.get_total_flops()
    matmuls = b * s * gpt2_flops.block_matmul_flops_per_token(h)
    attention = 4 * b * s**2 * h
    assert counted in (matmuls, matmuls + attention)  # integer counts from the shapes: exact
