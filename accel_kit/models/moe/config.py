"""The shape of a mixture-of-experts model: one frozen dataclass, checked when it is made.

Attention is Llama's (grouped-query, RoPE, RMSNorm, no biases) with an optional norm on queries and keys;
each layer's MLP is either a router over ``n_experts`` SwiGLU experts of which every token takes its top
``experts_per_token`` (a MoE layer), or a dense SwiGLU MLP of ``ffn_hidden_size`` (the layers in
``dense_layers``). Field names map one to one onto transformers' Qwen3-MoE, Mixtral and OLMoE configs
(``moe.hf.hf_config``).
"""
from __future__ import annotations

from dataclasses import dataclass

from accel_kit.models.common.attention import QK_NORMS
from accel_kit.models.family import PaddedVocab

EXPERT_KERNELS = ("auto", "grouped_mm", "loop")
HF_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM")


@dataclass(frozen=True)
class MoEConfig(PaddedVocab):
    """Shape of a decoder-only MoE language model.

    Args:
        n_layers: decoder layers L (MoE and dense together).
        hidden_size: model width h.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention).
        n_experts: routed experts per MoE layer E.
        experts_per_token: experts each token is routed to (top-k).
        expert_ffn_hidden_size: one expert's SwiGLU inner width F.
        ffn_hidden_size: the dense layers' SwiGLU width (0 where every layer is a MoE layer).
        head_dim: per-head width; None (given): hidden_size / n_heads (Qwen3 sets it apart: 128 at width 2048).
        dense_layers: indices of the layers that keep a dense MLP (Qwen3-MoE's ``mlp_only_layers``;
            DeepSeek's first k layers are range(k)).
        n_shared_experts: experts every token passes through besides its routed ones (DeepSeek-style,
            ungated, their outputs added to the routed experts'); 0 for the three releases here.
        shared_expert_ffn_hidden_size: one shared expert's width; None: expert_ffn_hidden_size.
        norm_topk_prob: the top-k router probabilities are renormalised to sum to 1 (Mixtral always,
            Qwen3-MoE yes, OLMoE no).
        router_aux_loss_coef: weight of the load-balancing loss (Switch Transformer's, as transformers'
            ``load_balancing_loss_func`` computes it) added to the language-model loss; 0 turns it off.
        qk_norm: RMSNorm on queries and keys before RoPE: None, "head" (Qwen3) or "full" (OLMoE).
        vocab_size, seq_len, rope_theta, rms_norm_eps, tie_embeddings, pad_vocab_multiple: as Llama's.
        hf_architecture: transformers' class of the same model (conversion, the reference layer).
        expert_kernel: how the experts' products run: ``grouped_mm`` (``torch._grouped_mm``, one call for
            every expert), ``loop`` (one product per expert) or ``auto`` (grouped_mm where it runs on the
            device in the dtype, else the loop; the family resolves it per point, ``kernel_overrides``).
    """

    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    n_experts: int
    experts_per_token: int
    expert_ffn_hidden_size: int
    ffn_hidden_size: int = 0
    head_dim: int | None = None
    dense_layers: tuple[int, ...] = ()
    n_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int | None = None
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    qk_norm: str | None = None
    vocab_size: int = 32000
    seq_len: int = 4096
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    pad_vocab_multiple: int = 1
    hf_architecture: str = "Qwen3MoeForCausalLM"
    expert_kernel: str = "auto"
    dropout: float = 0.0

    def __post_init__(self) -> None:
        # a tuple however it came (a list from JSON or YAML), so the config stays hashable and comparable
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        if self.head_dim is None and self.n_heads > 0:  # Llama's rule, fixed here so RoPE and conversion read one value
            if self.hidden_size % self.n_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads} "
                                 f"(set head_dim to decouple them)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.n_heads)
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "n_experts", "experts_per_token",
                     "expert_ffn_hidden_size", "vocab_size", "seq_len", "pad_vocab_multiple", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads} "
                             f"(each key/value head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} is odd; RoPE rotates pairs of dimensions")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} is above n_experts {self.n_experts}")
        bad = [i for i in self.dense_layers if not 0 <= i < self.n_layers]
        if bad or len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError(f"dense_layers {list(self.dense_layers)} must be distinct layer indices in "
                             f"0..{self.n_layers - 1}")
        if self.dense_layers and self.ffn_hidden_size < 1:
            raise ValueError(f"dense_layers {list(self.dense_layers)} need a positive ffn_hidden_size")
        if self.n_shared_experts < 0 or (self.shared_expert_ffn_hidden_size or 1) < 1:
            raise ValueError("n_shared_experts and shared_expert_ffn_hidden_size must not be negative")
        self._check_choices()

    def _check_choices(self) -> None:
        for name, allowed in (("qk_norm", QK_NORMS), ("expert_kernel", EXPERT_KERNELS),
                              ("hf_architecture", HF_ARCHITECTURES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}")
        if self.router_aux_loss_coef < 0:
            raise ValueError(f"router_aux_loss_coef {self.router_aux_loss_coef} is negative")
        if self.dropout != 0.0:
            raise ValueError(f"dropout {self.dropout}: these MoE models train without dropout, only 0.0 is accepted")

    # RoPE (accel_kit.models.common.rope) reads head_dim and rope_scaling; the releases here use plain RoPE.
    rope_scaling = None

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - len(self.dense_layers)

    @property
    def shared_width(self) -> int:
        """All shared experts' SwiGLU width together (they run as one MLP of the summed width)."""
        return self.n_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size)

    def is_moe_layer(self, index: int) -> bool:
        return index not in self.dense_layers
