"""Property tests (hypothesis): the dataset loader never fails with anything but a DataError or a
ValidationError that names the row or line, valid rows round-trip, and the scoring functions stay in range
and move the right way."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from offline_eval import DataError, SingleTurnSample, ValidationError
from offline_eval.dataset import ALIASES, FIELDS, load_rows, to_sample
from offline_eval.engines.base import JudgeOutput
from offline_eval.run.evaluation import validate
from offline_eval.metrics import metric_by_name
from offline_eval.metrics.answer_accuracy import AnswerAccuracy
from offline_eval.metrics.answer_correctness import correctness_score, fbeta
from offline_eval.metrics.answer_relevancy import relevancy_score
from offline_eval.metrics.claims import supported_share
from offline_eval.metrics.context_precision import average_precision

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
METRICS = [metric_by_name(n) for n in ("faithfulness", "answer_accuracy", "context_precision", "rubrics_score")]

# ---- the dataset loader ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)
field_names = st.sampled_from([*FIELDS, *ALIASES, "rubrics", "id"]) | st.text(max_size=10)
records = st.dictionaries(field_names, json_values, max_size=6)
anything = records | json_values


def names_a_row(message: str) -> bool:
    return bool(re.search(r"\b(row|line) \d+", message))


def load_and_check(source):
    """What evaluate() does before its first judge call: load, validate for some metrics, build samples."""
    try:
        rows = load_rows(source)
    except DataError as exc:
        assert names_a_row(str(exc)), exc
        return
    errors = validate(rows, METRICS)
    for e in errors:
        assert names_a_row(str(e)), e
    if errors:
        assert names_a_row(str(ValidationError(errors)))
    bad = {e.row.number for e in errors}
    for row in rows:
        if row.number not in bad:
            sample = to_sample(row)
            assert isinstance(sample.response, str) and all(isinstance(c, str) for c in sample.retrieved_contexts)


@FAST
@given(st.lists(anything, min_size=1, max_size=5))
def test_any_list_of_rows_loads_or_names_the_bad_row(items):
    load_and_check(items)


line_text = st.one_of(records.map(lambda r: json.dumps(r, allow_nan=True)), json_values.map(json.dumps),
                      st.text(max_size=30).filter(lambda s: "\n" not in s and "\r" not in s))


@FAST
@given(st.lists(line_text, min_size=1, max_size=5), st.binary(max_size=8))
def test_any_jsonl_file_loads_or_names_the_bad_line(tmp_path_factory, lines, junk):
    path = tmp_path_factory.mktemp("jsonl") / "data.jsonl"
    path.write_bytes("\n".join(lines).encode() + b"\n" + junk)
    load_and_check(path)


text = st.text(min_size=1, max_size=40).filter(lambda s: s.strip())
valid_rows = st.fixed_dictionaries(
    {"user_input": text, "response": text, "retrieved_contexts": st.lists(text, min_size=1, max_size=3),
     "reference": text},
    optional={"id": st.integers() | st.text(max_size=10), "rubrics": st.just({f"score{i}_description": f"d{i}"
                                                                             for i in range(1, 6)})})


@FAST
@given(st.lists(valid_rows, min_size=1, max_size=4), st.booleans())
def test_valid_rows_round_trip_through_jsonl(tmp_path_factory, rows, old_names):
    rename = {v: k for k, v in ALIASES.items() if k != "ground_truths"} if old_names else {}
    path = tmp_path_factory.mktemp("rt") / "data.jsonl"
    path.write_text("".join(json.dumps({rename.get(k, k): v for k, v in r.items()}, ensure_ascii=False) + "\n"
                            for r in rows), encoding="utf-8")
    loaded = load_rows(path)
    assert validate(loaded, METRICS) == []
    assert [row.line for row in loaded] == list(range(1, len(rows) + 1))
    for row, original in zip(loaded, rows):
        assert to_sample(row) == SingleTurnSample(**{k: v for k, v in original.items() if k != "id"})
        assert row.extra == ({"id": original["id"]} if "id" in original else {})


# ---- scoring ---------------------------------------------------------------------------------------------

verdicts = st.lists(st.none() | st.booleans(), max_size=12)


@FAST
@given(verdicts)
def test_supported_share_is_a_share_and_more_support_never_lowers_it(vs):
    share = supported_share(vs)
    assert (share is None) == all(v is None for v in vs)
    if share is not None:
        assert 0 <= share <= 1
        assert supported_share([*vs, True]) >= share >= supported_share([*vs, False])


def accuracy(first, second):
    """AnswerAccuracy's score for two judge ratings ("0", "2", "4", or None for a failed call)."""
    plan = AnswerAccuracy().plan(SingleTurnSample(user_input="q", response="a", reference="r"), "en")
    next(plan)
    try:
        plan.send([JudgeOutput(text=v or "", value=v) for v in (first, second)])
    except StopIteration as done:
        return done.value.value
    raise AssertionError("the plan asked for more")


ratings = st.sampled_from([None, "0", "2", "4"])


@FAST
@given(ratings, ratings)
def test_answer_accuracy_averages_the_valid_ratings(first, second):
    score = accuracy(first, second)
    valid = [int(r) / 4 for r in (first, second) if r is not None]
    assert (score is None) == (not valid)
    if valid:
        assert 0 <= score <= 1 and min(valid) <= score <= max(valid)
        assert accuracy(first, second) == accuracy(second, first) or None in (first, second)
    if first is not None and first != "4" and second is not None:
        assert accuracy(str(int(first) + 2), second) > score  # a better rating raises the score


vectors = st.lists(st.floats(-10, 10), min_size=4, max_size=4).filter(lambda v: np.linalg.norm(v) > 1e-3)


@FAST
@given(vectors, st.lists(vectors, min_size=1, max_size=4), st.data())
def test_relevancy_is_a_cosine_and_zero_when_all_noncommittal(question, generated, data):
    flags = data.draw(st.lists(st.sampled_from([0, 1]), min_size=len(generated), max_size=len(generated)))
    score = relevancy_score(np.array(question), np.array(generated), flags)
    assert -1 - 1e-9 <= score <= 1 + 1e-9
    if all(flags):
        assert score == 0.0
    else:
        assert relevancy_score(np.array(question), np.array([question] * len(generated)), flags) == \
            pytest.approx(1.0)


@FAST
@given(verdicts)
def test_average_precision_is_in_range_and_rewards_useful_contexts_first(vs):
    ap = average_precision(vs)
    assert (ap is None) == all(v is None for v in vs)
    if ap is None:
        return
    assert 0 <= ap <= 1
    assert (ap == 0) == (not any(vs))
    for i in range(len(vs) - 1):
        if vs[i] is not True and vs[i + 1] is True:  # moving a useful context up never hurts
            swapped = [*vs[:i], True, vs[i], *vs[i + 2:]]
            assert average_precision(swapped) >= ap - 1e-12
    if all(v is True for v in vs):
        assert ap == 1.0


counts = st.integers(0, 20)


@FAST
@given(counts, counts, counts, st.floats(0.1, 5))
def test_fbeta_is_in_range_and_monotone(tp, fp, fn, beta):
    f = fbeta(tp, fp, fn, beta)
    assert 0 <= f <= 1
    assert fbeta(tp + 1, fp, fn, beta) >= f - 1e-12
    assert fbeta(tp, fp + 1, fn, beta) <= f + 1e-12
    assert fbeta(tp, fp, fn + 1, beta) <= f + 1e-12


@FAST
@given(st.floats(0, 1), st.floats(-1, 1), st.floats(0, 1), st.floats(0, 1))
def test_answer_correctness_blends_between_its_parts(factuality, similarity, w1, w2):
    assume(w1 + w2 > 1e-6)
    score = correctness_score(factuality, similarity, (w1, w2))
    assert min(factuality, similarity) - 1e-9 <= score <= max(factuality, similarity) + 1e-9
    assert math.isfinite(score)
