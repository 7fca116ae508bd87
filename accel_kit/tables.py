"""A study's table for people: its own columns, headers with units, rounded to the digits the noise supports.

A study's ``table(df)`` is the data (every column, raw floats, the record ids): what tests, the
CLI and the report compute from. ``readable`` turns it into what a notebook shows: no ids or
all-empty columns, the values every row shares said once above the table, a spread column
beside every throughput (``accel_kit.noise``), numbers rounded to what that spread supports.
The record ids stay reachable: ``run.records()`` / ``run.df()``, in the same row order.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from accel_kit import metrics, noise, results

# Words of metric names that are read as acronyms (or, for "hf", as the reference's name).
ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end", "mfu": "MFU", "mbu": "MBU", "kv": "KV",
            "hf": "transformers", "slo": "SLO", "a2a": "all-to-all"}
# Headers whose words a metric's name does not give; the rest are the name's words with its unit.
LABELS = {
    "micro_batch_size": "micro-batch", "gas": "GAS", "seq_len": "sequence (tokens)", "devices": "devices",
    "global_batch_size": "global batch", "batch_size": "batch", "tokens_per_s": "tokens/s",
    "tokens_per_s_per_device": "tokens/s per device", "samples_per_s": "samples/s",
    "samples_per_s_mean": "samples/s (mean step)", "tflops": "TFLOP/s", "tflops_per_device": "TFLOP/s per device",
    "tokens_per_j": "tokens/J", "flops_per_j": "FLOP/J", "mfu_pct": "MFU (%)", "mfu_measured_pct": "MFU measured (%)",
    "mem_peak_gib": "peak memory (GiB)", "mem_estimate_gib": "memory estimate (GiB)", "power_avg_w": "power (W)",
    "gain_vs_smallest_gas": "gain over smallest GAS (x)", "speedup": "speedup (x)",
    "scaling_efficiency_pct": "scaling efficiency (%)", "speedup_vs_dense": "speedup over dense (x)",
    "time_median_s": "median time (s)", "loss_gap_pct": "loss gap over dense (%)",
    "ideal_speedup": "ideal speedup (x)", "loss_curve_run": "loss-curve run", "n_params": "parameters", "loss_last": "last loss (nats)",
    # serving: the load and its latencies under the names people quote them by (TTFT, TPOT, ITL)
    "prompt_tokens": "input (tokens)", "output_tokens": "output (tokens)", "input_len": "input (tokens)",
    "output_len": "output (tokens)", "request_rate": "request rate (requests/s)",
    "serve_requests_per_s": "requests/s", "serve_output_tokens_per_s": "output tokens/s",
    "goodput_requests_per_s": "goodput (requests/s)", "goodput_pct": "goodput (% of requests)",
    "slo_ttft_s": "SLO TTFT (s)", "slo_tpot_s": "SLO TPOT (s)", "serve_requests_failed": "failed requests",
    "serve_server_start_s": "server start (s)",
    **{f"serve_{name}_p{q}_s": f"{ACRONYMS[name]} p{q} (s)" for name in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)},
}
# Counts shown as integers even where a column of them is float (a missing value makes pandas store floats).
COUNTS = ("global_batch_size", "n_params", "steps", "prompt_tokens", "output_tokens", "input_len", "output_len",
          "concurrency", "serve_requests_failed")
# The point's identity: said once above the table when every row shares it.
IDENTITY = ("system", "preset", "model", "precision", "devices", "impl", "direction", "seq_len", "micro_batch_size",
            "gas", "status", "vocab_size", "batch_size", "engine", "family", "layout", "dp", "tp", "pp", "cp")
# What the spread column replaces: the trials' variation as raw numbers.
REPLACED = ("time_cv", "noisy", "time_iqr_s")
MAX_TEXT = 48  # characters of a reason shown in a cell; the full text is in the record


@dataclass(repr=False)  # its repr is its text (below): a plain-text front end shows the table, not the fields
class Readable:
    """A table for people: ``frame`` (text cells), what every row shares (``shared``) and the footnote."""

    frame: pd.DataFrame
    shared: dict[str, str]
    footnote: str

    @property
    def caption(self) -> str:
        return " · ".join(f"{k} {v}" for k, v in self.shared.items())

    def _repr_html_(self) -> str:
        body = self.frame.to_html(index=False, escape=True, border=0)
        return (f"<p><b>{html.escape(self.caption)}</b></p>" if self.shared else "") + body + \
            f"<p style=\"font-size:0.85em;color:#555\">{html.escape(self.footnote)}</p>"

    def __str__(self) -> str:
        head = self.caption + "\n" if self.shared else ""
        return head + self.frame.to_string(index=False) + "\n" + self.footnote

    __repr__ = __str__

    def __len__(self) -> int:
        return len(self.frame)


def header(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    unit = metrics.METRICS[name].unit if name in metrics.METRICS else ("%" if name.endswith("_pct") else "")
    # a rate's "_per_s" is its unit's "/s": "prefill_tokens_per_s" reads "prefill tokens (tokens/s)"
    words = (name[: -len("_per_s")] if name.endswith("_per_s") and unit.endswith("/s") else name).replace("_", " ")
    for suffix in (" gib", " pct", " s", " j", " w"):
        words = words[: -len(suffix)] if words.endswith(suffix) and unit not in ("", "1", "text", "bool") else words
    words = " ".join(ACRONYMS.get(w, w) for w in words.split(" "))
    return f"{words} ({unit})" if unit not in ("", "1", "text", "bool", "nats") else words


def _empty(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def _cell(name: str, v) -> str:
    if _empty(v):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int,)) or (isinstance(v, float) and v.is_integer() and name in IDENTITY + COUNTS):
        return f"{int(v):,}"
    if isinstance(v, float):
        if name.endswith("_pct"):
            return f"{v:.1f}"
        if name.startswith(("speedup", "gain")) or name.endswith("_x"):
            return f"{v:.2f}"
        return noise.fmt(v, noise.decimals(None, v))
    text = str(v)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def readable(table: pd.DataFrame, records: pd.DataFrame, shown: list[str] | None = None) -> Readable:
    """``table`` (a study's ``table(df)``, with ``record_id``) for people; ``records`` its records (for the
    trials and runs of each point: a point is its key, ``results.point_key_of``); ``shown``: the columns a
    reader sees (a study's ``SHOWN``, the columns of its paper table; None: all of ``table``). A key field
    that varies among the rows (a second preset, sequence length or layout) is shown whatever ``shown``
    says: rows that differ only in it would read as the same point otherwise."""
    if table.empty:
        return Readable(table, {}, "no records")
    if shown is not None:
        apart = _telling_apart(table, shown)
        table = table[[c for c in table.columns if c in shown or c in apart or c == "record_id"]]
    from accel_kit.identity import with_point_key  # (the module alone: the studies' face imports this one)

    spread = noise.with_spread(with_point_key(records)) if "record_id" in table.columns else pd.DataFrame()
    spread = spread.set_index("record_id") if not spread.empty else spread
    shared: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    runs = 1
    for name in table.columns:
        col = table[name]
        if name == "record_id" or name in REPLACED or all(_empty(v) for v in col):
            continue
        values = [None if _empty(v) else v for v in col]
        if (name in IDENTITY + COUNTS or not isinstance(values[0], float)) and name not in noise.RATES \
                and len({str(v) for v in values}) == 1 and len(values) > 1:
            shared[LABELS.get(name, name.replace("_", " "))] = _cell(name, values[0])
            continue
        if name in noise.RATES and f"{name}_spread" in spread:
            ids = table["record_id"]
            sp = [spread[f"{name}_spread"].get(i, math.nan) for i in ids]
            runs = max([runs] + [int(spread["runs"].get(i, 1)) for i in ids])
            places = [noise.decimals(s, v) for s, v in zip(sp, col)]
            out[header(name)] = [noise.fmt(v, p) for v, p in zip(col, places)]
            out[f"{header(name)} spread"] = [noise.fmt(s, p) for s, p in zip(sp, places)]
            continue
        out[header(name)] = [_cell(name, v) for v in values]
    busy = busy_cells(table, records)
    if busy is not None:
        out[BUSY_HEADER] = busy
    note = noise.SPREAD_DOC + (f"; up to {runs} runs of a point" if runs > 1 else "") + \
        ". Each row's record id: run.table()['record_id'], in the same order." + \
        (f" {BUSY_NOTE}" if busy is not None and any(busy) else "")
    return Readable(pd.DataFrame(out), shared, note)


# A point measured while other work kept the machine busy (the records' ``machine_busy`` and
# ``load_others_cpu_pct``): marked in its row, the mark said under the table.
BUSY_HEADER = "busy"
BUSY_NOTE = ("busy: the machine was busy with other work during the point's timed window (the CPU time "
             "other processes took, % of the machine); its numbers may be low.")


def busy_cells(table: pd.DataFrame, records: pd.DataFrame) -> list[str] | None:
    """Per row of ``table``, ``busy (37 %)`` where its record says the machine was busy, else ""; None where
    the records carry no such reading (records from before it was recorded)."""
    if "machine_busy" not in records.columns or "record_id" not in table.columns or "record_id" not in records:
        return None
    by_id = records.drop_duplicates("record_id").set_index("record_id")
    cells = []
    for rid in table["record_id"]:
        flag = by_id["machine_busy"].get(rid) if rid in by_id.index else None
        if flag is None or _empty(flag) or not bool(flag):
            cells.append("")
            continue
        load = by_id["load_others_cpu_pct"].get(rid) if "load_others_cpu_pct" in by_id else None
        cells.append(f"busy ({load:.0f} %)" if load is not None and not _empty(load) else "busy")
    return cells


def _telling_apart(table: pd.DataFrame, shown: list[str]) -> list[str]:
    """The key fields of ``table`` outside ``shown`` that vary among its rows (a layout field is told by the
    ``layout`` label where that is shown)."""
    from accel_kit.identity import varying

    layout = set(results.LAYOUT_DEFAULTS) if "layout" in shown else set()
    return [f for f in varying(table) if f not in shown and f not in layout]


def width_px(t: Readable | pd.DataFrame, px_per_char: float = 8.0, padding_px: float = 16.0) -> float:
    """An upper estimate of the table's rendered width: the widest cell or header of each column
    (``t``: a readable table, or a frame of the texts shown, as ``accel_kit.report.tables.text_frame``)."""
    frame = t.frame if isinstance(t, Readable) else t
    total = 0.0
    for name in frame.columns:
        widest = max([len(str(name))] + [len(str(v)) for v in frame[name]])
        total += widest * px_per_char + padding_px
    return total
