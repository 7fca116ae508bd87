"""``TransformersCausalLM``: any transformers causal LM, from a ``config.json``, as a model family.

What our own families derive from their shape (FLOPs, GEMMs, prunable layers) this one reads off
transformers' model: FLOPs counted under torch's counter on fake tensors (``hf.count``), the
products and linears found in its first decoder layer on the meta device. What it cannot know
before allocation it says so: the activations a layer keeps (the fit check counts weights,
gradients, optimizer state and logits; a point that then runs out of memory is an ``oom`` record).
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from accel_kit.errors import ParameterError
from accel_kit.models.family import Family, FlopTerms, ModelShape, PipelineStages
from accel_kit.models.hf.config import PREFIX, HFConfig, config_file, load, transformers_config
from accel_kit.models.hf.moe import MoEShape
from accel_kit.models.hf.model import HFCausalLM, decoder_layers, expert_modules, layer_matmuls

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@lru_cache(maxsize=32)
def _counted(cfg: HFConfig, seq_len: int, micro_batch: int) -> tuple[FlopTerms, str]:
    from accel_kit.models.hf.count import count_flop_terms

    # the model of the point's vocabulary and padding (cfg), at the point's sequence and micro-batch
    return count_flop_terms(lambda: HFCausalLM(cfg), micro_batch=micro_batch, seq_len=seq_len,
                            n_layers=cfg.n_layers, n_heads=cfg.n_heads, head_dim=cfg.head_dim)


@dataclass(frozen=True)
class _Structure:
    """What the family reads off transformers' model of a config, built once on the meta device."""

    first_layer_matmuls: tuple[tuple[str, int, int], ...]  # (name, in, out) of the first decoder layer's linears
    layer_weights: int  # a decoder layer's linears and experts, the mean over the layers (dense and MoE alike)
    routed_expert_params: int  # one routed expert's parameters (its biases included: gpt-oss); 0 if dense
    experts_seen: tuple[int, int, int] = (0, 0, 0)  # (routed experts, one's width, MoE layers) of its experts modules
    # the is_causal flags the decoder layers' attention modules hold (transformers' attention functions read them;
    # a decoder's cross-attention holds False beside its causal self-attention); none: no module says
    causal_flags: frozenset[bool] = frozenset()


@lru_cache(maxsize=32)
def _structure(cfg: HFConfig) -> _Structure:
    from transformers.utils import logging as hf_logging

    # transformers' warnings while it builds this probe (BertLMHeadModel's "add is_decoder=True" ...) are quiet: the
    # model built to run says them again, and a preset refused here is refused in one line
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model = HFCausalLM(cfg)
    finally:
        hf_logging.set_verbosity(verbosity)
    _, layers = decoder_layers(model, cfg.n_layers)
    experts = [m for _, m in expert_modules(model)]
    linears = sum(k * n for layer in layers for _, k, n in layer_matmuls(layer))
    expert_params = sum(p.numel() for m in experts for p in m.parameters())
    one_expert = sum(p.numel() for p in experts[0].parameters()) // experts[0].num_experts if experts else 0
    seen = (0, 0, 0)
    if experts:  # down_proj: (experts, hidden, width), or (experts, width, hidden) where the weights are transposed
        first = experts[0]
        seen = (first.num_experts, first.down_proj.shape[-2 if first.is_transposed else -1], len(experts))
    causal = frozenset(m.is_causal for layer in layers for m in layer.modules()
                       if isinstance(getattr(m, "is_causal", None), bool))
    return _Structure(tuple(layer_matmuls(layers[0])), (linears + expert_params) // cfg.n_layers, one_expert, seen,
                      causal)


def _with_experts_seen(cfg: HFConfig) -> HFConfig:
    """``cfg`` with the experts its model holds where ``hf.moe``'s table does not know the architecture: routed
    experts, width and MoE layers read off the experts modules, the top-k from ``num_experts_per_tok`` (the
    name most architectures use; without it the experts stay unknown, and every weight counts as active).
    Shared experts are not told apart from a dense MLP there: 0."""
    n_experts, width, layers = _structure(cfg).experts_seen
    top_k = getattr(transformers_config(cfg), "num_experts_per_tok", None)
    if cfg.moe.n_experts or not n_experts or not top_k:
        return cfg
    return replace(cfg, moe=MoEShape(n_experts=n_experts, experts_per_token=int(top_k), expert_ffn_hidden_size=width,
                                     n_moe_layers=layers))


class TransformersCausalLM(Family[HFConfig]):
    """Any ``AutoModelForCausalLM`` architecture transformers knows, built from a config file with random weights."""

    name: ClassVar[str] = "hf"
    config_type: ClassVar[type] = HFConfig
    presets: ClassVar[dict[str, HFConfig]] = {}  # its presets are files: hf:PATH
    sources: ClassVar[dict[str, str]] = {}
    prefix: ClassVar[str] = PREFIX
    # The file's shape is the user's; a point sets its sequence (within the config's positions), another
    # tokenizer's vocabulary, the embedding's padding.
    overridable: ClassVar[tuple[str, ...]] = ("vocab_size", "seq_len", "pad_vocab_multiple")
    hf_model_class: ClassVar[str] = "AutoModelForCausalLM"

    def load(self, preset: str) -> HFConfig:
        """The config of preset ``hf:PATH`` (a one-line ParameterError for a file that cannot run)."""
        cfg = load(preset[len(PREFIX):])
        try:
            _structure(cfg)  # built once on the meta device: a shape transformers cannot build fails here
        except ParameterError:
            raise
        except Exception as exc:  # noqa: BLE001 - transformers' own check of the shape, in its words
            raise ParameterError(f"model preset {preset}: transformers cannot build this shape: "
                                 f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
        return _with_experts_seen(cfg)

    def digest(self, preset: str) -> str | None:
        """The config file's contents, hashed (None where there is no readable file: the point fails on its own)."""
        try:
            return hashlib.sha256(config_file(preset[len(PREFIX):]).read_bytes()).hexdigest()[:16]
        except (ParameterError, OSError):
            return None

    def preload_modules(self, preset: str) -> tuple[str, ...]:
        """transformers' modules its points import (seconds): the auto classes and the architecture's modeling."""
        try:
            model_type = json.loads(config_file(preset[len(PREFIX):]).read_text())["model_type"]
        except (ParameterError, OSError, ValueError, KeyError):
            return ()
        return ("transformers.models.auto.modeling_auto", f"transformers.models.{model_type}.modeling_{model_type}")

    def why_not_generating(self, cfg: HFConfig) -> str | None:
        """Why transformers' model of ``cfg`` does not generate text, or None where it does.

        ``load`` asks only that transformers have a causal-LM class for the config's ``model_type``, and
        encoders have one too: BERT's is ``BertLMHeadModel``, which attends both ways unless the config sets
        ``is_decoder``. Served or generated, such a model would be measured as a generator. So two more
        questions, both answered by transformers rather than by a list of names:

        1. The architectures the config declares (``architectures``, the class that saved it), where they name
           classes transformers has, include a causal-LM class (one of ``AutoModelForCausalLM``'s): a
           ``BertModel``'s or ``BertForMaskedLM``'s config is an encoder's, a ``BartForConditionalGeneration``'s
           an encoder-decoder's, of which this family would build the decoder alone.
        2. The decoder layers of the causal LM transformers builds attend causally: some attention module holds
           ``is_causal`` True (the flag transformers' attention functions read), or none holds the flag
           (state-space and recurrent layers, classes that keep none, transformers 4's encoders among them).
        """
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        import transformers

        hf = transformers_config(cfg)
        # names transformers does not have (a misspelt class, remote code) say nothing either way
        declared = [name for name in getattr(hf, "architectures", None) or [] if name in dir(transformers)]
        if declared and not set(declared) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
            return f"its architecture {', '.join(declared)} has no causal-LM head (no AutoModelForCausalLM class)"
        if _structure(cfg).causal_flags == {False}:
            hint = " (transformers makes it a decoder where the config sets is_decoder)" \
                if hasattr(hf, "is_decoder") else ""
            return f"{cfg.architecture} attends both ways for this config, as an encoder does{hint}"
        return None

    # --- building

    init_by_name = False  # transformers initialises its models, each architecture its own way

    def build(self, cfg: HFConfig, *, activation_checkpointing: bool = False) -> HFCausalLM:
        return HFCausalLM(cfg, activation_checkpointing=activation_checkpointing)

    def build_layer(self, cfg: HFConfig, impl: str = "native") -> nn.Module:
        raise ParameterError(f"model preset {cfg.label}: the hf family runs the training studies; the "
                             f"microbenchmark times our families' layers (gpt2, llama)")

    # --- shape and work

    def context_length(self, cfg: HFConfig) -> int:
        return cfg.max_positions  # the config's positions; seq_len is the point's sequence

    def shape(self, cfg: HFConfig) -> ModelShape:
        return ModelShape(family=self.name, n_layers=cfg.n_layers, hidden_size=cfg.hidden_size, n_heads=cfg.n_heads,
                          n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, ffn_hidden_size=cfg.ffn_hidden_size,
                          vocab_size_model=cfg.padded_vocab_size, vocab_size=cfg.vocab_size,
                          architecture=cfg.architecture, **asdict(cfg.moe))

    def flop_terms(self, cfg: HFConfig, seq_len: int, *, micro_batch: int = 1) -> FlopTerms:
        """Counted: one forward and backward of a ``micro_batch`` x ``seq_len`` batch on fake tensors."""
        return _counted(cfg, seq_len, micro_batch)[0]

    def flops_source(self, cfg: HFConfig, seq_len: int, *, micro_batch: int = 1) -> str:
        return _counted(cfg, seq_len, micro_batch)[1]

    def layer_flop_terms(self, cfg: HFConfig, seq_len: int) -> FlopTerms:
        """One layer's share of the counted model: the mean over its layers (a decoder stack repeats one layer;
        a MoE model may keep dense ones, DeepSeek-V3's first)."""
        terms = self.flop_terms(cfg, seq_len)
        return FlopTerms(matmul=terms.matmul // cfg.n_layers, attention=terms.attention // cfg.n_layers)

    def gemm_shapes(self, cfg: HFConfig, tokens: int) -> tuple[tuple[int, int, int], ...]:
        """(M, K, N) of the first decoder layer's linears, in the order the layer holds them; a MoE model's
        then one routed expert's two products (gate and up together, then down) at balanced routing: the
        tokens x top-k rows shared by the experts."""
        shapes = tuple((tokens, k, n) for _, k, n in _structure(cfg).first_layer_matmuls)
        moe = cfg.moe
        if moe.n_experts:
            rows, width = max(1, tokens * moe.experts_per_token // moe.n_experts), moe.expert_ffn_hidden_size
            shapes += ((rows, cfg.hidden_size, 2 * width), (rows, width, cfg.hidden_size))
        return shapes

    # --- memory

    def activation_bytes_per_layer(self, cfg: HFConfig, micro_batch: int, seq_len: int, *,
                                   flash_attention: bool, tp: int = 1) -> int:
        """Not known before allocation for an arbitrary architecture: 0, so the fit check counts what is
        known (weights, gradients, optimizer state, logits); a point that then runs out is an ``oom`` record."""
        return 0

    def layer_weight_count(self, cfg: HFConfig) -> int:
        """A decoder layer's linears and every one of its experts, the mean over the layers (a MoE model may
        keep dense layers: DeepSeek-V3's first ones)."""
        return _structure(cfg).layer_weights

    def inactive_weight_count(self, cfg: HFConfig) -> int:
        """The routed experts beyond a token's top-k, in every MoE layer (each expert's weights as the model
        holds them: biases included where it has them)."""
        moe = cfg.moe
        return moe.n_moe_layers * (moe.n_experts - moe.experts_per_token) * _structure(cfg).routed_expert_params

    # --- structure

    def prunable_linears(self, model: nn.Module) -> list[tuple[str, nn.Linear]]:
        """Every decoder layer's ``nn.Linear``s (embeddings, norms and the output projection stay dense, as
        in our families; GPT-2's ``Conv1D`` layers are not ``nn.Linear`` and stay dense too)."""
        cfg = next(m.cfg for m in model.modules() if isinstance(m, HFCausalLM))
        prefix, _ = decoder_layers(model, cfg.n_layers)
        return [(name, m) for name, m in model.named_modules()
                if isinstance(m, nn.Linear) and name.startswith(prefix + ".")]

    def pipeline_stages(self, model: nn.Module) -> PipelineStages:
        raise NotImplementedError("the hf family's models are not split into pipeline stages (their attribute "
                                  "names differ by architecture)")

    # --- transformers

    def to_hf(self, model: HFCausalLM) -> nn.Module:
        return copy.deepcopy(model.model)

    def from_hf(self, hf_model: nn.Module) -> nn.Module:
        raise NotImplementedError("an hf model is transformers' own already; HFCausalLM(cfg, model=...) wraps one")

    def hf_config(self, cfg: HFConfig) -> PretrainedConfig:
        return transformers_config(cfg)

