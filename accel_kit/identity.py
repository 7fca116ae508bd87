"""What "the same point" and "the same configuration" are, for the study tables, figures and findings.

A point is its key (``results.point_key_of``: the sweep's ``Point.key()``, a hash of every field that
determines the measurement); ``results.latest`` and ``noise.with_spread`` group by it. A comparison
(GAS k against the smallest GAS, N devices against the fewest) sets a point against the others of its
configuration: every field of the key but the axis compared along (``config_key``), read from the
records' parameters, so that a field a study does not name (the preset, the sequence length, the
layout) still keeps two configurations apart. A table or a figure names every key field that varies
among its rows (``varying``): two presets in one folder are two rows, two lines.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Iterable

import pandas as pd

from accel_kit.engine.kinds import point_classes
from accel_kit.engine.point import KEY_DEFAULTS, NOT_IN_KEY

# The kind is the same for every point of a study; the system is named first, apart.
_NOT_SHOWN = {"kind", "system"}


def key_fields(df: pd.DataFrame) -> list[str]:
    """The key's fields that ``df``'s records carry, the system first, then each kind's in declaration order."""
    # Each kind's point class (the kinds' registry: a kind registered since is known too): its fields, less
    # those not in the key, are what a point is.
    classes = point_classes()
    kinds = [k for k in (df["kind"].dropna().unique() if "kind" in df.columns else []) if k in classes]
    fields = ["system"]
    for kind in kinds or list(classes):  # (a frame without kinds: any kind's fields it carries)
        fields += [f for f in classes[kind].model_fields if f not in NOT_IN_KEY and f not in _NOT_SHOWN]
    return [f for f in dict.fromkeys(fields) if f in df.columns]


def _norm(field: str, value: object) -> object:
    # Missing is None however it was read (NaN, None); a field added after records existed, missing from
    # an older record, holds its default there (engine.point.KEY_DEFAULTS), as the key itself says.
    if value is None or (isinstance(value, float) and math.isnan(value)):
        value = KEY_DEFAULTS.get(field)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)  # (a column with a NaN holds its integers as floats)
    return value


def config_key(df: pd.DataFrame, without: str | Iterable[str]) -> pd.Series:
    """Per row, its configuration: the values of every key field but ``without`` (the axis compared along),
    as a tuple; rows with the same tuple are compared with each other."""
    drop = {without} if isinstance(without, str) else set(without)
    fields = [f for f in key_fields(df) if f not in drop]
    return pd.Series([tuple(_norm(f, row.get(f)) for f in fields) for _, row in df.iterrows()], index=df.index,
                     dtype=object)


def varying(df: pd.DataFrame, among: Iterable[str] | None = None) -> list[str]:
    """The key fields (or those of ``among``) whose values differ between the rows of ``df``."""
    fields = list(among) if among is not None else key_fields(df)
    return [f for f in fields if f in df.columns and len({_norm(f, v) for v in df[f]}) > 1]


_WORDS = {"seq_len": "sequence", "micro_batch_size": "micro-batch", "gas": "GAS", "batch_size": "batch"}


def config_label(row: object, fields: Iterable[str]) -> str:
    """A configuration as a finding names it: ``gpt2-debug, seq len 64``; ``fields``: those to name; ``row``: a
    frame's row or a mapping (read with ``get``), or an object holding them as attributes (a point)."""
    parts = []
    for f in fields:
        value = _norm(f, row.get(f) if hasattr(row, "get") else getattr(row, f, None))
        if value is None:
            continue
        name = _WORDS.get(f, f.replace("_", " "))
        parts.append(str(value) if f in ("preset", "precision", "system", "layout", "engine") else f"{name} {value}")
    return ", ".join(parts)


def with_varying(columns: list[str], df: pd.DataFrame) -> list[str]:
    """A table's ``columns`` with every key field that varies among ``df``'s rows and is not among them,
    after the configuration's names (system, preset, precision): a table shows what tells its rows apart
    (the preset, the sequence length), and sorts by it before the axes."""
    extra = [f for f in varying(df) if f not in columns]
    lead = max([columns.index(c) + 1 for c in ("system", "preset", "precision") if c in columns], default=0)
    return columns[:lead] + extra + columns[lead:]


def with_point_key(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its ``point_key`` filled where a row has none: a frame from ``results.load`` has every one;
    a frame built by hand in ``load``'s flat columns gets, per row, a hash of its key fields' values, so that
    its points stay apart (and a row repeated at a later time is the same point)."""
    if df.empty or ("point_key" in df.columns and df["point_key"].notna().all()):
        return df
    fields = key_fields(df)
    made = [hashlib.sha256(json.dumps([_norm(f, row.get(f)) for f in fields], default=str).encode()).hexdigest()[:16]
            for _, row in df.iterrows()]
    have = df["point_key"] if "point_key" in df.columns else pd.Series(None, index=df.index, dtype=object)
    return df.assign(point_key=[k if isinstance(k, str) and k else m for k, m in zip(have, made)])


def order(config: tuple) -> tuple:
    """A sort key of a ``config_key`` tuple: numbers by value, then texts, a missing part first."""
    return tuple((0, 0.0, "") if v is None else (1, float(v), "") if isinstance(v, (int, float)) and
                 not isinstance(v, bool) else (2, 0.0, str(v)) for v in config)
