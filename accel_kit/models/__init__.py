"""Models: one folder per family (``gpt2/``, ``llama/``, ``moe/``, ``hf/``), the decoder pieces our families share
(``common/``), the family protocol and the registry.

    from accel_kit.models import build_model, count_params, family_of, family_of_model,
                                      get_config
    model = build_model("gpt2-xl", seq_len=2048)  # or materialize(preset, device=..., dtype=...): built where it runs
    cfg = get_config("gpt2-xl"); family_of(cfg).flop_terms(cfg, seq_len=2048).total()
"""
from accel_kit.models.family import (IGNORE_INDEX, AttentionShape, Family, FlopTerms, ModelShape, PipelineStages,
                                     layer_output)
from accel_kit.models.memory import MemoryEstimate, estimate_training_memory, fits
from accel_kit.models.registry import (FAMILIES, FILE_FAMILIES, PRESETS, build_deferred, build_model, building_on,
                                       check_preset, count_active_params, count_params, family_of, family_of_model,
                                       get_config, is_deferred, materialize, materialize_deferred, preset_digest)

__all__ = ["AttentionShape", "FAMILIES", "FILE_FAMILIES", "Family", "FlopTerms", "IGNORE_INDEX", "MemoryEstimate", "ModelShape",
           "PRESETS", "PipelineStages", "build_deferred", "build_model", "building_on", "check_preset", "count_active_params", "count_params", "estimate_training_memory", "family_of",
           "family_of_model", "fits", "get_config", "is_deferred", "layer_output", "materialize", "materialize_deferred",
           "preset_digest"]
