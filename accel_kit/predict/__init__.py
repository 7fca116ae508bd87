"""What-if: throughput and memory past the devices at hand, with the prediction's own error.

    from accel_kit import predict
    run = predict.what_if("cpu", preset="gpt2-debug", devices=[1, 2, 4], seq_len=256)
    run.table(); run.held_out_summary()

``accel_kit.predict.predictor`` says how a step is modelled, ``comm`` the collectives, ``links``
where link figures come from, ``heldout`` how the error is measured. ``accel-kit predict`` and
``notebooks/what_if.ipynb`` go through ``what_if``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from pydantic import PositiveInt

from accel_kit.errors import AccelKitError
from accel_kit.json_types import JSONObject, JSONValue
from accel_kit.mesh import ParallelLayout
from accel_kit.params import PrecisionRequest, StudyParams
from accel_kit.predict.heldout import error_summary, held_out, load_records
from accel_kit.predict.predictor import Prediction, Predictor
from accel_kit.predict.shape import shape_for
from accel_kit.results import Record

if TYPE_CHECKING:
    import plotly.graph_objects as go

STUDY = "what_if"  # params/what_if/<profile>.yaml


class WhatIfParams(StudyParams, ParallelLayout):
    """What to predict: a model, its sequence and precision, and the layout (``ParallelLayout``'s fields, as a
    training point takes them) at each device count. None: the system's default (its micro-batch, sequence
    length, precision)."""

    preset: str = "gpt2-xl"
    devices: list[PositiveInt] | PositiveInt = [1]  # device counts, each predicted in the layout (``layouts``)
    seq_len: PositiveInt | None = None
    precision: PrecisionRequest | None = None
    activation_checkpointing: bool = False
    # Devices a node holds (a ring of more crosses nodes, over the inter-node link); None: the system's.
    devices_per_node: PositiveInt | None = None
    records: list[str] | None = None  # output folders (or .jsonl files, archives) to learn from; None: outputs/
    # Inference (``WhatIf.inference``): the preset's greedy generations of each batch, prompt and output length.
    inference_batch_sizes: list[PositiveInt] = [1]
    inference_input_len: PositiveInt = 128  # prompt tokens
    inference_output_len: PositiveInt = 128  # new tokens, the first with the prefill

    def layouts(self, micro_batch_size: int | None = None) -> list[ParallelLayout]:
        """The layout at each device count (``micro_batch_size``: the system's, where the parameter is None)."""
        fields = self.model_dump(include=set(ParallelLayout.model_fields))
        counts = self.devices if isinstance(self.devices, list) else [self.devices]
        mb = self.micro_batch_size or micro_batch_size
        return [ParallelLayout(**fields | {"devices": n, "micro_batch_size": mb}) for n in counts]

    def check(self) -> None:
        """Refuse, in one line, a preset not known (a named one, or an ``hf:PATH`` config whose file cannot
        run) or a layout that does not divide the devices or that is not built (``validate_layout``); what the
        model allows is checked once the system's defaults are known (``what_if``)."""
        from accel_kit.models import check_preset

        check_preset(self.preset)
        for layout in self.layouts():
            layout.validate_layout()


@dataclass
class WhatIf:
    """Predictions for one system, and how wrong its records say such predictions are."""

    system: str
    params: WhatIfParams
    predictions: list[Prediction]
    held_out: pd.DataFrame
    errors: pd.DataFrame
    record_dirs: list[str]
    notes: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list, repr=False)  # what the predictions learnt from

    def inference(self, precision: str | None = None) -> pd.DataFrame:
        """TTFT, TPOT and output tokens/s of the preset's greedy generations (``params.inference_*``), fitted on the
        system's own offline-generation records (``accel_kit.predict.inference``); ``precision`` None: the one
        most of them ran. One row per batch size, with the basis; empty (``inference_summary`` says why) without
        records."""
        from accel_kit.predict.inference import InferencePredictor, generation_shape

        predictor = InferencePredictor(self.system, self.records)
        precision = precision or next(iter(predictor.precisions()), None)
        if precision is None:
            return pd.DataFrame()
        p = self.params
        rows = []
        for b in p.inference_batch_sizes:
            shape = generation_shape(p.preset, batch_size=b, input_len=p.inference_input_len,
                                     output_len=p.inference_output_len, precision=precision)
            try:
                rows.append(predictor.predict(shape).row())
            except ValueError as exc:
                rows.append({"system": self.system, "preset": p.preset, "batch_size": b, "basis": None,
                             "why_not": str(exc)})
        return pd.DataFrame(rows)

    def inference_summary(self) -> str:
        """The inference predictions' held-out error in words (leave-one-out over the system's generate points)."""
        from accel_kit.predict.inference import error_summary, held_out

        summary = error_summary(held_out(self.records, [self.system]))
        if summary.empty:
            return (f"inference held-out error: no ok generate records of {self.system} under "
                    f"{', '.join(self.record_dirs)} (run the inference study there), so nothing is predicted")
        r = summary.iloc[0]
        return (f"inference held-out error ({self.system}, leave-one-out over its generate points): "
                f"{int(r['predicted'])}/{int(r['points'])} points predicted; TTFT mean "
                f"{_pct(r['ttft_mean_abs_error'])}, max {_pct(r['ttft_max_abs_error'])}; TPOT mean "
                f"{_pct(r['tpot_mean_abs_error'])}, max {_pct(r['tpot_max_abs_error'])}")

    def table(self) -> pd.DataFrame:
        """One row per prediction; empty (with ``explain`` saying why) when none could be made."""
        return pd.DataFrame([p.row() for p in self.predictions])

    def explain(self) -> str:
        """Each prediction's inputs and assumptions, in words."""
        lines = []
        for p in self.predictions:
            lay = p.shape.layout
            layout = (f" (dp {lay.dp} x tp {lay.tp} x pp {lay.pp} x cp {lay.cp}, {lay.engine})"
                      if lay.devices > 1 else "")
            lines.append(f"{p.system}, {p.shape.preset}, {lay.devices} device(s){layout}, seq {p.shape.seq_len}, "
                         f"micro-batch {lay.micro_batch_size}, GAS {lay.gas}, {p.shape.precision}: "
                         f"{p.tokens_per_s:.4g} tokens/s, {p.memory_per_device_gib:.3g} GiB per device"
                         + ("" if p.fits is None else (" (fits)" if p.fits else " (does NOT fit)"))
                         + (f"  [basis: {p.basis}; NOT fitted to this system's training records]"
                            if p.basis != "records" else ""))
            lines += [f"    input: {x}" for x in p.inputs] + [f"    assumption: {x}" for x in p.assumptions]
        return "\n".join(lines + self.notes)

    def held_out_summary(self) -> str:
        """The held-out error in words; always shown next to the predictions."""
        if self.errors.empty:
            return (f"held-out error: no dense training records of {self.system} under "
                    f"{', '.join(self.record_dirs)}, so this system's predictions are unchecked")
        mine = self.errors[self.errors["system"].isin([self.system])]
        if mine.empty:
            return f"held-out error: no records of {self.system} could be predicted from the others"
        lines = [f"held-out error ({self.system}, leave-one-out over its dense training points; a point run "
                 "more than once is measured by the median of its runs):"]
        for _, r in mine.iterrows():
            lines.append(f"  {r['study']:12s} {int(r['predicted'])}/{int(r['points'])} points predicted; step time "
                         f"mean {_pct(r['step_mean_abs_error'])}, max {_pct(r['step_max_abs_error'])}; "
                         f"peak memory mean {_pct(r['mem_mean_abs_error'])}, max {_pct(r['mem_max_abs_error'])}"
                         + (f"; the runs' own spread {_pct(r['run_spread_mean'])}"
                            if pd.notna(r.get("run_spread_mean")) else ""))
        return "\n".join(lines)

    def figures(self) -> dict[str, go.Figure]:
        from accel_kit.predict.plots import predicted_vs_measured, scaling_prediction

        figs = {}
        if self.predictions:
            figs["what_if_scaling"] = scaling_prediction(self.table())
        if not self.held_out.empty and self.held_out["predicted_step_s"].notna().any():
            figs["what_if_held_out"] = predicted_vs_measured(self.held_out)
        return figs


def _pct(v) -> str:
    return "n/a" if v is None or pd.isna(v) else f"{100 * v:.1f} %"


def resolve_params(profile: str | None, overrides: JSONObject) -> WhatIfParams:
    from accel_kit import params as _params

    p = _params.resolve(WhatIfParams, STUDY, profile, overrides)
    p.check()
    return p


def what_if(system: str, params: WhatIfParams | None = None, **overrides: JSONValue) -> WhatIf:
    """Predict ``params`` (or the overrides on the defaults) on ``system`` from the records found.

    Raises:
        ParameterError: a layout that ``accel-kit run`` refuses (``accel_kit.engine.layout.check_layout``), in one line.
    """
    from accel_kit.engine.layout import check_layout
    from accel_kit.engine.point import TrainSpec
    from accel_kit.paths import output_dir
    from accel_kit.systems import load_system

    params = params or resolve_params(None, overrides)
    sys_desc = load_system(system)
    dirs = params.records or [str(output_dir())]
    # Folders the user named must exist (a one-line DataError otherwise); the default may not yet.
    records = load_records(d for d in dirs if params.records or Path(d).exists())
    predictor = Predictor(system, records, link_root=dirs[0], devices_per_node=params.devices_per_node)
    precision = prediction_precision(params.precision or sys_desc.default_precision, sys_desc, predictor)
    predictions, notes = [], []
    seq_len = params.seq_len or sys_desc.seq_len
    for layout in params.layouts(sys_desc.micro_batch_size):
        check_layout(TrainSpec(preset=params.preset, seq_len=seq_len, precision=precision,
                               activation_checkpointing=params.activation_checkpointing, **layout.model_dump()))
        shape = shape_for(params.preset, layout, seq_len=seq_len, precision=precision,
                          activation_checkpointing=params.activation_checkpointing)
        try:
            predictions.append(predictor.predict(shape))
        except AccelKitError as exc:  # e.g. no records and no datasheet: say so, predict the rest
            notes.append(f"cannot predict {layout.devices} device(s): {exc}")
    ho = held_out(records, [system], link_root=dirs[0])
    return WhatIf(system, params, predictions, ho, error_summary(ho), dirs, notes, records)


def prediction_precision(requested: str, system, predictor: Predictor) -> str:
    """``auto``: the precision most of the system's records ran (what the prediction learns from), else the
    adapter's choice where the device is here, else bf16."""
    if requested != "auto":
        return requested
    counts = pd.Series([r.params["precision"] for r in predictor.train]).value_counts()
    if len(counts):
        return str(counts.index[0])
    from accel_kit.devices import get_adapter

    adapter = get_adapter(system.adapter, system.options)
    if adapter.availability():
        return adapter.resolve_precision("auto").precision
    # Neither records nor the device are here to say what "auto" resolves to: bf16, the precision
    # "auto" prefers wherever a device supports it (first of accel_kit.precision.LOW_PRECISIONS: it
    # trains without loss scaling). A name, since shapes and records carry precisions by name; the
    # prediction's shape shows it, so the choice is visible.
    return "bf16"


def run_notebook(namespace: dict[str, object]) -> WhatIf:
    """``what_if`` from a notebook's parameters cell (its globals()); an unknown injected parameter is an error."""
    from accel_kit.studies import NOTEBOOK_NAMES, injected_parameters, notebook_profile

    # The study notebooks' names (system, profile, output_dir), then what to predict.
    injected = injected_parameters(STUDY, namespace, sorted(set(NOTEBOOK_NAMES) | set(WhatIfParams.parameter_names())))
    profile = notebook_profile(namespace, injected)
    overrides = {n: namespace.get(n) for n in WhatIfParams.parameter_names()}
    if namespace.get("output_dir") and not overrides.get("records"):
        overrides["records"] = [str(namespace["output_dir"])]
    return what_if(namespace.get("system", "cpu"), resolve_params(profile, overrides))


__all__ = ["AccelKitError", "Prediction", "Predictor", "WhatIf", "WhatIfParams", "error_summary", "held_out",
           "load_records", "resolve_params", "run_notebook", "shape_for", "what_if"]
