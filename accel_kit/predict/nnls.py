"""A small non-negative least-squares solver on relative error, with subset selection.

Generic: it knows nothing of steps, records or precisions. ``accel_kit.predict.fits`` calls it
with the work of each term per record against the measured step times (seconds per unit of work)
or the memory terms against the measured peaks (multiples of each term).
"""
from __future__ import annotations

import itertools

import numpy as np

# Two subsets whose penalised errors differ by less than this (a relative RMS error, so dimensionless)
# are a tie. With exact records several subsets fit to rounding (1e-16 here, 1e-13 there, by which
# BLAS kernels the CPU has); 1e-9 is far above that and far below any difference a measurement shows.
TIE_TOLERANCE = 1e-9


def nnls_relative(work: np.ndarray, target: np.ndarray, *, penalty: float) -> tuple[np.ndarray, float]:
    """Non-negative coefficients minimising the relative error of ``work @ coefs`` against ``target``.

    ``work`` is one row per observation and one column per term; ``target`` the measured value
    of each row. Exhaustive over the subsets of terms (2^k - 1 least-squares solves, so for the
    handful of terms a model has), each with a non-negative solution scored as

        score = relative RMS error + penalty x (number of terms) x max(best RMS error, 1e-3),

    so each extra term must lower the error by more than ``penalty`` times the best error found.
    The lowest score wins; scores within ``TIE_TOLERANCE`` of it tie, and a tie goes to the fewest
    terms, then to the subset that comes first in column order (the caller lists its terms from the
    most to the least fundamental). The choice therefore never rests on the last bits LAPACK returns,
    which differ between CPU kinds. Exact and dependency-free. Returns (the coefficient of each term,
    zero where left out; the relative RMS error). Raises ValueError when no subset has a non-negative
    solution.
    """
    n, k = work.shape
    A = work / target[:, None]  # rows scaled so the residual is relative
    scale = np.where(A.max(axis=0) > 0, A.max(axis=0), 1.0)
    A = A / scale
    ones = np.ones(n)
    fits: list[tuple[float, tuple[int, ...], np.ndarray]] = []
    for size in range(1, min(k, n) + 1):
        for subset in itertools.combinations(range(k), size):
            cols = list(subset)
            if not np.any(A[:, cols]):
                continue
            coef, *_ = np.linalg.lstsq(A[:, cols], ones, rcond=None)
            if np.any(coef < 0):
                continue
            coefs = np.zeros(k)
            coefs[cols] = coef
            rms = float(np.sqrt(np.mean((A @ coefs - 1) ** 2)))
            fits.append((rms, subset, coefs))
    if not fits:
        raise ValueError("no non-negative fit exists for these records")
    unit = penalty * max(min(f[0] for f in fits), 1e-3)
    scores = [rms + unit * len(subset) for rms, subset, _ in fits]
    lowest = min(scores)
    tied = [f for f, s in zip(fits, scores) if s <= lowest + TIE_TOLERANCE]
    rms, _, coefs = min(tied, key=lambda f: (len(f[1]), f[1]))
    return coefs / scale, rms
