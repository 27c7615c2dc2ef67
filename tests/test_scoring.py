"""Scoring math of every metric, against values computed by hand.

The judge is scripted: it answers each request by its stage tag ("judge1", "claims", "verdict[0]", ...),
so these tests check how a metric turns judge answers into a score and a reason, nothing about models.
"""

import json
import re

import numpy as np
import pytest

from offline_eval.constraints import ConstraintViolation
from offline_eval.metrics import judge_constraints
from offline_eval.metrics.answer_relevancy import questions_schema
from offline_eval.metrics.base import detect_language
from offline_eval.metrics.collections import (ALL, AnswerAccuracy, AnswerCorrectness, AnswerRelevancy,
                                              ContextPrecision, ContextRecall, ContextRelevance, Faithfulness,
                                              ResponseGroundedness, RubricsScore)
from offline_eval.metrics.rubrics import DEFAULT_WITH_REFERENCE, DEFAULT_WITHOUT_REFERENCE
from scripted import FAIL, ScriptedJudge, TableEmbeddings, TagJudge, any_valid_answer, item_text, user_text

def tagged(prefix: str, answers: list[str]) -> dict[str, str]:
    """{"verdict[0]": "yes", "verdict[1]": "no", ...}"""
    return {f"{prefix}[{i}]": a for i, a in enumerate(answers)}


def system_text(request) -> str:
    return request.messages[0][1]


EINSTEIN = dict(
    user_input="When and where was Albert Einstein born?",
    retrieved_contexts=["Albert Einstein was born March 14, 1879.",
                        "Albert Einstein was born at Ulm, in Württemberg, Germany."],
    response="Albert Einstein was born in 1879 in Ulm.",
    reference="Albert Einstein was born on 14 March 1879 in Ulm, Germany.",
)


# ---- NVIDIA dual-judge metrics ------------------------------------------------------------------------

@pytest.mark.parametrize("metric_cls, ratings, expected", [
    (AnswerAccuracy, ("4", "2"), 0.75),  # (4/4 + 2/4) / 2
    (AnswerAccuracy, ("4", "4"), 1.0),
    (AnswerAccuracy, ("0", "2"), 0.25),
    (ContextRelevance, ("2", "1"), 0.75),  # (2/2 + 1/2) / 2
    (ContextRelevance, ("0", "1"), 0.25),
    (ResponseGroundedness, ("1", "0"), 0.25),
    (ResponseGroundedness, ("2", "2"), 1.0),
])
def test_dual_judge_score_is_the_mean_of_scaled_ratings(metric_cls, ratings, expected):
    judge = TagJudge({"judge1": ratings[0], "judge2": ratings[1]})
    result = metric_cls(llm=judge, scoring="argmax").score(**EINSTEIN)  # Ragas' semantics
    assert result.value == pytest.approx(expected)
    # The probability scoring reads plain answers as certain: the share of templates that gave the top rating.
    top = str(max(int(o) for o in judge.requests[0].constraint.options))
    assert result.scores["probability"] == pytest.approx(sum(r == top for r in ratings) / 2)
    assert sorted(r.tag for r in judge.requests) == ["judge1", "judge2"]
    assert result.details["ratings"] == list(ratings)


@pytest.mark.parametrize("metric_cls, top", [(AnswerAccuracy, "4"), (ContextRelevance, "2"),
                                             (ResponseGroundedness, "2")])
@pytest.mark.parametrize("failing", ["judge1", "judge2"])
def test_dual_judge_uses_the_valid_rating_when_the_other_fails(metric_cls, top, failing):
    answers = {"judge1": top, "judge2": top, failing: FAIL}
    assert metric_cls(llm=TagJudge(answers)).score(**EINSTEIN).value == 1.0


@pytest.mark.parametrize("metric_cls", [AnswerAccuracy, ContextRelevance, ResponseGroundedness])
def test_dual_judge_has_no_value_when_both_fail(metric_cls):
    assert metric_cls(llm=TagJudge({"judge1": FAIL, "judge2": FAIL})).score(**EINSTEIN).value is None


def test_answer_accuracy_second_judge_swaps_response_and_reference():
    judge = TagJudge({"judge1": "4", "judge2": "4"})
    AnswerAccuracy(llm=judge).score(user_input="Capital of France?", response="RESPONSE-TEXT",
                                    reference="REFERENCE-TEXT")
    first, second = (item_text(r) for r in judge.requests)
    swapped = first.replace("RESPONSE-TEXT", "\0").replace("REFERENCE-TEXT", "RESPONSE-TEXT").replace("\0", "REFERENCE-TEXT")
    assert first != second
    assert second == swapped


# ---- claim-based ratios: Faithfulness (response vs contexts), ContextRecall (reference vs contexts) ---

CLAIM_RATIO = [(Faithfulness, "claims"), (ContextRecall, "reference_claims")]


@pytest.mark.parametrize("metric_cls, claims_tag", CLAIM_RATIO)
@pytest.mark.parametrize("verdicts, expected", [
    (["yes", "yes", "no"], 2 / 3),
    (["no", "no"], 0.0),
    (["yes"], 1.0),
    (["yes", "no", "no", "yes"], 0.5),
    (["yes", FAIL, "no"], 0.5),  # a failed verdict is left out of the ratio
    ([FAIL, FAIL], None),
])
def test_claim_ratio(metric_cls, claims_tag, verdicts, expected):
    claims = [f"Claim number {i}." for i in range(len(verdicts))]
    judge = TagJudge({claims_tag: {"claims": claims}, **tagged("verdict", verdicts)})
    result = metric_cls(llm=judge).score(**EINSTEIN)
    assert result.value == (None if expected is None else pytest.approx(expected))
    assert result.details["claims"] == claims
    assert [r.tag for r in judge.requests] == [claims_tag, *tagged("verdict", verdicts)]


@pytest.mark.parametrize("metric_cls, claims_tag", CLAIM_RATIO)
def test_claim_ratio_has_no_value_without_claims(metric_cls, claims_tag):
    judge = TagJudge({claims_tag: {"claims": []}})
    result = metric_cls(llm=judge).score(**EINSTEIN)
    assert result.value is None
    assert re.search(r"\bno\b.*\bclaims\b", result.reason)
    assert result.details == {"claims": [], "verdicts": []}  # the same shape as with claims
    assert len(judge.requests) == 1  # nothing to check


@pytest.mark.parametrize("metric_cls, claims_tag", CLAIM_RATIO)
def test_claim_ratio_has_no_value_when_extraction_fails(metric_cls, claims_tag):
    result = metric_cls(llm=TagJudge({claims_tag: FAIL})).score(**EINSTEIN)
    assert result.value is None
    assert "input too long" in result.reason


def test_faithfulness_beijing_example_scores_two_thirds():
    claims = ["北京是中国的首都。", "北京拥有故宫等著名景点。", "北京常住人口超过5000万。"]
    judge = TagJudge({"claims": {"claims": claims}, **tagged("verdict", ["yes", "yes", "no"])})
    result = Faithfulness(llm=judge).score(
        user_input="介绍一下北京。",
        response="北京是中国的首都，拥有故宫等著名景点，常住人口超过5000万。",
        retrieved_contexts=["北京是中华人民共和国首都，著名景点包括故宫、天坛。2024年统计常住人口约为2185万人。"],
    )
    assert result.value == pytest.approx(2 / 3)
    assert f"{result.value:.3f}" == "0.667"
    assert result.details["verdicts"] == [True, True, False]
    lines = {claim: next(line for line in result.reason.splitlines() if claim in line) for claim in claims}
    assert "not supported" not in lines[claims[0]] and "supported" in lines[claims[0]]
    assert "not supported" not in lines[claims[1]] and "supported" in lines[claims[1]]
    assert "not supported" in lines[claims[2]]


def test_faithfulness_counts_repeated_claims_once():
    judge = TagJudge({"claims": {"claims": ["A.", "A.", " A. ", "B."]}, **tagged("verdict", ["yes", "no"])})
    result = Faithfulness(llm=judge).score(**EINSTEIN)
    assert result.details["claims"] == ["A.", "B."]
    assert result.value == 0.5


# ---- AnswerRelevancy ----------------------------------------------------------------------------------

QUESTION = EINSTEIN["user_input"]


def relevancy(generated: list[tuple[str, list[float], int]], strictness: int = 3):
    """Score EINSTEIN with generated (question, vector, noncommittal) triples; the user input is [1, 0, 0]."""
    table = {QUESTION: [1, 0, 0], **{q: v for q, v, _ in generated}}
    judge = TagJudge({"questions": {"questions": [{"question": q, "noncommittal": n} for q, _, n in generated]}})
    metric = AnswerRelevancy(llm=judge, embeddings=TableEmbeddings(table), strictness=strictness)
    return metric.score(**EINSTEIN), judge


def test_answer_relevancy_is_the_mean_cosine_to_the_user_input():
    result, _ = relevancy([("Where was Einstein born?", [2, 0, 0], 0),  # cosine 1
                           ("What is relativity?", [0, 1, 0], 0),  # cosine 0
                           ("When was Einstein born?", [3, 4, 0], 0)])  # cosine 3/5
    assert result.value == pytest.approx((1 + 0 + 0.6) / 3)
    assert "Where was Einstein born?" in result.reason
    assert result.details["similarities"] == [1.0, 0.0, 0.6]  # each question's cosine, shown by `view`


def test_answer_relevancy_is_zero_when_every_question_is_noncommittal():
    result, _ = relevancy([("Where was Einstein born?", [1, 0, 0], 1),
                           ("Who was Einstein?", [1, 1, 0], 1),
                           ("When was Einstein born?", [3, 4, 0], 1)])
    assert result.value == 0.0
    assert "noncommittal" in result.reason


def test_answer_relevancy_keeps_the_mean_when_only_some_are_noncommittal():
    # Ragas 0.4 zeroes the score only when *all* generations are noncommittal.
    result, _ = relevancy([("Where was Einstein born?", [1, 0, 0], 1),
                           ("Who was Einstein?", [0, 1, 0], 0),
                           ("When was Einstein born?", [3, 4, 0], 0)])
    assert result.value == pytest.approx(1.6 / 3)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_answer_relevancy_strictness_asks_for_exactly_n_questions(n):
    generated = [(f"Question {i}?", [1, i, 0], 0) for i in range(n)]
    result, judge = relevancy(generated, strictness=n)
    (request,) = judge.requests
    questions = request.constraint.schema["properties"]["questions"]
    assert questions["minItems"] == questions["maxItems"] == n
    assert result.details["questions"] == [q for q, _, _ in generated]
    assert result.value == pytest.approx(np.mean([1 / np.hypot(1, i) for i in range(n)]))
    one_short = {"questions": [{"question": "q?", "noncommittal": 0}] * (n - 1)}
    with pytest.raises(ConstraintViolation):
        request.constraint.parse(json.dumps(one_short))


@pytest.mark.parametrize("strictness", [0, 11])
def test_answer_relevancy_strictness_is_bounded(strictness):
    with pytest.raises(ValueError):
        AnswerRelevancy(strictness=strictness)


def test_answer_relevancy_has_no_value_when_question_generation_fails():
    metric = AnswerRelevancy(llm=TagJudge({"questions": FAIL}), embeddings=TableEmbeddings({}))
    assert metric.score(**EINSTEIN).value is None


# ---- ContextPrecision ---------------------------------------------------------------------------------

@pytest.mark.parametrize("verdicts, expected", [
    (["yes", "no", "yes"], (1 / 1 + 2 / 3) / 2),  # precision@1 and precision@3, over 2 useful contexts
    (["no", "yes"], 1 / 2),
    (["yes", "yes", "no"], 1.0),
    (["no", "no", "yes", "yes"], (1 / 3 + 2 / 4) / 2),
    (["no", "no"], 0.0),  # no useful context
    ([FAIL, "yes"], 1.0),  # a failed verdict is no verdict: left out, never "not useful"
    (["yes", FAIL, "no", "yes"], (1 / 1 + 2 / 3) / 2),  # ranked as yes, no, yes
    ([FAIL, FAIL], None),
])
def test_context_precision_is_average_precision(verdicts, expected):
    contexts = [f"Context {i}." for i in range(len(verdicts))]
    judge = TagJudge(tagged("context", verdicts))
    result = ContextPrecision(llm=judge).score(**{**EINSTEIN, "retrieved_contexts": contexts})
    assert result.value == (None if expected is None else pytest.approx(expected))
    failed = verdicts.count(FAIL)
    assert (f"{failed} of {len(verdicts)} verdicts failed, left out of the ranking" in result.reason) == bool(failed)
    for i, request in enumerate(judge.requests):  # one request per context, in rank order
        assert request.tag == f"context[{i}]" and contexts[i] in user_text(request)


# ---- AnswerCorrectness --------------------------------------------------------------------------------

def correctness(response_claims, in_reference, reference_claims, in_response, **options):
    """Score EINSTEIN; the response embeds to [1, 0] and the reference to [3, 4] (cosine 0.6)."""
    judge = TagJudge({"claims": {"claims": response_claims}, "reference_claims": {"claims": reference_claims},
                      **tagged("in_reference", in_reference), **tagged("in_response", in_response)})
    embeddings = TableEmbeddings({EINSTEIN["response"]: [1, 0], EINSTEIN["reference"]: [3, 4]})
    return AnswerCorrectness(llm=judge, embeddings=embeddings, **options).score(**EINSTEIN)


def test_answer_correctness_blends_claim_f1_and_similarity():
    # TP 2, FP 1 (response claims vs reference); FN 1 (reference claims missing from the response).
    result = correctness(["R1", "R2", "R3"], ["yes", "yes", "no"], ["G1", "G2"], ["yes", "no"])
    precision, recall = 2 / 3, 2 / 3
    f1 = 2 * precision * recall / (precision + recall)
    assert {k: result.details[k] for k in ("tp", "fp", "fn")} == {"tp": 2, "fp": 1, "fn": 1}
    assert result.details["factuality"] == pytest.approx(f1)
    assert result.details["similarity"] == pytest.approx(0.6)
    assert result.value == pytest.approx(0.75 * f1 + 0.25 * 0.6)  # 0.65


@pytest.mark.parametrize("in_reference, in_response, options, expected", [
    (["yes"], ["yes", "no", "no"], {}, 0.75 * 0.5 + 0.25 * 0.6),  # P 1, R 1/3: F1 = 0.5
    (["yes"], ["yes", "no", "no"], {"beta": 2.0}, 0.75 * (5 / 13) + 0.25 * 0.6),  # F2 = 5PR / (4P + R)
    (["yes", "yes"], ["yes", "yes", "yes"], {}, 0.75 * 1.0 + 0.25 * 0.6),
    (["no"], ["no", "no", "no"], {}, 0.75 * 0.0 + 0.25 * 0.6),
    (["yes"], ["yes", "no", "no"], {"weights": (0.5, 0.5)}, 0.5 * 0.5 + 0.5 * 0.6),
])
def test_answer_correctness_weights_and_beta(in_reference, in_response, options, expected):
    result = correctness([f"R{i}" for i in range(len(in_reference))], in_reference,
                         [f"G{i}" for i in range(len(in_response))], in_response, **options)
    assert result.value == pytest.approx(expected)


def test_answer_correctness_without_similarity_weight_needs_no_embeddings():
    judge = TagJudge({"claims": {"claims": ["R0"]}, "reference_claims": {"claims": ["G0"]},
                      "in_reference[0]": "yes", "in_response[0]": "no"})
    metric = AnswerCorrectness(llm=judge, embeddings=TableEmbeddings({}), weights=(1.0, 0.0))
    assert metric.score(**EINSTEIN).value == pytest.approx(2 / 3)  # P 1, R 1/2; the empty table is never used


def test_answer_correctness_noncommittal_response_has_zero_factuality():
    result = correctness([], [], ["G0", "G1"], ["no", "no"])
    assert result.details["factuality"] == 0.0
    assert result.value == pytest.approx(0.25 * 0.6)


@pytest.mark.parametrize("weights", [(1.0,), (0.0, 0.0), (-0.5, 1.5)])
def test_answer_correctness_rejects_bad_weights(weights):
    with pytest.raises(ValueError):
        AnswerCorrectness(weights=weights)


# ---- RubricsScore -------------------------------------------------------------------------------------

CUSTOM_RUBRICS = {f"score{i}_description": f"Custom level {i}: marker-{i * 11}" for i in range(1, 6)}


def rubric_judge(score: int = 4, feedback: str = "Correct year and town; the day is missing.") -> TagJudge:
    return TagJudge({"rubric": {"feedback": feedback, "score": score}})


@pytest.mark.parametrize("score", [1, 3, 5])
def test_rubrics_score_is_the_raw_score_and_the_feedback_is_the_reason(score):
    result = RubricsScore(llm=rubric_judge(score, "Because.")).score(**EINSTEIN)
    assert result.value == float(score)
    assert result.reason == "Because."


def test_rubrics_given_to_the_metric_are_in_the_prompt():
    judge = rubric_judge()
    RubricsScore(llm=judge, rubrics=CUSTOM_RUBRICS).score(**EINSTEIN)
    system = user_text(judge.requests[0])
    assert all(description in system for description in CUSTOM_RUBRICS.values())


def test_rubrics_of_a_sample_override_the_metric_rubrics():
    judge = rubric_judge()
    sample_rubrics = {k: v.replace("Custom", "Per-sample") for k, v in CUSTOM_RUBRICS.items()}
    RubricsScore(llm=judge, rubrics=CUSTOM_RUBRICS).score(**EINSTEIN, rubrics=sample_rubrics)
    system = user_text(judge.requests[0])
    assert all(d in system for d in sample_rubrics.values())
    assert not any(d in system for d in CUSTOM_RUBRICS.values())


@pytest.mark.parametrize("has_reference, default", [(True, DEFAULT_WITH_REFERENCE),
                                                    (False, DEFAULT_WITHOUT_REFERENCE)])
def test_rubrics_default_depends_on_the_reference(has_reference, default):
    judge = rubric_judge()
    sample = EINSTEIN if has_reference else {k: v for k, v in EINSTEIN.items() if k != "reference"}
    RubricsScore(llm=judge).score(**sample)
    assert all(d in user_text(judge.requests[0]) for d in default.values())


@pytest.mark.parametrize("rubrics", [
    {k: v for k, v in CUSTOM_RUBRICS.items() if k != "score5_description"},  # a level missing
    {**CUSTOM_RUBRICS, "score6_description": "extra"},  # an extra level
    {f"score{i}": "d" for i in range(1, 6)},  # wrong key names
    {f"score{i}_description": "d" for i in range(0, 5)},
])
def test_rubrics_with_bad_keys_are_refused(rubrics):
    with pytest.raises(ValueError, match="score1_description"):
        RubricsScore(rubrics=rubrics)


# ---- language -----------------------------------------------------------------------------------------

CJK = re.compile(r"[\u4e00-\u9fff]")

ZH_SAMPLE = dict(
    user_input="企业级 API 接口报错 40301 代表什么？",
    retrieved_contexts=["40301 错误代表租户 Token 已过期或未分配对应接口的 RBAC 权限。"],
    response="40301 表示权限不足或 Token 已失效。",
    reference="40301 表示租户 Token 已过期或没有接口权限。",
)


def requests_of(metric_cls, sample: dict, **options) -> list:
    """Every judge request `metric_cls` makes for `sample`."""
    judge = ScriptedJudge(any_valid_answer)
    texts = [sample["user_input"], sample["response"], sample["reference"], "generated?"]
    embeddings = TableEmbeddings({t: [1.0, float(i)] for i, t in enumerate(texts)})
    metric_cls(llm=judge, embeddings=embeddings, **options).score(**sample)
    return judge.requests


def prompts_of(metric_cls, sample: dict, **options) -> list[str]:
    """The system turns of every judge call `metric_cls` makes for `sample` (in the prompts' language)."""
    return [system_text(r) for r in requests_of(metric_cls, sample, **options)]


@pytest.mark.parametrize("metric_cls", ALL)
def test_a_metric_declares_exactly_the_constraints_it_asks_for(metric_cls):
    """A started vLLM server compiles the declared constraints before the run (engines/vllm_launch.py), so an
    undeclared one would be compiled mid-run, holding its requests (issue 17)."""
    for sample in (EINSTEIN, ZH_SAMPLE):
        judge = ScriptedJudge(any_valid_answer)
        texts = [sample["user_input"], sample["response"], sample["reference"], "generated?"]
        metric = metric_cls(llm=judge, embeddings=TableEmbeddings({t: [1.0, float(i)] for i, t in enumerate(texts)}))
        metric.score(**sample)
        assert {r.constraint.key for r in judge.requests} == {c.key for c in metric.constraints}
        assert {c.key for c in metric.constraints} <= {c.key for c in judge_constraints()}


def test_declared_constraints_follow_the_metric_settings():
    assert AnswerRelevancy(strictness=5).constraints == (questions_schema(5),)
    assert questions_schema(3) in judge_constraints()  # the default strictness is compiled at server start
    assert len({c.key for c in judge_constraints()}) == len(judge_constraints())


@pytest.mark.parametrize("metric_cls", ALL)
def test_chinese_input_gets_chinese_prompts(metric_cls):
    prompts = prompts_of(metric_cls, ZH_SAMPLE)
    assert prompts and all(CJK.search(p) for p in prompts)


@pytest.mark.parametrize("metric_cls", ALL)
def test_english_input_gets_english_prompts(metric_cls):
    prompts = prompts_of(metric_cls, EINSTEIN)
    assert prompts and not any(CJK.search(p) for p in prompts)


@pytest.mark.parametrize("metric_cls", [Faithfulness, AnswerAccuracy])
def test_language_can_be_forced(metric_cls):
    assert all(CJK.search(p) for p in prompts_of(metric_cls, EINSTEIN, language="zh"))
    assert not any(CJK.search(p) for p in prompts_of(metric_cls, ZH_SAMPLE, language="en"))


@pytest.mark.parametrize("text, lang", [
    ("When was Einstein born?", "en"),
    ("北京是中国的首都吗？", "zh"),
    ("企业级 API 接口报错 40301 代表什么？", "zh"),  # mostly CJK, with some Latin letters
    ("What does 北京 mean in English?", "en"),  # mostly Latin
    ("", "en"),
    ("40301 ???", "en"),  # no letters at all
    ("日本の首都はどこですか？", "ja"),  # kanji with kana: Japanese, not Chinese
    ("東京都人口統計", "zh"),  # kanji alone cannot be told from Chinese
    ("アインシュタインはいつ生まれましたか？", "ja"),
    ("서울은 한국의 수도입니까?", "ko"),
    ("대한민국의 首都는 서울이다.", "ko"),  # hangul with some hanja
])
def test_detect_language(text, lang):
    assert detect_language(text) == lang


JA_SAMPLE = dict(user_input="アインシュタインはいつ生まれましたか？", retrieved_contexts=["アインシュタインは1879年に生まれた。"],
                 response="アインシュタインは1879年に生まれました。", reference="1879年3月14日に生まれた。")
KO_SAMPLE = dict(user_input="아인슈타인은 언제 태어났나요?", retrieved_contexts=["아인슈타인은 1879년에 태어났다."],
                 response="아인슈타인은 1879년에 태어났습니다.", reference="1879년 3월 14일에 태어났다.")


@pytest.mark.parametrize("metric_cls", ALL)
@pytest.mark.parametrize("sample, name", [(JA_SAMPLE, "Japanese"), (KO_SAMPLE, "Korean")])
def test_japanese_and_korean_get_english_prompts_that_ask_for_their_language(metric_cls, sample, name):
    requests = requests_of(metric_cls, sample)
    assert requests and not any(CJK.search(system_text(r)) for r in requests)  # never the Chinese prompts
    hint = f"write the text you generate (claims, questions, feedback) in {name}."
    for r in requests:  # the requests that generate text ask for the input's language; yes/no and ratings not
        assert user_text(r).endswith(hint) is (r.tag in ("claims", "reference_claims", "questions", "rubric")), r.tag
    forced = requests_of(metric_cls, EINSTEIN, language="ja")  # an English input, forced to Japanese
    assert {r.tag for r in forced if user_text(r).endswith(hint.replace(name, "Japanese"))} == {
        r.tag for r in requests if user_text(r).endswith(hint)}


@pytest.mark.parametrize("metric", [Faithfulness(), ContextRecall(), AnswerCorrectness(weights=(1, 0))])
def test_claims_are_taken_from_the_text_alone_never_from_the_question(metric):
    """The question never reaches claim extraction: shown it, the default judge took claims from it."""
    from offline_eval.dataset import SingleTurnSample

    sample = SingleTurnSample(user_input="Was Marie Curie born in Warsaw in 1867?",
                              response="She won two Nobel Prizes.", reference="Marie Curie won two Nobel Prizes.",
                              retrieved_contexts=["Marie Curie won the Nobel Prize in 1903 and in 1911."])
    first_stage = next(metric.plan(sample, "en"))
    extractions = [r for r in first_stage if "claims" in r.tag]
    assert extractions
    for request in extractions:
        shown = "\n".join(m["content"] for m in request.chat())
        assert "Warsaw" not in shown and ("She won two Nobel Prizes." in shown or "Marie Curie won two" in shown)
