"""The ``accel-kit prepare`` commands (hooked into the main CLI by ``add_prepare_parser``).

    accel-kit prepare text [INPUT ...] --out DIR [--tokenizer gpt2|FILE] [--workers N] [--val-fraction F]
    accel-kit prepare fasta INPUT ... --out DIR [--tokenizer codon-71] [--block-size N] [--val-fraction F]
    accel-kit prepare synthetic-genome --out FILE [--records N] [--seed S] [--length-nt L]

``prepare text`` without inputs prepares the embedded default corpus (Python's pydoc topics).
Its ``--tokenizer FILE`` is a ``tokenizer.json`` or a tiktoken file (Llama 3's ``tokenizer.model``)
the user brings (see :mod:`accel_kit.tokenizers.files`).
Each sub-command sets ``func(args) -> int``; errors are raised as ``AccelKitError`` for the
main CLI to print.
"""
from __future__ import annotations

import argparse

from accel_kit.json_types import JSONObject


def _number(text: str, kind: type) -> float | int:
    # argparse would name the type function in its message ("invalid _fraction value"); say what is wanted.
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None


def _fraction(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def _text_tokenizer(value: str) -> str:
    """gpt2 or a file's path (checked when loaded, with the file's own message); the codon ones are
    refused here, as argparse's choices did before files were accepted."""
    from accel_kit.tokenizers import TOKENIZER_NAMES

    if value in TOKENIZER_NAMES and value != "gpt2":
        raise argparse.ArgumentTypeError(f"{value} is a genome tokenizer (prepare fasta); text takes gpt2 "
                                         f"or the path of a tokenizer.json or tiktoken file")
    return value


def _output_folder(out: str) -> None:
    """Fail in one line, before any input is read, when ``--out`` cannot be written: the prepared
    folder is built beside it and renamed onto it, so its parent folder must take files."""
    from pathlib import Path

    from accel_kit.paths import writable_dir

    writable_dir(Path(out).absolute().parent, f"--out {out!r}: its folder")


def _summary(meta: JSONObject, out: str) -> str:
    splits = meta["splits"]
    unit = "records" if meta["kind"] == "fasta" else "documents"
    status = "reused" if meta.get("reused") else "wrote"
    return (f"{status} {out}: {meta['tokenizer']} ({meta['dtype']}, {meta['layout']}), "
            f"train {splits['train']['tokens']:,} tokens / {splits['train']['documents']:,} {unit}, "
            f"val {splits['val']['tokens']:,} tokens / {splits['val']['documents']:,} {unit}")


def _cmd_text(args: argparse.Namespace) -> int:
    from accel_kit.data import prepare_default_text, prepare_text

    _output_folder(args.out)
    options = dict(tokenizer=args.tokenizer, val_fraction=args.val_fraction,
                   num_workers=args.workers, progress=not args.quiet)
    if args.inputs:
        meta = prepare_text(args.inputs, args.out, **options)
    else:
        meta = prepare_default_text(args.out, **options)
    print(_summary(meta, args.out))
    return 0


def _cmd_fasta(args: argparse.Namespace) -> int:
    from accel_kit.data import prepare_fasta

    _output_folder(args.out)
    meta = prepare_fasta(args.inputs, args.out, tokenizer=args.tokenizer, block_size=args.block_size,
                         val_fraction=args.val_fraction, progress=not args.quiet)
    line = _summary(meta, args.out)
    if meta.get("truncated_records"):
        line += f"; {meta['truncated_records']:,} records truncated to block_size {meta['block_size']}"
    print(line)
    return 0


def _cmd_synthetic_genome(args: argparse.Namespace) -> int:
    from accel_kit.data import synthetic_genomes
    from accel_kit.paths import writable_file

    writable_file(args.out, "output FASTA (--out)")
    path = synthetic_genomes(args.out, n_records=args.records, seed=args.seed, length_nt=args.length_nt)
    print(f"wrote {path}: {args.records} synthetic genomes of {args.length_nt:,} nt (seed {args.seed})")
    return 0


def add_prepare_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``prepare {text,fasta,synthetic-genome}`` to the main CLI's subparsers.

    Args:
        subparsers: the object returned by ``parser.add_subparsers()``.

    Returns:
        The ``prepare`` parser.
    """
    from accel_kit.tokenizers import TOKENIZER_NAMES

    prepare = subparsers.add_parser("prepare", help="tokenize a corpus or genomes into train/val .bin files")
    sub = prepare.add_subparsers(dest="prepare_command", required=True, metavar="{text,fasta,synthetic-genome}")

    text = sub.add_parser("text", help="tokenize text (JSONL, txt, datasets folder; default: embedded corpus)")
    text.add_argument("inputs", nargs="*", metavar="INPUT",
                      help=".jsonl[.gz] / .txt[.gz] files or folders, or a datasets save_to_disk folder "
                           "(none: the embedded pydoc corpus)")
    text.add_argument("--out", required=True, metavar="DIR", help="output folder")
    text.add_argument("--tokenizer", default="gpt2", type=_text_tokenizer, metavar="gpt2|FILE",
                      help="gpt2 (default), or a tokenizer file you bring: a Hugging Face tokenizer.json, or a "
                           "tiktoken BPE file such as Llama 3's tokenizer.model (needs pip install tiktoken)")
    text.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                      help="tokenizer threads (default: all cores; 1: single-threaded)")
    text.add_argument("--val-fraction", type=_fraction, default=0.0005, metavar="F",
                      help="fraction of documents held out for validation (default: 0.0005)")
    text.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    text.set_defaults(func=_cmd_text)

    fasta = sub.add_parser("fasta", help="tokenize FASTA genomes into codons (GenSLM)")
    fasta.add_argument("inputs", nargs="+", metavar="INPUT", help="FASTA files (.fasta/.fa/.fna[.gz]) or folders")
    fasta.add_argument("--out", required=True, metavar="DIR", help="output folder")
    fasta.add_argument("--tokenizer", default="codon-71", choices=[n for n in TOKENIZER_NAMES if n.startswith("codon")])
    fasta.add_argument("--block-size", type=_positive_int, default=None, metavar="N",
                       help="fixed rows of N tokens per record, padded/truncated (GenSLM: 2048); "
                            "default: one stream with EOS between records")
    fasta.add_argument("--val-fraction", type=_fraction, default=0.0005, metavar="F",
                       help="fraction of records held out for validation (default: 0.0005)")
    fasta.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    fasta.set_defaults(func=_cmd_fasta)

    genome = sub.add_parser("synthetic-genome", help="write a FASTA of synthetic SARS-CoV-2-like genomes")
    genome.add_argument("--out", required=True, metavar="FILE", help="output FASTA (.fasta, or .fasta.gz)")
    genome.add_argument("--records", type=_positive_int, default=100, metavar="N", help="genomes (default: 100)")
    genome.add_argument("--seed", type=_non_negative_int, default=0, metavar="S", help="random seed (default: 0)")
    genome.add_argument("--length-nt", type=int, default=29_903, metavar="L",
                        help="nucleotides per genome (default: 29903, like SARS-CoV-2)")
    genome.set_defaults(func=_cmd_synthetic_genome)
    return prepare
