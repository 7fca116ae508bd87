"""Where each transformers mixture-of-experts architecture keeps its experts in its config: ``ARCHITECTURES``.

The one table of architecture knowledge in the hf family: the config attribute names of the routed
experts, the experts a token is sent to, one expert's width, the shared experts and which layers are
MoE layers (transformers' own names, read from each architecture's configuration and modeling files).
``moe_shape`` reads them into the expert fields of ``ModelShape``. For an architecture not in the
table the family reads the experts off the model transformers builds (``hf.family``: experts, width
and MoE layers from its experts modules, top-k from ``num_experts_per_tok``; shared experts 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class MoEAttributes:
    """One architecture's config attribute names for its mixture of experts."""

    experts: str  # routed experts per MoE layer
    width: str  # one routed expert's inner (SwiGLU) width
    top_k: str = "num_experts_per_tok"  # routed experts per token
    shared: str | None = None  # shared experts, each of the routed experts' width (DeepSeek-V3)
    shared_width: str | None = None  # or: the width of the one shared MLP every token passes (Qwen2-MoE)
    # Which of the layers have experts: every one; all from first_k_dense_replace on (DeepSeek-V3); every
    # decoder_sparse_step-th not listed in mlp_only_layers (Qwen2-MoE, Qwen3-MoE).
    layers: Literal["all", "first_k_dense_replace", "decoder_sparse_step"] = "all"
    head_dim: str | None = None  # the query/key heads' width where the config's head_dim is another (MLA)


ARCHITECTURES: dict[str, MoEAttributes] = {
    "mixtral": MoEAttributes("num_local_experts", "intermediate_size"),
    "qwen2_moe": MoEAttributes("num_experts", "moe_intermediate_size", shared_width="shared_expert_intermediate_size",
                               layers="decoder_sparse_step"),
    "qwen3_moe": MoEAttributes("num_experts", "moe_intermediate_size", layers="decoder_sparse_step"),
    "olmoe": MoEAttributes("num_experts", "intermediate_size"),
    # multi-head latent attention: head_dim is the rotary part alone; scores run over nope + rope (qk_head_dim)
    "deepseek_v3": MoEAttributes("n_routed_experts", "moe_intermediate_size", shared="n_shared_experts",
                                 layers="first_k_dense_replace", head_dim="qk_head_dim"),
    "gpt_oss": MoEAttributes("num_local_experts", "intermediate_size"),  # biased experts (their biases are weights)
    "glm4_moe": MoEAttributes("n_routed_experts", "moe_intermediate_size", shared="n_shared_experts",
                              layers="first_k_dense_replace"),
}


@dataclass(frozen=True)
class MoEShape:
    """The expert fields of ``ModelShape`` (all 0 for a dense model)."""

    n_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_hidden_size: int = 0
    n_shared_experts: int = 0
    n_moe_layers: int = 0


def _moe_layers(hf: PretrainedConfig, rule: str, n_layers: int) -> int:
    if rule == "first_k_dense_replace":
        return max(0, n_layers - int(hf.first_k_dense_replace or 0))
    if rule == "decoder_sparse_step":  # the modeling files' test, layer by layer
        step, dense = int(hf.decoder_sparse_step or 1), set(hf.mlp_only_layers or ())
        return sum(1 for i in range(n_layers) if i not in dense and (i + 1) % step == 0)
    return n_layers


def moe_shape(hf: PretrainedConfig, n_layers: int) -> MoEShape:
    """The experts of transformers' config ``hf`` (a dense architecture, or one with no experts: zeros)."""
    attrs = ARCHITECTURES.get(hf.model_type)
    n_experts = int(getattr(hf, attrs.experts, 0) or 0) if attrs else 0
    if not n_experts:
        return MoEShape()
    width = int(getattr(hf, attrs.width))
    shared = int(getattr(hf, attrs.shared, 0) or 0) if attrs.shared else 0
    if attrs.shared_width and getattr(hf, attrs.shared_width, 0):
        # One merged shared MLP, counted in routed experts' widths (Qwen1.5-MoE-A2.7B's 5632 = 4 x 1408: the
        # 4 shared experts its release names); a width that is no multiple rounds to the nearest, at least 1.
        shared = max(1, round(int(getattr(hf, attrs.shared_width)) / width))
    return MoEShape(n_experts=n_experts, experts_per_token=int(getattr(hf, attrs.top_k)),
                    expert_ffn_hidden_size=width, n_shared_experts=shared,
                    n_moe_layers=_moe_layers(hf, attrs.layers, n_layers))


def query_head_dim(hf: PretrainedConfig) -> int | None:
    """The query/key heads' width where the architecture's ``head_dim`` attribute means something else, else None."""
    attrs = ARCHITECTURES.get(hf.model_type)
    return int(getattr(hf, attrs.head_dim)) if attrs and attrs.head_dim else None
