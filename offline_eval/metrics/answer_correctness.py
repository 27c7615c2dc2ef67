"""Answer Correctness: factual overlap with the reference (F-beta over claims) blended with semantic
similarity, weights 0.75 / 0.25 as in Ragas.

Both the response and the reference are split into claims (the shared claim stage). Each response claim is
checked against the reference (supported: TP, not: FP) and each reference claim against the response (not
covered: FN). Ragas asks for this classification in one JSON call; we ask one yes/no question per claim,
which small judges answer far more reliably, and which reuses Faithfulness' verdict stage.

Deliberate difference: Ragas scores factuality 1.0 whenever either side has no claims; here a side with no
claims simply contributes no TP, so "I don't know" against a factual reference scores factuality 0.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..dataset import SingleTurnSample
from ..run.plan import Embed
from .base import YES_NO, Metric, MetricResult, Plan, p_yes, verdict
from .claims import CLAIMS, check_claim, claims_of, extract_claims, verdict_lines


def fbeta(tp: float, fp: float, fn: float, beta: float = 1.0) -> float:
    """Ragas' F-beta: precision tp/(tp+fp), recall tp/(tp+fn); 1.0 when there is nothing to compare."""
    if tp + fp + fn == 0:
        return 1.0
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    if precision + recall == 0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * precision * recall / (b2 * precision + recall)


def correctness_score(factuality: float, similarity: float, weights: Sequence[float]) -> float:
    return float(np.average([factuality, similarity], weights=weights))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


class AnswerCorrectness(Metric):
    name = "answer_correctness"
    required = ("user_input", "response", "reference")
    needs_embeddings = True
    constraints = (CLAIMS, YES_NO)

    def __init__(self, llm=None, embeddings=None, weights: Sequence[float] = (0.75, 0.25),
                 beta: float = 1.0, **kwargs):
        super().__init__(llm, embeddings, **kwargs)
        if len(weights) != 2 or min(weights) < 0 or sum(weights) == 0:
            raise ValueError("weights must be two non-negative numbers [factuality, similarity], not both 0")
        self.weights = tuple(float(w) for w in weights)
        self.beta = float(beta)
        self.needs_embeddings = self.weights[1] > 0

    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        out_r, out_g = yield [extract_claims(sample.response, lang),
                              extract_claims(sample.reference, lang, "reference_claims")]
        answer, truth = claims_of(out_r), claims_of(out_g)
        if answer is None or truth is None:
            failed = out_r if answer is None else out_g
            return MetricResult(None, f"claim extraction failed: {failed.meta.get('error')}")
        checks = [check_claim(c, [sample.reference], lang, f"in_reference[{i}]", retrieved=False)
                  for i, c in enumerate(answer)]
        checks += [check_claim(c, [sample.response], lang, f"in_response[{i}]", retrieved=False)
                   for i, c in enumerate(truth)]
        items: list = checks + ([Embed((sample.response, sample.reference), lang)] if self.needs_embeddings else [])
        results = yield items
        verdicts: list[Optional[bool]] = [verdict(o) for o in results[:len(checks)]]
        in_ref, in_resp = verdicts[:len(answer)], verdicts[len(answer):]
        tp = sum(v is True for v in in_ref)
        fp = sum(v is False for v in in_ref)
        fn = sum(v is False for v in in_resp)
        factuality = fbeta(tp, fp, fn, self.beta)
        # Soft counts: each verdict's probability of "yes" counts as that much TP (and the rest as FP / FN).
        p_ref = [p for p in map(p_yes, results[:len(answer)]) if p is not None]
        p_resp = [p for p in map(p_yes, results[len(answer):len(checks)]) if p is not None]
        soft = fbeta(sum(p_ref), sum(1 - p for p in p_ref), sum(1 - p for p in p_resp), self.beta)
        similarity = cosine(results[-1][0], results[-1][1]) if self.needs_embeddings else 0.0
        score = correctness_score(factuality, similarity, self.weights)
        reason = (f"factuality F{self.beta:g} {factuality:.2f} (TP {tp}, FP {fp}, FN {fn}), "
                  f"similarity {similarity:.2f}\nresponse claims vs reference:\n{verdict_lines(answer, in_ref)}"
                  f"\nreference claims vs response:\n{verdict_lines(truth, in_resp)}")
        scores = {"argmax": score, "probability": correctness_score(soft, similarity, self.weights)}
        return MetricResult(score, reason, {"tp": tp, "fp": fp, "fn": fn, "factuality": factuality,
                                            "similarity": similarity, "response_claims": answer,
                                            "reference_claims": truth}, scores=scores)
