"""Greedy generation with a static KV cache: the one decode loop every family's model runs (gpt-fast's).

Two plain steps, no generation framework between them: a prefill (``forward_cached`` over the
prompt at position 0, writing every layer's cache) gives the first new token; then each decode
step runs ``forward_cached`` on the last token at position t, writing position t of the cache and
attending over positions 0 .. t. The cache is allocated once, for prompt plus new tokens
(``Family.new_kv_cache``). The model must be of a family with ``supports_kv_cache``.

Timing: pass a ``Stopwatch`` (``accel_kit.timing``, the one clock, synchronised on both sides of
each region) and each forward is one region closed as its own step: ``times_s[0]`` is the prefill
(time to first token), ``times_s[1:]`` the decode steps (time per output token), as
``GenerationTimes`` reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from accel_kit.timing import Stopwatch

StepCallback = Callable[[int, torch.Tensor], None]  # (new token's index 0 .. N-1, its ids (B,))


@dataclass(frozen=True)
class GenerationTimes:
    """One generation's times: the prefill (TTFT, the first new token included) and each decode step."""

    prefill_s: float
    decode_step_s: list[float]

    @classmethod
    def from_stopwatch(cls, watch: Stopwatch) -> "GenerationTimes":
        return cls(watch.times_s[0], list(watch.times_s[1:]))


def _family(model: nn.Module):
    from accel_kit.models.registry import family_of

    family = family_of(model.cfg)
    if not family.supports_kv_cache:
        raise ValueError(f"the {family.name} family's models have no KV-cache forward")
    return family


def _next_token(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Greedy choice (B,) from logits (B, 1, V_padded), over the tokenizer's ids only (padding rows never win)."""
    return logits[:, -1, :vocab_size].argmax(dim=-1)


@torch.inference_mode()
def greedy_generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, *,
                    on_step: StepCallback | None = None, stopwatch: Stopwatch | None = None) -> torch.Tensor:
    """Greedy decoding of ``max_new_tokens`` after ``prompt_ids`` (B, T); returns the ids (B, T + N).

    Args:
        model: a model of a family with ``supports_kv_cache`` (``model.cfg`` names its family).
        prompt_ids: (B, T) token ids, every prompt of the same length (no padding).
        max_new_tokens: N >= 1; T + N must fit the model's positions.
        on_step: called with each new token's index and ids, outside any timed region.
        stopwatch: times the prefill and each decode step as steps of their own (module docstring).
    """
    family = _family(model)
    B, T = prompt_ids.shape
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if T + max_new_tokens > family.context_length(model.cfg):
        raise ValueError(f"{T} prompt and {max_new_tokens} new tokens are beyond the model's context "
                         f"{family.context_length(model.cfg)}")
    vocab = family.shape(model.cfg).vocab_size
    dtype = next(model.parameters()).dtype
    cache = family.new_kv_cache(model.cfg, B, T + max_new_tokens, dtype=dtype, device=prompt_ids.device)
    out = torch.empty(B, T + max_new_tokens, dtype=prompt_ids.dtype, device=prompt_ids.device)
    out[:, :T] = prompt_ids
    watch = stopwatch or Stopwatch(lambda: None)
    for i in range(max_new_tokens):
        start = 0 if i == 0 else T + i - 1
        tokens = prompt_ids if i == 0 else out[:, start:start + 1]  # the prompt, then the last new token
        with watch.region():
            out[:, T + i] = _next_token(model.forward_cached(tokens, cache, start), vocab)
        watch.end_step()
        if on_step is not None:
            on_step(i, out[:, T + i])
    return out


def timed_greedy_generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
                          synchronize: Callable[[], None]) -> tuple[torch.Tensor, GenerationTimes]:
    """``greedy_generate`` with the prefill and every decode step timed (``synchronize``: the adapter's)."""
    watch = Stopwatch(synchronize)
    tokens = greedy_generate(model, prompt_ids, max_new_tokens, stopwatch=watch)
    return tokens, GenerationTimes.from_stopwatch(watch)
