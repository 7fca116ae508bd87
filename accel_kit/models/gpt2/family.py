"""The GPT-2 family (GPT-2, GPT-3 shapes, GenSLM): its answers to ``accel_kit.models.family.Family``.

Fused QKV (three h x h matrices in one), an MLP of width r*h with GELU, learned positions,
LayerNorm, biases, the output projection tied to the embedding (Radford et al. 2019).
"""
from __future__ import annotations

import torch
from torch import nn

import accel_kit.models.gpt2.hf as gpt2_hf  # by its full name: no import through the package's face
from accel_kit.models.family import Family, FlopTerms, ModelShape, PipelineStages, group_rows_by_shard, shard_block
from accel_kit.models.gpt2.flops import attention_flops_per_token, block_gemm_shapes, block_matmul_flops_per_token
from accel_kit.models.gpt2.block import Block
from accel_kit.models.gpt2.model import GPT, GPTConfig
from accel_kit.models.init import ONES, ZEROS, Init, InitRule, initialised
from accel_kit.models.gpt2.presets import PRESETS, SOURCES


INIT_STD = 0.02  # GPT-2's initializer_range


class GPT2(Family[GPTConfig]):
    name = "gpt2"
    config_type = GPTConfig
    presets = PRESETS
    sources = SOURCES
    overridable = ("vocab_size", "seq_len", "pad_vocab_multiple", "dropout", "narrow_linear_fast_path")
    hf_model_class = "GPT2LMHeadModel"
    hf_modules = ("transformers.models.gpt2.modeling_gpt2",)
    supports_kv_cache = True  # GPT.forward_cached
    hf_conversion = gpt2_hf

    def build(self, cfg: GPTConfig, *, activation_checkpointing: bool = False) -> GPT:
        return initialised(lambda: GPT(cfg, activation_checkpointing=activation_checkpointing), self.init_rule(cfg))

    def build_layer(self, cfg: GPTConfig, impl: str = "native") -> nn.Module:
        if impl == "native":
            return initialised(lambda: Block(cfg.block), self.init_rule(cfg))
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        return GPT2Block(self.hf_config(cfg), layer_idx=0)

    def init_rule(self, cfg: GPTConfig) -> InitRule:
        # GPT-2's: normal(0, 0.02) for the linears and both embeddings, biases 0, LayerNorms' weights 1; the
        # residual projections (c_proj) at 0.02 / sqrt(2 n_layers), so the residual stream's variance does not
        # grow with depth.
        residual = Init(std=INIT_STD / (2 * cfg.n_layers) ** 0.5)

        def rule(name: str) -> Init:
            module, _, kind = name.rpartition(".")
            if kind == "bias":
                return ZEROS
            if module.rpartition(".")[2].startswith("ln_"):
                return ONES
            return residual if module.endswith("c_proj") else Init(std=INIT_STD)
        return rule

    def context_length(self, cfg: GPTConfig) -> int:
        return cfg.seq_len  # the learned position table's rows

    def shape(self, cfg: GPTConfig) -> ModelShape:
        # Multi-head attention: as many key/value heads as query heads.
        return ModelShape("gpt2", cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.n_heads,
                          cfg.hidden_size // cfg.n_heads, cfg.mlp_ratio * cfg.hidden_size, cfg.padded_vocab_size,
                          cfg.vocab_size)

    def layer_flop_terms(self, cfg: GPTConfig, seq_len: int) -> FlopTerms:
        # QKV 3h^2 + output h^2 + MLP 2rh^2 weights, 2 FLOPs each per token; scores and weighted sum 4sh.
        return FlopTerms(block_matmul_flops_per_token(cfg.hidden_size, cfg.mlp_ratio),
                         attention_flops_per_token(cfg.hidden_size, seq_len))

    def gemm_shapes(self, cfg: GPTConfig, tokens: int) -> tuple[tuple[int, int, int], ...]:
        return block_gemm_shapes(tokens, cfg.hidden_size, cfg.mlp_ratio)

    def activation_bytes_per_layer(self, cfg: GPTConfig, micro_batch: int, seq_len: int, *,
                                   flash_attention: bool, tp: int = 1) -> int:
        # Korthikanti et al. 2022, section 4.1: s*b*h*(34 + 5*a*s/h) bytes at 16 bit; the second term is
        # the stored score matrix, which flash / memory-efficient attention never materialises. Under
        # tensor parallelism (section 4.2, no sequence parallelism) s*b*h*(10 + 24/t + 5*a*s/(h*t)): the
        # two LayerNorms' inputs (4 sbh), the attention's and the MLP's inputs (2 + 2 sbh) and their output
        # dropout masks (1 + 1 sbh) are whole on every rank; Q, K, V, the scores, the GELU's input and
        # output and the projections' inputs split by heads and MLP width.
        s, b, h, a = seq_len, micro_batch, cfg.hidden_size, cfg.n_heads
        return s * b * h * 10 + (s * b * h * 24 + (0 if flash_attention else 5 * a * s * s * b)) // tp

    def layer_weight_count(self, cfg: GPTConfig) -> int:
        return (4 + 2 * cfg.mlp_ratio) * cfg.hidden_size ** 2

    def prunable_linears(self, model: nn.Module) -> list[tuple[str, nn.Linear]]:
        # The paper prunes the blocks' linears; embeddings, LayerNorms and the tied output projection stay dense.
        layers = []
        for block_name, block in model.named_modules():
            if isinstance(block, Block):
                layers += [(f"{block_name}.{name}", module) for name, module in block.named_modules()
                           if isinstance(module, nn.Linear)]
        return layers

    def pipeline_stages(self, model: nn.Module) -> PipelineStages:
        return GPT.stages

    pipeline_parallel = True  # the model computes embed, forward_blocks and head apart

    tensor_parallel = True

    def apply_tensor_parallel(self, model: nn.Module, tp_mesh) -> None:
        tp = tp_mesh.size()
        for block in model.h:
            attn = block.attn
            width = attn.n_heads * attn.head_dim
            group_rows_by_shard(attn.c_attn, [width] * 3, tp)  # fused [q; k; v]: each rank its heads of all three
            shard_block(block, tp_mesh, colwise=["attn.c_attn", "mlp.c_fc"], rowwise=["attn.c_proj", "mlp.c_proj"])
            attn.n_heads //= tp
            # the bf16 fast path's custom autograd takes plain tensors, not DTensor weights
            attn.fast_path = block.mlp.fast_path = False

    context_parallel = True

    def position_buffers(self, model: GPT) -> list[tuple[torch.Tensor, int]]:
        return model.position_buffers()

    def kernel_overrides(self, adapter, dtype: torch.dtype) -> dict[str, bool]:
        # The output projections' custom backward (block._NarrowOutputLinear), where the device says it pays.
        return {"narrow_linear_fast_path": adapter.nn_weight_gradient_pays(dtype)}
