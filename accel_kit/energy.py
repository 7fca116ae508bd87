"""Energy per token: a point's energy over its timed window, as record fields, checked for plausibility.

The adapter's meter (``accel_kit.devices.power``) reads the window; this module turns the
reading into the record's fields, the same for every device and study:

- ``energy_j``: joules over the timed trials (warm-up excluded), all devices of the point;
- ``power_avg_w``: ``energy_j`` over the window's length (``energy_window_s``);
- ``tokens_per_j`` (training) or ``flops_per_j`` (microbenchmark): the work of the window per joule;
- ``energy_source``: the counter, the library and energy counter or sampled power, in one line
  (also apart: ``energy_method``, ``energy_sampling_period_s``, ``energy_rated_power_w``);
- ``energy_reason``: why ``energy_j`` is null (None when it was measured).

Where nothing was read the figures are null with the reason, never zero. A figure that cannot
be true (negative, or an average above the device's rated power by more than
``RATED_POWER_MARGIN``) raises ``ImplausibleEnergy``: the point is recorded as an error.
"""
from __future__ import annotations

from typing import Literal

from accel_kit.devices.power import EnergyWindow

# An average over a window cannot exceed the device's power limit by much: power capping acts within
# milliseconds. 1.5 leaves room for short boosts (a CPU's short-term limit) and a limit read low.
RATED_POWER_MARGIN = 1.5
Work = Literal["tokens", "flops"]
FIELDS = ("energy_j", "power_avg_w", "energy_window_s", "energy_source", "energy_method", "energy_sampling_period_s",
          "energy_rated_power_w", "energy_reason")


class ImplausibleEnergy(RuntimeError):
    """An energy figure that cannot be right (the counter, its units or the window is wrong)."""


def per_j_field(work: Work | None) -> str | None:
    """``tokens_per_j`` or ``flops_per_j``; None for a point kind without a unit of work."""
    return f"{work}_per_j" if work else None


def null_fields(reason: str, work: Work | None = None) -> dict:
    """Every energy field null, with ``reason``."""
    fields = dict.fromkeys(FIELDS) | {"energy_reason": reason}
    if work:
        fields[per_j_field(work)] = None
    return fields


def energy_fields(window: EnergyWindow | None, *, work: Work, amount: float) -> dict:
    """The record's energy fields for ``window``, in which ``amount`` tokens (or FLOPs) were computed.

    Raises:
        ImplausibleEnergy: a negative figure, or an average power above RATED_POWER_MARGIN x the rated power.
    """
    if window is None:
        return null_fields("no energy meter was run for this point", work)
    source = window.source
    fields = null_fields(window.reason or "", work) | {"energy_window_s": window.window_s}
    if source is not None:
        fields |= {"energy_source": source.describe(), "energy_method": source.method,
                   "energy_sampling_period_s": source.sampling_period_s, "energy_rated_power_w": source.rated_power_w}
    energy = window.energy_j
    if energy is None:
        fields["energy_reason"] = window.reason or "the meter returned no figure and no reason"
        return fields
    if energy < 0:
        raise ImplausibleEnergy(f"negative energy {energy:.3f} J over a {window.window_s:.3f} s window "
                                f"({source.describe() if source else 'unknown source'})")
    if source is not None and window.window_s < source.min_window_s:
        fields["energy_reason"] = (f"the timed window ({window.window_s:.3f} s) is shorter than the {source.min_window_s:g} s "
                                   "this counter needs to be read within about 10 %: run more trials (or steps)")
        return fields
    if energy == 0 or window.window_s <= 0:
        fields["energy_reason"] = (f"the counter did not advance over the {window.window_s:.3f} s window (it updates "
                                   "less often, or the device reports no energy for itself, as an MI250's second die)")
        return fields
    power = energy / window.window_s
    rated = source.rated_power_w if source is not None else None
    if rated and power > RATED_POWER_MARGIN * rated:
        raise ImplausibleEnergy(f"average power {power:.0f} W ({energy:.1f} J over {window.window_s:.2f} s) is above "
                                f"{RATED_POWER_MARGIN} x the rated {rated:.0f} W ({source.rated_power_source}): "
                                f"the reading of {source.describe()} is wrong")
    return fields | {"energy_j": energy, "power_avg_w": power, per_j_field(work): amount / energy,
                     "energy_reason": None}


def fill_missing(metrics: dict, work: Work | None, status: str, reason: str | None) -> dict:
    """``metrics`` with every energy field present: a point that did not measure gets nulls and the reason."""
    if "energy_j" in metrics:
        return metrics
    if status == "ok":
        return null_fields("not measured: this kind of point reads no energy", work) | metrics
    why = f"not measured: the point ended {status}" + (f" ({reason})" if reason else "")
    return null_fields(why, work) | metrics


def table_columns(df, work: Work = "tokens") -> list[str]:
    """The energy columns a study's table shows: none where no record has a figure (a device without a reading)."""
    col = per_j_field(work)
    has = col in df.columns and bool(df[col].notna().any())
    return [col, "power_avg_w", "energy_j"] if has else []
