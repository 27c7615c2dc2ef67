"""What a metric is: its inputs, its judge stages and its scoring math, and nothing else.

A metric's `plan(sample, lang)` is a generator. Each `yield` hands the scheduler one stage — a list of
`JudgeRequest`s and `Embed`s — and receives their results in the same order; the generator's return value
is the `MetricResult` (that vocabulary lives in plan.py, shared with the run core). So a metric states *what*
to ask, in order (claims, then one verdict per claim), and never calls an engine or loops over a dataset: the
scheduler runs the plans of every sample together and batches each stage across them.

The public methods (`score`, `ascore`, `batch_score`, `single_turn_ascore`) mirror Ragas 0.4.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Iterable, Optional, Sequence

from ..constraints import Choice, Constraint
from ..dataset import SingleTurnSample, ValidationError, check_row, load_rows, to_sample
from ..engines.base import JudgeOutput, JudgeRequest, Sampling
from ..run.plan import (DEFAULT_SCORING, LANGUAGE_NAMES, PROMPT_LANGUAGES, MetricResult, Plan, check_scoring,
                    detect_language)
# The Ragas-style methods run metrics through the run entry point. This is no cycle: the run core imports only
# plan.py (and Metric under TYPE_CHECKING), never this module or the metrics package.
from ..run.scheduler import run_metrics

YES_NO = Choice(("yes", "no"))


# The prompt layout. A judge call that shows a sample's retrieved contexts starts with one system turn shared
# by every such call, then the contexts, always in the same form, and only then the metric's instructions and
# the item (claim, question, rating task). So all of a sample's context-showing calls, across metrics, share
# one prompt prefix holding the whole contexts, and an engine that reuses prefixes (llama.cpp's KV cache,
# vLLM's prefix cache) computes them once per sample instead of once per call. A call that does not show the
# contexts (claim extraction, answer accuracy, question generation) keeps its instructions as the system turn,
# shared by that metric's calls across samples: moving them after a shared system turn made the judge take
# claims from the question on CiteCheck dev (README, "How well the default judge agrees with people").
JUDGE_SYSTEM = {
    "en": "You are a careful, impartial judge of texts. Follow the instructions of each task exactly, judge "
          "only by the texts you are given, and reply only in the form the task asks for.",
    "zh": "你是一名严谨、公正的文本评审。严格按照每个任务的说明作答，只依据给出的文本判断，并且只用任务要求的形式回复。",
}
CONTEXTS_HEADING = {"en": "### Context:", "zh": "### 上下文："}


def request(lang: str, task: str, item: str, constraint: Any, tag: str, contexts: Optional[Sequence[str]] = None,
            retrieved: bool = True) -> JudgeRequest:
    """A judge request in the layout above: with `contexts`, the shared system turn, then a user turn with the
    contexts, the task's instructions and the item; without, the task's instructions as the system turn and the
    item as the user turn. `retrieved=False`: the texts in the contexts' place are not the sample's retrieved
    contexts (a claim checked against the reference), so schedules need not keep them together."""
    if contexts is None:
        return JudgeRequest((("system", task), ("user", item)), constraint, Sampling(), tag=tag)
    user = "\n\n".join([f"{CONTEXTS_HEADING[lang]}\n{numbered(contexts)}", task, item])
    return JudgeRequest((("system", JUDGE_SYSTEM[lang]), ("user", user)), constraint, Sampling(), tag=tag,
                        shows_contexts=retrieved)


def numbered(items: Sequence[str]) -> str:
    return "\n".join(f"[{i}] {item}" for i, item in enumerate(items, 1))


def mean_of_valid(values: Iterable[Optional[float]]) -> Optional[float]:
    """The mean of the values that are not None (Ragas: 'if only one rating is valid, use it')."""
    valid = [v for v in values if v is not None]
    return sum(valid) / len(valid) if valid else None


def rating(output: JudgeOutput, scale: float) -> Optional[float]:
    """A constrained rating output scaled to [0, 1]; None if the call failed (e.g. input too long)."""
    return None if output.value is None else int(output.value) / scale


def top_rating_probability(output: JudgeOutput, scale: float) -> Optional[float]:
    """The judge's probability of the top rating ("fully grounded", "fully relevant", "fully matches"); 1 or
    0 from its answer when the engine gave no probabilities; None if the call failed. Chosen over the expected
    rating on BEGIN dev, the tuning set: the same ROC-AUC, and a score that reads as the chance that the judge
    calls the sample fully right, so 0.5 is a coin toss (the expected rating gives a "partial" rating half
    credit, which put unsupported responses above 0.5)."""
    if output.value is None:
        return None
    top = str(int(scale))
    if output.probabilities:
        return output.probabilities[top]
    return float(output.value == top)


def joint_top_probability(outputs: Sequence[JudgeOutput], scale: float,
                          weights: Optional[Sequence[float]] = None) -> Optional[float]:
    """P(top rating) with the templates' distributions combined as a product of experts: each template is
    evidence about the same rating, so P(r) is proportional to the product of the templates' P(r). Where both
    lean to the top rating the joint says so more firmly; where they disagree it stays low. Chosen over the
    mean of the templates' P(top) on BEGIN dev, the tuning set (response groundedness: ROC-AUC 0.945 vs 0.943,
    kappa at 0.5 0.65 vs 0.30; README, "How well the default judge agrees with people"). Where a call gave no
    distribution, or the templates are certain of different ratings, it is the mean of their P(top); None if
    every call failed. `weights`: each template's exponent in the product (default 1 each), used only when
    every template gave a rating, so a lone rating is read as it stands."""
    valid = [o for o in outputs if o.value is not None]
    if not valid:
        return None
    mean = mean_of_valid(top_rating_probability(o, scale) for o in valid)
    if not all(o.probabilities for o in valid):
        return mean
    exponents = weights if weights is not None and len(valid) == len(outputs) else [1.0] * len(valid)
    options = valid[0].probabilities.keys()
    joint = {k: math.prod(o.probabilities.get(k, 0.0) ** w for o, w in zip(valid, exponents)) for k in options}
    total = sum(joint.values())
    return joint[str(int(scale))] / total if total > 0 else mean


def verdict(output: JudgeOutput) -> Optional[bool]:
    return None if output.value is None else output.value == "yes"


def p_yes(output: JudgeOutput) -> Optional[float]:
    """The judge's probability of "yes" (1 or 0 from its answer when the engine gave no probabilities);
    None if the call failed."""
    if output.value is None:
        return None
    if output.probabilities:
        return output.probabilities["yes"]
    return float(output.value == "yes")


class Metric:
    """Base class. Subclasses set `name`, `required` (sample fields) and implement `plan`."""

    name: str = ""
    required: tuple[str, ...] = ()
    needs_embeddings: bool = False
    shows_contexts: bool = False  # the first stage's prompts carry the retrieved contexts
    # Every output constraint the plan's judge requests use. A server engine compiles each one into a grammar
    # (on vLLM, seconds per JSON constraint for a large vocabulary), so a started server compiles them all
    # before it reports ready (engines/vllm_launch.py). tests/test_constraints.py checks the declaration.
    constraints: tuple[Constraint, ...] = ()

    def __init__(self, llm: Any = None, embeddings: Any = None, name: Optional[str] = None,
                 language: str = "auto", scoring: str = DEFAULT_SCORING):
        self.llm = llm
        self.embeddings = embeddings
        self.scoring = check_scoring(scoring)
        if name:
            self.name = name
        if language not in ("auto", *PROMPT_LANGUAGES, *LANGUAGE_NAMES):
            raise ValueError(f"language must be one of auto, {', '.join([*PROMPT_LANGUAGES, *LANGUAGE_NAMES])}")
        self.language = language

    def config(self) -> dict[str, Any]:
        """The metric's class and settings (name, scoring, language, strictness, rubrics, ...) without its
        models, as plain JSON: what identifies its results in a resumed or scaled-out run."""
        settings = {k: v for k, v in vars(self).items() if k not in ("llm", "embeddings")}
        return {"class": type(self).__name__, **json.loads(json.dumps(settings, sort_keys=True, default=str))}

    # ---- what subclasses implement -------------------------------------------------------------------
    def plan(self, sample: SingleTurnSample, lang: str) -> Plan:
        raise NotImplementedError

    def context_probes(self, sample: SingleTurnSample, lang: str) -> list[JudgeRequest]:
        """The judge requests whose prompts carry the retrieved contexts, at their longest: what must fit the
        judge's context window (long_inputs.py). Default: the first stage, for metrics that show the contexts
        there; none for metrics that never do."""
        if not (self.shows_contexts and sample.retrieved_contexts):
            return []
        return [item for item in next(self.plan(sample, lang)) if isinstance(item, JudgeRequest)]

    def language_of(self, sample: SingleTurnSample) -> str:
        if self.language != "auto":
            return self.language
        return detect_language(sample.user_input or sample.response or sample.reference)

    # ---- Ragas-style API -----------------------------------------------------------------------------
    def score(self, **fields: Any) -> MetricResult:
        return self.batch_score([fields])[0]

    async def ascore(self, **fields: Any) -> MetricResult:
        return (await self.abatch_score([fields]))[0]

    def batch_score(self, inputs: list[dict[str, Any]], show_progress: bool = False) -> list[MetricResult]:
        samples = self._samples(inputs)
        return [r[self.name] for r in run_metrics(samples, [self], show_progress=show_progress)]

    async def abatch_score(self, inputs: list[dict[str, Any]]) -> list[MetricResult]:
        return await asyncio.to_thread(self.batch_score, inputs)

    async def single_turn_ascore(self, sample: SingleTurnSample) -> float:
        return float((await self.abatch_score([sample.to_dict()]))[0])

    def single_turn_score(self, sample: SingleTurnSample) -> float:
        return float(self.batch_score([sample.to_dict()])[0])

    def _samples(self, inputs: list[dict[str, Any]]) -> list[SingleTurnSample]:
        rows = load_rows(inputs)
        errors = [e for row in rows for e in check_row(row, self.required)]
        if errors:
            raise ValidationError(errors)
        return [to_sample(row) for row in rows]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def two_judges(first: JudgeRequest, second: JudgeRequest, scale: float, labels: dict[str, str],
               weights: Optional[Sequence[float]] = None) -> Plan:
    """The NVIDIA-style dual judge: two templates rate the same sample; each rating is scaled to [0, 1]
    and the score is the mean of the valid ones (if only one is valid, that one). The probability scoring is
    P(top rating) of the two templates' distributions combined (`joint_top_probability`, with `weights`)."""
    outputs = yield [first, second]
    score = mean_of_valid(rating(o, scale) for o in outputs)
    p_top = joint_top_probability(outputs, scale, weights)
    raw = [o.value for o in outputs]
    said = [f"judge {i}: {labels[r]}" for i, r in enumerate(raw, 1) if r is not None]
    reason = f"ratings {raw[0]} and {raw[1]} (of {int(scale)}); " + "; ".join(said or ["no valid rating"])
    return MetricResult(score, reason, {"ratings": raw}, scores={"argmax": score, "probability": p_top})
