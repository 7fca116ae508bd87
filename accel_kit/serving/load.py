"""The load generator: streaming completions against a server, at a fixed concurrency or Poisson arrivals.

Why a client of our own (about 150 lines over httpx, already a dependency) and not an established
generator: each was tried against the main environment (torch 2.13 CPU, transformers 5.24) and none fits
there. ``vllm bench serve`` comes only with vLLM, whose CPU build lives in an environment of its own (it
pins its own torch and an older transformers); aiperf pins pandas 2.3, psutil 7.0, rich 14.1 and others
below what the main environment holds, and pulls kubernetes, dash, kaleido and optuna; guidellm pulls
sanic, datasets and faker and reads its prompts through a hub processor. What we need of one is small and
well defined (vLLM's benchmark defines it the same way): per request, the time to the first streamed token
(TTFT), the gaps between tokens (ITL), time per output token after the first (TPOT), and end-to-end
latency; over the point, request and output-token throughput and goodput under an SLO.

Requests go to ``/v1/completions`` with ``stream`` on (both engines serve it), prompts of a set token
count drawn from the model folder's tokenizer with a seeded generator (every prompt differs, so no
prefix cache serves one from another), ``max_tokens`` the output length. Every loop is bounded: the
count of requests, each request's timeout, and the point's deadline (requests still open then fail).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from accel_kit.errors import ParameterError


@dataclass(frozen=True)
class Load:
    """One load: ``concurrency`` requests in flight at once, or Poisson arrivals at ``request_rate`` per s."""

    n_requests: int
    prompt_tokens: int
    output_tokens: int
    concurrency: int | None = None
    request_rate: float | None = None
    seed: int = 0
    request_timeout_s: float = 120.0
    deadline_s: float = 600.0

    def __post_init__(self) -> None:
        check_load(self.concurrency, self.request_rate)
        for name in ("n_requests", "prompt_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise ParameterError(f"{name} must be at least 1, got {getattr(self, name)}")


def check_load(concurrency: int | None, request_rate: float | None) -> None:
    """One line for a load that is not exactly one of a positive concurrency and a positive request rate."""
    if request_rate is not None and not request_rate > 0:
        raise ParameterError(f"request_rate must be a positive number of requests per second, got {request_rate}")
    if concurrency is not None and concurrency < 1:
        raise ParameterError(f"concurrency must be at least 1, got {concurrency}")
    if (concurrency is None) == (request_rate is None):
        raise ParameterError("a serving load is either a concurrency or a request_rate: give exactly one")


@dataclass
class RequestResult:
    """One request's timings (seconds from its send) and counts; ``error`` set when it failed."""

    start_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's definition); None for a one-token answer."""
        if self.e2e_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def make_prompts(model_dir: Path, n: int, n_tokens: int, seed: int) -> list[str]:
    """``n`` different prompts of ``n_tokens`` tokens each: words of one token each (a leading space, letters
    only), drawn by a seeded generator from the folder's tokenizer, so a prompt re-encodes to that count."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    words = [w for w, i in tok.get_vocab().items() if w.startswith("\u0120") and w[1:].isalpha() and w[1:].isascii()]
    if not words:
        raise ParameterError(f"{model_dir}: the tokenizer has no one-token words to build prompts from")
    words = sorted(words)
    rng = random.Random(seed)
    return ["".join(rng.choice(words) for _ in range(n_tokens)).replace("\u0120", " ") for _ in range(n)]


def arrival_times_s(n: int, rate_per_s: float, seed: int) -> list[float]:
    """``n`` send times of a Poisson process at ``rate_per_s`` (exponential gaps), from the load's start; seeded
    apart from the prompts (``seed + 1``), so a rate's arrivals do not change with the prompts' length."""
    rng = random.Random(seed + 1)
    times, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        times.append(t)
    return times


def request_body(model: str, prompt: str, output_tokens: int, engine: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": output_tokens, "stream": True, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    if engine == "vllm":
        body["ignore_eos"] = True  # every answer the full length (transformers serve rejects the field)
    return body


async def _one_request(client, url: str, body: dict) -> RequestResult:
    """Send one streaming completion; time its first token and each gap after."""
    res = RequestResult(start_s=time.perf_counter())
    last = res.start_s
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                res.error = f"HTTP {resp.status_code}: {text}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    res.output_tokens = int(chunk["usage"].get("completion_tokens") or res.output_tokens)
                    res.prompt_tokens = chunk["usage"].get("prompt_tokens")
                if not any(c.get("text") for c in chunk.get("choices") or []):
                    continue
                now = time.perf_counter()
                if res.ttft_s is None:
                    res.ttft_s = now - res.start_s
                else:
                    res.itl_s.append(now - last)
                last = now
                res.output_tokens = max(res.output_tokens, len(res.itl_s) + 1)
        res.e2e_s = time.perf_counter() - res.start_s
        if res.ttft_s is None:
            res.error = "no token streamed"
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the load goes on
        res.error = f"{type(e).__name__}: {e}"[:300]
    return res


async def _run(load: Load, base_url: str, model: str, prompts: list[str], engine: str) -> tuple[list[RequestResult], float]:
    import httpx

    url = f"{base_url}/v1/completions"
    limits = httpx.Limits(max_connections=max(load.concurrency or 0, 64))
    async with httpx.AsyncClient(timeout=httpx.Timeout(load.request_timeout_s), limits=limits) as client:
        bodies = [request_body(model, p, load.output_tokens, engine) for p in prompts]
        t0 = time.perf_counter()
        if load.concurrency is not None:
            queue = list(reversed(bodies))

            async def worker() -> list[RequestResult]:
                done = []
                while queue:  # bounded: each pass takes one of the n_requests bodies
                    done.append(await _one_request(client, url, queue.pop()))
                return done

            tasks = [asyncio.create_task(worker()) for _ in range(min(load.concurrency, len(bodies)))]
        else:
            async def arrive(delay_s: float, body: dict) -> list[RequestResult]:
                await asyncio.sleep(delay_s)
                return [await _one_request(client, url, body)]

            delays = arrival_times_s(len(bodies), load.request_rate, load.seed)
            tasks = [asyncio.create_task(arrive(d, b)) for d, b in zip(delays, bodies)]
        finished, pending = await asyncio.wait(tasks, timeout=load.deadline_s)
        for task in pending:
            task.cancel()
        results = [r for task in finished if not task.cancelled() and task.exception() is None for r in task.result()]
        duration_s = time.perf_counter() - t0
    results += [RequestResult(error=f"not finished by the point's deadline of {load.deadline_s:.0f} s")
                for _ in range(len(bodies) - len(results))]
    return results, duration_s


def run_load(load: Load, base_url: str, model: str, model_dir: Path, engine: str = "transformers"
             ) -> tuple[list[RequestResult], float]:
    """Run ``load`` against the server at ``base_url``; returns each request's result and the load's wall time."""
    prompts = make_prompts(model_dir, load.n_requests, load.prompt_tokens, load.seed)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread (the CLI, a script): run one here
        return asyncio.run(_run(load, base_url, model, prompts, engine))
    # A loop already runs in this thread (a Jupyter kernel runs its cells inside one), and asyncio.run
    # refuses to nest: the load gets a loop of its own in a thread, and this call waits for it.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="accel-kit-load") as pool:
        return pool.submit(asyncio.run, _run(load, base_url, model, prompts, engine)).result()
