"""Context Relevance (NVIDIA): do the retrieved contexts, taken together, hold what the question needs?

Two judge templates rate 0, 1 or 2; each rating is divided by 2 and the score is the mean of the valid ones.
"""

from __future__ import annotations

from ..constraints import Choice
from ..dataset import SingleTurnSample
from .base import Metric, Plan, request, two_judges

RATING = Choice(("0", "1", "2"))

_JUDGE1 = {
    "en": """You are an expert who rates how relevant a Context is for answering a Question.
Use only what is written in the Context and the Question, not your own knowledge.
Say 0 if the Context contains no information that helps answer the Question.
Say 1 if the Context contains some relevant information but not enough to fully answer the Question.
Say 2 if the Context contains the information needed to answer the Question.
Reply with the rating only: 0, 1 or 2.""",
    "zh": """你是一名专家，负责评估一段上下文对回答某个问题的相关程度。
只依据上下文和问题中写明的内容，不要使用你自己的知识。
如果上下文中没有任何有助于回答问题的信息，打 0 分。
如果上下文包含部分相关信息，但不足以完整回答问题，打 1 分。
如果上下文包含回答问题所需的信息，打 2 分。
只回复分数：0、1 或 2。""",
}

_JUDGE2 = {
    "en": """As an expert, I determine to what extent a Context provides the information necessary to answer a Question, relying only on the Context and the Question.
0 means the Context is irrelevant to the Question.
1 means the Context is partially relevant: it helps, but something the Question asks for is missing.
2 means the Context is fully relevant: it answers the Question.
I reply with the rating only: 0, 1 or 2.""",
    "zh": """作为专家，我只依据上下文和问题，判断上下文在多大程度上提供了回答问题所需的信息。
0 表示上下文与问题无关。
1 表示上下文部分相关：有帮助，但缺少问题所要求的某些内容。
2 表示上下文完全相关：足以回答问题。
我只回复分数：0、1 或 2。""",
}

_ITEM = {
    "en": "### Question: {q}\n\nThe relevance rating (0, 1 or 2) is:",
    "zh": "### 问题：{q}\n\n相关性评分（0、1 或 2）：",
}

LABELS = {"0": "the contexts are irrelevant", "1": "the contexts are partially relevant",
          "2": "the contexts are fully relevant"}


class ContextRelevance(Metric):
    name = "context_relevance"
    required = ("user_input", "retrieved_contexts")
    shows_contexts = True
    constraints = (RATING,)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        item, contexts = _ITEM[lang].format(q=sample.user_input), sample.retrieved_contexts
        first = request(lang, _JUDGE1[lang], item, RATING, "judge1", contexts)
        second = request(lang, _JUDGE2[lang], item, RATING, "judge2", contexts)
        return (yield from two_judges(first, second, 2, LABELS))
