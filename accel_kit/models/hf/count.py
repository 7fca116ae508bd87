"""FLOPs of a transformers causal LM counted, not derived: one forward and backward under torch's
``FlopCounterMode`` on fake tensors (shapes only: nothing is allocated, on the device or the host).

The counter applies the convention of ``accel_kit.flops`` op by op: 2 FLOPs per multiply-add of
every matrix product, the attention products over the full score matrix, elementwise work not
counted. Two gaps are closed here:

- On the CPU (where the fake tensors dispatch), fused SDPA runs as
  ``aten._scaled_dot_product_flash_attention_for_cpu``, for which torch registers no formula: the
  count would miss the attention term (12 L H Q T per token). ``SDPA_FORMULAS`` gives that op and
  its backward the products they compute: forward Q K^T and P V, 2 x 2 b h s_q s_k d FLOPs, over
  every *query* head (grouped-query attention shares keys, not products); backward dV, dP, dQ and
  dK, twice that. The full score matrix is counted even under a causal mask, as the convention does.
- An architecture whose attention is some other kernel the counter cannot see would still come out
  short: when a model with attention heads counted no attention product at all, the config's
  analytic term (4 s n_heads head_dim per layer and token, ``accel_kit.flops``) is added and the
  record says so (``flops_source``).

- A mixture of experts is counted on transformers' ``batched_mm`` experts (``count_experts_batched``):
  the default ``grouped_mm`` has no fake-tensor kernel outside bf16 and its products' sizes hang on
  the routing (its offsets are data), and the ``eager`` loop indexes the experts a batch reaches
  (``nonzero``: a shape fake tensors cannot know). ``batched_mm`` gathers each (token, chosen expert)
  pair's weights and multiplies them in one batched product of T x top_k rows: exactly the products
  of the active experts, 2 x top_k x (one expert's weights) per token, whatever the routing, and none
  of the other experts'. It is the count's alone: training runs the default (``model.py``).

The terms split by op: batched products (``bmm``, ``baddbmm``) and SDPA are attention, except inside
the experts (their batched products are weights: matmul); the other products (``mm``, ``addmm``: the
linears, the routers) are the matmul term, less the output embedding's, which is the logits term.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from accel_kit.errors import ParameterError
from accel_kit.models.family import FlopTerms
from accel_kit.models.hf.model import HFCausalLM, expert_modules

if TYPE_CHECKING:
    from torch._ops import OpOverloadPacket
    from torch.utils.flop_counter import FlopCounterMode

ATTENTION_OPS = ("bmm", "baddbmm", "_scaled_dot_product")
# one op's FLOPs from its inputs' shapes (``FlopCounterMode``'s ``custom_mapping``)
FlopFormula = Callable[..., int]


def _sdpa_forward_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    b, h, s_q, d = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    # scores Q K^T: s_q s_k d multiply-adds per head; weighted sum P V: s_q s_k d_v
    return 2 * b * h * s_q * s_k * (d + d_v)


def _sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    # dV = P^T dO and dP = dO V^T (s_q s_k d_v each), dQ = dS K and dK = dS^T Q (s_q s_k d each)
    return 2 * _sdpa_forward_flops(query_shape, key_shape, value_shape)


def _formulas() -> dict[OpOverloadPacket, FlopFormula]:
    aten = torch.ops.aten
    out: dict[OpOverloadPacket, FlopFormula] = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", _sdpa_forward_flops),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_backward_flops)):
        op = getattr(aten, name, None)
        if op is not None:
            out[op] = formula
    return out


def _attention_ops(counts: dict[OpOverloadPacket, int]) -> int:
    return sum(v for op, v in counts.items() if any(a in str(op) for a in ATTENTION_OPS))


def _split(counts: dict[OpOverloadPacket, int], logits_flops: int, experts: list[dict[OpOverloadPacket, int]] = ()) -> tuple[int, int, int]:
    """(matmul, attention, logits) of one pass's per-op counts; ``experts``: the counts inside each experts
    module, whose batched products are their weights' (matmul), not attention."""
    attention = _attention_ops(counts) - sum(_attention_ops(c) for c in experts)
    total = sum(counts.values())
    return total - attention - logits_flops, attention, logits_flops


def count_experts_batched(model: nn.Module) -> None:
    """Switch transformers' ``model`` (a ``PreTrainedModel``) with experts to its ``batched_mm`` experts: the
    products of the active experts only, of shapes known before the routing is (see the module's note)."""
    if expert_modules(model) and getattr(model, "_can_set_experts_implementation", lambda: False)():
        model.set_experts_implementation("batched_mm")


def _count_passes(wrapper: HFCausalLM, idx: torch.Tensor) -> tuple[FlopCounterMode, FlopCounterMode]:
    """The counters of one forward and of its backward on ``idx``; a model whose products' shapes hang on
    the routing (experts outside transformers' experts interface, looping over the experts a batch reaches)
    is a one-line ParameterError: fake tensors hold no routing to count."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.utils.flop_counter import FlopCounterMode

    forward = FlopCounterMode(display=False, custom_mapping=_formulas())
    backward = FlopCounterMode(display=False, custom_mapping=_formulas())
    try:
        with forward:
            _, loss = wrapper(idx, idx)
        with backward:
            loss.backward()
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        cfg = wrapper.cfg
        raise ParameterError(f"model preset {cfg.label}: {cfg.architecture}'s FLOPs cannot be counted on fake "
                             f"tensors: an operation's shape depends on the data ({type(exc).__name__}: "
                             f"{str(exc).strip() or 'no message'}); its experts are not behind transformers' "
                             f"experts interface, whose batched kernel the count runs") from None
    return forward, backward


def count_flop_terms(model_factory: Callable[[], HFCausalLM], *, micro_batch: int, seq_len: int, n_layers: int, n_heads: int,
                     head_dim: int) -> tuple[FlopTerms, str]:
    """Forward (and counted backward) FLOPs per token of one training micro-batch of the model that
    ``model_factory()`` builds (an ``HFCausalLM``), and where the attention term comes from.

    Returns:
        (terms, source): source is ``counted``, or ``counted; attention analytic`` where the counter
        saw no attention product (the analytic term added).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    tokens = micro_batch * seq_len
    with FakeTensorMode(allow_non_fake_inputs=True):
        wrapper = model_factory()
        count_experts_batched(wrapper.model)
        head = wrapper.model.get_output_embeddings()
        forward, backward = _count_passes(wrapper, torch.zeros(micro_batch, seq_len, dtype=torch.long))
    counts = forward.get_flop_counts()
    # the products of the output projection and of the experts as counted under their modules (keys are
    # qualified from the root's class)
    names = {id(m): f"{type(wrapper).__name__}.{n}" for n, m in wrapper.named_modules()}
    logits = sum(counts.get(names.get(id(head)), {}).values())
    experts = [counts.get(names[id(m)], {}) for _, m in expert_modules(wrapper)]
    matmul, attention, logits = _split(counts["Global"], logits, experts)
    back_matmul, back_attention, _ = _split(backward.get_flop_counts()["Global"], 0)
    source = "counted"
    if attention == 0 and n_heads > 0:
        analytic = 4 * seq_len * n_heads * head_dim * n_layers * tokens  # accel_kit.flops: scores and sum, full
        attention, back_attention, source = analytic, 2 * analytic, "counted; attention analytic"
    return FlopTerms(matmul=matmul // tokens, attention=attention // tokens, logits=logits // tokens,
                     backward=(back_matmul + back_attention) // tokens), source
