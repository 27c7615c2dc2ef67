"""Rubric score: the judge grades the response 1-5 against a rubric that describes each score.

Give the rubric to the metric (`RubricsScore(rubrics={...})`) or per sample in a `rubrics` field; the keys
are "score1_description" ... "score5_description" as in Ragas. Without one, a default rubric is used
(with or without reference, depending on the sample). As in Ragas, the value is the raw score 1-5, not
scaled to [0, 1]; the judge's short feedback is the reason.
"""

from __future__ import annotations

from typing import Optional

from ..constraints import JsonSchema, enum, obj, string
from ..dataset import SingleTurnSample
from .base import Metric, MetricResult, Plan, request

MAX_FEEDBACK_CHARS = 300

SCORE = JsonSchema.of(obj(feedback=string(MAX_FEEDBACK_CHARS), score=enum(1, 2, 3, 4, 5)), "rubric_score")

DEFAULT_WITH_REFERENCE = {
    "score1_description": "The response is incorrect or does not address the question; it contradicts the reference.",
    "score2_description": "The response is mostly incorrect; only a small part agrees with the reference.",
    "score3_description": "The response is partly correct: it agrees with the reference on some key points but misses or gets others wrong.",
    "score4_description": "The response is mostly correct and agrees with the reference, with minor omissions or inaccuracies.",
    "score5_description": "The response is fully correct and complete, and agrees with the reference in every key point.",
}

DEFAULT_WITHOUT_REFERENCE = {
    "score1_description": "The response does not address the question or is clearly wrong or unsupported.",
    "score2_description": "The response addresses the question poorly, with major errors or gaps.",
    "score3_description": "The response partly answers the question but has noticeable errors or gaps.",
    "score4_description": "The response answers the question well, with minor issues.",
    "score5_description": "The response answers the question fully, accurately and clearly.",
}

_PROMPT = {
    "en": """You grade a response from 1 to 5 using only the scoring rubric below.
First write brief feedback (one or two sentences) explaining the grade, then give the score.
Reply with JSON: {{"feedback": "...", "score": N}}

Scoring rubric:
{rubric}""",
    "zh": """你只根据下面的评分细则，给一段回答打 1 到 5 分。
先写简短的反馈（一两句话）说明理由，再给出分数。反馈用中文书写。
只输出 JSON：{{"feedback": "...", "score": N}}

评分细则：
{rubric}""",
}

_LABELS = {
    "en": {"q": "Question", "a": "Response", "r": "Reference answer"},
    "zh": {"q": "问题", "a": "回答", "r": "参考答案"},
}


def rubric_text(rubrics: dict[str, str]) -> str:
    return "\n".join(f"Score {k.removeprefix('score').split('_')[0]}: {v}" for k, v in sorted(rubrics.items()))


class RubricsScore(Metric):
    name = "rubrics_score"
    required = ("response",)
    shows_contexts = True
    constraints = (SCORE,)

    def __init__(self, llm=None, embeddings=None, rubrics: Optional[dict[str, str]] = None, **kwargs):
        super().__init__(llm, embeddings, **kwargs)
        if rubrics is not None:
            check_rubrics(rubrics)
        self.rubrics = rubrics

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        rubrics = sample.rubrics or self.rubrics
        if rubrics is None:
            rubrics = DEFAULT_WITH_REFERENCE if sample.reference else DEFAULT_WITHOUT_REFERENCE
        check_rubrics(rubrics)
        label = _LABELS[lang]
        parts = []
        if sample.user_input:
            parts.append(f"{label['q']}: {sample.user_input}")
        parts.append(f"{label['a']}: {sample.response}")
        if sample.reference:
            parts.append(f"{label['r']}: {sample.reference}")
        task = _PROMPT[lang].format(rubric=rubric_text(rubrics))
        (out,) = yield [request(lang, task, "\n\n".join(parts), SCORE, "rubric",
                                (sample.retrieved_contexts or None))]
        if out.value is None:
            return MetricResult(None, f"grading failed: {out.meta.get('error')}")
        return MetricResult(float(out.value["score"]), out.value["feedback"], dict(out.value))


def check_rubrics(rubrics: dict[str, str]) -> None:
    expected = {f"score{i}_description" for i in range(1, 6)}
    if not isinstance(rubrics, dict) or set(rubrics) != expected:
        raise ValueError(f"rubrics must have exactly the keys {sorted(expected)}")
