"""Tokens/s of ``accel_kit.data.prepare_text`` against a plain one-document-at-a-time loop.

Both sides read the same JSON Lines corpus (Python's pydoc topics repeated to ``--mb``
megabytes), tokenize with GPT-2, append EOS after each document and write uint16 tokens:

* baseline: a single-process loop calling transformers' ``GPT2TokenizerFast.encode`` on one
  document at a time (the tokenizer built from vocab.json + merges.txt in a temp folder);
* accel-kit: ``prepare_text(..., val_fraction=0)`` (batched encoding on the Rust thread pool,
  plus hashing, atomic write and meta.json).

The outputs are checked to be identical. Each side runs ``--repeats`` times, interleaved; the
best run counts (other processes on a shared machine only ever slow a run down).

    python benchmarks/prepare_throughput.py [--mb 4] [--repeats 3] [--workers N]
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from accel_kit.cli import OneLineParser, at_least, script_main  # noqa: E402
from accel_kit.data import prepare_text  # noqa: E402
from accel_kit.data.corpus import default_text_documents  # noqa: E402
from accel_kit.tokenizers import load_tokenizer  # noqa: E402
from accel_kit.tokenizers.gpt2 import gpt2_files  # noqa: E402


def build_corpus(path: Path, megabytes: float) -> int:
    """Write the pydoc topics, repeated, as JSONL of about ``megabytes`` MB; return documents."""
    documents = [text for _, text in default_text_documents()]
    lines, size = [], 0
    while size < megabytes * 1e6:
        for text in documents:
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            lines.append(line)
            size += len(line.encode("utf-8"))
    path.write_text("".join(lines), encoding="utf-8")
    return len(lines)


def transformers_tokenizer(folder: Path):
    """transformers' GPT2TokenizerFast from the same GPT-2 files accel-kit uses."""
    from transformers import GPT2TokenizerFast

    encoder_json, vocab_bpe = gpt2_files()
    (folder / "vocab.json").write_text(encoder_json.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "merges.txt").write_text(vocab_bpe.read_text(encoding="utf-8"), encoding="utf-8")
    tokenizer = GPT2TokenizerFast.from_pretrained(str(folder))
    assert len(tokenizer) == 50257
    return tokenizer


def baseline(corpus: Path, out: Path, tokenizer) -> int:
    """The plain loop: one document at a time, EOS appended, uint16 file written."""
    eos = tokenizer.eos_token_id
    tokens: list[int] = []
    with open(corpus, encoding="utf-8") as handle:
        for line in handle:
            tokens.extend(tokenizer.encode(json.loads(line)["text"]))
            tokens.append(eos)
    np.array(tokens, dtype=np.uint16).tofile(out)
    return len(tokens)


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=at_least(0, float, above=True), default=4.0, help="corpus size in MB (default 4)")
    parser.add_argument("--repeats", type=at_least(1), default=3, help="runs per side (default 3)")
    parser.add_argument("--workers", type=at_least(1), default=None,
                        help="prepare_text num_workers (default: all cores)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="accel-kit-bench-") as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        n_docs = build_corpus(corpus, args.mb)
        corpus_mb = corpus.stat().st_size / 1e6
        hf = transformers_tokenizer(tmp)
        load_tokenizer("gpt2")  # build once outside the timings, as the baseline's is

        times = {"baseline": [], "accel-kit": []}
        n_tokens = {}
        for repeat in range(args.repeats):
            start = time.perf_counter()
            n_tokens["baseline"] = baseline(corpus, tmp / "baseline.bin", hf)
            times["baseline"].append(time.perf_counter() - start)

            out = tmp / f"prepared-{repeat}"
            start = time.perf_counter()
            meta = prepare_text([corpus], out, val_fraction=0.0, num_workers=args.workers, progress=False)
            times["accel-kit"].append(time.perf_counter() - start)
            n_tokens["accel-kit"] = meta["tokens"]
            identical = (out / "train.bin").read_bytes() == (tmp / "baseline.bin").read_bytes()
            if not identical:
                print("ERROR: prepare_text output differs from the baseline's", file=sys.stderr)
                return 1

    print(f"corpus: {corpus_mb:.1f} MB JSONL, "
          f"{n_docs:,} documents, {n_tokens['baseline']:,} GPT-2 tokens (outputs identical)")
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}; best of {args.repeats}")
    rates = {}
    for name, label in (("baseline", "transformers GPT2TokenizerFast, 1 doc/call loop"),
                        ("accel-kit", f"accel_kit prepare_text (workers={meta['num_workers']})")):
        best, median = min(times[name]), statistics.median(times[name])
        rates[name] = n_tokens[name] / best
        print(f"  {label:52s} {rates[name] / 1e6:6.2f} M tokens/s  (best {best:.2f} s, median {median:.2f} s)")
    print(f"speed-up: {rates['accel-kit'] / rates['baseline']:.2f}x")
    return 0


if __name__ == "__main__":
    script_main(main, Path(__file__).name)
