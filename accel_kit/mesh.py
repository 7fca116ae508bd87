"""A training point's parallel layout as records name it: the device mesh's dimensions, its label, and
the layout fields' values where a record predates them.

Below both the engine, which builds its mesh in this order (``accel_kit.engine.layout``), and the
records (``accel_kit.results``), which name it so and fill an older record's layout from it.
"""
from __future__ import annotations

from typing import Any

# A training record's parallel layout as columns, at the training point's defaults
# (``accel_kit.engine.point.TrainSpec``) where a record predates them: one model replica per device,
# under the engine it names (ddp where it names none), no context or expert parallelism.
LAYOUT_DEFAULTS: dict[str, Any] = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "engine": "ddp"}
# The device mesh's dimensions, outermost first (torchtitan's order): tp innermost, as its all-reduces run
# in every block, then cp, whose ring exchanges keys and values once per block.
MESH_DIMS = ("pp", "dp", "cp", "tp")


def mesh_label(ep: int = 1, **sizes: int) -> str:
    """The mesh as a record's ``mesh`` shows it, ``pp 1 x dp 2 x cp 1 x tp 1``, from each of ``MESH_DIMS``' sizes;
    with expert parallelism, the ep ranks carved out of dp after it: ``dp 4 (ep 2)``."""
    return " x ".join(f"{name} {sizes[name]}" + (f" (ep {ep})" if name == "dp" and ep > 1 else "")
                      for name in MESH_DIMS)
