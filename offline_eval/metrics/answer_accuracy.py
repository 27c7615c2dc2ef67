"""Answer Accuracy (NVIDIA): how well the response agrees with the reference answer.

Two judge templates rate 0, 2 or 4; the second swaps the roles of response and reference. Each rating is
divided by 4 and the score is the mean of the valid ratings.
"""

from __future__ import annotations

from ..constraints import Choice
from ..dataset import SingleTurnSample
from .base import Metric, Plan, request, two_judges

RATING = Choice(("0", "2", "4"))

_JUDGE1 = {
    "en": """You rate a User Answer against a Reference Answer for a Question. The Reference Answer is correct and complete.
Say 4 if the User Answer is fully contained in the Reference Answer and equivalent to it in all terms, topics, numbers, metrics, dates and units.
Say 2 if the User Answer is partially contained in the Reference Answer and almost equivalent to it.
Say 0 if the User Answer is not contained in the Reference Answer, is not accurate in its terms, topics, numbers, metrics, dates or units, or does not answer the Question.
Reply with the rating only: 4, 2 or 0.""",
    "zh": """你需要对照参考答案，为某个问题的用户答案打分。参考答案是正确且完整的。
如果用户答案完全包含在参考答案中，并且在术语、主题、数字、指标、日期和单位上都与参考答案一致，打 4 分。
如果用户答案部分包含在参考答案中，并且与参考答案基本一致，打 2 分。
如果用户答案不包含在参考答案中，或在术语、主题、数字、指标、日期、单位上不准确，或没有回答问题，打 0 分。
只回复分数：4、2 或 0。""",
}

_JUDGE2 = {
    "en": """I will rate the User Answer in comparison to the Reference Answer for a given Question.
A rating of 4 means the User Answer is entirely consistent with the Reference Answer, covering all aspects, topics, numbers, metrics, dates and units.
A rating of 2 means the User Answer is mostly aligned with the Reference Answer, with minor discrepancies.
A rating of 0 means the User Answer is inaccurate, incomplete or unrelated to the Reference Answer, or fails to address the Question.
I reply with the rating only: 4, 2 or 0.""",
    "zh": """我将针对给定问题，把用户答案与参考答案进行比较并打分。
4 分表示用户答案与参考答案完全一致，涵盖所有方面、主题、数字、指标、日期和单位。
2 分表示用户答案与参考答案大体一致，只有细微差异。
0 分表示用户答案不准确、不完整或与参考答案无关，或没有回答问题。
我只回复分数：4、2 或 0。""",
}

_USER = {
    "en": "### Question: {q}\n### User Answer: {a}\n### Reference Answer: {r}\nThe rating is:",
    "zh": "### 问题：{q}\n### 用户答案：{a}\n### 参考答案：{r}\n评分：",
}

LABELS = {"0": "does not match the reference", "2": "partially matches the reference",
          "4": "fully matches the reference"}


class AnswerAccuracy(Metric):
    name = "answer_accuracy"
    required = ("user_input", "response", "reference")
    constraints = (RATING,)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        q, a, r = sample.user_input, sample.response, sample.reference
        first = request(lang, _JUDGE1[lang], _USER[lang].format(q=q, a=a, r=r), RATING, "judge1")
        swapped = request(lang, _JUDGE2[lang], _USER[lang].format(q=q, a=r, r=a), RATING, "judge2")
        return (yield from two_judges(first, swapped, 4, LABELS))
