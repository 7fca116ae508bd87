"""GenSLM: genome language models on long codon sequences (paper Table IV).

GenSLM (Zvyagin et al. 2022) is a GPT trained on SARS-CoV-2 genomes split into codons
(three nucleotides, one token); a whole genome (~29.9 kb, ~10k codons) fits in a 10240-token
context, ten times a text model's. Table IV reports its training throughput per system and
model size; GenSLM's own measure is samples/s = global batch / mean step time, warm-up
excluded (the worker's ``samples_per_s_mean``), and we add tokens/s, MFU against the
datasheet and the measured matmul peak, peak memory and the attention kernel that ran.

Points are ``presets x seq_lens``, each preset's lengths ascending, so the sweep's memory
frontier records the lengths beyond the first that does not fit as ``skipped``.

Data: ``fasta`` (a FASTA file or folder) or, by default, ``synthetic_records`` synthetic
SARS-CoV-2-like genomes (``accel_kit.data.synthetic_genomes``, fixed seed, no download).
The genomes are prepared once per length with ``prepare_fasta(block_size=seq_len)`` under
``<outputs>/data/genslm/`` and reused while unchanged. Padding rule: GenSLM's, one record
per padded row (``[BOS] codons [EOS] [PAD]...`` with codon-71), batches of whole rows and
``-100`` targets at padding (``accel_kit.data.PaddedRowBatches``), so a sample never holds
two records and needs neither an attention mask nor a separator between records.

Quality check: ``quality_preset`` (a small model) trains for ``quality_steps`` at every
length, so the loss curve shows the measured models learn: it should fall well below
ln 64 = 4.16 nats, the loss of a model that knows only that a codon is one of 64.
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import ClassVar, Literal

import pandas as pd
from pydantic import Field, PositiveInt, field_validator

from accel_kit import energy, noise, results
from accel_kit.errors import ParameterError
from accel_kit.models import PRESETS
from accel_kit import identity
from accel_kit.studies.study import Headline, ReportTable, Row, Study
from accel_kit.studies.training import TrainingParams, make_point, resolve_precision, run_points
from accel_kit.systems import System

NAME = "genslm"
UNIFORM_CODON_NATS = math.log(64)  # cross-entropy of a uniform guess over the 64 codons
SYNTHETIC_SEED = 0  # the synthetic genomes are fixed data: their seed is not the training seed
GENSLM_PRESETS = ["genslm-25m", "genslm-250m", "genslm-2.5b", "genslm-25b", "gpt2-13b", "genslm-gpt3-xl"]


class Params(TrainingParams):
    """GenSLM study parameters; the shared training ones (precision, micro_batch_size, steps ...) are inherited."""

    presets: list[str] = Field(default=GENSLM_PRESETS, min_length=1)
    seq_lens: list[PositiveInt] = Field(default=[1024, 2048, 4096, 10240], min_length=1)
    fasta: str | None = None  # a FASTA file or folder; None: synthetic genomes
    synthetic_records: PositiveInt = 64  # genomes generated when fasta is None
    tokenizer: Literal["codon-71", "codon-69"] = "codon-71"
    # vocab_size (inherited): None = the tokenizer's (71 or 69); at least that many. The paper's
    # CS-2 GPT-3 XL used vocab 70, i.e. `-p tokenizer codon-69 -p vocab_size 70`.
    quality_preset: str | None = None  # trained for quality_steps at every length (added to presets if absent)
    quality_steps: PositiveInt = 30
    # Single values of the training spec that this study takes as lists (or from fasta).
    REPLACED_BY: ClassVar[dict[str, str]] = {
        "preset": "presets (a list)", "seq_len": "seq_lens (a list)",
        "data": "fasta (a FASTA file or folder; none: synthetic genomes)"}
    preset: str | None = None
    data: str | None = None  # each point's is set from fasta (its source label)

    @field_validator("presets")
    @classmethod
    def _known_presets(cls, value: list[str]) -> list[str]:
        unknown = [p for p in value if p not in PRESETS]
        if unknown:
            raise ValueError(f"unknown model preset {unknown[0]!r}; known: {', '.join(PRESETS)}")
        return value

    @field_validator("quality_preset")
    @classmethod
    def _known_quality_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown model preset {value!r}; known: {', '.join(PRESETS)}")
        return value

    def point_presets(self) -> list[str]:
        """The presets to run: the quality preset first (cheap, and its curve matters most), then ``presets``."""
        extra = [self.quality_preset] if self.quality_preset and self.quality_preset not in self.presets else []
        return extra + list(dict.fromkeys(self.presets))

    def model_vocab_size(self) -> int:
        """The embedding rows: ``vocab_size`` or the tokenizer's."""
        from accel_kit.tokenizers import load_tokenizer

        return self.vocab_size or load_tokenizer(self.tokenizer).vocab_size

    def check(self, system: System) -> None:
        # The shared check takes one preset: run it for each (precision, preset name).
        for preset in self.point_presets():
            TrainingParams.check(self.model_copy(update={"preset": preset}), system)
        from accel_kit.tokenizers import load_tokenizer

        tokens = load_tokenizer(self.tokenizer).vocab_size
        if self.vocab_size is not None and self.vocab_size < tokens:
            raise ParameterError(f"parameter 'vocab_size': {self.vocab_size} is smaller than the {tokens} tokens of "
                                 f"{self.tokenizer!r}; use at least {tokens} (or leave it unset)")


def prepare_genomes(params: Params, data_root: Path, seq_lens: list[int], *,
                    progress: bool) -> tuple[dict[int, str], str]:
    """Prepare the genomes as padded rows, once per length (reused when unchanged).

    Args:
        params: the study parameters (``fasta``, ``synthetic_records``, ``tokenizer``).
        data_root: the outputs' data folder.
        seq_lens: the lengths (block sizes) to prepare.
        progress: show progress bars.

    Returns:
        ``({seq_len: prepared folder}, data source label)``; the label is ``synthetic-genomes``
        or ``fasta:<resolved path>``.

    Raises:
        DataError: a missing or malformed FASTA input (one line, ``file:line``).
    """
    from accel_kit.data import prepare_fasta, synthetic_genomes

    if params.fasta is None:
        name = f"synthetic-n{params.synthetic_records}-seed{SYNTHETIC_SEED}"
        fasta = data_root / "genslm" / f"{name}.fasta"
        if not fasta.exists():  # deterministic bytes, so an existing file is the same file
            synthetic_genomes(fasta, params.synthetic_records, seed=SYNTHETIC_SEED)
        source = "synthetic-genomes"
    else:
        fasta = Path(params.fasta).expanduser().resolve()
        # The path's hash keeps two inputs with the same file name apart.
        digest = hashlib.sha256(str(fasta).encode()).hexdigest()[:8]
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", fasta.name)[:60] + f"-{digest}"
        source = f"fasta:{fasta}"
    folders = {}
    for seq_len in seq_lens:
        out = data_root / "genslm" / f"{name}-{params.tokenizer}-rows{seq_len}"
        prepare_fasta(fasta, out, tokenizer=params.tokenizer, block_size=seq_len, progress=progress)
        folders[seq_len] = str(out.resolve())
    return folders, source


def run(params: Params, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
        progress: bool = True, rerun: bool = False) -> list[results.Record]:
    """Prepare the genomes, then run (or resume) ``point_presets() x seq_lens``; one record per point."""
    params.check(system)  # before preparing data: a typo should cost nothing
    lengths = sorted(set(params.seq_lens))  # ascending, so the memory frontier is found first
    folders, source = prepare_genomes(params, records_path.parent.parent / "data", lengths, progress=progress)
    vocab = params.model_vocab_size()
    choice = resolve_precision(params, system)
    # data says where the genomes came from (the resume key), data_path is each length's prepared folder.
    points = [make_point(params, system, choice, preset=preset, seq_len=seq_len, vocab_size=vocab, data=source,
                         data_path=folders[seq_len],
                         steps=params.quality_steps if preset == params.quality_preset else params.steps)
              for preset in params.point_presets() for seq_len in lengths]
    return run_points(NAME, params, system, points, records_path=records_path, run_id=run_id, profile=profile,
                      progress=progress, rerun=rerun)


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Latest record per point, by model size (preset table order) then length."""
    order = {name: i for i, name in enumerate(PRESETS)}
    df = results.latest(identity.with_point_key(df))
    return df.assign(_order=df["preset"].map(order)).sort_values(["system", "_order", "seq_len"]).drop(columns="_order")


# What the notebook's table shows (the rest is in ``table``): the paper's Table IV columns, and memory.
SHOWN = ("system", "preset", "n_params", "seq_len", "precision", "micro_batch_size", "global_batch_size", "status",
         "tokens_per_s", "samples_per_s_mean", "mfu_measured_pct", "mem_peak_gib", "loss_last", "reason")


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Table IV: throughput (tokens/s and GenSLM's samples/s), MFU both ways and memory per model and length."""
    if df.empty:
        return df
    cols = ["system", "preset", "n_params", "vocab_size", "seq_len", "precision", "micro_batch_size",
            "global_batch_size", "activation_checkpointing", "attention_kernel", "attention_kernel_ran", "status",
            "tokens_per_s", "samples_per_s_mean", *energy.table_columns(df), "tflops_per_device", "mfu_pct",
            "mfu_measured_pct", "mem_peak_gib", "mem_estimate_gib", "steps", "loss_last", "reason", "record_id"]
    df = _ordered(df)
    cols = identity.with_varying(cols, df)  # with every key field that tells its rows apart
    return df[[c for c in dict.fromkeys(cols) if c in df.columns]].reset_index(drop=True)


def quality(df: pd.DataFrame) -> pd.DataFrame:
    """The quality check: first and last training loss of each point that ran, against ln 64.

    ``loss_last_minus_uniform_nats`` < 0 means the model predicts codons better than a
    uniform guess over the 64 codons.
    """
    if df.empty or "losses" not in df.columns:
        return pd.DataFrame()
    df = _ordered(df)
    df = df[df["status"] == "ok"]
    out = df[["system", "preset", "seq_len", "steps", "warmup_steps", "loss_first", "loss_last"]].copy()
    out["loss_min"] = [min(losses) for losses in df["losses"]]
    out["uniform_codon_nats"] = UNIFORM_CODON_NATS
    out["loss_last_minus_uniform_nats"] = out["loss_last"] - UNIFORM_CODON_NATS
    return out.reset_index(drop=True)


def loss_curves(df: pd.DataFrame) -> pd.DataFrame:
    """One row per optimizer step of each point that ran: ``step`` (1-based, warm-up included) and ``loss``."""
    rows = []
    if df.empty or "losses" not in df.columns:
        return pd.DataFrame()
    for rec in _ordered(df).itertuples():
        if rec.status == "ok" and isinstance(rec.losses, list):
            rows += [{"system": rec.system, "preset": rec.preset, "seq_len": rec.seq_len, "step": i, "loss": loss}
                     for i, loss in enumerate(rec.losses, 1)]
    return pd.DataFrame(rows)


def _mark_not_run(fig, latest: pd.DataFrame, y: float) -> None:
    """Points that did not run, as red crosses at height ``y`` with their status and reason on hover."""
    import plotly.graph_objects as go

    failed = latest[latest["status"] != "ok"]
    if failed.empty:
        return
    fig.add_trace(go.Scatter(
        x=failed["seq_len"], y=[y] * len(failed), mode="markers", name="did not run",
        marker=dict(symbol="x", size=12, color="crimson"),
        text=failed["preset"] + " " + failed["status"] + ": " + failed["reason"].fillna(""),
        hovertemplate="seq_len=%{x}<br>%{text}<extra></extra>"))


def figures(df: pd.DataFrame) -> dict:
    """Throughput, samples/s and memory against sequence length per model; the loss curves against ln 64."""
    from accel_kit import plots

    if df.empty:
        return {}
    latest = _ordered(df)
    spread = noise.with_spread(identity.with_point_key(df)).set_index("record_id")
    latest = latest.join(spread[[c for c in spread.columns if c.endswith(("_lo", "_hi", "_spread"))]], on="record_id")
    ok = latest[latest["status"] == "ok"]
    if ok.empty:
        return {}
    # Preset first: with a single line the legend names the model (plots.line labels by the first group).
    group = ["preset", "system", "precision", "micro_batch_size", "activation_checkpointing", "attention_kernel"]
    ticks = sorted(latest["seq_len"].unique())
    figs = {}
    for name, y, y_title, title in (
            ("genslm_tokens_per_s", "tokens_per_s", "tokens / s", "GenSLM training throughput against sequence length"),
            ("genslm_samples_per_s", "samples_per_s_mean", "samples / s (global batch / mean step time)",
             "GenSLM samples per second against sequence length"),
            ("genslm_memory", "mem_peak_gib", "GiB", "Peak memory per device against sequence length"),
            # beside tokens/s where the device reads its energy (absent, not zero, where it does not)
            ("genslm_energy", "tokens_per_j", "tokens / J", "GenSLM training energy efficiency against sequence length")):
        if not plots.has_values(ok, y):
            continue
        # Log y for rates: the models span three orders of magnitude in size.
        fig = plots.line(ok, x="seq_len", y=y, group=group, title=title, x_title="sequence length (codons)",
                         y_title=y_title, log_x=True, log_y=name != "genslm_memory",
                         hover=["n_params", "mfu_measured_pct", "mem_peak_gib"])
        if name != "genslm_memory":
            _mark_not_run(fig, latest, y=ok[y].min() / 2)  # below every measured point (a log axis has no 0)
        plots.swept_ticks(fig, ticks)
        if name != "genslm_memory":  # log ticks at 1, 2, 5 per decade, written out (plotly's own read "4" for 0.4)
            fig.update_yaxes(dtick="D2", tickformat=",.2~r")
        figs[name] = fig
    # The quality check is the quality preset's curve; the Table IV presets run only a few timed
    # steps on small devices, too few to judge learning (their losses are in ``quality``).
    checked = latest[latest["preset"] == latest["quality_preset"]] if "quality_preset" in latest else latest
    curves = loss_curves(checked if not checked.empty else latest)
    if not curves.empty:
        fig = plots.line(curves, x="step", y="loss", group=["preset", "seq_len", "system"],
                         title="Quality check: training loss on the genomes (warm-up steps included)",
                         x_title="optimizer step", y_title="cross-entropy (nats / codon)")
        fig.add_hline(y=UNIFORM_CODON_NATS, line_dash="dash", line_color="grey",
                      annotation_text="ln 64: uniform over codons", annotation_position="top right")
        figs["genslm_loss"] = fig
    return figs


STUDY = Study(
    NAME, Params, table, figures, run=run, keys=("system", "preset", "seq_len"), shown=SHOWN,
    headline=Headline("samples_per_s_mean", "samples/s", ("preset", "vocab_size", "micro_batch_size", "devices",
                                                         "seq_len")),
    # Table IV: GenSLM's own samples/s (the global batch over the mean step), beside tokens/s.
    report=(ReportTable("table-4-genslm", ("preset", "seq_len"), extra=(
        "vocab_size", "micro_batch_size", "activation_checkpointing", "attention_kernel", "steps"), rows=(
            Row("samples_per_s_mean", "samples/s"), Row("tokens_per_s"), Row("tokens_per_j"),
            Row("mfu_pct"), Row("mfu_measured_pct"),
            Row("mem_peak_gib", reason="the device reports no peak memory"), Row("loss_last"))),))
