"""Greedy generation with a static KV cache: the one decode loop every family's model runs (gpt-fast's).

Two plain steps, no generation framework between them: a prefill (``forward_cached`` over the
prompt at position 0, writing every layer's cache) gives the first new token; then each decode
step runs ``forward_cached`` on the last token at position t, writing position t of the cache and
attending over positions 0 .. t. A ``Decoder`` allocates the cache once, for one batch and prompt plus
new tokens (``Family.new_kv_cache``), and reuses it for every generation. The model must be of a family
with ``supports_kv_cache``.

Two implementations of the decode step (``IMPLS``), recorded by the points that run them:

- ``eager``: each step's operators launched one by one from Python, the position a Python int (the
  attention reads the cache's valid prefix, whose length grows by one each step).
- ``compiled``: the step through ``torch.compile`` with shapes that never change (the position a tensor
  on the device, the attention over the whole cache under a mask: ``accel_kit.models.kv_cache``), so one
  graph serves every step; on CUDA (and ROCm) in ``reduce-overhead`` mode, which replays the step as one
  captured CUDA graph: a decode step of a few milliseconds of kernels is otherwise bound by launching
  them (an H200 ran Llama 3.2 1B's step at 12.5 ms eager, where its weights take under 1 ms to read).
  The prefill runs eagerly: it runs once per generation and its length differs between points.
  Graphs compiled are counted (``Decoder.compiles``); after ``freeze()`` a compile is an error, so a
  recompile never lands inside a timed window as a number.

Timing: pass a ``Timeline`` (``accel_kit.timing``): a mark before the prefill and after every new token,
recorded as device events where the device has them, read with one synchronisation at the end; the
intervals are the prefill (time to first token) and each decode step (time per output token), as
``GenerationTimes`` reads them.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from accel_kit.timing import Timeline

StepCallback = Callable[[int, torch.Tensor], None]  # (new token's index 0 .. N-1, its ids (B,))
IMPLS = ("eager", "compiled")


class RecompiledInWindow(RuntimeError):
    """A compiled decode step compiled again after ``Decoder.freeze()``: its time would include compiling."""


@dataclass(frozen=True)
class GenerationTimes:
    """One generation's times: the prefill (TTFT, the first new token included) and each decode step."""

    prefill_s: float
    decode_step_s: list[float]

    @classmethod
    def from_intervals(cls, intervals_s: list[float]) -> "GenerationTimes":
        return cls(intervals_s[0], list(intervals_s[1:]))


def _family(model: nn.Module):
    from accel_kit.models.registry import family_of

    family = family_of(model.cfg)
    if not family.supports_kv_cache:
        raise ValueError(f"the {family.name} family's models have no KV-cache forward")
    return family


def _next_token(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Greedy choice (B,) from logits (B, 1, V_padded), over the tokenizer's ids only (padding rows never win)."""
    return logits[:, -1, :vocab_size].argmax(dim=-1)


# At most this many rows (a decode step's batch) a linear runs through the chosen few-rows kernel
FEW_ROWS = 16
TORCH_LINEAR = "torch"  # torch's own F.linear: every choice's baseline
FewRowsKernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (rows, in), W (out, in)) -> (rows, out)


class FewRowsLinears(TorchFunctionMode):
    """Every ``F.linear`` on at most ``FEW_ROWS`` rows through ``kernel``; more rows (a prefill) run as torch runs
    them. torch's own way of intercepting an operator for a region of code: the models stay as they are."""

    def __init__(self, kernel: FewRowsKernel):
        super().__init__()
        self.kernel = kernel

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and not kwargs:
            x, weight, bias = (*args, None)[:3]
            rows = x.numel() // x.shape[-1]
            if rows <= FEW_ROWS and weight.dim() == 2:
                y = self.kernel(x.reshape(rows, x.shape[-1]), weight).reshape(*x.shape[:-1], weight.shape[0])
                return y if bias is None else y + bias
        return func(*args, **kwargs)


def _best_of_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # first call: the kernels' own warm-up (thread pools, primitive caches, page faults on the outputs)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@torch.inference_mode()
def choose_few_rows_kernel(step: Callable[[], object], candidates: dict[str, FewRowsKernel], *,
                           repeats: int = 3) -> str:
    """The fastest of torch's own ``F.linear`` and the ``candidates`` (the device adapter's ``few_rows_linears``)
    for every linear of ``step`` (one decode step), timed on the whole step, the best of ``repeats``. Timed rather
    than ruled, since which kernel wins depends on the CPU, its BLAS and the shapes; and on the whole step rather
    than on each product alone, since a kernel with its own thread pool (numpy's BLAS) streamed a weight fastest
    alone but lost inside a step, where it and torch's threads took turns at spinning on the same cores. Host
    kernels: timed with the host clock."""
    def timed(kernel: FewRowsKernel | None) -> float:
        with FewRowsLinears(kernel) if kernel is not None else contextlib.nullcontext():
            return _best_of_s(step, repeats)

    times = {name: timed(kernel) for name, kernel in {TORCH_LINEAR: None, **candidates}.items()}
    return min(times, key=times.get)


def _graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class Decoder:
    """Greedy generation of one model for prompts of ``batch`` rows and up to ``max_len`` positions in all.

    Args:
        model: a model of a family with ``supports_kv_cache`` (``model.cfg`` names its family).
        batch: prompts per generation.
        max_len: prompt plus new tokens, at most; must fit the model's positions.
        impl: ``eager`` or ``compiled`` (module docstring).
        compile_mode: ``torch.compile``'s mode for the compiled step (the device adapter's ``decode_compile_mode``:
            ``reduce-overhead`` where CUDA graphs replay it).
        few_rows_linears: kernels the eager step's linears may run through at a batch of at most ``FEW_ROWS``
            (the device adapter's ``few_rows_linears``): the fastest on this model's step, torch's own included, is
            chosen here (``choose_few_rows_kernel``) and named in ``linear_kernel``.
    """

    def __init__(self, model: nn.Module, batch: int, max_len: int, impl: str = "eager", *,
                 compile_mode: str | None = None, few_rows_linears: dict[str, FewRowsKernel] | None = None):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        family = _family(model)
        if max_len > family.context_length(model.cfg):
            raise ValueError(f"{max_len} positions are beyond the model's context {family.context_length(model.cfg)}")
        self.model, self.batch, self.max_len, self.impl = model, batch, max_len, impl
        self.vocab = family.shape(model.cfg).vocab_size
        weight = next(model.parameters())
        self.device = weight.device
        self.cache = family.new_kv_cache(model.cfg, batch, max_len, dtype=weight.dtype, device=weight.device)
        self.linear_kernel = TORCH_LINEAR  # the kernel the eager step's linears run through (chosen below)
        self._few_rows: FewRowsKernel | None = None
        self.compiles = 0  # graphs compiled for this decoder's step so far
        self.frozen = False
        self._step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._decode
        if impl == "compiled":
            # The cache's tensors are the graph's inputs that it writes: marked static, the captured CUDA
            # graph writes them where they are instead of copying them in and out at every replay.
            for layer in self.cache.layers:
                torch._dynamo.mark_static_address(layer.k)
                torch._dynamo.mark_static_address(layer.v)
            self._step = torch.compile(self._decode, mode=compile_mode, fullgraph=True, dynamic=False)
        elif few_rows_linears and batch <= FEW_ROWS:
            self._choose_kernels(few_rows_linears)

    def _choose_kernels(self, candidates: dict[str, FewRowsKernel]) -> None:
        """Decode steps of a token at position 0 of the cache (which every prefill writes again), timed with
        each kernel."""
        token = torch.zeros(self.batch, 1, dtype=torch.long, device=self.device)
        self.linear_kernel = choose_few_rows_kernel(lambda: self.model.forward_cached(token, self.cache, 0),
                                                    candidates)
        self._few_rows = candidates.get(self.linear_kernel)

    def _decode(self, token: torch.Tensor, position: torch.Tensor | int) -> torch.Tensor:
        """One step: the token (B, 1) at ``position`` -> the next token (B,)."""
        return _next_token(self.model.forward_cached(token, self.cache, position), self.vocab)

    def freeze(self) -> None:
        """From now on a compile (a new shape, a guard that failed) raises ``RecompiledInWindow``."""
        self.frozen = True

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, *, on_step: StepCallback | None = None,
                 timeline: Timeline | None = None) -> torch.Tensor:
        """Greedy decoding of ``max_new_tokens`` after ``prompt_ids`` (B, T); returns the ids (B, T + N).

        Args:
            prompt_ids: (B, T) token ids, every prompt of the same length (no padding), B the decoder's batch.
            max_new_tokens: N >= 1; T + N must fit the decoder's ``max_len``.
            on_step: called with each new token's index and ids (the device's tensor: reading it on the host
                waits for the device).
            timeline: marked before the prefill and after each new token (module docstring).
        """
        B, T = prompt_ids.shape
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if B != self.batch:
            raise ValueError(f"this decoder's cache holds {self.batch} rows, got {B} prompts")
        if T + max_new_tokens > self.max_len:
            raise ValueError(f"{T} prompt and {max_new_tokens} new tokens exceed the decoder's {self.max_len} "
                             "positions")
        out = torch.empty(B, T + max_new_tokens, dtype=prompt_ids.dtype, device=prompt_ids.device)
        out[:, :T] = prompt_ids
        compiled = self.impl == "compiled"
        # every decode step's position, on the device once: a compiled step reads its own, no host copy per step
        positions = torch.arange(T, T + max_new_tokens, device=self.device) if compiled else None
        before = _graphs_compiled() if compiled else 0
        mark = timeline.mark if timeline is not None else (lambda: None)
        mark()
        out[:, T] = _next_token(self.model.forward_cached(prompt_ids, self.cache, 0), self.vocab)  # the prefill
        mark()
        if on_step is not None:
            on_step(0, out[:, T])
        with FewRowsLinears(self._few_rows) if self._few_rows is not None else contextlib.nullcontext():
            for i in range(1, max_new_tokens):
                start = T + i - 1  # the last new token's position
                out[:, T + i] = self._step(out[:, start:start + 1], positions[i - 1] if compiled else start)
                mark()
                if on_step is not None:
                    on_step(i, out[:, T + i])
        if compiled:
            grown = _graphs_compiled() - before
            self.compiles += grown
            if self.frozen and grown:
                raise RecompiledInWindow(f"the compiled decode step compiled {grown} more graph(s) after its "
                                         "warm-up (a shape or guard changed): its times would include compiling")
        return out


def greedy_generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, *, impl: str = "eager",
                    on_step: StepCallback | None = None, timeline: Timeline | None = None) -> torch.Tensor:
    """One greedy generation with a decoder of its own (``Decoder``): ids (B, T + N) after ``prompt_ids`` (B, T)."""
    B, T = prompt_ids.shape
    decoder = Decoder(model, B, T + max(max_new_tokens, 1), impl)  # refuses positions beyond the model's context
    return decoder.generate(prompt_ids, max_new_tokens, on_step=on_step, timeline=timeline)


def timed_greedy_generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
                          synchronize: Callable[[], None], new_event: Callable[[], object] | None = None,
                          ) -> tuple[torch.Tensor, GenerationTimes]:
    """``greedy_generate`` with the prefill and every decode step timed on a ``Timeline`` (``synchronize`` and
    ``new_event``: the adapter's ``synchronize`` and ``timing_event``)."""
    timeline = Timeline(synchronize, new_event)
    tokens = greedy_generate(model, prompt_ids, max_new_tokens, timeline=timeline)
    return tokens, GenerationTimes.from_intervals(timeline.intervals_s())
