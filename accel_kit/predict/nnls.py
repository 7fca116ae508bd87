"""A small non-negative least-squares solver on relative error, with subset selection.

Generic: it knows nothing of steps, records or precisions. ``accel_kit.predict.fits`` calls it
with the work of each term per record against the measured step times (seconds per unit of work)
or the memory terms against the measured peaks (multiples of each term).
"""
from __future__ import annotations

import itertools

import numpy as np


def nnls_relative(work: np.ndarray, target: np.ndarray, *, penalty: float) -> tuple[np.ndarray, float]:
    """Non-negative coefficients minimising the relative error of ``work @ coefs`` against ``target``.

    ``work`` is one row per observation and one column per term; ``target`` the measured value
    of each row. Exhaustive over the subsets of terms (2^k - 1 least-squares solves, so for the
    handful of terms a model has): each extra term must lower the relative RMS error by more
    than ``penalty`` times the best error found (at least 1e-3), else the smaller subset wins.
    Exact and dependency-free. Returns (the coefficient of each term, zero where left out;
    the relative RMS error). Raises ValueError when no subset has a non-negative solution.
    """
    n, k = work.shape
    A = work / target[:, None]  # rows scaled so the residual is relative
    scale = np.where(A.max(axis=0) > 0, A.max(axis=0), 1.0)
    A = A / scale
    ones = np.ones(n)
    best: list[tuple[float, int, np.ndarray]] = []
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
            best.append((rms, size, coefs))
    if not best:
        raise ValueError("no non-negative fit exists for these records")
    floor = min(b[0] for b in best)
    # Each extra term must pay for itself: penalised error, then fewer terms.
    rms, _, coefs = min(best, key=lambda b: (b[0] + penalty * b[1] * max(floor, 1e-3), b[1]))
    return coefs / scale, rms
