"""Context Recall: how much of the reference answer the retrieved contexts cover.

The reference is split into atomic claims and each claim is checked against the contexts (the same two
stages Faithfulness uses, applied to the reference). Score = attributed claims / all claims; None when the
reference states no claims.
"""

from __future__ import annotations

from ..dataset import SingleTurnSample
from .base import YES_NO, Metric, Plan
from .claims import CLAIMS, claims_supported_by, longest_check


class ContextRecall(Metric):
    name = "context_recall"
    required = ("user_input", "retrieved_contexts", "reference")
    constraints = (CLAIMS, YES_NO)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        return (yield from claims_supported_by(sample.reference, sample.retrieved_contexts, lang, "reference",
                                               tag="reference_claims"))

    def context_probes(self, sample: SingleTurnSample, lang: str):
        return [longest_check(sample.reference, sample.retrieved_contexts, lang)]
