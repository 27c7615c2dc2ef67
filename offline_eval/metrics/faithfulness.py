"""Faithfulness: the share of the response's claims that the retrieved contexts support.

Stage 1 splits the response into atomic claims (bounded JSON list); stage 2 asks, for each claim, whether
the contexts support it (yes/no). Score = supported / total. A response with no claims (e.g. "I don't
know") has nothing to be unfaithful about: its value is None (Ragas gives NaN) and it is left out of means.
"""

from __future__ import annotations

from ..dataset import SingleTurnSample
from .base import YES_NO, Metric, Plan
from .claims import CLAIMS, claims_supported_by, longest_check


class Faithfulness(Metric):
    name = "faithfulness"
    required = ("response", "retrieved_contexts")
    constraints = (CLAIMS, YES_NO)

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        return (yield from claims_supported_by(sample.response, sample.retrieved_contexts, lang, "response"))

    def context_probes(self, sample: SingleTurnSample, lang: str):
        return [longest_check(sample.response, sample.retrieved_contexts, lang)]
