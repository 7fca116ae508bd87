"""Serving on a CPU: vLLM's CPU server against ``transformers serve``, same model, same load, side by side.

Both engines serve one model folder (a tiny Llama-shaped ``hf:`` config by default: vLLM's CPU attention has
kernels for head widths 32, 64, 80, ... only, so our 16-wide debug presets cannot run there) under the same
load (fixed concurrency, the same seeded prompts), through the serve kind's own path
(``accel_kit.engine.serve_measure.measure_points``). Prints, per engine, output tokens/s and p99 TPOT (with
p50 TTFT), and the point's overhead outside the timed requests: the server's start to a healthy ``/health``
and the warm-up request. Where vLLM cannot run (its environment not built, ``make vllm``; this CPU without
AVX2/AVX-512; the model's head width), its side prints the reason and transformers' side still runs.

    python benchmarks/serve_cpu.py                          # concurrency 1 and 4, 8 requests, 64 in / 32 out
    python benchmarks/serve_cpu.py --concurrency 1 4 16 --requests 16 --preset gpt2-small
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout

from accel_kit.engine import serve_measure as SM  # noqa: E402
from accel_kit.serving import server as S  # noqa: E402


def tiny_llama(folder: Path, hidden: int = 256, layers: int = 4) -> str:
    """An ``hf:`` Llama config with 64-wide heads (a kernel vLLM's CPU attention has), a 4096-id vocabulary."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, head_dim=64, vocab_size=4096,
                max_position_embeddings=512, tie_word_embeddings=True).save_pretrained(folder)
    return f"hf:{folder / 'config.json'}"


class _CPU:
    """The CPU adapter's answer for a serve point (none), so the kind's own vLLM check speaks."""

    def unsupported(self, kind, point):
        return None

    def torch_device(self, index=0):
        import torch

        return torch.device("cpu")


def _row(engine: str, concurrency: int, m: dict) -> str:
    return (f"{engine:13s} {concurrency:5d} {m['serve_output_tokens_per_s']:10.1f} {1e3 * m['serve_tpot_p99_s']:10.1f}"
            f" {1e3 * m['serve_ttft_p50_s']:10.1f} {m['goodput_requests_per_s']:9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=None, help="a preset or hf: config (default: a tiny Llama, 64-wide heads)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--engines", nargs="+", default=["vllm", "transformers"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="serve-cpu-") as scratch:
        preset = args.preset or tiny_llama(Path(scratch) / "config")
        print(f"model {preset if args.preset else 'tiny Llama (hf:, 4 layers, width 256, heads of 64)'}; "
              f"{args.requests} requests, {args.prompt_tokens} in / {args.output_tokens} out tokens, fp32")
        print(f"{'engine':13s} {'conc.':>5s} {'out tok/s':>10s} {'p99 TPOT':>10s} {'p50 TTFT':>10s} {'goodput':>9s}"
              f"   (ms; goodput: requests/s within TTFT 2 s, TPOT 100 ms)")
        overheads = []
        for engine in args.engines:
            points = [SM.ServePoint(system="cpu", precision="fp32", preset=preset, engine=engine, concurrency=c,
                                    n_requests=args.requests, prompt_tokens=args.prompt_tokens,
                                    output_tokens=args.output_tokens, start_timeout_s=600, request_timeout_s=300)
                      for c in args.concurrency]
            try:
                S.check_engine(engine)
                reason = SM.unsupported_serve(_CPU(), points[0])
            except Exception as e:  # noqa: BLE001 - a missing engine is a line of the table, not the end of it
                reason = str(e)
            if reason:
                print(f"{engine:13s} not run: {reason}")
                continue
            for point, result in zip(points, SM.measure_points(points, Path(scratch) / engine, deadline_s=1200)):
                if result.status != "ok":
                    print(f"{engine:13s} {point.concurrency:5d} {result.status}: {result.reason}")
                    continue
                print(_row(engine, point.concurrency, result.metrics))
                if result.metrics.get("serve_server_start_s"):
                    overheads.append((engine, result.metrics["serve_server_start_s"], result.metrics["serve_warmup_s"]))
        for engine, start_s, warm_s in overheads:
            print(f"overhead outside the timed requests, {engine}: server start {start_s:.1f} s, warm-up {warm_s:.2f} s")


if __name__ == "__main__":
    main()
