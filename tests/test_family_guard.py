"""Nothing outside a model family's folder reads a model config's fields by name (issue: model families).

The engine asks the family (``accel_kit.models.family.Family``) and reads the family-neutral records it
returns (``ModelShape``, ``AttentionShape``, ``FlopTerms``); a config field read elsewhere is GPT-2 (or
Llama) knowledge leaking out, which a third family would silently get wrong. A static scan, so that it
holds on code no test happens to run (a vendor adapter without its SDK, say).
"""
from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

from accel_kit.engine.kinds import point_classes
from accel_kit.models.family import AttentionShape, ModelShape
from accel_kit.models.registry import FAMILIES, FILE_FAMILIES

PACKAGE = Path(__file__).resolve().parent.parent / "accel_kit"
# Each family's folder (its module's package): named-preset families and the file-preset ones (hf:PATH)
FAMILY_DIRS = tuple(Path(sys.modules[type(f).__module__].__file__).parent
                    for f in [*FAMILIES.values(), *FILE_FAMILIES.values()])
# ... and the decoder pieces the families are made of (attention, block, causal-LM skeleton, HF mapping): each
# family builds them from its own config, so reading it there is the family's knowledge, written once.
FAMILY_DIRS += (PACKAGE / "models" / "common",)
# What usually names a model config in this code base.
CONFIG_NAMES = {"cfg", "config", "model_cfg", "gpt_cfg", "llama_cfg"}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _config_fields() -> tuple[set[str], set[str]]:
    """(fields only a config has: a read of one anywhere is a leak, fields a config shares with the
    neutral records or with points: a read of one on something named like a config is a leak)."""
    config = set().union(*(_fields(f.config_type) for f in FAMILIES.values()))
    neutral = _fields(ModelShape) | _fields(AttentionShape)
    neutral |= set().union(*(set(cls.model_fields) for cls in point_classes().values()))
    # (the file-preset families' configs are not in the union: theirs describe a file, path and model_type,
    # names too common to ban; their shape fields are the named families' own)
    return config - neutral, config & neutral


def _leaks(path: Path, only_config: set[str], shared: set[str], root: Path = PACKAGE.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        if node.attr in only_config or (node.attr in shared and owner_name in CONFIG_NAMES):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_knows_the_config_fields(tmp_path):
    only_config, shared = _config_fields()
    # a field of one family's config alone, and one every config shares with the neutral shape
    assert {"mlp_ratio", "rope_theta", "rms_norm_eps", "tie_embeddings"} <= only_config
    assert {"hidden_size", "n_heads", "n_layers"} <= shared
    # and the scan finds a read of each kind
    probe = tmp_path / "probe.py"
    probe.write_text("def f(cfg, shape):\n    return cfg.hidden_size, shape.hidden_size, x.mlp_ratio\n")
    leaks = _leaks(probe, only_config, shared, root=tmp_path)
    assert [line.split(": ", 1)[1] for line in leaks] == ["cfg.hidden_size", "x.mlp_ratio"]


def test_no_config_field_is_read_outside_a_family_folder():
    only_config, shared = _config_fields()
    leaks = [leak for path in sorted(PACKAGE.rglob("*.py")) if not any(d in path.parents for d in FAMILY_DIRS)
             for leak in _leaks(path, only_config, shared)]
    assert not leaks, "model config fields read outside their family's folder (ask the family):\n" + "\n".join(leaks)
