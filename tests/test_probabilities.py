"""Probability-weighted scores: each constrained choice also yields the judge's probability of every allowed
option. The engine tests run real models through the real llama.cpp engine; the scoring-math tests use the
scripted judge."""

from __future__ import annotations

import math

import pytest

from offline_eval.cache import JudgeCache
from offline_eval.constraints import Choice, JsonSchema, array, obj, string
from offline_eval.engines.base import JudgeRequest
from offline_eval.metrics import ContextRelevance, Faithfulness, ResponseGroundedness
from offline_eval.metrics.base import YES_NO
from offline_eval.run.scheduler import run_metrics
from scripted import FAIL, ScriptedJudge, TagJudge

RATING = Choice(("0", "1", "2"))


# ---- Choice.distribution --------------------------------------------------------------------------------

def test_distribution_gives_each_first_token_to_the_option_it_begins():
    probs = YES_NO.distribution([("yes", math.log(0.5)), ("y", math.log(0.1)), ("no", math.log(0.2)),
                                 (" yes", math.log(0.15)), ("Yes", math.log(0.05))])
    assert probs == pytest.approx({"yes": 0.6 / 0.8, "no": 0.2 / 0.8})  # " yes" and "Yes" are not allowed


def test_distribution_gives_unlisted_options_zero_and_none_without_allowed_tokens():
    assert RATING.distribution([("2", -0.1), ("x", 0.0)]) == {"0": 0.0, "1": 0.0, "2": 1.0}
    assert RATING.distribution([("x", 0.0)]) is None
    assert RATING.distribution([("1", -1000.0), ("2", -1001.0)])["1"] == pytest.approx(1 / (1 + math.exp(-1)))


def test_choice_options_must_be_prefix_free():
    # With "1" and "10", the first token "1" would not decide the option.
    with pytest.raises(ValueError, match="prefixes"):
        Choice(("1", "10"))


# ---- the real llama.cpp engine --------------------------------------------------------------------------

def _check(out, choice: Choice) -> None:
    assert set(out.probabilities) == set(choice.options)
    assert sum(out.probabilities.values()) == pytest.approx(1.0)
    assert all(0.0 <= p <= 1.0 for p in out.probabilities.values())
    # Greedy decoding under the grammar picks the most probable allowed first token: the same option.
    assert max(out.probabilities, key=out.probabilities.get) == out.value


@pytest.mark.engine
def test_llamacpp_probabilities_are_a_distribution_whose_argmax_is_the_output(smollm):
    asks = [("Is the sky blue on a clear day? Answer yes or no.", YES_NO),
            ("Rate how much you like the number seven, 0, 1 or 2.", RATING),
            ("Pick one of 0, 2 or 4.", Choice(("0", "2", "4")))]
    requests = [JudgeRequest((("system", "You answer briefly."), ("user", q)), c) for q, c in asks]
    outputs = smollm.generate(requests)
    for out, (_, choice) in zip(outputs, asks):
        _check(out, choice)
    # Not a constant: different prompts give different distributions.
    assert outputs[0].probabilities != pytest.approx({"yes": 0.5, "no": 0.5})
    # JSON outputs carry none.
    (json_out,) = smollm.generate([JudgeRequest((("user", "List one colour."),),
                                                JsonSchema.of(obj(colours=array(string(20), 1))))])
    assert json_out.value is not None and json_out.probabilities is None


@pytest.mark.engine
def test_default_judge_is_confident_on_clear_claim_checks(qwen):
    from offline_eval.metrics.claims import check_claim

    source = ["Paris is the capital and largest city of France."]
    supported, contradicted = qwen.generate([check_claim("Paris is the capital of France.", source, "en"),
                                             check_claim("Paris is the capital of Germany.", source, "en")])
    _check(supported, YES_NO)
    _check(contradicted, YES_NO)
    assert supported.probabilities["yes"] > 0.9
    assert contradicted.probabilities["no"] > 0.9


# ---- scoring math (scripted judge) ----------------------------------------------------------------------

SAMPLE = {"user_input": "q", "response": "a. b.", "retrieved_contexts": ["c"]}


def _judge(verdicts, ratings):
    def answer(r: JudgeRequest):
        if r.tag == "claims":
            return {"claims": ["a", "b"]}
        if r.tag.startswith("verdict"):
            return verdicts[int(r.tag[8])]
        return ratings[r.tag]
    return ScriptedJudge(answer)


def test_both_scorings_in_every_result_and_the_switch_picks_the_value():
    judge = _judge([{"yes": 0.9, "no": 0.1}, {"yes": 0.2, "no": 0.8}],
                   {"judge1": {"0": 0.1, "1": 0.3, "2": 0.6}, "judge2": {"0": 0.0, "1": 0.8, "2": 0.2}})
    metrics = [Faithfulness(llm=judge), ResponseGroundedness(llm=judge)]
    (prob,) = run_metrics([_sample()], metrics, judge=judge)
    (argmax,) = run_metrics([_sample()], metrics, judge=judge, scoring="argmax")
    assert prob["faithfulness"].scores == pytest.approx({"probability": 0.55, "argmax": 0.5})
    assert prob["faithfulness"].value == pytest.approx(0.55) and argmax["faithfulness"].value == 0.5
    # P("2", fully grounded) of the two templates' distributions combined, the first weighted 1.5, the second 0.5
    joint = [p1 ** 1.5 * p2 ** 0.5 for p1, p2 in [(0.1, 0.0), (0.3, 0.8), (0.6, 0.2)]]
    p_top = joint[2] / sum(joint)
    assert prob["response_groundedness"].scores == pytest.approx({"probability": p_top, "argmax": 0.75})
    assert argmax["response_groundedness"].value == 0.75
    # Each judge call's record carries its distribution.
    calls = prob["faithfulness"].judge_calls
    assert calls[1]["probabilities"] == {"yes": 0.9, "no": 0.1} and "probabilities" not in calls[0]


def test_two_templates_that_lean_the_same_way_say_so_more_firmly_together():
    """Product of experts: two templates each at P(2) = 0.5 give a joint P(2) above either; a template sure of
    "2" against one sure of "0" falls back to the mean of their P(2)."""
    lean = {"0": 0.3, "1": 0.2, "2": 0.5}
    judge = _judge([], {"judge1": lean, "judge2": lean})
    (res,) = run_metrics([_sample()], [ResponseGroundedness(llm=judge)], judge=judge)
    assert res["response_groundedness"].scores["probability"] == pytest.approx(0.25 / (0.09 + 0.04 + 0.25))
    judge = _judge([], {"judge1": {"0": 0.0, "1": 0.0, "2": 1.0}, "judge2": {"0": 1.0, "1": 0.0, "2": 0.0}})
    (res,) = run_metrics([_sample()], [ResponseGroundedness(llm=judge)], judge=judge)
    assert res["response_groundedness"].scores["probability"] == pytest.approx(0.5)


def test_groundedness_leans_on_its_first_template_where_the_two_disagree():
    """Response groundedness weighs the first template's distribution 1.5 and the second's 0.5 (their sum, 2,
    keeps the product's firmness): swapping two templates that disagree moves its score, while Context
    Relevance, whose templates count alike, gives the same score either way."""
    sure, unsure = {"0": 0.1, "1": 0.2, "2": 0.7}, {"0": 0.2, "1": 0.5, "2": 0.3}

    def p_top(metric, first, second):
        judge = _judge([], {"judge1": first, "judge2": second})
        (res,) = run_metrics([_sample()], [metric(llm=judge)], judge=judge)
        return res[metric.name].scores["probability"]

    def weighted(first, second, w1, w2):
        joint = {k: first[k] ** w1 * second[k] ** w2 for k in first}
        return joint["2"] / sum(joint.values())

    assert p_top(ResponseGroundedness, sure, unsure) == pytest.approx(weighted(sure, unsure, 1.5, 0.5))
    assert p_top(ResponseGroundedness, unsure, sure) == pytest.approx(weighted(unsure, sure, 1.5, 0.5))
    assert p_top(ResponseGroundedness, sure, unsure) > p_top(ResponseGroundedness, unsure, sure)
    assert p_top(ContextRelevance, sure, unsure) == pytest.approx(p_top(ContextRelevance, unsure, sure))
    assert p_top(ContextRelevance, sure, unsure) == pytest.approx(weighted(sure, unsure, 1, 1))
    # a lone rating (the other call failed) is read as it stands, unweighted
    judge = TagJudge({"judge1": FAIL, "judge2": unsure})
    (res,) = run_metrics([_sample()], [ResponseGroundedness(llm=judge)], judge=judge)
    assert res["response_groundedness"].scores["probability"] == pytest.approx(0.3)


def test_metric_level_scoring_and_bad_names():
    judge = _judge([{"yes": 0.9, "no": 0.1}, {"yes": 0.2, "no": 0.8}], {})
    (res,) = run_metrics([_sample()], [Faithfulness(llm=judge, scoring="argmax")], judge=judge)
    assert res["faithfulness"].value == 0.5
    with pytest.raises(ValueError, match="scoring"):
        Faithfulness(scoring="mean")


def test_probabilities_survive_the_cache(tmp_path):
    judge = _judge([{"yes": 0.7, "no": 0.3}, {"yes": 0.6, "no": 0.4}], {})
    with JudgeCache(tmp_path / "c.sqlite") as cache:
        (first,) = run_metrics([_sample()], [Faithfulness()], judge=judge, cache=cache)
        (again,) = run_metrics([_sample()], [Faithfulness()], judge=judge, cache=cache)
    assert len(judge.requests) == 3  # the rerun came from the cache
    assert all(c.get("cached") for c in again["faithfulness"].judge_calls)
    assert again["faithfulness"].scores == first["faithfulness"].scores == pytest.approx(
        {"probability": 0.65, "argmax": 1.0})


def _sample():
    from offline_eval.dataset import load_rows, to_sample

    return to_sample(load_rows([SAMPLE])[0])


def test_without_probabilities_the_probability_scoring_reads_the_answers_as_certain():
    # An engine that gives no distribution (or an older cache entry): P(top) is 1 for a top rating, else 0.
    judge = _judge([], {"judge1": "2", "judge2": "1"})
    (res,) = run_metrics([_sample()], [ResponseGroundedness(llm=judge)], judge=judge)
    assert res["response_groundedness"].scores == pytest.approx({"probability": 0.5, "argmax": 0.75})
