"""Answer Relevancy: does the response address the question that was asked?

The judge writes `strictness` questions (default 3) that the response would answer, in the input's
language, each with a noncommittal flag. The score is the mean cosine similarity between the embedding of
the user input and those of the generated questions; if every flag says the response is noncommittal
(evasive, "I don't know"), the score is 0 — as in Ragas 0.4.

Unlike Ragas, which samples the question prompt `strictness` times, we ask for all questions in one
constrained call: at temperature 0 repeated samples would be identical, and one call is cheaper.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..constraints import JsonSchema, array, copyable, enum, obj, string
from ..dataset import SingleTurnSample
from ..run.plan import Embed
from .base import Metric, MetricResult, Plan, request

MAX_QUESTION_CHARS = 200

_PROMPT = {
    "en": """You read an answer and write {n} different questions that this answer responds to, each phrased as a user would ask it.
For each question also give "noncommittal": 1 if the answer is evasive, vague or non-committal (for example "I don't know", "I'm not sure", "it depends"), otherwise 0.
Write the questions in English.
Reply with JSON: {{"questions": [{{"question": "...", "noncommittal": 0}}, ...]}}

Example
Answer: Albert Einstein was born in Germany.
{{"questions":[{{"question":"Where was Albert Einstein born?","noncommittal":0}}, ...]}}""",
    "zh": """阅读一段回答，写出 {n} 个不同的问题，使这段回答正好是对这些问题的回答，问题的措辞要像用户提问一样。
每个问题还要给出 "noncommittal"：如果回答含糊、回避或不置可否（例如“我不知道”“我不确定”“视情况而定”），取 1，否则取 0。
问题必须用中文书写。
只输出 JSON：{{"questions": [{{"question": "...", "noncommittal": 0}}, ...]}}

示例
回答：阿尔伯特·爱因斯坦出生于德国。
{{"questions":[{{"question":"爱因斯坦出生在哪里？","noncommittal":0}}, ...]}}""",
}

_USER = {"en": "Answer: {a}", "zh": "回答：{a}"}


def questions_schema(n: int) -> JsonSchema:
    item = obj(question=string(MAX_QUESTION_CHARS, min_length=1), noncommittal=enum(0, 1))
    return JsonSchema.of(obj(questions=array(item, n, min_items=n)), "questions")


def similarities(question_vec: np.ndarray, generated_vecs: np.ndarray) -> np.ndarray:
    """The cosine between the user input and each generated question."""
    q = question_vec / np.linalg.norm(question_vec)
    g = generated_vecs / np.linalg.norm(generated_vecs, axis=1, keepdims=True)
    return g @ q


def relevancy_score(question_vec: np.ndarray, generated_vecs: np.ndarray,
                    noncommittal: Sequence[int]) -> float:
    """Mean cosine between the user input and each generated question; 0 if all are noncommittal."""
    if noncommittal and all(noncommittal):
        return 0.0
    return float(np.mean(similarities(question_vec, generated_vecs)))


class AnswerRelevancy(Metric):
    name = "answer_relevancy"
    required = ("user_input", "response")
    needs_embeddings = True

    def __init__(self, llm=None, embeddings=None, strictness: int = 3, **kwargs):
        super().__init__(llm, embeddings, **kwargs)
        if not 1 <= strictness <= 10:
            raise ValueError("strictness must be between 1 and 10")
        self.strictness = strictness

    @property
    def constraints(self) -> tuple[JsonSchema, ...]:  # a property, not a setting: runs are keyed by vars(metric)
        return (questions_schema(self.strictness),)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        schema = questions_schema(self.strictness)
        task = _PROMPT[lang].format(n=self.strictness)
        (out,) = yield [request(lang, task, _USER[lang].format(a=copyable(sample.response)), schema, "questions")]
        if out.value is None:
            return MetricResult(None, f"question generation failed: {out.meta.get('error')}")
        items = out.value["questions"]
        questions = [it["question"] for it in items]
        flags = [it["noncommittal"] for it in items]
        (vectors,) = yield [Embed((sample.user_input, *questions), lang)]
        score = relevancy_score(vectors[0], vectors[1:], flags)
        if all(flags):
            reason = "the response is noncommittal"
        else:
            reason = "questions the response answers:\n" + "\n".join(f"- {q}" for q in questions)
        cosines = [round(float(c), 4) for c in similarities(vectors[0], vectors[1:])]
        return MetricResult(score, reason, {"questions": questions, "noncommittal": flags, "similarities": cosines})
