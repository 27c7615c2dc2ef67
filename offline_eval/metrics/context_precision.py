"""Context Precision (with reference): are the useful contexts ranked first?

For each retrieved context the judge says whether it was useful for arriving at the reference answer
(yes/no). The score is the average precision of those verdicts:
    sum_k (precision@k * v_k) / (number of useful contexts)
and 0 when no context is useful. A verdict call that failed is no verdict: that context is left out of the
ranking (it is not "not useful"), and the score is None when no verdict is valid.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..dataset import SingleTurnSample
from .base import YES_NO, Metric, MetricResult, Plan, p_yes, request, verdict

_PROMPT = {
    "en": """You are given one retrieved context (above), a question and its reference answer.
Answer "yes" if the context was useful in arriving at the reference answer: it contains information that the answer uses or that supports it.
Answer "no" if the context does not help to arrive at the reference answer.""",
    "zh": """给定一段检索到的上下文（见上文）、一个问题和它的参考答案。
如果这段上下文有助于得出参考答案（包含参考答案用到或能支持参考答案的信息），回答 "yes"。
如果这段上下文对得出参考答案没有帮助，回答 "no"。""",
}

_ITEM = {
    "en": "Question: {q}\nReference answer: {r}\n\nWas the context useful in arriving at the reference answer? Answer yes or no.",
    "zh": "问题：{q}\n参考答案：{r}\n\n这段上下文是否有助于得出参考答案？回答 yes 或 no。",
}


def average_precision(verdicts: Sequence[Optional[float]]) -> Optional[float]:
    """Average precision over the ranked verdicts: True/False, or the probability of "useful" (a soft
    verdict counts that share of a hit). Failed verdicts (None) are left out; None if all failed."""
    valid = [float(v) for v in verdicts if v is not None]
    if not valid:
        return None
    hits, total = 0.0, 0.0
    for k, useful in enumerate(valid, 1):
        hits += useful
        total += hits / k * useful
    return total / hits if hits else 0.0


class ContextPrecision(Metric):
    name = "context_precision"
    required = ("user_input", "retrieved_contexts", "reference")
    shows_contexts = True
    constraints = (YES_NO,)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        q, r = sample.user_input, sample.reference
        # One call per context, showing that context alone (Ragas' semantics): each context is computed once.
        item = _ITEM[lang].format(q=q, r=r)
        outputs = yield [request(lang, _PROMPT[lang], item, YES_NO, f"context[{i}]", [c])
                         for i, c in enumerate(sample.retrieved_contexts)]
        verdicts = [verdict(o) for o in outputs]
        marks = "".join({True: "1", False: "0", None: "?"}[v] for v in verdicts)
        reason = f"usefulness of the contexts in rank order: {marks}"
        if None in verdicts:  # "?" marks them
            reason += f" ({verdicts.count(None)} of {len(verdicts)} verdicts failed, left out of the ranking)"
        ap = average_precision(verdicts)
        return MetricResult(ap, reason, {"verdicts": verdicts},
                            scores={"argmax": ap, "probability": average_precision([p_yes(o) for o in outputs])})
