"""transformers' causal LM behind the engine's model interface: ``forward(idx, targets) -> (logits, loss)``.

The model is transformers' own, built from its config with random weights (``from_config``:
no checkpoint is read). The loss is ours (``lm_loss``): the engine's targets are already the
next tokens, where transformers' ``labels`` would be shifted once more.
"""
from __future__ import annotations

import torch
from torch import nn

from accel_kit.errors import ParameterError
from accel_kit.models.family import lm_loss, unique_param_count
from accel_kit.models.hf.config import PREFIX, HFConfig, transformers_config


def build_transformers_model(cfg: HFConfig) -> nn.Module:
    """transformers' ``AutoModelForCausalLM`` of ``cfg``, randomly initialised on the current default device.

    SDPA attention where the architecture has it (transformers' default, and what our families'
    transformers configs ask for); an architecture without it runs its eager attention.
    """
    from transformers import AutoModelForCausalLM, PreTrainedModel

    hf = transformers_config(cfg)
    # transformers before 5 has no experts implementations to choose (its MoE models loop over their experts)
    choosable = cfg.moe.n_experts and hasattr(PreTrainedModel, "set_experts_implementation")
    experts = {"experts_implementation": experts_implementation(cfg)} if choosable else {}
    try:
        return AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa", **experts)
    except ValueError as exc:
        if "sdpa" not in str(exc).lower() and "scaled_dot_product" not in str(exc).lower():
            raise ParameterError(f"model preset {PREFIX}{cfg.path}: transformers cannot build it: "
                                 f"{str(exc).splitlines()[0]}") from None
    return AutoModelForCausalLM.from_config(hf, attn_implementation="eager", **experts)


def experts_implementation(cfg: HFConfig) -> str:
    """transformers' experts kernel a MoE model trains with: its default ``grouped_mm`` (one grouped product per
    projection, the experts' tokens sorted together), where the rows it multiplies are 16-byte aligned.

    torch's CPU ``_grouped_mm`` refuses strides that are no multiple of 16 bytes (measured: a width of 36 fails
    in bf16, 30 or 33 in fp32 too), and transformers does not fall back on it. Widths of multiples of 8 elements
    are aligned in every precision; others run ``batched_mm``: the same products on each (token, expert) pair's
    gathered weights (T x top_k copies of an expert's weights per layer: memory no released shape pays, as their
    widths are multiples of 64). Not the ``eager`` loop: it skips the experts no token reached, whose weights
    then get no gradient, which DDP's reducer waits for.
    """
    aligned = cfg.hidden_size % 8 == 0 and cfg.moe.expert_ffn_hidden_size % 8 == 0
    return "grouped_mm" if aligned else "batched_mm"


class HFCausalLM(nn.Module):
    """A transformers causal LM (``.model``) with the engine's interface; ``.cfg`` is its ``HFConfig``
    (how ``family_of_model`` finds the family through DDP or ``torch.compile``)."""

    def __init__(self, cfg: HFConfig, *, activation_checkpointing: bool = False, model: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.model = model if model is not None else build_transformers_model(cfg)
        if activation_checkpointing:
            if not getattr(self.model, "supports_gradient_checkpointing", False):
                raise ParameterError(f"model preset {PREFIX}{cfg.path}: {cfg.architecture} has no activation "
                                     f"checkpointing in transformers")
            # non-reentrant, as our families' checkpointing (run_blocks)
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if idx.shape[1] > self.cfg.max_positions:
            raise ValueError(f"sequence of {idx.shape[1]} tokens is longer than the model's {self.cfg.max_positions}")
        logits = self.model(input_ids=idx, use_cache=False).logits  # (B, T, V_padded)
        return logits, (None if targets is None else lm_loss(logits, targets))

    def num_params(self) -> int:
        """Unique parameters (a tied output projection counted once)."""
        return unique_param_count(self)


def decoder_layers(model: nn.Module, n_layers: int) -> tuple[str, nn.ModuleList]:
    """The decoder layers of a transformers causal LM (inside ``model``, a wrapper included): the first
    ``nn.ModuleList`` of ``n_layers`` modules, with its qualified name. Every architecture keeps them so
    (``model.layers``, ``transformer.h`` ...), under names that differ."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return name, module
    raise ValueError(f"{type(model).__name__} has no list of {n_layers} decoder layers")


def layer_matmuls(layer: nn.Module) -> list[tuple[str, int, int]]:
    """(name, in, out) of one layer's weight matrices: its ``nn.Linear``s, and GPT-2's ``Conv1D``s (a
    linear with its weight stored (in, out))."""
    out = []
    for name, m in layer.named_modules():
        if isinstance(m, nn.Linear):
            out.append((name, m.in_features, m.out_features))
        elif type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None and m.weight.dim() == 2:
            out.append((name, m.weight.shape[0], m.weight.shape[1]))
    return out


def expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The experts modules of a transformers MoE model, with their qualified names: those transformers'
    ``use_experts_implementation`` made (it gives each ``num_experts``, ``has_gate`` and ``is_transposed``), whose
    kernel the config's experts implementation chooses."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "has_gate") and hasattr(m, "is_transposed") and hasattr(m, "num_experts")]
