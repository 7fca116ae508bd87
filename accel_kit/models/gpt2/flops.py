"""GPT-2's FLOP formulas, in the convention of ``accel_kit.flops`` (PaLM; Megatron-LM).

Symbols: b batch, s sequence length, h hidden size, L layers, V vocabulary, r MLP ratio.
Biases, LayerNorm, softmax, GELU and residual adds are O(b*s*h): under 1 % at GPT-2 XL sizes.
"""
from __future__ import annotations

from accel_kit.flops import direction_factor


def block_matmul_flops_per_token(hidden: int, mlp_ratio: int = 4) -> int:
    """Forward FLOPs per token of one block's weight matrices: 2 * (params in linears).

    QKV 3h^2 + output projection h^2 + MLP 2*r*h^2 weights, 2 FLOPs per weight per token:
    with r = 4 that is 24 h^2.
    """
    return 2 * (3 * hidden**2 + hidden**2 + 2 * mlp_ratio * hidden**2)


def block_gemm_shapes(tokens: int, hidden: int, mlp_ratio: int = 4) -> tuple[tuple[int, int, int], ...]:
    """The (M, K, N) products of one block's linears on ``tokens`` rows, in forward order.

    The same products ``block_matmul_flops_per_token`` counts (QKV, output projection, MLP up
    and down): the measured matmul peak includes them, so the workload is compared with its
    own shapes, not only square ones.
    """
    return ((tokens, hidden, 3 * hidden), (tokens, hidden, hidden), (tokens, hidden, mlp_ratio * hidden),
            (tokens, mlp_ratio * hidden, hidden))


def attention_flops_per_token(hidden: int, seq_len: int) -> int:
    """Forward FLOPs per token of the attention products in one block.

    Scores Q @ K^T: s * h multiply-adds per token (over all heads); weighted sum P @ V: the
    same. 2 products x 2 FLOPs x s x h = 4 s h (full matrix, see module docstring).
    """
    return 4 * seq_len * hidden


def block_flops(batch: int, seq_len: int, hidden: int, *, mlp_ratio: int = 4,
                direction: str = "forward") -> int:
    """FLOPs of one transformer block on a (batch, seq_len, hidden) input.

    Forward: 24*b*s*h^2 + 4*b*s^2*h for r = 4 (docs/study.md, "One transformer block"). ``forward_backward``
    is 3x forward.
    """
    tokens = batch * seq_len
    forward = tokens * (block_matmul_flops_per_token(hidden, mlp_ratio) + attention_flops_per_token(hidden, seq_len))
    return forward * direction_factor(direction)


def gpt_flops_per_token(n_layers: int, hidden: int, seq_len: int, vocab_size: int, *,
                        mlp_ratio: int = 4, direction: str = "forward_backward",
                        include_lm_head: bool = True) -> int:
    """FLOPs per token of a GPT (decoder-only) model.

    Per token forward: L blocks (24 L h^2 + 4 L s h for r = 4) plus the output projection
    onto the vocabulary, 2 h V (Megatron counts it; PaLM's 6N excludes embeddings, so pass
    ``include_lm_head=False`` for the strict PaLM figure). With backward, 3x:
    72 L h^2 + 12 L s h + 6 h V, i.e. Megatron's 72 b s L h^2 (1 + s/6h + V/12hL) per step
    and PaLM's 6N + 12 L H Q T (H*Q = h) per token.
    """
    per_layer = block_matmul_flops_per_token(hidden, mlp_ratio) + attention_flops_per_token(hidden, seq_len)
    forward = n_layers * per_layer + (2 * hidden * vocab_size if include_lm_head else 0)
    return forward * direction_factor(direction)


def sparse_gpt_flops_per_token(n_layers: int, hidden: int, seq_len: int, vocab_size: int, *,
                               nonzero_block_weights: int, mlp_ratio: int = 4, direction: str = "forward_backward",
                               include_lm_head: bool = True) -> int:
    """*Effective* FLOPs per token of a GPT whose block weights are sparse: only non-zero weights count.

    This is the work a device that skips zero weights does (Cerebras CS-2, the paper's
    Figures 7-8). Each non-zero weight costs 2 FLOPs per token forward, as in
    ``block_matmul_flops_per_token``; backward stays 2x forward because both of its
    products shrink with the weights: dX = dY @ W touches only non-zero weights, and dW is
    wanted only where W is not pruned (a pruned weight's gradient is discarded). Attention's
    score products have no weights, and the output projection is tied to the (unpruned)
    embedding, so those terms are the dense ones. With every block weight non-zero this
    equals ``gpt_flops_per_token``.

    Args:
        nonzero_block_weights: non-zero weights in the linears of all ``n_layers`` blocks together.
    """
    dense_blocks = n_layers * block_matmul_flops_per_token(hidden, mlp_ratio)
    dense_forward = gpt_flops_per_token(n_layers, hidden, seq_len, vocab_size, mlp_ratio=mlp_ratio,
                                        direction="forward", include_lm_head=include_lm_head)
    forward = dense_forward - dense_blocks + 2 * nonzero_block_weights
    return forward * direction_factor(direction)
