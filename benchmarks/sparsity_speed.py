"""Sparse against dense matmul at GPT-2 XL MLP shapes: where (if anywhere) sparsity pays on this device.

The weight-sparsity study uses a sparse kernel only where it beats the dense matmul
(``accel_kit.sparsity``, ``sparse_kernels: auto``). This benchmark shows where that is, side
by side in one run, through the study's own kernels: for each MLP layer of GPT-2 XL
(c_fc: weight (6400, 1600); c_proj: weight (1600, 6400)) with X of (4096 tokens, in), at
each sparsity, in each dtype:

- ``dense``: ``F.linear`` on the masked weight (zeros multiplied), the fallback;
- ``csr fwd``: the forward product alone, Y^T = W_csr X^T (torch.sparse; MKL on CPU);
- ``csr fwd+bwd``: the training path (forward, input gradient through W^T in CSR, weight
  gradient only at kept positions), against the dense layer's forward+backward.

dtypes without a sparse kernel (bf16 on CPU: MKL's CSR products are fp32/fp64 only) are
reported as such, and their dense times are still shown, because a sparse fp32 product must
beat the *fastest* dense option to be worth anything. Ends with the crossover: the lowest
sparsity at which CSR beats dense, per layer and dtype.

    python benchmarks/sparsity_speed.py [--sparsities 0.6,0.8,0.9,0.95,0.99] [--tokens 4096] [--trials 3]
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from accel_kit.cli import OneLineParser, at_least, script_main
from accel_kit.devices import ADAPTERS, get_adapter
from accel_kit.errors import UnavailableError
from accel_kit.sparsity import CSRKernel, KernelLinear, magnitude_mask
from accel_kit.timing import measure

SHAPES = {"mlp.c_fc (6400x1600)": (6400, 1600), "mlp.c_proj (1600x6400)": (1600, 6400)}  # (out, in)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _best_ms(fn, adapter, trials: int) -> float:
    return 1e3 * measure(fn, adapter.synchronize, warmup=1, trials=trials).min_s


def _bench(shape, sparsity, dtype, tokens, adapter, trials) -> dict:
    device = adapter.torch_device()
    out_f, in_f = shape
    torch.manual_seed(0)
    dense = nn.Linear(in_f, out_f, bias=False, device=device, dtype=dtype)
    mask = magnitude_mask(dense.weight, sparsity)
    with torch.no_grad():
        dense.weight.mul_(mask)
    x = torch.randn(tokens, in_f, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(tokens, out_f, device=device, dtype=dtype)
    row = {"dense fwd": _best_ms(lambda: F.linear(x, dense.weight), adapter, trials),
           "dense fwd+bwd": _best_ms(lambda: torch.autograd.grad(dense(x), [x, dense.weight], g), adapter, trials)}
    try:
        kernel = CSRKernel(mask, dtype)
        sparse = KernelLinear(dense, kernel)
        ops = kernel.operands(dense.weight, dtype)
        x2 = x.detach()
        row["csr fwd"] = _best_ms(lambda: kernel.forward(ops, x2), adapter, trials)

        def train_step() -> None:
            kernel.invalidate()  # the sparse operands are rebuilt once per optimizer step: count it
            torch.autograd.grad(sparse(x), [x, dense.weight], g)
        row["csr fwd+bwd"] = _best_ms(train_step, adapter, trials)
    except (RuntimeError, NotImplementedError) as exc:
        row["csr"] = f"no kernel: {str(exc).splitlines()[0][:70]}"
    return row


def _sparsities(text: str) -> list[float]:
    """Comma-separated fractions in [0, 1), for argparse."""
    try:
        values = [float(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers in [0, 1), got {text!r}") from None
    bad = [v for v in values if not 0 <= v < 1]  # NaN included
    if bad:
        raise argparse.ArgumentTypeError(f"each sparsity must be in [0, 1), got {bad[0]}")
    return values


def _dtypes(text: str) -> list[str]:
    """Comma-separated names of ``DTYPES``, for argparse."""
    names = text.split(",")
    bad = [n for n in names if n not in DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype {bad[0]!r}; known: {', '.join(DTYPES)}")
    return names


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sparsities", type=_sparsities, default="0.6,0.8,0.9,0.95,0.99")
    ap.add_argument("--tokens", type=at_least(1), default=4096, help="rows of X (micro-batch x sequence)")
    ap.add_argument("--dtypes", type=_dtypes, default="fp32,bf16")
    ap.add_argument("--trials", type=at_least(1), default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=sorted(ADAPTERS),
                    help="device adapter (accel_kit.devices)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
    adapter = get_adapter(args.device)
    status = adapter.availability()
    if not status:  # before any tensor is made on a device that is not here
        raise UnavailableError(f"device adapter {args.device!r} is not available here: {status.reason}")
    sparsities = args.sparsities
    print(f"torch {torch.__version__}, {adapter.name}, {torch.get_num_threads()} threads, X ({args.tokens}, in); "
          f"best of {args.trials} (ms)")
    print(f"{'layer':24s} {'dtype':5s} {'sparsity':>8s} {'dense fwd':>10s} {'csr fwd':>10s} {'fwd x':>6s} "
          f"{'dense f+b':>10s} {'csr f+b':>10s} {'f+b x':>6s}")
    crossover: dict[tuple[str, str], dict[str, float | None]] = {}
    fastest_dense: dict[str, float] = {}
    for name, shape in SHAPES.items():
        for dname in args.dtypes:
            key = (name, dname)
            crossover[key] = {"fwd": None, "fwd+bwd": None}
            for s in sparsities:
                r = _bench(shape, s, DTYPES[dname], args.tokens, adapter, args.trials)
                fastest_dense[name] = min(fastest_dense.get(name, float("inf")), r["dense fwd+bwd"])
                if "csr" in r:
                    print(f"{name:24s} {dname:5s} {s:8.2f} {r['dense fwd']:10.1f} {'-':>10s} {'':6s} "
                          f"{r['dense fwd+bwd']:10.1f}  {r['csr']}")
                    continue
                fwd_x, fb_x = r["dense fwd"] / r["csr fwd"], r["dense fwd+bwd"] / r["csr fwd+bwd"]
                print(f"{name:24s} {dname:5s} {s:8.2f} {r['dense fwd']:10.1f} {r['csr fwd']:10.1f} {fwd_x:6.2f} "
                      f"{r['dense fwd+bwd']:10.1f} {r['csr fwd+bwd']:10.1f} {fb_x:6.2f}")
                r["fb_ms"] = r["csr fwd+bwd"]
                for what, ratio in (("fwd", fwd_x), ("fwd+bwd", fb_x)):
                    if ratio > 1 and crossover[key][what] is None:
                        crossover[key][what] = s
                crossover[key].setdefault("best_fb_ms", r["fb_ms"])
                crossover[key]["best_fb_ms"] = min(crossover[key]["best_fb_ms"], r["fb_ms"])
    print("\ncrossover (lowest sparsity at which CSR beats dense in the same dtype):")
    for (name, dname), c in crossover.items():
        if "best_fb_ms" not in c:
            print(f"  {name} {dname}: no sparse kernel on {adapter.name}")
            continue
        fmt = lambda v: f"s >= {v:g}" if v is not None else f"not up to s = {sparsities[-1]:g}"
        vs_fastest = c["best_fb_ms"] / fastest_dense[name]
        print(f"  {name} {dname}: forward {fmt(c['fwd'])}; training step (fwd+bwd) {fmt(c['fwd+bwd'])}; "
              f"its best fwd+bwd is {vs_fastest:.1f}x the fastest dense dtype's time")


if __name__ == "__main__":
    script_main(main, Path(__file__).name)
