"""Agreement statistics between judge scores and human labels, with bootstrap confidence intervals.

Plain numpy (no scipy): ROC-AUC and its curve, accuracy, balanced accuracy, Cohen's kappa, Spearman and
Kendall (tau-b) correlations, the threshold that maximises balanced accuracy on a calibration split, and
percentile bootstrap intervals. A prediction is `score >= threshold`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

NAN = float("nan")


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values share their average rank."""
    return pd.Series(np.asarray(x, dtype=float)).rank(method="average").to_numpy()


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """ROC-AUC via the rank-sum (Mann-Whitney U) formula; ties count one half. NaN without both classes."""
    scores = np.asarray(scores, dtype=float)
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return NAN
    ranks = average_ranks(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def roc_curve(scores: Sequence[float], positive: Sequence[bool]) -> list[tuple[float, float]]:
    """(false positive rate, true positive rate) at every distinct threshold, from (0, 0) to (1, 1)."""
    scores = np.asarray(scores, dtype=float)
    positive = np.asarray(positive, dtype=bool)
    if positive.all() or not positive.any():
        return []
    points = [(0.0, 0.0)]
    for t in np.unique(scores)[::-1]:
        pred = scores >= t
        points.append((float(pred[~positive].mean()), float(pred[positive].mean())))
    return points


def accuracy(pred: Sequence[bool], positive: Sequence[bool]) -> float:
    pred, positive = np.asarray(pred, dtype=bool), np.asarray(positive, dtype=bool)
    return float((pred == positive).mean()) if len(pred) else NAN


def balanced_accuracy(pred: Sequence[bool], positive: Sequence[bool]) -> float:
    """The mean of the recalls of the classes present (sensitivity and specificity)."""
    pred, positive = np.asarray(pred, dtype=bool), np.asarray(positive, dtype=bool)
    recalls = [(pred[positive == c] == c).mean() for c in (True, False) if (positive == c).any()]
    return float(np.mean(recalls)) if recalls else NAN


def cohen_kappa(a: Sequence[Any], b: Sequence[Any]) -> float:
    """Cohen's kappa of two raters over any categories: (observed - chance agreement) / (1 - chance).
    NaN when chance agreement is 1 (both raters always give one and the same category)."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) == 0:
        return NAN
    observed = float((a == b).mean())
    chance = sum(float((a == c).mean() * (b == c).mean()) for c in np.union1d(a, b))
    return NAN if chance >= 1.0 else (observed - chance) / (1.0 - chance)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks. NaN if either side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    if len(rx) < 2 or rx.std() == 0 or ry.std() == 0:
        return NAN
    return float(np.corrcoef(rx, ry)[0, 1])


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (tie-corrected), from the contingency table of the distinct values: O(n log n) time and
    O(kx * ky) memory for kx, ky distinct values (labels have a handful), not O(n^2) pairs. NaN if either side
    is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    xs, xi = np.unique(x, return_inverse=True)
    ys, yi = np.unique(y, return_inverse=True)
    table = np.zeros((len(xs), len(ys)))
    np.add.at(table, (xi, yi), 1)
    # above[i, j]: rows with a larger x and a larger y than cell (i, j); left_above: larger x, smaller y
    suffix = table[::-1, ::-1].cumsum(0).cumsum(1)[::-1, ::-1]  # x >= i and y >= j
    above = np.zeros_like(table)
    above[:-1, :-1] = suffix[1:, 1:]
    larger_x = np.zeros_like(table)
    larger_x[:-1, :] = table[::-1].cumsum(0)[::-1][1:]  # x > i, per y
    below = np.zeros_like(table)
    below[:, 1:] = larger_x.cumsum(1)[:, :-1]  # x > i and y < j
    concordant, discordant = (table * above).sum(), (table * below).sum()
    pairs = n * (n - 1) / 2
    tied_x = (table.sum(1) * (table.sum(1) - 1) / 2).sum()
    tied_y = (table.sum(0) * (table.sum(0) - 1) / 2).sum()
    if pairs - tied_x <= 0 or pairs - tied_y <= 0:
        return NAN
    return float((concordant - discordant) / np.sqrt((pairs - tied_x) * (pairs - tied_y)))


def best_threshold(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """The threshold (one of the scores) whose predictions `score >= t` have the highest balanced accuracy;
    ties go to the threshold nearest 0.5, then the lower one."""
    scores = np.asarray(scores, dtype=float)
    candidates = np.unique(scores)
    if len(candidates) == 0:
        return 0.5
    quality = [balanced_accuracy(scores >= t, positive) for t in candidates]
    best = max(quality)
    tied = [t for t, q in zip(candidates, quality) if q == best]
    return float(min(tied, key=lambda t: (abs(t - 0.5), t)))


def calibration_split(positive: Sequence[bool], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibration indices, held-out indices): half of each class, picked at random with `seed`, so both
    halves keep the class balance. An odd class gives its extra row to the held-out half."""
    positive = np.asarray(positive, dtype=bool)
    rng = np.random.default_rng(seed)
    calibration, held_out = [], []
    for cls in (True, False):
        idx = rng.permutation(np.flatnonzero(positive == cls))
        calibration.extend(idx[: len(idx) // 2])
        held_out.extend(idx[len(idx) // 2:])
    return np.sort(np.array(calibration, dtype=int)), np.sort(np.array(held_out, dtype=int))


def bootstrap_ci(stat: Callable[..., float], arrays: Sequence[Sequence[Any]], resamples: int = 1000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat(*arrays)`: resample the rows with replacement `resamples`
    times (seeded) and take the (1-level)/2 and (1+level)/2 quantiles. Resamples where the statistic is
    undefined (NaN, e.g. AUC on a resample with one class) are dropped."""
    arrays = [np.asarray(a) for a in arrays]
    n = len(arrays[0])
    if n == 0 or resamples <= 0:
        return NAN, NAN
    rng = np.random.default_rng(seed)
    values = np.array([stat(*(a[idx] for a in arrays)) for idx in rng.integers(0, n, size=(resamples, n))])
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return NAN, NAN
    tail = (1 - level) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


def estimate(stat: Callable[..., float], arrays: Sequence[Sequence[Any]], resamples: int,
             seed: int) -> dict[str, Any]:
    """{"value": stat on the data, "ci": [low, high]} (a 95% percentile bootstrap interval)."""
    value = stat(*arrays) if len(arrays[0]) else NAN
    return {"value": value, "ci": list(bootstrap_ci(stat, arrays, resamples, seed))}


def agreement(scores: Sequence[Optional[float]], labels: Sequence[float], positive: Sequence[bool],
              threshold: float | str = 0.5, seed: int = 0, resamples: int = 1000) -> dict[str, Any]:
    """Agreement of one judge's scores with the labels of one metric.

    Samples without a score are left out (their number is reported as `no_score`). Threshold-free statistics
    (ROC-AUC, Spearman, Kendall) use every scored sample. Threshold statistics (accuracy, balanced accuracy,
    Cohen's kappa of the prediction `score >= threshold` against the positive class) use every scored sample
    with a fixed threshold; with threshold "auto" the threshold maximising balanced accuracy is chosen on a
    seeded, class-stratified 50% calibration split and the statistics are reported on the other half only.
    Every statistic has a 95% percentile bootstrap interval (`resamples`, seeded); the threshold is held fixed
    within the bootstrap."""
    values = np.array([np.nan if s is None else s for s in scores], dtype=float)
    scored = ~np.isnan(values)
    s, y, pos = values[scored], np.asarray(labels, dtype=float)[scored], np.asarray(positive, dtype=bool)[scored]
    out: dict[str, Any] = {"n": len(values), "scored": int(scored.sum()), "no_score": int((~scored).sum())}
    if threshold == "auto":
        calibration, held_out = calibration_split(pos, seed)
        t = best_threshold(s[calibration], pos[calibration])
        out["threshold_rule"] = f"max balanced accuracy on a 50% calibration split (seed {seed})"
    else:
        held_out, t = np.arange(len(s)), float(threshold)
        out["threshold_rule"] = "fixed"
    out["threshold"] = t
    out["evaluated_on"] = int(len(held_out))
    pred_arrays = [s[held_out] >= t, pos[held_out]]
    out["accuracy"] = estimate(accuracy, pred_arrays, resamples, seed)
    out["balanced_accuracy"] = estimate(balanced_accuracy, pred_arrays, resamples, seed)
    out["kappa"] = estimate(cohen_kappa, pred_arrays, resamples, seed)
    out["auc"] = estimate(roc_auc, [s, pos], resamples, seed)
    out["spearman"] = estimate(spearman, [s, y], resamples, seed)
    out["kendall"] = estimate(kendall_tau_b, [s, y], resamples, seed)
    out["roc"] = roc_curve(s, pos)
    out["mean_score"] = {"positive": _mean(s[pos]), "negative": _mean(s[~pos])}
    return out


def calibration(scores: Sequence[Optional[float]], positive: Sequence[bool], bins: int = 10) -> dict[str, Any]:
    """How far scores are from the share of positives among the samples that get them: a reliability table
    of `bins` equal-width score bins on [0, 1] (count, mean score, share positive) and the expected
    calibration error, sum over bins of (count / n) * |mean score - share positive|. A well calibrated 0.7
    means that 70% of such samples are positive."""
    values = np.array([np.nan if s is None else s for s in scores], dtype=float)
    keep = ~np.isnan(values)
    s, pos = values[keep], np.asarray(positive, dtype=bool)[keep]
    if not len(s):
        return {"ece": math.nan, "bins": []}
    which = np.minimum((s * bins).astype(int), bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            mean, share = float(s[inside].mean()), float(pos[inside].mean())
            ece += inside.sum() / len(s) * abs(mean - share)
            table.append({"lo": b / bins, "hi": (b + 1) / bins, "n": int(inside.sum()), "mean_score": mean,
                          "positive_rate": share})
    return {"ece": float(ece), "bins": table}


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else NAN


# ---- consistency ----------------------------------------------------------------------------------------

def share_identical(first: Sequence[Any], others: Sequence[Sequence[Any]]) -> float:
    """The share of (rerun, sample) pairs whose value equals the first run's (None equals None)."""
    pairs = [(a, b) for run in others for a, b in zip(first, run)]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else NAN


def mean_difference(a: Sequence[float], b: Sequence[float], resamples: int = 1000,
                    seed: int = 0) -> dict[str, Any]:
    """The mean of a - b with a bootstrap interval (e.g. template 1's rating minus template 2's)."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return estimate(lambda d: float(d.mean()), [diff], resamples, seed)
