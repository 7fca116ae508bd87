"""Static-KV-cache generation (``accel_kit.models.generate``) and the families' inference FLOPs and bytes.

Greedy tokens are checked against transformers' ``generate(do_sample=False)`` from the same weights
(``Family.to_hf``), and cached logits against a full forward's, all in fp32 on the tiny presets. The
FLOP and byte counts are checked against hand counts for GPT-2 XL and Llama 3.1 8B.
"""
from __future__ import annotations

import functools

import time
import types

import pytest
import torch

from accel_kit.models import family_of, get_config
from accel_kit.models import generate as G
from accel_kit.models.generate import Decoder, RecompiledInWindow, greedy_generate, timed_greedy_generate
from accel_kit.timing import Timeline, percentiles

PRESETS = ("gpt2-debug", "llama3-debug")
PROMPT_LEN, NEW_TOKENS = 8, 16


@functools.cache
def _model(preset: str):
    """(family, cfg, model, prompt), built once per preset (the tests only read the model): a tiny model in fp32
    with matrices wide enough (std 0.3) that greedy tokens vary from step to step: the families' 0.02 init makes
    a random model repeat one token, which would check little. The norms keep their 1 and 0: redrawn at std 0.3
    too, GPT-2's LayerNorms scaled the stream by near-zero weights and half the seeds 0-7 repeated one token
    (with them kept, every seed 0-7 gives 27-32 distinct tokens of 32, both presets)."""
    torch.manual_seed(0)
    family, cfg = family_of(preset), get_config(preset)
    model = family.build(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    prompt = torch.randint(0, cfg.vocab_size, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    return family, cfg, model, prompt


@functools.cache
def _hf(preset: str):
    return family_of(preset).to_hf(_model(preset)[2]).eval()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("cache", [None, "static"])
def test_greedy_tokens_equal_transformers(preset, cache):
    family, cfg, model, prompt = _model(preset)
    ours = greedy_generate(model, prompt, NEW_TOKENS)
    theirs = _hf(preset).generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                  do_sample=False, use_cache=True, cache_implementation=cache, pad_token_id=0)
    assert ours.shape == (2, PROMPT_LEN + NEW_TOKENS)
    assert len(set(ours[:, PROMPT_LEN:].flatten().tolist())) > 3  # the check is not of one repeated token
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("preset", (*PRESETS, "moe-debug"))
def test_cached_logits_equal_full_forward(preset):
    family, cfg, model, prompt = _model(preset)
    ids = greedy_generate(model, prompt, NEW_TOKENS)
    with torch.no_grad():
        full, _ = model(ids)  # (B, T + N, V)
        cache = family.new_kv_cache(cfg, 2, ids.shape[1], dtype=torch.float32, device="cpu")
        steps = [model.forward_cached(ids[:, :PROMPT_LEN], cache, 0)]  # prefill: the last prompt position's
        steps += [model.forward_cached(ids[:, t:t + 1], cache, t) for t in range(PROMPT_LEN, ids.shape[1])]
        for offset, logits in enumerate(steps):
            torch.testing.assert_close(logits[:, 0], full[:, PROMPT_LEN - 1 + offset], rtol=1e-4, atol=1e-4)
        # a chunk after position 0 (the shifted causal mask) gives the same logits too
        chunked = family.new_kv_cache(cfg, 2, ids.shape[1], dtype=torch.float32, device="cpu")
        model.forward_cached(ids[:, :5], chunked, 0)
        torch.testing.assert_close(model.forward_cached(ids[:, 5:12], chunked, 5)[:, 0], full[:, 11],
                                   rtol=1e-4, atol=1e-4)


def test_timed_generation_times_prefill_and_each_step():
    _, _, model, prompt = _model("llama3-debug")
    seen = []
    tokens, times = timed_greedy_generate(model, prompt, 5, lambda: None)
    greedy_generate(model, prompt, 5, on_step=lambda i, ids: seen.append((i, ids.shape)))
    assert tokens.shape == (2, PROMPT_LEN + 5)
    assert times.prefill_s > 0 and len(times.decode_step_s) == 4 and all(t > 0 for t in times.decode_step_s)
    assert seen == [(i, (2,)) for i in range(5)]


class _Events:
    """A device whose events read a clock the test advances by hand, and whose synchronisations are counted."""

    def __init__(self):
        self.now_s, self.syncs = 0.0, 0

    def synchronize(self):
        self.syncs += 1

    def event(self):
        device = self

        class Event:
            def record(self):
                self.at_s = device.now_s

            def elapsed_time(self, later):
                return (later.at_s - self.at_s) * 1e3  # milliseconds, as torch's events give

        return Event()


def test_the_decode_loop_synchronises_once_per_generation_and_events_read_as_the_host_clock(monkeypatch):
    _, _, model, prompt = _model("llama3-debug")
    device = _Events()
    steps_s = iter([0.004, 0.001, 0.002, 0.003, 0.0015] * 4)
    forward = model.forward_cached

    def slow_forward(*args):  # each forward takes a known time on the device's clock
        device.now_s += next(steps_s)
        return forward(*args)

    monkeypatch.setattr(model, "forward_cached", slow_forward)
    decoder = Decoder(model, 2, PROMPT_LEN + 5)
    on_events = Timeline(device.synchronize, device.event)
    on_host = Timeline(lambda: None, None, clock=lambda: device.now_s)  # a CPU's: each mark reads the host clock

    class Both:  # marks both timelines at each boundary the loop marks
        def mark(self):
            on_events.mark()
            on_host.mark()

    decoder.generate(prompt, 5, timeline=Both())
    assert device.syncs == 0  # the loop itself never waits for the device
    events, host = on_events.intervals_s(), on_host.intervals_s()
    assert device.syncs == 1  # reading the times does, once
    assert events == pytest.approx([0.004, 0.001, 0.002, 0.003, 0.0015]) and events == pytest.approx(host)
    assert percentiles(events[1:], "tpot") == pytest.approx(percentiles(host[1:], "tpot"))


def test_the_timeline_on_a_cpu_times_every_step_within_the_generation():
    _, _, model, prompt = _model("gpt2-debug")
    timeline = Timeline(lambda: None)
    import time

    start = time.perf_counter()
    greedy_generate(model, prompt, 6, timeline=timeline)
    wall_s = time.perf_counter() - start
    intervals = timeline.intervals_s()
    assert len(intervals) == 6 and all(t > 0 for t in intervals) and sum(intervals) <= wall_s


@pytest.mark.slow  # compiles two tiny models with inductor: about 10 s on 2 cores
@pytest.mark.parametrize("preset", PRESETS)
def test_the_compiled_decode_gives_the_eager_tokens_and_compiles_once(preset):
    _, _, model, prompt = _model(preset)
    eager = greedy_generate(model, prompt, NEW_TOKENS)
    decoder = Decoder(model, 2, PROMPT_LEN + NEW_TOKENS, impl="compiled")
    assert torch.equal(decoder.generate(prompt, NEW_TOKENS), eager)
    assert decoder.compiles == 1  # one graph for every step: the position is a tensor, the shapes never change
    decoder.freeze()
    assert torch.equal(decoder.generate(prompt, NEW_TOKENS), eager) and decoder.compiles == 1


def test_a_compile_after_the_warm_up_is_an_error(monkeypatch):
    _, _, model, prompt = _model("gpt2-debug")
    decoder = Decoder(model, 2, PROMPT_LEN + 3, impl="compiled")
    decoder._step = lambda token, position: decoder._decode(token, int(position))  # no compile: the count is faked
    counts = iter(range(0, 100, 2))
    monkeypatch.setattr(G, "_graphs_compiled", lambda: next(counts))
    decoder.generate(prompt, 3)
    assert decoder.compiles == 2
    decoder.freeze()
    with pytest.raises(RecompiledInWindow, match="after its warm-up"):
        decoder.generate(prompt, 3)


def test_few_rows_kernels_give_the_same_products_and_tokens():
    from accel_kit.devices.cpu import CPUAdapter, swapped_linear

    kernels = CPUAdapter().few_rows_linears(torch.float32)
    assert "swapped" in kernels and CPUAdapter().few_rows_linears(torch.bfloat16) == {}
    torch.manual_seed(0)
    w, b = torch.randn(48, 32), torch.randn(48)
    step, prefill = torch.randn(2, 1, 32), torch.randn(G.FEW_ROWS + 1, 32)  # a decode step's (B, 1, h); a prefill's
    for kernel in kernels.values():
        with torch.inference_mode(), G.FewRowsLinears(kernel):
            few, many = torch.nn.functional.linear(step, w, b), torch.nn.functional.linear(prefill, w)
            strided = torch.nn.functional.linear(step[..., ::2], w[:, ::2])  # strided operands
        assert few.shape == (2, 1, 48)
        torch.testing.assert_close(few, torch.nn.functional.linear(step, w, b))  # the same product, another order
        torch.testing.assert_close(strided, torch.nn.functional.linear(step[..., ::2], w[:, ::2]))
        assert torch.equal(many, torch.nn.functional.linear(prefill, w))  # more rows than FEW_ROWS: torch's own
    _, _, model, prompt = _model("llama3-debug")
    eager = greedy_generate(model, prompt, NEW_TOKENS)
    # The choice runs on a fake clock that only the slow kernel moves, a second a product: a real sleep raced
    # the real step, which a loaded machine slowed past the sleep (the sleeping kernel then won).
    clock = types.SimpleNamespace(now=0.0)

    def slow(x, weight):
        clock.now += 1.0
        return swapped_linear(x, weight)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(G, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
        decoder = Decoder(model, 2, PROMPT_LEN + NEW_TOKENS, few_rows_linears={"slow": slow, "swapped": swapped_linear})
    assert clock.now > 0  # the slow kernel ran inside the timed steps
    assert decoder.linear_kernel == "torch"  # the slow one never wins; a tie goes to torch's own
    assert torch.equal(decoder.generate(prompt, NEW_TOKENS), eager)
    for name, kernel in kernels.items():  # each kernel's tokens, forced
        forced = Decoder(model, 2, PROMPT_LEN + NEW_TOKENS)
        forced._few_rows = kernel
        assert torch.equal(forced.generate(prompt, NEW_TOKENS), eager), name


def test_generation_past_the_context_is_refused():
    _, cfg, model, _ = _model("gpt2-debug")
    prompt = torch.zeros(1, cfg.seq_len - 2, dtype=torch.long)
    with pytest.raises(ValueError, match="beyond the model's context"):
        greedy_generate(model, prompt, 4)


def test_the_training_forward_keeps_no_cache():
    # the cache is an argument of forward_cached alone: the training forward and its autograd are untouched
    family, cfg = family_of("llama3-debug"), get_config("llama3-debug")
    model = family.build(cfg).train()
    logits, _ = model(torch.randint(0, cfg.vocab_size, (2, 8)))
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# --- FLOPs and bytes against hand counts

def test_gpt2_xl_inference_counts():
    family, cfg = family_of("gpt2-xl"), get_config("gpt2-xl")  # 48 layers, h 1600, 25 heads of 64, V 50257
    linears = 48 * 12 * 1600**2  # per layer QKV 3h^2 + out h^2 + MLP 8h^2: 1,474,560,000
    head = 1600 * 50257  # tied output projection, read for the logits: 80,411,200
    assert family.decode_weight_count(cfg, 1) == linears + head == 1_554_971_200
    # K and V, 48 layers, 25 heads x 64 (no GQA), 16-bit: 2 x 48 x 1600 x 2 = 307,200 bytes per token
    assert family.kv_cache_bytes(cfg, 1, 1024, 2) == 2 * 48 * 1024 * 1600 * 2 == 314_572_800
    assert family.kv_cache_bytes(cfg, 8, 1024, 2) == 8 * 314_572_800
    # decode at cache length 1024: 2 per weight, attention 4 x 1024 x 1600 per layer, logits 2 h V
    assert family.decode_step_flops(cfg, 1, 1024) == 2 * linears + 48 * 4 * 1024 * 1600 + 2 * head == 3_424_515_200
    assert family.decode_step_flops(cfg, 4, 1024) == 4 * 3_424_515_200
    # prefill of 128 tokens: per token 2 per weight plus the full 128 x 128 score matrix; logits once
    assert family.prefill_flops(cfg, 1, 128) == 128 * (2 * linears + 48 * 4 * 128 * 1600) + 2 * head \
        == 382_681_347_200
    assert family.decode_step_bytes(cfg, 1, 1024, weight_bytes=2, kv_bytes=2) == 1_554_971_200 * 2 + 314_572_800


def test_llama31_8b_inference_counts():
    family, cfg = family_of("llama3.1-8b"), get_config("llama3.1-8b")
    assert cfg.padded_vocab_size == 128256
    # per layer: q 4096^2, k and v 4096 x 1024 each (8 KV heads of 128), o 4096^2, gate/up/down 4096 x 14336
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert layer == 218_103_808
    head = 4096 * 128256  # untied: the output projection is read, the embedding's B rows are not counted
    assert family.decode_weight_count(cfg, 1) == 32 * layer + head == 7_504_658_432  # + embedding 0.53B = 8.03B
    # GQA: K and V at 8 x 128 wide, 32 layers, bf16: 2 x 32 x 1024 x 2 = 128 KiB per token
    assert family.kv_cache_bytes(cfg, 1, 1, 2) == 131_072
    assert family.kv_cache_bytes(cfg, 1, 2048, 2) == 268_435_456
    # decode at 2048: attention counts every one of the 32 query heads: 4 x 2048 x 32 x 128 per layer
    assert family.decode_step_flops(cfg, 1, 2048) == 2 * 32 * layer + 32 * 4 * 2048 * 4096 + 2 * head \
        == 16_083_058_688
    assert family.prefill_flops(cfg, 2, 512) == 2 * (512 * 32 * (2 * layer + 4 * 512 * 4096) + 2 * head)
    assert family.decode_step_bytes(cfg, 1, 2048, weight_bytes=2, kv_bytes=2) == 7_504_658_432 * 2 + 268_435_456


def test_kv_cache_bytes_match_the_allocated_cache():
    for preset in PRESETS:
        family, cfg = family_of(preset), get_config(preset)
        cache = family.new_kv_cache(cfg, 3, 20, dtype=torch.float32, device="cpu")
        assert cache.nbytes == family.kv_cache_bytes(cfg, 3, 20, 4)


def test_a_moe_decode_step_reads_its_active_experts_at_batch_1_and_more_as_the_batch_grows():
    from accel_kit.models import count_active_params

    family, cfg = family_of("qwen3-30b-a3b"), get_config("qwen3-30b-a3b")
    embedding = cfg.hidden_size * cfg.padded_vocab_size  # gathered B rows, not read whole (untied)
    norms = cfg.n_layers * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size  # not counted as read
    assert family.decode_weight_count(cfg, 1) == count_active_params("qwen3-30b-a3b") - embedding - norms
    counts = [family.decode_weight_count(cfg, b) for b in (1, 8, 64)]
    assert counts[0] < counts[1] < counts[2]
    every_expert = cfg.n_layers * family.layer_weight_count(cfg) + cfg.hidden_size * cfg.padded_vocab_size
    assert abs(family.decode_weight_count(cfg, 10**6) - every_expert) <= cfg.n_layers  # rounding, per layer
