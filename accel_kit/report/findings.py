"""Findings computed from the records, each citing the records it rests on (never written by hand).

Throughput is compared only between records of one configuration (the study's model, sizes,
device count and precision; each study's ``Study.headline``): the paper names unequal batch sizes, GAS and
precision as what makes cross-system comparisons unfair, so a finding never ranks two
systems on different work.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import pandas as pd

import accel_kit.report.render as R
from accel_kit import noise
from accel_kit.report.cells import energy_reason
from accel_kit.report.context import Context, Section, study_table
from accel_kit.report.render import esc
from accel_kit.results import Record
from accel_kit import identity
from accel_kit.studies.study import Headline

# Two records are compared when they share every field of the point's key but the system's own
# (``identity.config_key``).
ACROSS_SYSTEMS = ("system", "devices_per_node")


def headlines() -> dict[str, Headline]:
    """Each registered study's headline (``Study.headline``: its metric, unit and the parameters a finding names
    of a point), in the registry's order; a study that declares none is not ranked."""
    from accel_kit import studies

    declared = {name: studies.get_study(name).headline for name in studies.STUDIES}
    return {name: h for name, h in declared.items() if h is not None}


def _config(row: pd.Series, keys: list[str]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {R.short(row[k], 40)}" for k in keys
                     if k in row and not R.is_missing(row[k]))


def fastest(ctx: Context) -> list[str]:
    """Per study and precision: the system fastest on the points more than one system measured."""
    out = []
    for study, headline in headlines().items():
        metric, unit, keys = headline.metric, headline.unit, list(headline.keys)
        df = ctx.study(study)
        if df.empty or metric not in df.columns:
            continue
        ok = noise.with_spread(df, [metric])  # each point's latest record, with its spread
        ok = ok[(ok["status"] == "ok") & ok[metric].notna()]
        if ok.empty:
            continue
        ok = ok.assign(_config=identity.config_key(ok, ACROSS_SYSTEMS))
        for precision, sub in ok.groupby("precision", sort=True):
            keys_here = [k for k in keys if k in sub.columns]
            keys_here += [k for k in identity.varying(sub) if k not in keys_here + list(ACROSS_SYSTEMS)]
            head = f"<b>{esc(study)}, {esc(precision)}</b>: "
            systems = sorted(sub["system"].unique())
            shared = [g for _, g in sorted(sub.groupby("_config", sort=False), key=lambda kv: identity.order(kv[0]))
                      if g["system"].nunique() > 1]
            if shared:
                # A point is won only when the interval of the fastest over the second excludes 1.
                ranked = [g.sort_values(metric, ascending=False) for g in shared]
                won = [g for g in ranked if noise.differs(noise.Measured.of(g.iloc[0], metric),
                                                          noise.Measured.of(g.iloc[1], metric))]
                wins = Counter(g.iloc[0]["system"] for g in won)
                tied = len(shared) - len(won)
                if wins:
                    n = max(wins.values())
                    winners = sorted(s for s, w in wins.items() if w == n)
                    # The example: the largest of the points the (first) winner won.
                    g = max((g for g in won if g.iloc[0]["system"] == winners[0]), key=lambda g: g[metric].max())
                    who = (f"{esc(winners[0])} is fastest" if len(winners) == 1
                           else f"{esc(' and '.join(winners))} are each fastest")
                    who += f" beyond the noise at {n} of {len(shared)} points measured by more than one system"
                    who += f" ({tied} within noise)" if tied else ""
                else:
                    g = max(ranked, key=lambda g: g[metric].max())
                    who = (f"no system is faster beyond the noise at any of the {len(shared)} points measured by "
                           f"more than one system")
                best, second = g.iloc[0], g.iloc[1]
                a, b = noise.Measured.of(best, metric), noise.Measured.of(second, metric)
                out.append(head + f"{who}; e.g. at {esc(_config(best, keys_here))}: {esc(best['system'])} "
                           f"{esc(a.text())} against {esc(second['system'])} {esc(b.text())} {unit}: "
                           f"{esc(noise.ratio_text(a, b))}"
                           + ctx.cite.refs([best["record_id"], second["record_id"]]))
            elif len(systems) == 1:
                best = sub.loc[sub[metric].idxmax()]
                out.append(head + f"only {esc(systems[0])} has ok {esc(precision)} records; its best: "
                           f"{R.fmt_num(best[metric])} {unit} at {esc(_config(best, keys_here))}"
                           + ctx.cite.refs([best["record_id"]]))
            else:
                parts = []
                for system in systems:
                    best = sub[sub["system"] == system]
                    best = best.loc[best[metric].idxmax()]
                    parts.append(f"{esc(system)} {R.fmt_num(best[metric])} {unit} at {esc(_config(best, keys_here))}"
                                 + ctx.cite.refs([best["record_id"]]))
                out.append(head + "no point was measured by more than one system, so none is ranked; best of "
                           "each: " + "; ".join(parts))
    return out


def scaling_efficiency(ctx: Context) -> list[str]:
    """Per system: the scaling efficiency at the largest device count that ran."""
    t = study_table(ctx, "scaling")
    out = []
    if t.empty:
        return out
    layouts = t["layout"].nunique() > 1
    for (system, preset, precision, layout), g in t.groupby(["system", "preset", "precision", "layout"], sort=True):
        ok = g[g["status"] == "ok"].sort_values("devices")
        # The layout named where the records hold more than one: each is scaled against its own base.
        head = f"<b>{esc(system)}</b> ({esc(preset)}, {esc(precision)}{', ' + esc(layout) if layouts else ''}): "
        failed = g[(g["status"] != "ok") & (g["devices"] > (ok["devices"].max() if not ok.empty else 0))]
        tail = ""
        if not failed.empty:
            f = failed.sort_values("devices").iloc[0]
            tail = (f"; {int(f['devices'])} devices did not run: {esc(f['status'])} "
                    f"({esc(R.short(f.get('reason'), 120))})" + ctx.cite.refs([f["record_id"]]))
        if len(ok) < 2:
            what = (f"only {int(ok['devices'].iloc[0])} device(s) ran ok, so no efficiency" if len(ok)
                    else "no device count ran ok")
            out.append(head + what + (ctx.cite.refs(list(ok["record_id"])) if len(ok) else "") + tail)
            continue
        base, top = ok.iloc[0], ok.iloc[-1]
        out.append(head + _against_ideal(ctx, base, top) + ctx.cite.refs([base["record_id"], top["record_id"]])
                   + tail)
    return out


def _against_ideal(ctx: Context, base: pd.Series, top: pd.Series) -> str:
    """``top``'s tokens/s against ideal scaling from ``base`` (base x N / N0, its samples scaled alike): a
    shortfall (or a gain) called one only when the interval of the ratio excludes 1 (``noise.differs``),
    else "within noise"."""
    n, n0 = int(top["devices"]), int(base["devices"])
    what = (f"efficiency {R.fmt_pct(top['scaling_efficiency_pct'])}, speedup {R.fmt_ratio(top['speedup'])} "
            f"over {n0} device(s) against the ideal {R.fmt_ratio(n / n0)}")
    rate = _measured(ctx, "scaling", [top["record_id"], base["record_id"]], "tokens_per_s")
    if len(rate) < 2:
        return f"scaling efficiency at {n} devices: {what}"
    got, b = rate
    ideal = noise.Measured(b.value * n / n0, b.spread * n / n0, tuple(v * n / n0 for v in b.samples), b.busy)
    measured = f"{got.text()} against the ideal {ideal.text()} tokens/s"
    verdict = noise.differs(got, ideal)
    if verdict:
        side = "below" if got.value < ideal.value else "above"
        return (f"at {n} devices, {side} ideal scaling beyond the noise: {noise.ratio_text(got, ideal)} "
                f"({what}; {measured})")
    return f"at {n} devices, against ideal scaling: {noise.ratio_text(got, ideal)} ({what}; {measured})"


def longest_sequence(ctx: Context) -> list[str]:
    """Per system and configuration: the longest sequence that fit, and the first that did not."""
    out = []
    for study, group in (("seq_length", ["system", "preset", "precision", "layout", "devices"]),
                         ("genslm", ["system", "preset", "precision"])):
        t = study_table(ctx, study)
        if t.empty:
            continue
        group = [k for k in group if k in t.columns]
        for key, g in t.groupby(group, sort=True):
            ok = g[g["status"] == "ok"].sort_values("seq_len")
            label = ", ".join(R.fmt_key(k) for k in key[1:]) + (" device(s)" if "devices" in group else "")
            head = f"<b>{esc(key[0])}</b> ({esc(study)}, {esc(label)}): "
            top = ok["seq_len"].max() if not ok.empty else 0
            beyond = g[(g["status"] != "ok") & (g["seq_len"] > top)].sort_values("seq_len")
            text = (f"longest sequence that fit {int(top):,} tokens" + ctx.cite.refs([ok.iloc[-1]["record_id"]])
                    if not ok.empty else "no length ran ok")
            if not beyond.empty:
                b = beyond.iloc[0]
                text += (f"; {int(b['seq_len']):,} did not: {esc(b['status'])} ({esc(R.short(b.get('reason'), 120))})"
                         + ctx.cite.refs([b["record_id"]]))
            elif not ok.empty:
                text += "; every longer length asked for also ran" if len(ok) == len(g) else ""
            out.append(head + text)
    return out


def sparse_dense(ctx: Context) -> list[str]:
    """Per system and preset: throughput at the highest sparsity that ran, relative to dense."""
    t = study_table(ctx, "sparsity")
    out = []
    if t.empty:
        return out
    ok = t[(t["status"] == "ok") & t["speedup_vs_dense"].notna() & (t["sparsity"] > 0)]
    for (system, preset), g in ok.groupby(["system", "preset"], sort=True):
        top = g.sort_values(["sparsity", "tokens_per_s"]).iloc[-1]
        dense = t[(t["system"] == system) & (t["preset"] == preset) & (t["config"] == "dense") & (t["status"] == "ok")]
        ideal = (f"; the FLOP-proportional ideal is {R.fmt_ratio(top['ideal_speedup'])}"
                 if not R.is_missing(top.get("ideal_speedup")) else "")
        rate = _measured(ctx, "sparsity", [top["record_id"]] + list(dense["record_id"][:1]), "tokens_per_s")
        said = (f"{R.fmt_ratio(top['speedup_vs_dense'])} the dense tokens/s" if len(rate) < 2
                else noise.ratio_text(*rate) + " the dense tokens/s" if noise.differs(*rate)
                else "dense tokens/s " + noise.ratio_text(*rate))
        out.append(f"<b>{esc(system)}</b> ({esc(preset)}): {esc(top['config'])} runs at "
                   f"{esc(said)} ({esc(top.get('execution') or '?')})"
                   f"{ideal}" + ctx.cite.refs(list(dense["record_id"][:1]) + [top["record_id"]]))
    return out


def _measured(ctx: Context, study: str, record_ids: list[str], metric: str) -> list[noise.Measured]:
    """The records' ``metric`` with its spread (``Context.spreads``: widened to the point's runs), in the order
    of ``record_ids``; a record that is not its point's latest is left out."""
    spread = ctx.spreads(study)
    if spread.empty or metric not in spread.columns:
        return []
    return [noise.Measured.of(spread.loc[r], metric) for r in record_ids if r in spread.index]


def gas_gain(ctx: Context) -> list[str]:
    """Per system and micro-batch: each larger GAS against the smallest, a gain only beyond the noise
    (the notebook prints the same findings: the gas study's ``Study.findings``)."""
    from accel_kit import studies

    # Over every run of each point (its latest cited): its samples are all its trials, as in the notebook.
    found = studies.get_study("gas").findings(ctx.records.study_runs("gas"))
    return [esc(f["text"]) + ctx.cite.refs(f["record_ids"]) for f in found]


def energy(ctx: Context) -> list[str]:
    """Per system: the best tokens per joule, or why there is none."""
    out = []
    for system in ctx.systems:
        recs = [r for r in ctx.records.records if ctx.records.column(r) == system and r.status == "ok"]
        best = max((r for r in recs if r.metrics.get("tokens_per_j") is not None),
                   key=lambda r: r.metrics["tokens_per_j"], default=None)
        if best is not None:
            out.append(f"<b>{esc(system)}</b>: best {R.fmt_num(best['metrics']['tokens_per_j'])} tokens/J "
                       f"({esc(best['study'])}, {esc(best.get('model'))})" + ctx.cite.refs([best["record_id"]]))
        elif recs:
            out.append(f"<b>{esc(system)}</b>: no energy reading: {esc(energy_reason(recs[0].metrics))}"
                       + ctx.cite.refs([recs[0].record_id]))
    return out


def input_bound(ctx: Context) -> list[str]:
    """Per study and system: the points whose step waited on its input (``input_bound``), named, with the
    loader's rate alone against what the step consumed; nothing when no point did."""
    out = []
    hits: dict[tuple[str, str], list[Record]] = {}
    for r in ctx.records.records:
        if r.status == "ok" and r.metrics.get("input_bound"):
            hits.setdefault((r.study, ctx.records.column(r)), []).append(r)
    for (study, system), recs in sorted(hits.items()):
        worst = max(recs, key=lambda r: r.metrics["input_wait_pct"])
        m = worst.metrics
        loader = m.get("loader_tokens_per_s")
        out.append(f"<b>{esc(system)}</b>, {esc(study)}: {len(recs)} point(s) waited on their input; the worst, "
                   f"{esc(worst.model)}, spent {R.fmt_pct(m['input_wait_pct'])} of its step on the loader "
                   f"({R.fmt_num(loader) if loader is not None else 'too fast to time'} tokens/s alone against "
                   f"the step's {R.fmt_num(m['step_input_tokens_per_s'])})" + ctx.cite.refs([r.record_id for r in recs]))
    return out


FINDINGS: list[tuple[str, Callable[[Context], list[str]]]] = [
    ("Fastest system per study and precision", fastest),
    ("Scaling efficiency at the largest device count", scaling_efficiency),
    ("Longest sequence that fit", longest_sequence),
    ("Sparse against dense throughput", sparse_dense),
    ("Gradient accumulation", gas_gain),
    ("Energy", energy),
    ("Input-bound points", input_bound),
]


def findings_section(ctx: Context) -> Section:
    s = Section("findings", "Findings")
    s.text("<p>Computed from the records when this page was built; throughput is compared only between "
           "records of the same configuration (every field of the point's key but the one compared along); "
           f"{esc(noise.CI_DOC)}.</p>")
    body = []
    for title, fn in FINDINGS:
        items = fn(ctx)
        if items:
            body.append(f"<h3>{esc(title)}</h3><ul class=\"findings\">"
                        + "".join(f"<li>{item}</li>" for item in items) + "</ul>")
        else:
            body.append(f"<h3>{esc(title)}</h3><p class=\"nofig\">No records to compute this from.</p>")
    return s.text("".join(body))
