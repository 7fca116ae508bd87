"""An offline-generation point kind and an inference study, registered from outside accel_kit (at import).

The shape ``docs/engine.md`` gives for adding a kind and a study, run end to end by
``tests/test_kind_registry.py``: the kind (its point type, measurement, the adapter's answer, its
metrics) is ``register_kind``'s one call; the study (its parameters, points, table, figures: its ``STUDY``
declaration) is ``register_study``'s. Neither touches the worker, the sweep runner or the fork server. Greedy
generation without a KV cache: each new token runs the model over the whole sequence so far.
"""
from __future__ import annotations

import hashlib
import json
from typing import ClassVar, Literal

import pandas as pd
from pydantic import PositiveInt

from accel_kit import results
from accel_kit.engine import measurement
from accel_kit.engine.kinds import adapter_check, register_kind
from accel_kit.engine.measurement import Context, KindMeasurement, Window
from accel_kit.engine.point import NOT_IN_KEY, Frontier, Point
from accel_kit.engine.result import Result
from accel_kit.metrics import Metric
from accel_kit.params import StudyParams
from accel_kit.studies import Headline, Study, register_study
from accel_kit import identity

KIND = "inference_points:offline_generation"  # a "module:Name" kind: the worker imports this module to find it
NAME = "inference_test"


# ---- the kind -------------------------------------------------------------------------------------

class GenerationPoint(Point):
    """One offline-generation point: ``batch_size`` prompts of ``prompt_len`` tokens, ``new_tokens`` generated."""

    kind: Literal["inference_points:offline_generation"] = KIND
    ENERGY_WORK: ClassVar[str | None] = "tokens"  # its energy figure: tokens per joule
    RATE_METRIC: ClassVar[str | None] = "tflops_per_device"
    preset: str
    batch_size: PositiveInt
    prompt_len: PositiveInt
    new_tokens: PositiveInt
    warmup: int = 1
    trials: PositiveInt = 2
    seed: int = 0

    def label(self) -> str:
        return f"{self.preset} {self.precision}, batch {self.batch_size}, prompt {self.prompt_len}"

    def frontier(self) -> Frontier:
        fields = self.model_dump(exclude=NOT_IN_KEY | {"prompt_len"})
        return Frontier(hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16], "prompt_len",
                        self.prompt_len)


class GenerationMeasurement(KindMeasurement):
    """Timed calls of one greedy generation of the batch, through the shared measurement path."""

    work = "tokens"

    def __init__(self, point: GenerationPoint, ctx: Context):
        from accel_kit.models import family_of, get_config

        super().__init__(point, ctx)
        self.total_len = point.prompt_len + point.new_tokens
        self.cfg = get_config(point.preset, seq_len=self.total_len)
        family = family_of(self.cfg)
        # Without a KV cache, step t runs the model over prompt_len + t tokens: each at that length's forward FLOPs.
        self.flops_per_call = sum(point.batch_size * n * family.flop_terms(self.cfg, n).total("forward")
                                  for n in range(point.prompt_len, self.total_len))
        self.base = {"flops": self.flops_per_call}
        self.out["model"] = point.preset

    def total_flops(self) -> float:
        return self.flops_per_call * (self.point.warmup + self.point.trials)

    def setup(self) -> Window:
        import torch

        from accel_kit.models import build_model
        from accel_kit.precision import dtype_of

        p, device = self.point, self.ctx.device
        torch.manual_seed(p.seed)
        model = build_model(p.preset, seq_len=self.total_len).to(device=device, dtype=dtype_of(p.precision)).eval()
        prompts = torch.randint(0, 1000, (p.batch_size, p.prompt_len), device=device)

        @torch.no_grad()
        def generate() -> None:
            tokens = prompts
            for _ in range(p.new_tokens):
                logits, _ = model(tokens)
                tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            self.generated = tokens

        return Window(generate, warmup=p.warmup, trials=p.trials, noisy_cv=1.0)

    def metrics(self, timing, mem_bytes):
        from accel_kit import flops as F

        p = self.point
        generated = p.batch_size * p.new_tokens
        achieved = F.tflops(self.flops_per_call, timing.median_s)
        return ({"generated_tokens_per_s": generated / timing.median_s,
                 "time_per_output_token_s": timing.median_s / p.new_tokens, "tflops_per_device": achieved,
                 "generated_tokens_valid": bool((self.generated[:, p.prompt_len:] < self.cfg.vocab_size).all())},
                achieved, generated * p.trials)

    def summary(self, metrics: dict) -> str:
        return f"{metrics['generated_tokens_per_s']:.0f} generated tok/s"


def unsupported_generation(adapter, point: GenerationPoint) -> str | None:
    """The adapter's answer (``unsupported_<kind>`` where it has one), then the model's position table."""
    from accel_kit.models import get_config

    positions = get_config(point.preset).seq_len  # the preset's context length
    beyond = (f"prompt_len {point.prompt_len} + new_tokens {point.new_tokens} exceed the {positions} positions "
              f"of {point.preset}" if point.prompt_len + point.new_tokens > positions else None)
    return adapter_check(adapter, point) or beyond


register_kind(KIND, GenerationPoint, lambda point, ctx: measurement.run(GenerationMeasurement(point, ctx)),
              unsupported=unsupported_generation,
              metrics=(Metric("generated_tokens_per_s", "tokens/s", "tokens generated per second over the batch"),
                       Metric("time_per_output_token_s", "s", "one generation call over its new tokens"),
                       Metric("generated_tokens_valid", "bool", "every generated id lies in the vocabulary")))


# ---- the study ------------------------------------------------------------------------------------

class Params(StudyParams):
    preset: str = "gpt2-debug"
    precision: Literal["fp32", "bf16"] = "fp32"
    batch_size: PositiveInt = 2
    prompt_lens: list[PositiveInt] = [4, 8]
    new_tokens: PositiveInt = 3
    trials: PositiveInt = 2
    timeout_s: float = 600


def points(params: Params, system) -> list[GenerationPoint]:
    """One point per prompt length, shortest first (so a memory frontier is found before the longer ones)."""
    return [GenerationPoint(system=system.id, precision=params.precision, preset=params.preset,
                            batch_size=params.batch_size, prompt_len=n, new_tokens=params.new_tokens,
                            trials=params.trials) for n in sorted(set(params.prompt_lens))]


TABLE_KEYS = ["system", "preset", "precision", "batch_size", "prompt_len"]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """The latest record of each point (the one identity, ``results.point_key_of``), with every key field that
    varies among the rows shown beside the table's own."""
    if df.empty:
        return df
    df = results.latest(df)
    keys = identity.with_varying(TABLE_KEYS, df)
    cols = [c for c in keys + ["status", "generated_tokens_per_s", "time_per_output_token_s", "reason",
                                     "record_id"] if c in df.columns]
    return df[cols].sort_values([k for k in keys if k in df.columns]).reset_index(drop=True)


def figures(df: pd.DataFrame) -> dict:
    from accel_kit import plots

    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    if ok.empty:
        return {}
    return {"inference_rate": plots.grouped_bars(ok, x="prompt_len", y="generated_tokens_per_s", facet="precision",
                                                 group=["system"], title="Generated tokens per second",
                                                 x_title="prompt length", y_title="tokens/s")}


STUDY = Study(NAME, Params, table, figures, points=points, keys=tuple(TABLE_KEYS), work="inference",
              headline=Headline("generated_tokens_per_s", "tokens/s", ("preset", "batch_size", "prompt_len")))
register_study(NAME, __name__)
