"""Agreement statistics on hand-computed cases, the calibration split, and bootstrap interval coverage."""

import math

import numpy as np
import pytest

from offline_eval.comparison.agreement import (accuracy, agreement, balanced_accuracy, best_threshold, bootstrap_ci,
                                    calibration_split, cohen_kappa, kendall_tau_b, mean_difference, roc_auc,
                                    roc_curve, share_identical, spearman)
from offline_eval.comparison.compare import rank, smallest_within_margin


def test_cohen_kappa_by_hand():
    a = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0]
    b = [1, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    # observed 7/10; chance 0.5*0.6 + 0.5*0.4 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5)
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(["2", "1", "0"], ["2", "1", "0"]) == pytest.approx(1.0)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))  # chance agreement 1: undefined


def test_accuracy_and_balanced_accuracy_by_hand():
    labels = [True, True, True, True, False, False]
    pred = [True, True, True, False, False, True]
    assert accuracy(pred, labels) == pytest.approx(4 / 6)
    assert balanced_accuracy(pred, labels) == pytest.approx((3 / 4 + 1 / 2) / 2)
    assert balanced_accuracy([True] * 6, labels) == pytest.approx(0.5)  # always "positive"


def test_roc_auc_counts_pairs_and_half_ties():
    scores = [0.9, 0.8, 0.4, 0.5, 0.3]
    positive = [True, True, True, False, False]
    assert roc_auc(scores, positive) == pytest.approx(5 / 6)  # 5 of the 6 (pos, neg) pairs ordered
    assert roc_auc([0.5, 0.5], [True, False]) == pytest.approx(0.5)
    assert math.isnan(roc_auc([0.1, 0.2], [True, True]))
    curve = roc_curve(scores, positive)
    assert curve[0] == (0.0, 0.0) and curve[-1] == (1.0, 1.0)
    assert (0.0, 2 / 3) in curve  # threshold 0.8: two of three positives, no negative


def test_spearman_and_kendall_by_hand():
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    assert spearman(x, y) == pytest.approx(1 - 6 * 4 / (5 * 24))  # sum of squared rank differences = 4
    assert kendall_tau_b(x, y) == pytest.approx((8 - 2) / 10)  # 8 concordant, 2 discordant pairs
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_kendall_tau_b_with_ties_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 3, 40), rng.integers(0, 5, 40)
    assert kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_best_threshold_maximises_balanced_accuracy_and_prefers_the_one_near_half():
    scores = [0.6, 0.7, 0.8, 0.9, 0.1, 0.2, 0.3, 0.65]
    positive = [True] * 4 + [False] * 4
    # t=0.6 and t=0.7 both reach (1 + 3/4) / 2; 0.6 is nearer 0.5
    assert best_threshold(scores, positive) == pytest.approx(0.6)
    assert best_threshold([0.2, 0.8], [False, True]) == pytest.approx(0.8)


def test_calibration_split_is_stratified_disjoint_and_seeded():
    positive = np.array([True] * 10 + [False] * 7)
    calibration, held_out = calibration_split(positive, seed=5)
    assert sorted([*calibration, *held_out]) == list(range(17))
    assert positive[calibration].sum() == 5 and (~positive[calibration]).sum() == 3  # odd class: extra to held-out
    again = calibration_split(positive, seed=5)
    assert (again[0] == calibration).all() and not (calibration_split(positive, seed=6)[0] == calibration).all()


def test_auto_threshold_is_chosen_on_the_calibration_half_and_reported_on_the_other():
    rng = np.random.default_rng(0)
    labels = np.array([1.0] * 30 + [0.0] * 30)
    scores = np.clip(labels * 0.3 + rng.uniform(0, 0.7, 60), 0, 1)
    pos = labels == 1.0
    out = agreement(scores.tolist(), labels, pos, threshold="auto", seed=1, resamples=50)
    calibration, held_out = calibration_split(pos, seed=1)
    t = best_threshold(scores[calibration], pos[calibration])
    assert out["threshold"] == pytest.approx(t) and out["evaluated_on"] == len(held_out) == 30
    assert out["balanced_accuracy"]["value"] == pytest.approx(balanced_accuracy(scores[held_out] >= t, pos[held_out]))
    assert out["auc"]["value"] == pytest.approx(roc_auc(scores, pos))  # threshold-free: every row


def test_agreement_leaves_out_samples_without_a_score():
    out = agreement([1.0, None, 0.0, 0.5], np.array([1.0, 1.0, 0.0, 1.0]), np.array([True, True, False, True]),
                    threshold=0.5, resamples=20)
    assert (out["n"], out["scored"], out["no_score"]) == (4, 3, 1)
    assert out["accuracy"]["value"] == pytest.approx(1.0) and out["kappa"]["value"] == pytest.approx(1.0)


def test_bootstrap_interval_covers_a_known_accuracy_about_95_percent_of_the_time():
    rng = np.random.default_rng(42)
    true_accuracy, n, trials = 0.8, 100, 200
    covered = 0
    for trial in range(trials):
        correct = rng.random(n) < true_accuracy
        lo, hi = bootstrap_ci(lambda c: float(c.mean()), [correct], resamples=400, seed=trial)
        covered += lo <= true_accuracy <= hi
    assert 0.88 <= covered / trials <= 0.99


def test_bootstrap_is_reproducible_and_skips_undefined_resamples():
    x = np.array([0.1, 0.9, 0.4, 0.8, 0.3])
    pos = np.array([False, True, False, True, True])
    assert bootstrap_ci(roc_auc, [x, pos], 200, seed=7) == bootstrap_ci(roc_auc, [x, pos], 200, seed=7)
    lo, hi = bootstrap_ci(roc_auc, [x, pos], 200, seed=7)
    assert 0 <= lo <= hi <= 1


def test_consistency_helpers():
    assert share_identical([1.0, None, 0.5], [[1.0, None, 0.5], [1.0, 0.0, 0.5]]) == pytest.approx(5 / 6)
    bias = mean_difference([1.0, 0.5, 1.0], [0.5, 0.5, 0.0], resamples=100)
    assert bias["value"] == pytest.approx(0.5) and bias["ci"][0] <= 0.5 <= bias["ci"][1]


def test_ranking_and_the_smallest_judge_within_the_margin():
    values = {"big": 0.80, "mid": 0.79, "small": 0.70, "broken": float("nan")}
    sizes = {"big": 7_000, "mid": 3_000, "small": 1_000, "broken": 10}
    assert rank(values) == ["big", "mid", "small", "broken"]
    assert smallest_within_margin(values, sizes, 0.02) == "mid"
    assert smallest_within_margin(values, sizes, 0.0) == "big"
    assert smallest_within_margin(values, sizes, 0.2) == "small"
    assert smallest_within_margin(values, {"big": None, "mid": None, "small": None}, 0.02) == "big"
