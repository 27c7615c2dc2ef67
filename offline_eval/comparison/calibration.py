"""A judge's recalibration of its probability scores: a monotone map fit on human labels.

A small judge's probabilities rank well but sit on its own scale: the default judge is rarely sure that a
response is *fully* grounded, so supported responses score 0.3-0.6 and 0.5 is not a coin toss. A calibration
maps a metric's probability score p to sigmoid(slope * logit(p) + shift), fit by logistic regression on
labelled rows. scripts/judge_accuracy.py (--suite sets) fits one on the tuned-on set and measures the cut it
implies on the others; no run applies one to its scores yet, because that measurement does not yet justify it
(README, "How well the default judge agrees with people"). A monotone map never changes a ranking (ROC-AUC),
only where 0.5 falls and how far a score is from a rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

_EPS = 1e-4  # probabilities are clipped to [eps, 1 - eps] so that 0 and 1 have finite log-odds


def logit(p: float) -> float:
    p = min(max(p, _EPS), 1 - _EPS)
    return math.log(p / (1 - p))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


@dataclass(frozen=True)
class Calibration:
    slope: float = 1.0
    shift: float = 0.0

    def __call__(self, p: Optional[float]) -> Optional[float]:
        return None if p is None else sigmoid(self.slope * logit(p) + self.shift)

    def threshold(self) -> float:
        """The raw score that maps to 0.5."""
        return sigmoid(-self.shift / self.slope)


def fit(scores: Sequence[float], labels: Sequence[bool], slope: Optional[float] = 1.0,
        prior: float = 1.0) -> Calibration:
    """Logistic regression of the labels on logit(score): the shift alone with `slope` fixed (default 1: few
    labelled rows move where 0.5 falls without making the scores steeper), or both with slope=None. A weak
    Gaussian prior (`prior`, in rows' worth of weight) pulls toward the identity, so that labels a score
    separates perfectly give a finite fit. Newton's method from the identity."""
    xs = [logit(s) for s in scores]
    ys = [1.0 if y else 0.0 for y in labels]
    a, b = (1.0 if slope is None else slope), 0.0
    for _ in range(100):
        ps = [sigmoid(a * x + b) for x in xs]
        w = [p * (1 - p) for p in ps]
        gb = sum(p - y for p, y in zip(ps, ys)) + prior * b
        hbb = sum(w) + prior
        if slope is not None:
            step_a, step_b = 0.0, gb / hbb
        else:
            ga = sum((p - y) * x for p, y, x in zip(ps, ys, xs)) + prior * (a - 1)
            haa = sum(wi * x * x for wi, x in zip(w, xs)) + prior
            hab = sum(wi * x for wi, x in zip(w, xs))
            det = haa * hbb - hab * hab
            step_a, step_b = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a - step_a, b - step_b
        if abs(step_a) + abs(step_b) < 1e-9:
            break
    return Calibration(round(a, 4), round(b, 4))

