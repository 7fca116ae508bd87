"""A transformers causal LM's shape, read from a ``config.json`` the user brings: ``HFConfig``.

The config is the file's path plus what a point may change (its sequence, vocabulary,
padding) and the shape read once from the file, so that records, the fit check and the
attention probe need no transformers model. transformers' own config object is rebuilt from
the file where a model is built (``transformers_config``): the dataclass pickles and hashes
as the engine's configs do, and a worker process reads the same file.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, SupportsInt

from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.models.family import PaddedVocab
from accel_kit.models.hf.moe import MoEShape, moe_shape, query_head_dim

if TYPE_CHECKING:
    from transformers import PretrainedConfig

PREFIX = "hf:"  # -p preset hf:PATH


@dataclass(frozen=True)
class HFConfig(PaddedVocab):
    """A transformers causal LM: the config file and the shape it describes.

    ``vocab_size`` is the tokenizer's (the ids data may hold), ``padded_vocab_size`` the
    embedding's rows; ``seq_len`` the point's sequence, at most ``max_positions`` (the context
    the config declares: learned position tables have no more rows); ``moe`` the experts of a
    mixture-of-experts architecture (``hf.moe``; zeros for a dense one).
    """

    path: str  # the config.json, absolute
    model_type: str  # transformers' name of the architecture's config ("qwen2", "gemma" ...)
    architecture: str  # the causal-LM class transformers builds for it ("Qwen2ForCausalLM")
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_positions: int
    seq_len: int
    pad_vocab_multiple: int = 1
    moe: MoEShape = MoEShape()

    def __post_init__(self) -> None:
        if self.seq_len > self.max_positions:
            raise ValueError(f"sequence of {self.seq_len} tokens is longer than the {self.max_positions} positions "
                             f"of {self.path} (max_position_embeddings)")
        if self.vocab_size < 1 or self.pad_vocab_multiple < 1:
            raise ValueError(f"vocab_size {self.vocab_size} and pad_vocab_multiple {self.pad_vocab_multiple} "
                             f"must be positive")

    @property
    def label(self) -> str:
        return PREFIX + self.path


def config_file(path: str) -> Path:
    """The config.json that ``path`` names: the file, or the one in the folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ParameterError(f"model preset {PREFIX}{path}: no config file at {p} "
                             f"(give a config.json or a folder holding one)")
    return p.resolve()


def read_json(file: Path) -> JSONObject:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ParameterError(f"model preset {PREFIX}{file}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ParameterError(f"model preset {PREFIX}{file}: no model_type in the config (not a transformers "
                             f"config.json)")
    return data


def transformers_config(cfg: HFConfig) -> PretrainedConfig:
    """transformers' config of ``cfg``: the file's, with the point's vocabulary (padded), SDPA attention
    where the architecture has it (what our families' transformers configs use) and no cache."""
    hf = _file_config(cfg.path, os.stat(cfg.path).st_mtime_ns)
    hf = type(hf).from_dict(hf.to_dict())  # a copy: the cached one stays the file's
    hf.vocab_size = cfg.padded_vocab_size
    hf.use_cache = False
    return hf


@lru_cache(maxsize=16)
def _file_config(path: str, _mtime_ns: int) -> PretrainedConfig:
    """transformers' config object of the file (cached per path and modification time: every lookup of a
    preset rebuilds its config, and a process looks it up several times)."""
    from transformers import AutoConfig

    data = read_json(Path(path))
    try:
        return AutoConfig.for_model(**data)
    except (ValueError, KeyError) as exc:  # a model_type this transformers does not know
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ParameterError(f"model preset {PREFIX}{path}: transformers {_version()} cannot read this config: "
                             f"{first}") from None


def _version() -> str:
    import transformers

    return transformers.__version__


def causal_lm_class(hf: PretrainedConfig, path: str) -> str:
    """The name of transformers' causal-LM class for the config's architecture, or a one-line error."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(hf.model_type)
    if name is None:
        raise ParameterError(f"model preset {PREFIX}{path}: model_type {hf.model_type!r} is not a causal language "
                             f"model transformers builds (AutoModelForCausalLM has no class for it)")
    return name


def _shape_field(hf: PretrainedConfig, path: str, *names: str, default: int | None = None) -> SupportsInt:
    for name in names:
        value = getattr(hf, name, None)
        if value is not None:
            return value
    if default is not None:
        return default
    raise ParameterError(f"model preset {PREFIX}{path}: the config has no {' or '.join(names)}; "
                         f"accel-kit reads the shape from it")


def load(path: str) -> HFConfig:
    """The ``HFConfig`` of the config file ``path`` names, its shape checked.

    Raises:
        ParameterError: no config there, not a causal LM, an architecture transformers does not
            know, or a shape that cannot run (heads that do not divide the width ...).
    """
    file = config_file(path)
    hf = _file_config(str(file), os.stat(file).st_mtime_ns)
    architecture = causal_lm_class(hf, str(file))
    where = str(file)
    hidden = int(_shape_field(hf, where, "hidden_size", "n_embd", "d_model"))
    heads = int(_shape_field(hf, where, "num_attention_heads", "n_head"))
    if heads < 1 or hidden < 1:
        raise ParameterError(f"model preset {PREFIX}{where}: hidden size {hidden} and heads {heads} must be positive")
    explicit_head_dim = query_head_dim(hf) or getattr(hf, "head_dim", None)
    if explicit_head_dim is None and hidden % heads:
        raise ParameterError(f"model preset {PREFIX}{where}: {heads} attention heads do not divide the width "
                             f"{hidden} (and the config gives no head_dim)")
    kv_heads = int(_shape_field(hf, where, "num_key_value_heads", default=heads))
    if kv_heads < 1 or heads % kv_heads:
        raise ParameterError(f"model preset {PREFIX}{where}: {kv_heads} key/value heads do not divide the "
                             f"{heads} query heads")
    # GPT-2's n_inner None means 4h (its modeling code's default).
    ffn = int(_shape_field(hf, where, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden))
    vocab = int(_shape_field(hf, where, "vocab_size"))
    positions = int(_shape_field(hf, where, "max_position_embeddings", "n_positions"))
    n_layers = int(_shape_field(hf, where, "num_hidden_layers", "n_layer"))
    return HFConfig(path=where, model_type=hf.model_type, architecture=architecture, n_layers=n_layers,
                    hidden_size=hidden, n_heads=heads, n_kv_heads=kv_heads,
                    head_dim=int(explicit_head_dim or hidden // heads), ffn_hidden_size=ffn, vocab_size=vocab,
                    max_positions=positions, seq_len=positions, moe=moe_shape(hf, n_layers))
