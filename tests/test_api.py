"""The Ragas-shaped public API, with a scripted judge: metric.score/ascore/batch_score, the legacy
SingleTurnSample API, evaluate() and its result, and request deduplication across metrics and samples.

The snippets from the seed documents (the Ragas "Nvidia Metrics" page and the Faithfulness / Answer
Relevance article) are run as written, with the judge and embeddings passed in.
"""

import asyncio
import math
import re

import datasets
import pytest

from offline_eval import MetricResult, SingleTurnSample, ValidationError, evaluate
from offline_eval.metrics import answer_relevance, answer_relevancy, faithfulness
from offline_eval.metrics.collections import (AnswerAccuracy, AnswerCorrectness, AnswerRelevancy, ContextPrecision,
                                              ContextRecall, ContextRelevance, Faithfulness, ResponseGroundedness,
                                              RubricsScore)
from scripted import ScriptedJudge, TableEmbeddings, user_text


def constant_judge(answer: str) -> ScriptedJudge:
    return ScriptedJudge(lambda request: answer)


def only(table: dict, text: str):
    """The value of the one key of `table` that occurs in `text`."""
    (value,) = [v for k, v in table.items() if k in text]
    return value


def rag_judge(claims: dict[str, list[str]], supported: set[str],
              questions: dict[str, list[tuple[str, int]]]) -> ScriptedJudge:
    """Claims by the text they are extracted from, "yes" for the supported claims, and generated
    (question, noncommittal) pairs by response."""

    def answer(request):
        text = user_text(request)
        if request.tag in ("claims", "reference_claims"):
            return {"claims": only(claims, text)}
        if request.tag == "questions":
            return {"questions": [{"question": q, "noncommittal": n} for q, n in only(questions, text)]}
        return "yes" if any(claim in text for claim in supported) else "no"

    return ScriptedJudge(answer)


# ---- the Nvidia metrics page: collections API and legacy API -----------------------------------------

EINSTEIN_CONTEXTS = ["Albert Einstein was born March 14, 1879.",
                     "Albert Einstein was born at Ulm, in Württemberg, Germany."]

NVIDIA_EXAMPLES = [  # (metric, inputs, the top rating both judges give in the page's worked example)
    (AnswerAccuracy, dict(user_input="When was Einstein born?", response="Albert Einstein was born in 1879.",
                          reference="Albert Einstein was born in 1879."), "4"),
    (ContextRelevance, dict(user_input="When and Where Albert Einstein was born?",
                            retrieved_contexts=EINSTEIN_CONTEXTS), "2"),
    (ResponseGroundedness, dict(response="Albert Einstein was born in 1879.",
                                retrieved_contexts=EINSTEIN_CONTEXTS), "2"),
]


@pytest.mark.parametrize("metric_cls, inputs, top", NVIDIA_EXAMPLES)
def test_score(metric_cls, inputs, top):
    scorer = metric_cls(llm=constant_judge(top))
    result = scorer.score(**inputs)
    assert isinstance(result, MetricResult)
    assert result.value == 1.0
    assert isinstance(result.reason, str) and result.reason
    assert [call["stage"] for call in result.judge_calls] == ["judge1", "judge2"]


@pytest.mark.parametrize("metric_cls, inputs, top", NVIDIA_EXAMPLES)
def test_ascore(metric_cls, inputs, top):
    scorer = metric_cls(llm=constant_judge(top))
    result = asyncio.run(scorer.ascore(**inputs))
    assert result.value == 1.0


@pytest.mark.parametrize("metric_cls, inputs, top", NVIDIA_EXAMPLES)
def test_legacy_single_turn_ascore_returns_a_float(metric_cls, inputs, top):
    sample = SingleTurnSample(**inputs)
    scorer = metric_cls(llm=constant_judge(top))
    score = asyncio.run(scorer.single_turn_ascore(sample))
    assert type(score) is float and score == 1.0
    assert scorer.single_turn_score(sample) == 1.0


def test_legacy_score_of_a_sample_without_a_value_is_nan():
    sample = SingleTurnSample(response="I don't know.", retrieved_contexts=EINSTEIN_CONTEXTS)
    scorer = Faithfulness(llm=ScriptedJudge(lambda request: {"claims": []}))
    assert math.isnan(asyncio.run(scorer.single_turn_ascore(sample)))


def test_batch_score_keeps_input_order():
    ratings = {"He was born in 1879.": "4", "He was born in 1880.": "0", "He was born in the 1870s.": "2"}
    judge = ScriptedJudge(lambda request: only(ratings, user_text(request)))
    inputs = [dict(user_input="When was Einstein born?", response=r,
                   reference="Albert Einstein was born on 14 March 1879.") for r in ratings]
    results = AnswerAccuracy(llm=judge, scoring="argmax").batch_score(inputs)
    assert [r.value for r in results] == [1.0, 0.0, 0.5]


def test_invalid_inputs_raise_before_any_judge_call():
    judge = constant_judge("4")
    with pytest.raises(ValidationError, match="row 2: field 'reference' is missing"):
        AnswerAccuracy(llm=judge).batch_score([NVIDIA_EXAMPLES[0][1], {"user_input": "q", "response": "a"}])
    assert judge.requests == []


def test_collections_names_every_metric():
    metrics = [AnswerAccuracy, ContextRelevance, ResponseGroundedness, Faithfulness, AnswerRelevancy,
               ContextPrecision, ContextRecall, AnswerCorrectness, RubricsScore]
    assert [m.name for m in metrics] == [
        "answer_accuracy", "context_relevance", "response_groundedness", "faithfulness", "answer_relevancy",
        "context_precision", "context_recall", "answer_correctness", "rubrics_score"]
    assert answer_relevance is answer_relevancy


# ---- evaluate() ---------------------------------------------------------------------------------------

TOWER = "Where is the Eiffel Tower?"
TOWER_ROWS = [
    {"user_input": TOWER, "retrieved_contexts": ["The Eiffel Tower stands in Paris."],
     "response": "It is in Paris.", "notes": "short"},
    {"user_input": TOWER, "retrieved_contexts": ["The Eiffel Tower stands in Paris."],
     "response": "The tower is in Paris and 500 m tall.", "notes": "wrong height"},
    {"user_input": TOWER, "retrieved_contexts": ["The Eiffel Tower stands in Paris."],
     "response": "I don't know.", "notes": "evasive"},
]
TOWER_JUDGE = dict(
    claims={"It is in Paris.": ["The Eiffel Tower is in Paris."],
            "The tower is in Paris and 500 m tall.": ["The Eiffel Tower is in Paris.",
                                                      "The Eiffel Tower is 500 m tall."],
            "I don't know.": []},
    supported={"The Eiffel Tower is in Paris."},
    questions={"It is in Paris.": [("Where is the tower?", 0), ("Where is the Eiffel Tower?", 0),
                                   ("In which city is the Eiffel Tower?", 0)],
               "The tower is in Paris and 500 m tall.": [("Where is the tower?", 0), ("How tall is it?", 0),
                                                         ("Where and how tall is it?", 0)],
               "I don't know.": [("Where is the tower?", 1), ("Where is it?", 1), ("What is it?", 1)]},
)
TOWER_EMBEDDINGS = {  # cosine with the user input [1, 0]: 1, 1, 1, 0.6, 0.8, and 0s for the evasive one
    TOWER: [1, 0], "Where is the tower?": [1, 0], "In which city is the Eiffel Tower?": [2, 0],
    "How tall is it?": [3, 4], "Where and how tall is it?": [4, 3], "Where is it?": [0, 1], "What is it?": [0, 1],
}


def evaluate_tower(metrics):
    return evaluate(TOWER_ROWS, metrics=metrics, llm=rag_judge(**TOWER_JUDGE),
                    embeddings=TableEmbeddings(TOWER_EMBEDDINGS), show_progress=False)


def test_evaluate_means_leave_out_samples_without_a_value():
    results = evaluate_tower([faithfulness, answer_relevancy])
    assert results.values("faithfulness") == [1.0, 0.5, None]  # "I don't know." makes no claims
    assert results["faithfulness"] == pytest.approx(0.75)
    assert results.values("answer_relevancy") == pytest.approx([1.0, (1 + 0.6 + 0.8) / 3, 0.0])
    assert results["answer_relevancy"] == pytest.approx(0.6)
    assert results.summary()["faithfulness"] == {"mean": pytest.approx(0.75), "scored": 2, "no_value": 1,
                                                 "coverage": pytest.approx(2 / 3), "failed_calls": 0}


def test_answer_relevance_is_an_alias_in_results_and_metric_names():
    by_instance = evaluate_tower([faithfulness, answer_relevance])
    by_name = evaluate_tower(["faithfulness", "answer_relevance"])
    assert by_name.metric_names == by_instance.metric_names == ["faithfulness", "answer_relevancy"]
    assert by_name["answer_relevance"] == by_instance["answer_relevancy"] == pytest.approx(0.6)
    with pytest.raises(KeyError, match="context_recall"):
        by_name["context_recall"]


def test_to_pandas_has_one_row_per_sample():
    frame = evaluate_tower([faithfulness, answer_relevancy]).to_pandas()
    assert len(frame) == 3
    assert {"notes", "user_input", "retrieved_contexts", "response", "faithfulness",
            "answer_relevancy"} <= set(frame.columns)
    assert frame["notes"].tolist() == ["short", "wrong height", "evasive"]
    assert frame["faithfulness"].tolist()[:2] == [1.0, 0.5]
    assert math.isnan(frame["faithfulness"].iloc[2])


def test_article_example_two_chinese_rows(capsys):
    eval_data = {
        "question": ["公司的远程办公申请审批流是怎样的？", "企业级 API 接口报错 40301 代表什么？"],
        "contexts": [["员工需在 OA 系统提交远程办公申请，由直属 Leader 审批后抄送 HR 备案。"],
                     ["40301 错误代表租户 Token 已过期或未分配对应接口的 RBAC 权限。"]],
        "answer": ["您需要在 OA 提单，直属主管审批通过并抄送 HR 即可生效。", "40301 表示权限不足或 Token 已失效。"],
    }
    dataset = datasets.Dataset.from_dict(eval_data)
    remote, error = eval_data["answer"]
    judge = rag_judge(
        claims={remote: ["远程办公需要在 OA 提单。", "远程办公申请由直属主管审批。", "审批后抄送 HR。"],
                error: ["40301 表示权限不足。", "40301 表示 Token 已失效。"]},
        supported={"远程办公需要在 OA 提单。", "远程办公申请由直属主管审批。", "审批后抄送 HR。",
                   "40301 表示权限不足。", "40301 表示 Token 已失效。"},
        questions={remote: [("远程办公怎么申请？", 0), ("远程办公要谁审批？", 0), ("远程办公要抄送谁？", 0)],
                   error: [("40301 是什么错误？", 0), ("40301 怎么解决？", 0), ("40301 代表什么？", 0)]},
    )
    embeddings = TableEmbeddings({
        eval_data["question"][0]: [1, 0, 0], "远程办公怎么申请？": [1, 0, 0], "远程办公要谁审批？": [3, 4, 0],
        "远程办公要抄送谁？": [4, 3, 0],  # cosines 1, 0.6, 0.8: mean 0.8
        eval_data["question"][1]: [0, 0, 1], "40301 是什么错误？": [0, 0, 1], "40301 怎么解决？": [0, 0, 2],
        "40301 代表什么？": [0, 0, 1],  # mean 1.0
    })

    results = evaluate(dataset=dataset, metrics=[faithfulness, answer_relevance], llm=judge,
                       embeddings=embeddings, show_progress=False)
    print("【自动化评测大盘】:")
    print(f"全局忠实度 (Faithfulness): {results['faithfulness']:.4f}")
    print(f"全局答案相关性 (Answer Relevance): {results['answer_relevance']:.4f}")

    assert capsys.readouterr().out.splitlines() == [
        "【自动化评测大盘】:",
        "全局忠实度 (Faithfulness): 1.0000",
        "全局答案相关性 (Answer Relevance): 0.9000",
    ]
    assert results["faithfulness"] >= 0.90  # the article's CI gate
    assert all(re.search(r"[\u4e00-\u9fff]", r.messages[0][1]) for r in judge.requests)  # Chinese prompts


# ---- deduplication ------------------------------------------------------------------------------------

HAMLET = {"user_input": "Who wrote Hamlet?",
          "retrieved_contexts": ["Hamlet is a tragedy written by William Shakespeare around 1600."],
          "response": "William Shakespeare wrote Hamlet around 1600.",
          "reference": "William Shakespeare wrote Hamlet around 1600."}  # reference == response
HAMLET_CLAIMS = ["William Shakespeare wrote Hamlet.", "Hamlet was written around 1600."]


@pytest.mark.parametrize("rows, metrics", [
    ([HAMLET], [Faithfulness, ContextRecall]),  # same claims and verdict requests from two metrics
    ([HAMLET, HAMLET], [Faithfulness]),  # the same requests from two samples
])
def test_identical_requests_are_sent_once(rows, metrics):
    judge = rag_judge(claims={HAMLET["response"]: HAMLET_CLAIMS}, supported=set(HAMLET_CLAIMS), questions={})
    result = evaluate(rows, metrics=[m() for m in metrics], llm=judge, show_progress=False)
    per_metric = [len(res.judge_calls) for row in result.results.values() for res in row.values()]
    assert per_metric == [3, 3]  # one extraction and two verdicts each
    assert len(judge.requests) == 3
    assert result.stats.judge_calls == 3 and result.stats.deduplicated == 3
    assert all(value == 1.0 for scores in result.scores for value in scores.values())
