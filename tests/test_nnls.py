"""The predictor's subset-selecting solver chooses its terms by a fixed rule, not by rounding."""
import numpy as np
import pytest

from accel_kit.predict.nnls import nnls_relative


def _tied_case():
    """Four observations of six terms whose true rates use terms 0, 1 and 2; term 3 is 0 plus 1 and
    term 4 is 0 plus 2 over these rows, so several three-term subsets fit the targets exactly
    (to rounding), as the predictor's records of one model do."""
    rng = np.random.default_rng(0)
    base = rng.uniform(1.0, 3.0, size=(4, 3))
    work = np.column_stack([base, base[:, 0] + base[:, 1], base[:, 0] + base[:, 2], rng.uniform(1.0, 3.0, 4)])
    target = base @ np.array([2.0, 1.0, 0.5])
    return work, target


def test_several_subsets_tie_and_the_fixed_rule_picks_the_same_terms_under_tiny_perturbations():
    work, target = _tied_case()
    # the tie is real: at least two three-term subsets fit exactly
    exact = 0
    for cols in ([0, 1, 2], [0, 3, 2], [0, 1, 2], [1, 3, 2]):
        coef, *_ = np.linalg.lstsq(work[:, cols] / target[:, None], np.ones(4), rcond=None)
        exact += bool((coef >= 0).all() and np.allclose(work[:, cols] @ coef, target, rtol=1e-12))
    assert exact >= 3
    coefs, rms = nnls_relative(work, target, penalty=0.03)
    assert rms < 1e-12 and list(np.flatnonzero(coefs)) == [0, 1, 2]  # fewest terms, then column order
    assert coefs[[0, 1, 2]] == pytest.approx([2.0, 1.0, 0.5], rel=1e-9)
    rng = np.random.default_rng(1)
    for _ in range(20):
        noisy_work = work * (1 + 1e-12 * rng.standard_normal(work.shape))
        noisy_target = target * (1 + 1e-12 * rng.standard_normal(target.shape))
        chosen, _ = nnls_relative(noisy_work, noisy_target, penalty=0.03)
        assert list(np.flatnonzero(chosen)) == [0, 1, 2]


def test_an_extra_term_must_pay_for_itself_and_no_fit_is_refused():
    work, target = _tied_case()
    noisy = target * np.array([1.0, 1.001, 0.999, 1.0])  # 0.1 % noise: no subset is exact
    coefs, rms = nnls_relative(work, noisy, penalty=0.03)
    assert 0 < rms < 2e-3 and np.count_nonzero(coefs) <= 3
    with pytest.raises(ValueError, match="no non-negative fit"):
        nnls_relative(np.array([[1.0], [2.0]]), np.array([-1.0, -2.0]), penalty=0.03)
