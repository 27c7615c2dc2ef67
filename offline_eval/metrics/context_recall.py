"""Context Recall: how much of the reference answer the retrieved contexts cover.

The reference is split into atomic claims and each claim is checked against the contexts (the same two
stages Faithfulness uses, applied to the reference). Score = attributed claims / all claims; None when the
reference states no claims.
"""

from __future__ import annotations

from ..dataset import SingleTurnSample
from .base import Metric, MetricResult, Plan, verdict
from .claims import check_claim, claims_of, extract_claims, supported_share, verdict_lines


class ContextRecall(Metric):
    name = "context_recall"
    required = ("user_input", "retrieved_contexts", "reference")

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        (out,) = yield [extract_claims(sample.reference, sample.user_input, lang, "reference_claims")]
        claims = claims_of(out)
        if claims is None:
            return MetricResult(None, f"claim extraction failed: {out.meta.get('error')}")
        if not claims:
            return MetricResult(None, "the reference makes no factual claims", {"claims": []})
        outputs = yield [check_claim(c, sample.retrieved_contexts, lang, f"verdict[{i}]")
                         for i, c in enumerate(claims)]
        verdicts = [verdict(o) for o in outputs]
        found = sum(v is True for v in verdicts)
        reason = f"{found}/{len(claims)} reference claims found in the contexts:\n" + verdict_lines(claims, verdicts)
        return MetricResult(supported_share(verdicts), reason, {"claims": claims, "verdicts": verdicts})
