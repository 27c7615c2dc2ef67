"""Faithfulness: the share of the response's claims that the retrieved contexts support.

Stage 1 splits the response into atomic claims (bounded JSON list); stage 2 asks, for each claim, whether
the contexts support it (yes/no). Score = supported / total. A response with no claims (e.g. "I don't
know") has nothing to be unfaithful about: its value is None (Ragas gives NaN) and it is left out of means.
"""

from __future__ import annotations

from ..dataset import SingleTurnSample
from .base import Metric, MetricResult, Plan, verdict
from .claims import check_claim, claims_of, extract_claims, supported_share, verdict_lines


class Faithfulness(Metric):
    name = "faithfulness"
    required = ("response", "retrieved_contexts")

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        (claims_out,) = yield [extract_claims(sample.response, sample.user_input, lang)]
        claims = claims_of(claims_out)
        if claims is None:
            return MetricResult(None, f"claim extraction failed: {claims_out.meta.get('error')}")
        if not claims:
            return MetricResult(None, "the response makes no factual claims", {"claims": []})
        outputs = yield [check_claim(c, sample.retrieved_contexts, lang, f"verdict[{i}]")
                         for i, c in enumerate(claims)]
        verdicts = [verdict(o) for o in outputs]
        score = supported_share(verdicts)
        supported = sum(v is True for v in verdicts)
        reason = f"{supported}/{len(claims)} claims supported by the contexts:\n" + verdict_lines(claims, verdicts)
        return MetricResult(score, reason, {"claims": claims, "verdicts": verdicts})
