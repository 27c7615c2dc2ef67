"""The probability scoring's recalibration: the fit and the map."""

import random

import pytest

from offline_eval.comparison.calibration import Calibration, fit, logit, sigmoid


def _rows(slope: float, shift: float, n: int, seed: int = 0):
    """Scores with labels drawn from P(positive | p) = sigmoid(slope * logit(p) + shift)."""
    rng = random.Random(seed)
    scores = [rng.uniform(0.02, 0.98) for _ in range(n)]
    labels = [rng.random() < sigmoid(slope * logit(p) + shift) for p in scores]
    return scores, labels


def test_the_fit_recovers_the_map_that_made_the_labels():
    scores, labels = _rows(2.0, 1.0, 4000)
    both = fit(scores, labels, slope=None)
    assert both.slope == pytest.approx(2.0, abs=0.2) and both.shift == pytest.approx(1.0, abs=0.15)
    shift_only = fit(*_rows(1.0, -0.8, 4000))
    assert shift_only.slope == 1.0 and shift_only.shift == pytest.approx(-0.8, abs=0.15)


def test_a_shift_moves_where_half_falls_and_keeps_the_order():
    c = Calibration(shift=0.5)
    assert c(c.threshold()) == pytest.approx(0.5)
    assert c.threshold() < 0.5  # a positive shift: scores a little under 0.5 read as supported
    raw = [0.0, 0.1, 0.35, 0.5, 0.9, 1.0]
    mapped = [c(p) for p in raw]
    assert mapped == sorted(mapped) and all(0 < m < 1 for m in mapped)
    assert c(None) is None
    assert Calibration()(0.3) == pytest.approx(0.3)


def test_labels_the_score_separates_perfectly_give_a_finite_fit():
    c = fit([0.1, 0.2, 0.3, 0.7, 0.8, 0.9], [False, False, False, True, True, True], slope=None)
    assert 0 < c.slope < 100 and abs(c.shift) < 100 and 0.3 < c.threshold() < 0.7

