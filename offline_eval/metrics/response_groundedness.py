"""Response Groundedness (NVIDIA): is the response supported by the retrieved contexts?

Two judge templates rate 0, 1 or 2; each rating is divided by 2 and the score is the mean of the valid ones.
"""

from __future__ import annotations

from ..constraints import Choice
from ..dataset import SingleTurnSample
from .base import Metric, Plan, numbered, request, two_judges

RATING = Choice(("0", "1", "2"))

_JUDGE1 = {
    "en": """You are an expert who rates whether an Assertion is grounded in a Context.
Say 0 if the Assertion is not supported by the Context, or contradicts it.
Say 1 if the Assertion is only partially supported: some of what it states is not in the Context.
Say 2 if everything the Assertion states is supported by the Context.
Use only the Context, not your own knowledge. Reply with the rating only: 0, 1 or 2.""",
    "zh": """你是一名专家，负责判断一段断言是否以给定上下文为依据。
如果断言得不到上下文的支持，或与上下文矛盾，打 0 分。
如果断言只得到部分支持：其中一些内容在上下文中找不到，打 1 分。
如果断言的所有内容都得到上下文的支持，打 2 分。
只依据上下文，不要使用你自己的知识。只回复分数：0、1 或 2。""",
}

_JUDGE2 = {
    "en": """As a specialist in checking statements against sources, I rate how well the Context supports the Assertion.
0: the Context does not support the Assertion (unsupported or contradicted).
1: the Context supports part of the Assertion, but not all of it.
2: the Context fully supports every part of the Assertion.
I reply with the rating only: 0, 1 or 2.""",
    "zh": """作为核查陈述与来源的专家，我评估上下文对断言的支持程度。
0：上下文不支持该断言（无依据或相互矛盾）。
1：上下文支持断言的一部分，但不是全部。
2：上下文完全支持断言的每一部分。
我只回复分数：0、1 或 2。""",
}

_USER = {
    "en": "### Context:\n{c}\n\n### Assertion: {a}\n\nThe groundedness rating (0, 1 or 2) is:",
    "zh": "### 上下文：\n{c}\n\n### 断言：{a}\n\n依据性评分（0、1 或 2）：",
}

LABELS = {"0": "the response is not grounded in the contexts",
          "1": "the response is partially grounded in the contexts",
          "2": "the response is fully grounded in the contexts"}


class ResponseGroundedness(Metric):
    name = "response_groundedness"
    required = ("response", "retrieved_contexts")

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        user = _USER[lang].format(c=numbered(sample.retrieved_contexts), a=sample.response)
        first = request(_JUDGE1[lang], user, RATING, "judge1")
        second = request(_JUDGE2[lang], user, RATING, "judge2")
        return (yield from two_judges(first, second, 2, LABELS))
