"""The mixture-of-experts family: config, presets, experts, token dispatch, model, transformers conversion and
its ``Family``.

    from accel_kit.models.moe import FAMILY, PRESETS
    model = FAMILY.build(FAMILY.with_overrides(PRESETS["qwen3-30b-a3b"], seq_len=4096))
"""
from accel_kit.models.moe.config import MoEConfig
from accel_kit.models.moe.dispatch import LocalDispatch
from accel_kit.models.moe.experts import Experts
from accel_kit.models.moe.family import MixtureOfExperts
from accel_kit.models.moe.model import MoEBlock, MoEMLP, MoEModel
from accel_kit.models.moe.presets import PRESETS, SOURCES

FAMILY = MixtureOfExperts()

__all__ = ["Experts", "FAMILY", "LocalDispatch", "MixtureOfExperts", "MoEBlock", "MoEConfig", "MoEMLP", "MoEModel",
           "PRESETS", "SOURCES"]
