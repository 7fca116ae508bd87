"""What a model family answers: the protocol the engine, sparsity, predictor and adapters ask.

A family is one folder under ``accel_kit/models/`` (``gpt2/``, ``llama/``, ``moe/``) holding its typed
config, its presets with their sources, its modules (made of the shared decoder pieces,
``accel_kit.models.common``) and its conversion to and from transformers, and one ``Family``
subclass that answers every question about its shape. The registry (``accel_kit.models.registry``)
lists the families, one line each. Outside a family's folder and the pieces it is made of no code
reads a config field by name: it asks the family, or reads the family-neutral records below
(``ModelShape``, ``FlopTerms``, ``AttentionShape``, ``PipelineStages``).

FLOPs follow one convention for every family (``accel_kit.flops``): 2 FLOPs per multiply-add
of a matrix product, attention over the full score matrix, backward twice the forward,
recomputation not counted.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Generic, Iterable, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from accel_kit.flops import direction_factor
from accel_kit.json_types import JSONObject

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import PretrainedConfig

    from accel_kit.models.init import InitRule
    from accel_kit.models.kv_cache import KVCache
    from accel_kit.models.moe.parallel import ExpertShards

IGNORE_INDEX = -100  # targets with this value (padding) do not count in any family's loss


def run_blocks(blocks: Iterable[nn.Module], x: torch.Tensor, *, checkpointing: bool, training: bool) -> torch.Tensor:
    """``x`` through every block in turn; with ``checkpointing`` (training, grad on) each block keeps only
    its input and recomputes the rest in backward."""
    for block in blocks:
        if checkpointing and training and torch.is_grad_enabled():
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = block(x)
    return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32 over every target that is not ``IGNORE_INDEX``: every family's training loss."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def unique_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` with each one's data once (layers that share a table hold one tensor, or views of one)."""
    seen: dict[tuple, torch.Tensor] = {}
    for t in tensors:
        seen.setdefault((t.data_ptr(), t.shape, t.stride()), t)
    return list(seen.values())


def unique_param_count(model: nn.Module) -> int:
    """Parameters counted once each (a tied output projection is the embedding's)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def layer_output(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The hidden states a layer returns: transformers 4.x's layers return a tuple, 5.x's and ours a tensor."""
    return out[0] if isinstance(out, tuple) else out


class PaddedVocab:
    """What every family's config computes from its ``vocab_size`` and ``pad_vocab_multiple``."""

    @property
    def padded_vocab_size(self) -> int:
        """The embedding's and the output projection's rows: the vocabulary padded up to a multiple of
        ``pad_vocab_multiple`` (a multiple of 64 runs faster matmuls)."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m


@dataclass(frozen=True)
class AttentionShape:
    """What kernel selection needs: query heads, key/value heads (fewer under GQA), head dim."""

    n_heads: int
    n_kv_heads: int
    head_dim: int


MOE_FIELDS = ("n_experts", "experts_per_token", "expert_ffn_hidden_size", "n_shared_experts", "n_moe_layers")


@dataclass(frozen=True)
class ModelShape:
    """The shape that ran, family-neutral: what records and the predictor read.

    ``vocab_size_model`` is the rows the output projection computes over (padded where the
    config pads the embedding), ``vocab_size`` the tokenizer's tokens (the ids data may hold);
    ``ffn_hidden_size`` the MLP's inner width (GPT-2: 4h; Llama 3: its SwiGLU width rule).
    """

    family: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size_model: int
    vocab_size: int
    architecture: str | None = None  # transformers' class that ran (the hf family); None: our family's own model
    # Mixture of experts (0 for a dense model): routed experts per MoE layer, the experts each token is routed
    # to (top-k), one expert's inner width, the experts every token passes through besides (shared experts),
    # and how many of the n_layers are MoE layers (the rest keep a dense MLP of ffn_hidden_size).
    n_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_hidden_size: int = 0
    n_shared_experts: int = 0
    n_moe_layers: int = 0
    expert_kernel: str | None = None  # how the experts' products ran ("grouped_mm", "loop"); None: no experts

    def record(self) -> JSONObject:
        """The record fields of the shape (``family``, ``n_layers``, ``n_kv_heads``, ``ffn_hidden_size`` ...);
        the tokenizer's vocabulary is a point parameter already, so it is left out, and so is an
        architecture our family's name already says, and the expert fields of a dense model."""
        fields = asdict(self)
        del fields["vocab_size"]
        if fields["architecture"] is None:
            del fields["architecture"]
        if not self.n_experts:
            for name in MOE_FIELDS:
                del fields[name]
        if fields["expert_kernel"] is None:
            del fields["expert_kernel"]
        return fields

    @property
    def attention(self) -> AttentionShape:
        return AttentionShape(self.n_heads, self.n_kv_heads, self.head_dim)


@dataclass(frozen=True)
class FlopTerms:
    """Forward FLOPs per token, by term (PaLM convention, see ``accel_kit.flops``).

    ``matmul``: the weight matrices of the blocks counted; ``attention``: their score and
    weighted-sum products over the full sequence; ``logits``: the output projection onto the
    vocabulary (0 for a single block). ``backward``: the backward's FLOPs per token where they were
    counted (a transformers model's, ``accel_kit.models.hf``); None: the convention's twice the forward.
    ``matmul_unpruned``: the part of ``matmul`` on weights weight sparsity leaves dense (a MoE layer's
    router and routed experts, ``Family.prunable_linears``); 0 where every block linear is prunable.
    """

    matmul: int
    attention: int
    logits: int = 0
    backward: int | None = None
    matmul_unpruned: int = 0

    @property
    def forward(self) -> int:
        return self.matmul + self.attention + self.logits

    def total(self, direction: str = "forward_backward", *, include_lm_head: bool = True) -> int:
        """FLOPs per token in ``direction``; ``include_lm_head=False`` leaves the logits out (PaLM's 6N)."""
        if self.backward is not None and direction == "forward_backward":
            # the counted backward; the logits' share of it is their two products, as every product's
            return self.forward + self.backward - (0 if include_lm_head else self.logits * direction_factor(direction))
        return (self.forward - (0 if include_lm_head else self.logits)) * direction_factor(direction)

    def sparse(self, nonzero_block_weights: int, direction: str = "forward_backward") -> int:
        """*Effective* FLOPs per token when the prunable block linears hold only ``nonzero_block_weights``
        non-zeros.

        Each non-zero weight costs 2 FLOPs per token forward; backward stays twice the forward, as
        both of its products shrink with the weights (a pruned weight's gradient is discarded).
        Attention, the (unpruned) output projection and ``matmul_unpruned`` keep their dense counts.
        """
        pruned = self.matmul - self.matmul_unpruned
        return (self.forward - pruned + 2 * nonzero_block_weights) * direction_factor(direction)


def group_rows_by_shard(linear: nn.Linear, widths: list[int], parts: int) -> None:
    """Reorder a fused linear's output rows (in place) so that cutting them into ``parts`` contiguous shards
    gives each shard its own share of every matrix fused in it.

    A column-wise tensor-parallel shard is a contiguous block of output rows; cut as it is, a fused
    [q; k; v] of widths ``widths`` would give rank 0 all of q and none of v. Regrouped as
    [q_0; k_0; v_0 | q_1; k_1; v_1 | ...], shard r holds q, k and v of its heads, and the module's forward,
    which splits its output by the (now local) widths, runs unchanged. A permutation of a freshly
    initialised model's rows is the same model: every weight keeps its value and its own optimizer state,
    so a tensor-parallel run trains as one process does. (Unfusing the linear would do the same and
    rename the weights; the permutation keeps the model's names and its one GEMM per fused matrix.)

    On a model not yet initialised (built on the meta device to be sharded first) there are no values to
    move: the linear records the order (``init_layout``), in which its parameters are then drawn
    (``accel_kit.models.init``), so they hold what regrouping one process's would.
    """
    import functools

    linear.init_layout = functools.partial(rows_grouped_by_shard, widths=list(widths), parts=parts)
    with torch.no_grad():
        for t in (linear.weight, linear.bias):
            if t is not None:
                t.copy_(linear.init_layout(t))


def rows_grouped_by_shard(t: torch.Tensor, widths: list[int], parts: int) -> torch.Tensor:
    """``t``'s rows (fused matrices of ``widths``) reordered as ``group_rows_by_shard`` orders them (a copy)."""
    chunks = [piece.chunk(parts, dim=0) for piece in t.split(widths, dim=0)]
    return torch.cat([c[r] for r in range(parts) for c in chunks], dim=0)


def shard_block(block: nn.Module, tp_mesh: DeviceMesh, colwise: list[str], rowwise: list[str]) -> None:
    """DTensor tensor parallelism on one block: ``colwise`` linears (by name in the block) split their output
    rows over ``tp_mesh``, ``rowwise`` ones their input columns, and all-reduce their output (Megatron-LM's
    pairing: one all-reduce per pair forward, one backward)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {name: ColwiseParallel() for name in colwise} | {name: RowwiseParallel() for name in rowwise}
    parallelize_module(block, tp_mesh, plan)


@dataclass(frozen=True)
class PipelineStages:
    """Where a model splits into pipeline stages, as attribute names on the model.

    ``embedding``: modules that run before the first block; ``blocks``: the ``nn.ModuleList`` of
    blocks; ``head``: modules after the last block (final norm, output projection). A pipeline
    stage keeps its share of the blocks, the first stage the embedding, the last the head; the
    others are set to None on that stage's model (``accel_kit.engine.pipeline``).
    """

    embedding: tuple[str, ...]
    blocks: str
    head: tuple[str, ...]


class KernelAdvisor(Protocol):
    """What ``Family.kernel_overrides`` asks of a device adapter (``accel_kit.devices.base.BaseAdapter``, which
    models/ may not import: devices/ imports the models)."""

    def torch_device(self) -> torch.device: ...

    def nn_weight_gradient_pays(self, dtype: torch.dtype) -> bool: ...


#: A family's own config (its ``config_type``): every ``Family`` method takes the one its family builds.
C = TypeVar("C")


class Family(ABC, Generic[C]):
    """One model family. Subclasses set the class attributes and answer the methods from a config.

    Every method takes the family's own config (``config_type``); the engine gets one from
    ``accel_kit.models.get_config(preset, **overrides)`` and never reads its fields.
    """

    name: ClassVar[str]
    config_type: ClassVar[type]
    presets: ClassVar[dict[str, object]]  # preset -> its config (a ``config_type``)
    sources: ClassVar[dict[str, str]]  # preset -> where its shape comes from
    overridable: ClassVar[tuple[str, ...]]  # config fields a point may override (vocab_size, seq_len ...)
    hf_model_class: ClassVar[str]  # transformers' class of the same architecture, e.g. "LlamaForCausalLM"
    # transformers' modules its reference layer (``build_layer(impl="hf")``) imports: seconds to import,
    # so a fork server loads them once for the points that need them (``Point.preload_modules``).
    hf_modules: ClassVar[tuple[str, ...]] = ()

    # --- building

    @abstractmethod
    def build(self, cfg: C, *, activation_checkpointing: bool = False) -> nn.Module:
        """The model, randomly initialised as the family initialises it (``init_rule``), on the current default
        device in the default dtype: made on the meta device, allocated there and drawn by parameter name
        (``accel_kit.models.init.initialised``); under ``torch.device("meta")`` its shape alone, nothing drawn.

        ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``."""

    @abstractmethod
    def build_layer(self, cfg: C, impl: str = "native") -> nn.Module:
        """One transformer layer, ``(B, T, h) -> (B, T, h)``: ours (``native``, initialised as ``build``'s
        layers) or transformers' (``hf``)."""

    # The family's models are drawn by ``init_rule`` (so they can be built on meta and sharded first,
    # ``build_deferred``); False: the family's models initialise themselves (transformers' own, the hf family).
    init_by_name: ClassVar[bool] = True

    def init_rule(self, cfg: C) -> InitRule:
        """How each parameter of the family's models (and of a layer alone) starts, by its name: an
        ``accel_kit.models.init.InitRule``. The one place the family's initialisation is written."""
        raise NotImplementedError(f"the {self.name} family initialises its models itself")

    # --- shape and work

    @abstractmethod
    def shape(self, cfg: C) -> ModelShape: ...

    @abstractmethod
    def layer_flop_terms(self, cfg: C, seq_len: int) -> FlopTerms:
        """Forward FLOPs per token of one layer at ``seq_len`` (no logits)."""

    def flop_terms(self, cfg: C, seq_len: int, *, micro_batch: int = 1) -> FlopTerms:
        """Forward FLOPs per token of the whole model: its layers and the output projection (2 h V).

        ``micro_batch``: the batch a family that counts its FLOPs counts at (``accel_kit.models.hf``);
        a formula's per-token figure does not depend on it."""
        shape = self.shape(cfg)
        layer = self.layer_flop_terms(cfg, seq_len)
        return FlopTerms(shape.n_layers * layer.matmul, shape.n_layers * layer.attention,
                         2 * shape.hidden_size * shape.vocab_size_model)

    def flops_source(self, cfg: C, seq_len: int, *, micro_batch: int = 1) -> str:
        """Where ``flop_terms`` come from, for the record: ``analytic`` (our families' formulas) or ``counted``."""
        return "analytic"

    def ran_fields(self, model: nn.Module) -> JSONObject:
        """Record fields only the model knows once it has run (a MoE model's experts' kernel: torch.compile may
        have chosen another than the config's); they replace the shape's. None by default."""
        return {}

    def preload_modules(self, preset: str) -> tuple[str, ...]:
        """Modules a training point of ``preset`` imports beyond every point's (``Point.preload_modules``)."""
        return ()

    def digest(self, preset: str) -> str | None:
        """For a family whose presets are files: a digest of ``preset``'s file (part of a point's resume key)."""
        return None

    @abstractmethod
    def gemm_shapes(self, cfg: C, tokens: int) -> tuple[tuple[int, int, int], ...]:
        """The (M, K, N) products of one layer's linears on ``tokens`` rows, in forward order: the
        products ``layer_flop_terms`` counts as matmul, so a measured peak can use the workload's shapes."""

    # --- memory

    @abstractmethod
    def activation_bytes_per_layer(self, cfg: C, micro_batch: int, seq_len: int, *, flash_attention: bool,
                                   tp: int = 1) -> int:
        """Bytes one layer keeps for backward with 16-bit activations (Korthikanti et al. 2022's accounting),
        on one of ``tp`` tensor-parallel ranks: the tensors inside attention and the MLP (split by heads and
        MLP width) divide by ``tp``; the norms' inputs and outputs and what lies between the blocks do not
        (no sequence parallelism here), after Korthikanti et al. section 4.2."""

    @abstractmethod
    def layer_weight_count(self, cfg: C) -> int:
        """Weights of one layer's linears that occupy memory (the microbenchmark's memory floor): every
        expert of a mixture-of-experts layer, not only those a token is routed to."""

    def inactive_weight_count(self, cfg: C) -> int:
        """Parameters of the whole model that a token does not multiply: the routed experts beyond its top-k,
        in every MoE layer. ``n_params - inactive_weight_count`` is the active count (``n_params_active``),
        the weights a token's FLOPs are counted on. 0 for a dense model."""
        return 0

    def expert_weight_count(self, cfg: C) -> int:
        """Weights of every routed expert of the whole model: what expert parallelism shards over its ep ranks
        (the memory estimate). By default from ``inactive_weight_count``: a MoE layer's experts are all of one
        size, so the E - k a token skips are (E - k) / E of them; 0 for a dense model, or where every expert is
        active (E = k), which a family then answers itself."""
        shape = self.shape(cfg)
        skipped = shape.n_experts - shape.experts_per_token
        return self.inactive_weight_count(cfg) * shape.n_experts // skipped if shape.n_experts and skipped else 0

    # --- inference (a static KV cache; ``accel_kit.models.generate`` runs it, docs/inference.md)

    def why_not_generating(self, cfg: C) -> str | None:
        """Why the config's model does not generate text (an encoder ...), or None where it does: the inference
        study refuses such a preset before any point. Our own families build causal LMs: None."""
        return None

    # The family's models have ``forward_cached(idx (B, T), cache: KVCache, start: int) -> logits (B, 1, V_padded)``:
    # tokens at positions start .. start + T - 1 write their keys and values to the cache and attend over its
    # valid prefix; only the last position's logits are computed (``accel_kit.models.kv_cache``).
    supports_kv_cache: ClassVar[bool] = False

    def unsupported_compiled_decode(self, precision: str) -> str | None:
        """Why the decode step of this family's models cannot run through torch.compile in ``precision``
        (``accel_kit.models.generate``, impl ``compiled``), or None where it can."""
        return None

    def context_length(self, cfg: C) -> int:
        """The positions the model is built for: a generation's prompt plus new tokens may not exceed it."""
        raise NotImplementedError(f"the {self.name} family does not say its context length")

    def new_kv_cache(self, cfg: C, batch: int, max_len: int, *, dtype: torch.dtype,
                     device: torch.device | str) -> KVCache:
        """A zeroed ``KVCache`` for ``batch`` sequences of up to ``max_len`` positions (prompt plus new tokens)."""
        from accel_kit.models.kv_cache import KVCache

        s = self.shape(cfg)
        return KVCache.allocate(s.n_layers, batch, s.n_kv_heads, max_len, s.head_dim, dtype=dtype, device=device)

    def kv_cache_bytes(self, cfg: C, batch: int, seq_len: int, dtype_bytes: int) -> int:
        """Bytes of the KV cache holding ``seq_len`` positions of ``batch`` sequences.

        Per layer, position and sequence: one key and one value (2) of n_kv_heads x head_dim elements each
        (GQA's narrower width: the cache never holds the n_heads-wide broadcast). A MoE family's attention is
        dense, so its cache is the same formula."""
        s = self.shape(cfg)
        return 2 * s.n_layers * batch * seq_len * s.n_kv_heads * s.head_dim * dtype_bytes

    def prefill_flops(self, cfg: C, batch: int, prompt_len: int) -> int:
        """Forward FLOPs of the prefill of ``batch`` prompts of ``prompt_len`` tokens.

        Every prompt token passes every layer: ``layer_flop_terms`` at seq_len = prompt_len, whose weight
        term is 2 per (active) weight per token and whose attention term is the *full* prompt x prompt score
        matrix (4 T nh hd per token per layer), not the causal half a kernel computes: the convention of
        ``accel_kit.flops``, so a prefill's MFU reads on the same scale as a training step's. The output
        projection (2 h V) runs for the last position only, as ``forward_cached`` (and transformers'
        ``generate``, ``logits_to_keep=1``) computes it."""
        s = self.shape(cfg)
        layer = self.layer_flop_terms(cfg, prompt_len)
        per_prompt_token = s.n_layers * (layer.matmul + layer.attention)
        return batch * (prompt_len * per_prompt_token + 2 * s.hidden_size * s.vocab_size_model)

    def decode_step_flops(self, cfg: C, batch: int, cache_len: int) -> int:
        """Forward FLOPs of one decode step of ``batch`` sequences attending over ``cache_len`` cached positions
        (the new token's own included).

        Per sequence: the weights' 2 per (active) weight; attention's scores and weighted sum over the
        cache, 2 products x 2 FLOPs x cache_len x nh x hd per layer (one query: no masked half to argue
        about), which is ``layer_flop_terms``' attention term at seq_len = cache_len; the output projection
        2 h V."""
        return batch * self.flop_terms(cfg, cache_len).forward

    def decode_weight_count(self, cfg: C, batch: int) -> int:
        """Weights one decode step of ``batch`` sequences reads from memory: every layer's linears a token of
        the batch multiplies, and the output projection (h x V_padded, read whole for the logits).

        Not counted: the embedding table (only B rows of it are gathered, unless it is the tied output
        projection, counted already), norms and biases (O(h) per layer, under 0.1 %). Dense default: all the
        linears, whatever the batch. A MoE family overrides it with the experts its batch reaches: at batch 1
        the top-k (``n_layers x layer_weight_count - inactive_weight_count``, as here); at batch B up to
        min(E, B k) experts per MoE layer, since each expert's weights are read once per step however many
        tokens it takes."""
        s = self.shape(cfg)
        return s.n_layers * self.layer_weight_count(cfg) - self.inactive_weight_count(cfg) \
            + s.hidden_size * s.vocab_size_model

    def decode_step_bytes(self, cfg: C, batch: int, cache_len: int, *, weight_bytes: int, kv_bytes: int) -> int:
        """Bytes one decode step reads: the weights it multiplies once each (``decode_weight_count``, read once
        for the whole batch: a GEMV batch shares them) plus the KV cache's K and V at ``cache_len`` positions
        (``kv_cache_bytes``), each read once by the attention. Activations (B x h per layer) and the logits
        (B x V) are left out: under 0.1 % of the weights at batch 1; they grow with the batch (a few % at batch
        64 for Llama 3.1 8B's shape), so at a large batch the MBU read from these bytes is a lower bound."""
        weights = self.decode_weight_count(cfg, batch) * weight_bytes
        return weights + self.kv_cache_bytes(cfg, batch, cache_len, kv_bytes)

    # --- structure

    @abstractmethod
    def prunable_linears(self, model: nn.Module) -> list[tuple[str, nn.Linear]]:
        """The linears weight sparsity prunes (every block's; embeddings, norms and the head stay dense)."""

    @abstractmethod
    def pipeline_stages(self, model: nn.Module) -> PipelineStages: ...

    # The family's models run one pipeline stage's part alone (``stage_forward``); the layout check asks.
    pipeline_parallel: ClassVar[bool] = False

    def stage_forward(self, model: nn.Module, x: torch.Tensor, *, first: bool, last: bool) -> torch.Tensor:
        """One pipeline stage's forward on ``model`` holding only the stage's parts (``PipelineStages``).

        ``x``: token ids (B, T) on the first stage, else the previous stage's hidden states (B, T, h).
        Returns hidden states (B, T, h), or logits (B, T, V_padded) on the last stage. Our families'
        models compute their own forward as ``embed``, ``forward_blocks`` and ``head`` (GPT-2's
        positions are added in ``embed``; Llama's RoPE tables live in each block), so a stage runs
        exactly the operations one process runs on its part.
        """
        if not self.pipeline_parallel:
            raise NotImplementedError(f"the {self.name} family's models do not run as pipeline stages")
        if first:
            x = model.embed(x)
        x = model.forward_blocks(x)
        return model.head(x) if last else x

    # The family has a tensor-parallel plan (``apply_tensor_parallel``); the layout check asks.
    tensor_parallel: ClassVar[bool] = False

    def apply_tensor_parallel(self, model: nn.Module, tp_mesh: DeviceMesh) -> None:
        """Shard every block of ``model`` over ``tp_mesh`` in place (heads and MLP width split, attention
        run on the local heads); the embedding, the final norm and the head stay replicated."""
        raise NotImplementedError(f"the {self.name} family has no tensor-parallel plan")

    # The family's MoE layers take their experts sharded over expert-parallel ranks (``apply_expert_parallel``);
    # the layout check asks.
    expert_parallel: ClassVar[bool] = False

    def apply_expert_parallel(self, model: nn.Module, ep_mesh: DeviceMesh) -> ExpertShards:
        """Shard every MoE layer's routed experts of ``model`` over ``ep_mesh`` in place (E / ep experts a rank,
        tokens exchanged by all-to-all); returns what its dispatchers measure (``accel_kit.models.moe.parallel``)."""
        raise NotImplementedError(f"the {self.name} family has no expert-parallel plan")

    # The family's model reads everything it indexes by position from ``position_buffers``, so that context
    # parallelism can shard them with the tokens; the layout check asks.
    context_parallel: ClassVar[bool] = False

    def position_buffers(self, model: nn.Module) -> list[tuple[torch.Tensor, int]]:
        """The model's buffers indexed by sequence position (position ids, RoPE tables), each once, with its
        sequence dimension; each is ``seq_len`` long along it, and the model reads its first T entries for
        an input of T tokens. Context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
        replaces each, in place, by the entries of the rank's tokens, in its load-balanced order, so every
        token of a shard keeps its own position."""
        raise NotImplementedError(f"the {self.name} family's model takes no position buffers")

    # --- transformers

    # The family's conversion module: its ``to_hf(model)``, ``from_hf(hf_model)`` and ``hf_config(cfg)`` (our
    # families' ``hf.py``, declaring their names to ``accel_kit.models.common.hf``); None: the family overrides
    # the three methods below itself (the hf family's models are transformers' own).
    hf_conversion: ClassVar[ModuleType | None] = None

    def _conversion(self) -> ModuleType:
        if self.hf_conversion is None:
            raise NotImplementedError(f"the {self.name} family declares no conversion to transformers")
        return self.hf_conversion

    def to_hf(self, model: nn.Module) -> nn.Module:
        """transformers' own model (``hf_model_class``) holding a copy of ``model``'s weights."""
        return self._conversion().to_hf(model)

    def from_hf(self, hf_model: nn.Module) -> nn.Module:
        """Our model holding a copy of a transformers model's weights."""
        return self._conversion().from_hf(hf_model)

    def hf_config(self, cfg: C) -> PretrainedConfig:
        """transformers' config of the same shape (SDPA attention, no dropout unless the config has it)."""
        return self._conversion().hf_config(cfg)

    # --- configs as data (a compile process of its own rebuilds the model from them)

    def config_dict(self, cfg: C) -> JSONObject:
        return asdict(cfg)

    def config_from_dict(self, data: JSONObject) -> C:
        """The inverse of ``config_dict``; a family with nested config records overrides it."""
        return self.config_type(**data)

    # --- overrides

    def kernel_overrides(self, adapter: KernelAdvisor, dtype: torch.dtype) -> dict[str, object]:
        """Config overrides (fields in ``overridable``) of the kernel choices the family makes from the device
        adapter's answers (``accel_kit.devices.base.BaseAdapter``) for a point in ``dtype``; none by default."""
        return {}

    def with_overrides(self, cfg: C, **overrides: object) -> C:
        """``cfg`` with ``overrides`` (fields in ``overridable``; None leaves a field as it is)."""
        from dataclasses import replace

        from accel_kit.errors import ParameterError

        bad = sorted(set(overrides) - set(self.overridable))
        if bad:
            raise ParameterError(f"model override {bad[0]!r} is not one the {self.name} family has; "
                                 f"allowed: {', '.join(self.overridable)}")
        try:
            return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
        except ValueError as exc:  # the config's own check of the shape
            raise ParameterError(str(exc)) from None
