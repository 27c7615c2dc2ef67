"""Response Groundedness (NVIDIA): is the response supported by the retrieved contexts?

Two judge templates rate 0, 1 or 2; each rating is divided by 2 and the score is the mean of the valid ones.
The probability scoring combines the two templates' distributions with the first, fuller rubric weighted 3:1
(TEMPLATE_WEIGHTS).
"""

from __future__ import annotations

from ..constraints import Choice
from ..dataset import SingleTurnSample
from .base import Metric, Plan, request, two_judges

RATING = Choice(("0", "1", "2"))

_JUDGE1 = {
    "en": """You check whether an Assertion is grounded in a Context: whether the Context states what the Assertion says.
Rate 2 (fully grounded) if every fact in the Assertion is stated in the Context, possibly in other words. Words that carry no information, such as "yes", "I agree" or "good question", do not count.
Rate 1 (partially grounded) if some of the Assertion is stated in the Context, but at least one other statement is not, or a detail is changed (a different name, number, date, place or meaning).
Rate 0 (not grounded) if the main content of the Assertion is not in the Context, or the Assertion contradicts the Context.
Use only the Context, never your own knowledge. Reply with the rating only: 0, 1 or 2.""",
    "zh": """你负责判断一段断言是否以上下文为依据：上下文是否陈述了断言所说的内容。
如果断言中的每个事实都在上下文中有陈述（措辞可以不同），打 2 分（完全有依据）。不含信息的话，如"是的""我同意""好问题"，不计入。
如果断言的一部分在上下文中有陈述，但至少有一处其他陈述在上下文中找不到，或某个细节被改动（名称、数字、日期、地点或含义不同），打 1 分（部分有依据）。
如果断言的主要内容不在上下文中，或断言与上下文矛盾，打 0 分（没有依据）。
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

_ITEM = {
    "en": "### Assertion: {a}\n\nThe groundedness rating (0, 1 or 2) is:",
    "zh": "### 断言：{a}\n\n依据性评分（0、1 或 2）：",
}

# Exponents of the two templates' distributions in their product (metrics/base.py joint_top_probability). On
# BEGIN dev, the tuning set, the first template alone ranked better than the second (ROC-AUC 0.955 vs 0.902)
# and than the plain product (0.938), whose firmness set kappa at 0.5 (0.65; the first alone 0.30). 1.5 and
# 0.5 keep the product's sum of 2 and lean on the first: 0.955, kappa 0.70. On the held-out sets the change is
# small and within its intervals (ROC-AUC CiteCheck +0.010, WiCE +0.003; README, "How well the default judge
# agrees with people"); it was adopted by a rule fixed before they were measured.
TEMPLATE_WEIGHTS = (1.5, 0.5)

LABELS = {"0": "the response is not grounded in the contexts",
          "1": "the response is partially grounded in the contexts",
          "2": "the response is fully grounded in the contexts"}


class ResponseGroundedness(Metric):
    name = "response_groundedness"
    required = ("response", "retrieved_contexts")
    shows_contexts = True
    constraints = (RATING,)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        item, contexts = _ITEM[lang].format(a=sample.response), sample.retrieved_contexts
        first = request(lang, _JUDGE1[lang], item, RATING, "judge1", contexts)
        second = request(lang, _JUDGE2[lang], item, RATING, "judge2", contexts)
        return (yield from two_judges(first, second, 2, LABELS, TEMPLATE_WEIGHTS))
