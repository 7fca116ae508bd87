"""The transformers family: any causal LM transformers knows, from a ``config.json`` (``-p preset hf:PATH``).

    from accel_kit.models import get_config, build_model
    cfg = get_config("hf:path/to/config.json", seq_len=512)
"""
from accel_kit.models.hf.config import PREFIX, HFConfig
from accel_kit.models.hf.family import TransformersCausalLM
from accel_kit.models.hf.model import HFCausalLM

FAMILY = TransformersCausalLM()

__all__ = ["FAMILY", "HFCausalLM", "HFConfig", "PREFIX", "TransformersCausalLM"]
