"""Seedable synthetic genomes shaped like SARS-CoV-2, for GenSLM runs without real data.

Each file holds ``n_records`` variants of one ancestral genome (GenSLM pre-trains on ~1.5M
closely related SARS-CoV-2 genomes). The ancestor, ~29.9 kb, is laid out like the virus:

* a 5' untranslated region (~265 nt, AT-rich, like the real genome's ~64% A+T);
* open reading frames: ``ATG``, sense codons drawn from a skewed codon-usage table, and a
  stop codon (``TAA`` / ``TAG`` / ``TGA``); the first ORF covers ~2/3 of the genome (like
  ORF1ab), the rest are shorter (40..1300 codons, like S, M, N ...), separated by short
  non-coding stretches (5..120 nt) so they fall in all three reading frames;
* a 3' untranslated region filling the genome to exactly ``length_nt``.

Variants carry independent point substitutions (``mutation_rate`` per nucleotide). The codon
usage table is fixed (the same "organism" for every seed); the seed controls the ancestor and
the mutations. The codon entropy of the frame-0 tokenization is about 3.5-3.9 nats (seed-dependent), well
below the ln 64 = 4.16 of uniform codons, so a language model has something to learn.

Deterministic: the same ``(n_records, seed, length_nt, mutation_rate)`` gives the same bytes,
and record ``i`` does not depend on ``n_records``.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from accel_kit.atomic import atomic_path
from accel_kit.errors import ParameterError
from accel_kit.tokenizers.codon import CODONS

STOP_CODONS = ("TAA", "TAG", "TGA")
SENSE_CODONS = tuple(codon for codon in CODONS if codon not in STOP_CODONS)
#: Stop codon frequencies (TAA is the most used stop in SARS-CoV-2 and most genomes).
STOP_WEIGHTS = (0.5, 0.2, 0.3)
#: Nucleotide frequencies of non-coding stretches (A, C, G, T): AT-rich.
NONCODING_BASE_P = (0.30, 0.18, 0.18, 0.34)
LINE_WIDTH = 70
_USAGE_SEED = 2310_04607  # fixed: the codon usage table is the same for every seed


def codon_usage() -> np.ndarray:
    """The fixed skewed usage table over :data:`SENSE_CODONS` (probabilities, sum 1).

    A Dirichlet(0.5) draw: a few codons are common and many are rare, as in real genomes.
    """
    rng = np.random.default_rng(_USAGE_SEED)
    return rng.dirichlet(np.full(len(SENSE_CODONS), 0.5))


def _as_array(codons: tuple[str, ...]) -> np.ndarray:
    return np.frombuffer("".join(codons).encode("ascii"), dtype=np.uint8).reshape(-1, 3)


def _noncoding(rng: np.random.Generator, n_nt: int) -> np.ndarray:
    return np.frombuffer(b"ACGT", dtype=np.uint8)[rng.choice(4, size=n_nt, p=NONCODING_BASE_P)]


def _orf(rng: np.random.Generator, n_codons: int, usage: np.ndarray) -> np.ndarray:
    """ATG + (n_codons - 2) sense codons + a stop codon, as nucleotide bytes."""
    sense = _as_array(SENSE_CODONS)[rng.choice(len(SENSE_CODONS), size=max(n_codons - 2, 0), p=usage)]
    stop = _as_array(STOP_CODONS)[rng.choice(3, p=STOP_WEIGHTS)]
    return np.concatenate((np.frombuffer(b"ATG", dtype=np.uint8), sense.ravel(), stop))


def ancestral_genome(rng: np.random.Generator, length_nt: int) -> np.ndarray:
    """One synthetic genome of exactly ``length_nt`` nucleotides (uint8 ASCII array)."""
    usage = codon_usage()
    utr3 = int(rng.integers(200, 260))
    parts = [_noncoding(rng, int(rng.integers(240, 290)))]
    used = len(parts[0])
    first = True
    while True:
        n_codons = int(0.66 * length_nt / 3) if first else int(rng.integers(40, 1300))
        gap = 0 if first else int(rng.integers(5, 121))
        if used + gap + 3 * n_codons + utr3 > length_nt:
            break
        if gap:
            parts.append(_noncoding(rng, gap))
        parts.append(_orf(rng, n_codons, usage))
        used += gap + 3 * n_codons
        first = False
    parts.append(_noncoding(rng, max(length_nt - used, 0)))
    return np.concatenate(parts)[:length_nt]


def _mutate(rng: np.random.Generator, genome: np.ndarray, rate: float) -> np.ndarray:
    """A copy with point substitutions: each site mutates with probability ``rate``."""
    variant = genome.copy()
    sites = np.flatnonzero(rng.random(len(genome)) < rate)
    bases = np.frombuffer(b"ACGT", dtype=np.uint8)
    # Shift by 1..3 within ACGT so the new base always differs from the old one.
    old = np.searchsorted(bases, variant[sites])
    variant[sites] = bases[(old + rng.integers(1, 4, size=len(sites))) % 4]
    return variant


def synthetic_genomes(path: str | os.PathLike, n_records: int, seed: int = 0, length_nt: int = 29_903,
                      mutation_rate: float = 0.002) -> Path:
    """Write a FASTA file of synthetic SARS-CoV-2-like genomes (see the module docstring).

    Args:
        path: output file (``.gz`` suffix: gzip-compressed); written atomically.
        n_records: number of genomes (>= 1).
        seed: controls the ancestor and the mutations.
        length_nt: nucleotides per genome (SARS-CoV-2: 29,903; at least 600).
        mutation_rate: substitution probability per nucleotide of each variant.

    Returns:
        The path written.
    """
    if n_records < 1:
        raise ParameterError(f"n_records must be >= 1, got {n_records}")
    if length_nt < 600:
        raise ParameterError(f"length_nt must be >= 600, got {length_nt}")
    path = Path(path)
    children = np.random.SeedSequence(seed).spawn(n_records + 1)
    ancestor = ancestral_genome(np.random.default_rng(children[0]), length_nt)
    with atomic_path(path) as partial, open(partial, "wb") as raw, \
            (gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)  # byte-identical .gz
             if path.name.endswith(".gz") else raw) as handle:
        for index in range(n_records):
            genome = _mutate(np.random.default_rng(children[index + 1]), ancestor, mutation_rate)
            handle.write(f">synthetic-{seed}-{index:06d} length={length_nt}\n".encode())
            text = genome.tobytes()
            handle.write(b"\n".join(text[i:i + LINE_WIDTH] for i in range(0, len(text), LINE_WIDTH)))
            handle.write(b"\n")
    return path
