"""``MixtureOfExperts``: what the MoE family answers (shape, FLOPs of the active experts, GEMMs, memory,
structure, conversion).

FLOPs follow ``accel_kit.flops`` (2 per multiply-add, attention over the full score matrix, backward twice
the forward) on the weights a token multiplies: its top-k routed experts, the shared experts and the router
besides attention, not every expert of the layer (which the memory figures count).
"""
from __future__ import annotations

from types import ModuleType
from typing import ClassVar

import torch
from torch import nn

import accel_kit.models.moe.hf as moe_hf  # by its full name: no import through the package's face
from accel_kit.models.family import Family, FlopTerms, ModelShape, PipelineStages
from accel_kit.models.moe.config import MoEConfig
from accel_kit.models.moe.experts import Experts, grouped_mm_runs
from accel_kit.models.init import ONES, Init, InitRule, initialised, transformers_uninitialised
from accel_kit.models.moe.model import INIT_STD, MoEBlock, MoEModel
from accel_kit.models.moe.presets import PRESETS, SOURCES

BYTES_16BIT = 2  # Korthikanti's accounting is for 16-bit activations
BYTES_FP32 = 4  # SDPA's logsumexp, RMSNorm's inverse RMS and the router's softmax stay fp32
BYTES_INDEX = 8  # int64 routing indices
BYTES_INT32 = 4  # the grouped product's offsets


def _weights(cfg: MoEConfig) -> dict[str, int]:
    """Weights of one layer's matrices, by part: attention (q, k, v, o: h x nh hd, two h x nkv hd, nh hd x h),
    the router (h x E), one routed expert (gate, up, down: 3 h F), the shared experts (3 h F_shared in all)
    and a dense layer's MLP (3 h ffn)."""
    h, q, kv = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"attention": h * (q + 2 * kv) + q * h, "router": h * cfg.n_experts,
            "expert": 3 * h * cfg.expert_ffn_hidden_size, "shared": 3 * h * cfg.shared_width,
            "dense_mlp": 3 * h * cfg.ffn_hidden_size}


class MixtureOfExperts(Family[MoEConfig]):
    """Decoder-only MoE LMs (Mixtral, Qwen3-MoE, OLMoE): Llama's attention with optional QK-norm, a softmax
    top-k router over SwiGLU experts, optional shared experts and dense layers, a load-balancing loss."""

    name: ClassVar[str] = "moe"
    config_type: ClassVar[type] = MoEConfig
    presets: ClassVar[dict[str, MoEConfig]] = PRESETS
    sources: ClassVar[dict[str, str]] = SOURCES
    # The release's shape; a point may change the vocabulary, the context, the embedding padding, the experts'
    # kernel and the aux-loss weight.
    overridable: ClassVar[tuple[str, ...]] = ("vocab_size", "seq_len", "pad_vocab_multiple", "expert_kernel",
                                              "router_aux_loss_coef")
    hf_model_class: ClassVar[str] = "Qwen3MoeForCausalLM"  # moe-debug's; each config names its own (hf_architecture)
    hf_modules: ClassVar[tuple[str, ...]] = moe_hf.MODULES
    supports_kv_cache: ClassVar[bool] = True  # MoEModel.forward_cached
    hf_conversion: ClassVar[ModuleType] = moe_hf

    def unsupported_compiled_decode(self, precision: str) -> str | None:
        if precision == "bf16":
            return None
        # moe.experts: torch.compile traces torch._grouped_mm in bf16 only; the per-expert loop it falls back to
        # reads each expert's row count on the host, which a captured step cannot
        return (f"the MoE layer's grouped product compiles in bf16 only; in {precision} its per-expert loop reads "
                "the experts' row counts on the host, which a compiled decode step cannot (impl eager runs it)")

    # --- building

    def build(self, cfg: MoEConfig, *, activation_checkpointing: bool = False) -> MoEModel:
        return initialised(lambda: MoEModel(cfg, activation_checkpointing=activation_checkpointing),
                           self.init_rule(cfg))

    def init_rule(self, cfg: MoEConfig) -> InitRule:
        # transformers' init for these models: normal(0, 0.02) for the linears (the router too), the embedding and
        # the experts' 3-D weights; the norms (QK-norms too) start at 1
        return lambda name: ONES if name.endswith("norm.weight") else Init(std=INIT_STD)

    def build_layer(self, cfg: MoEConfig, impl: str = "native") -> nn.Module:
        """One MoE layer (never a dense one): ours, or transformers' decoder layer of ``cfg.hf_architecture``
        holding the weights ours has from the same seed."""
        if impl == "native":
            return initialised(lambda: MoEBlock(cfg), self.init_rule(cfg))
        if impl == "hf":
            # Our layer's weights under transformers' names: the two impls then time the same weights (one seed
            # gives both). transformers' experts are torch.empty until a whole model's post_init, and a lone
            # layer has none: its 2.4 GB of Qwen3-30B-A3B experts were never-written pages of zeros, on which
            # its fp32 products ran 15x faster than on real weights. Made without draws: every weight is ours.
            ours = self.build_layer(cfg, "native")
            layer = transformers_uninitialised(lambda: moe_hf.HFMoELayer(cfg))
            layer.layer.load_state_dict(moe_hf.state_map(cfg).layer_names(ours.state_dict()))
            return layer
        raise ValueError(f"layer impl must be 'native' or 'hf', got {impl!r}")

    # --- shape and work

    def shape(self, cfg: MoEConfig) -> ModelShape:
        return ModelShape(family=self.name, n_layers=cfg.n_layers, hidden_size=cfg.hidden_size, n_heads=cfg.n_heads,
                          n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                          ffn_hidden_size=cfg.ffn_hidden_size or cfg.expert_ffn_hidden_size,
                          vocab_size_model=cfg.padded_vocab_size, vocab_size=cfg.vocab_size,
                          n_experts=cfg.n_experts, experts_per_token=cfg.experts_per_token,
                          expert_ffn_hidden_size=cfg.expert_ffn_hidden_size, n_shared_experts=cfg.n_shared_experts,
                          n_moe_layers=cfg.n_moe_layers, expert_kernel=cfg.expert_kernel)

    def _attention_flops(self, cfg: MoEConfig, seq_len: int) -> int:
        # Q K^T and P V: hd multiply-adds each per (query head, key position), every one of the nh query heads
        # (GQA shares K and V, not the products), over all seq_len positions: 2 x 2 x seq_len x nh hd.
        return 4 * seq_len * cfg.n_heads * cfg.head_dim

    def layer_flop_terms(self, cfg: MoEConfig, seq_len: int) -> FlopTerms:
        """Forward FLOPs per token of one MoE layer: 2 per weight the token multiplies, plus attention's products.

        The token multiplies the attention projections (all of them), the router (h x E: its logits over every
        expert), its top-k routed experts (k x 3 h F: gate, up and down of each; the other E - k it skips) and
        the shared experts (3 h F_shared); each weight one multiply-add, 2 FLOPs. The top-k weighting and sum
        (k h multiply-adds) and the softmax are elementwise, not counted, as norms are not.
        """
        w = _weights(cfg)
        routed = w["router"] + cfg.experts_per_token * w["expert"]
        return FlopTerms(matmul=2 * (w["attention"] + routed + w["shared"]),
                         attention=self._attention_flops(cfg, seq_len), matmul_unpruned=2 * routed)

    def flop_terms(self, cfg: MoEConfig, seq_len: int, *, micro_batch: int = 1) -> FlopTerms:
        """The MoE layers' terms, the dense layers' (2 x (attention projections + 3 h ffn), Llama's), and the
        output projection (2 h V)."""
        moe, n_dense = self.layer_flop_terms(cfg, seq_len), len(cfg.dense_layers)
        w = _weights(cfg)
        dense_matmul = 2 * (w["attention"] + w["dense_mlp"])
        return FlopTerms(matmul=cfg.n_moe_layers * moe.matmul + n_dense * dense_matmul,
                         attention=cfg.n_layers * moe.attention, logits=2 * cfg.hidden_size * cfg.padded_vocab_size,
                         matmul_unpruned=cfg.n_moe_layers * moe.matmul_unpruned)

    def gemm_shapes(self, cfg: MoEConfig, tokens: int) -> tuple[tuple[int, int, int], ...]:
        """(M, K, N) of one MoE layer's products, in forward order: qkv, o, the router, the routed experts'
        gate+up and down, the shared experts'. The routed experts' are given as k products over all the
        tokens (the FLOPs they cost; they run as E products of about k tokens / E rows each)."""
        h, q, kv = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        f, fs = cfg.expert_ffn_hidden_size, cfg.shared_width
        routed = ((tokens, h, 2 * f), (tokens, f, h)) * cfg.experts_per_token
        shared = ((tokens, h, 2 * fs), (tokens, fs, h)) if fs else ()
        return ((tokens, h, q + 2 * kv), (tokens, q, h), (tokens, h, cfg.n_experts)) + routed + shared

    # --- memory

    def activation_bytes_per_layer(self, cfg: MoEConfig, micro_batch: int, seq_len: int, *,
                                   flash_attention: bool, tp: int = 1) -> int:
        """Bytes one MoE layer keeps for backward, 16-bit activations: Llama's attention accounting
        (``accel_kit.models.llama.family``) with the MLP replaced by the routed one. The estimate takes this
        for every layer (a dense layer of the releases' shapes keeps no more).

        With s sequence, b batch, h hidden, a heads, dq = a hd, dkv = n_kv_heads hd, E experts, k top-k, F
        the expert width, F_s the shared width:

        - the two RMSNorms (inputs and fp32 inverse RMS) and the inputs of qkv_proj and of the MLP: 8 sbh + 8 sb;
        - q, k, v after RoPE and attention's output: 2 sb (2 dq + 2 dkv); flash's logsumexp 4 abs or the
          probabilities 2 a s^2 b;
        - QK-norm: the norms' inputs, views of the whole qkv output, 2 sb (dq + 2 dkv), and their fp32
          inverse RMS (per head or per token);
        - routing: the router's fp32 softmax output, 4 sbE; the top-k probabilities and their sum (the
          renormalisation's backward), 4 sb (k + 1); the weights in the compute dtype, 2 sbk; int64 buffers
          (the top-k indices, the gathered rows' token index, the inverse of the sort), 24 sbk; the grouped
          product's int32 offsets, 4 E;
        - the active experts, on the s b k token copies: the gathered rows (the grouped product's input),
          2 sbk h; gate and up (one tensor), silu(gate) and their product, 8 sbk F; the experts' outputs in
          token order (the weighting's backward), 2 sbk h;
        - shared experts: SwiGLU's 8 sb F_s.

        Checked against the tensors autograd keeps for one bf16 layer (``tests/test_moe.py``).

        On ``tp`` ranks the per-head tensors divide by tp (attention's tensor parallelism); the experts stay
        whole (no tensor-parallel plan for them).
        """
        s, b, h, a = seq_len, micro_batch, cfg.hidden_size, cfg.n_heads
        dq, dkv = a * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        k, f = cfg.experts_per_token, cfg.expert_ffn_hidden_size
        sb = s * b
        whole = 2 * (BYTES_16BIT * sb * h + BYTES_FP32 * sb) + 2 * BYTES_16BIT * sb * h
        scores = BYTES_FP32 * a * sb if flash_attention else BYTES_16BIT * a * s * s * b
        split = BYTES_16BIT * sb * (2 * dq + 2 * dkv) + scores
        if cfg.qk_norm is not None:
            rows = (a + cfg.n_kv_heads) if cfg.qk_norm == "head" else 2
            split += BYTES_16BIT * sb * (dq + 2 * dkv) + BYTES_FP32 * sb * rows
        routing = (BYTES_FP32 * sb * (cfg.n_experts + k + 1) + BYTES_16BIT * sb * k + 3 * BYTES_INDEX * sb * k
                   + BYTES_INT32 * cfg.n_experts)
        experts = BYTES_16BIT * sb * k * (2 * h + 4 * f)
        shared = BYTES_16BIT * sb * 4 * cfg.shared_width
        return whole + routing + experts + shared + split // tp

    def layer_weight_count(self, cfg: MoEConfig) -> int:
        """Weights of one MoE layer's matrices, every expert's (memory): attention, router, E routed experts,
        the shared experts; the norms' weights not counted."""
        w = _weights(cfg)
        return w["attention"] + w["router"] + cfg.n_experts * w["expert"] + w["shared"]

    def context_length(self, cfg: MoEConfig) -> int:
        return cfg.seq_len  # the RoPE tables' positions

    def decode_weight_count(self, cfg: MoEConfig, batch: int) -> int:
        """Weights one decode step of ``batch`` sequences reads: every layer's attention, the routers, the shared
        experts and the dense layers' MLPs, the output projection, and in each MoE layer the routed experts the
        batch's B k choices reach, each read once however many of them it takes.

        The experts reached are known only once the router has run; here, their expectation under uniform
        routing, E (1 - (1 - k/E)^B): k at batch 1 (the active count), approaching E as the batch grows (a
        large batch reads every expert, as a dense model of the total size would)."""
        w, E, k = _weights(cfg), cfg.n_experts, cfg.experts_per_token
        reached = E * (1 - (1 - k / E) ** batch)
        moe = w["attention"] + w["router"] + w["shared"] + round(reached * w["expert"])
        dense = w["attention"] + w["dense_mlp"]
        return cfg.n_moe_layers * moe + len(cfg.dense_layers) * dense + cfg.hidden_size * cfg.padded_vocab_size

    def inactive_weight_count(self, cfg: MoEConfig) -> int:
        """The E - k routed experts a token skips, in each of the MoE layers."""
        return cfg.n_moe_layers * (cfg.n_experts - cfg.experts_per_token) * _weights(cfg)["expert"]

    # --- structure

    def prunable_linears(self, model: nn.Module) -> list[tuple[str, nn.Linear]]:
        """The attention linears, the dense layers' MLPs and the shared experts. Not the routed experts: their
        weights are 3-D tensors, not linears (the sparsity code and its kernels prune ``nn.Linear``), and each
        sees only its share of the tokens; not the router, whose few weights decide where every token goes."""
        return [(name, m) for name, m in model.named_modules()
                if isinstance(m, nn.Linear) and name.startswith("layers.") and not name.endswith(".router")]

    def pipeline_stages(self, model: nn.Module) -> PipelineStages:
        return MoEModel.stages

    # The pipeline's last stage computes the loss from the logits alone (``accel_kit.engine.pipeline``): the
    # load-balancing loss of every stage's MoE layers would be left out, so the family does not run as stages.
    pipeline_parallel: ClassVar[bool] = False
    # No tensor-parallel plan: sharding the attention alone would leave every expert whole on every rank.
    tensor_parallel: ClassVar[bool] = False
    context_parallel: ClassVar[bool] = False
    # Each MoE layer's routed experts shard over ep ranks, their tokens exchanged by all-to-all (``moe.parallel``).
    expert_parallel: ClassVar[bool] = True

    def apply_expert_parallel(self, model: nn.Module, ep_mesh):
        from accel_kit.models.moe.parallel import apply_expert_parallel

        return apply_expert_parallel(model, ep_mesh)

    def position_buffers(self, model: MoEModel) -> list[tuple[torch.Tensor, int]]:
        return model.position_buffers()

    def ran_fields(self, model: nn.Module) -> dict[str, str]:
        """The experts' kernel the last step ran (found through any wrapper), where it has run."""
        ran = next((m.kernel_ran for m in model.modules() if isinstance(m, Experts) and m.kernel_ran), None)
        return {"expert_kernel": ran} if ran else {}

    # --- configs as data

    def config_from_dict(self, data: dict) -> MoEConfig:
        return MoEConfig(**(data | {"dense_layers": tuple(data.get("dense_layers", ()))}))

    # --- overrides

    def kernel_overrides(self, adapter, dtype: torch.dtype) -> dict[str, str]:
        """The experts' kernel for a point in ``dtype`` on the adapter's device: grouped_mm where it runs there
        (tried once, ``moe.experts.grouped_mm_runs``), else the loop; the record says which."""
        device_type = adapter.torch_device().type
        return {"expert_kernel": "grouped_mm" if grouped_mm_runs(device_type, dtype) else "loop"}
