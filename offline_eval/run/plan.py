"""What the run core and the metrics exchange: a metric's plan, its stage items and its result.

A metric's `plan(sample, lang)` is a generator (`Plan`): each `yield` is one stage, a list of `JudgeRequest`s
and `Embed`s, and receives their results in the same order; its return value is the `MetricResult`. The run
core (scheduler.py, pipeline.py, long_inputs.py) needs only this vocabulary, never metrics.base: so this module
imports nothing of the run core or of the metrics package, and metrics.base can import the run entry point
(scheduler.run_metrics) at top level for its Ragas-style methods without an import cycle.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generator, Optional, Union

from ..constraints import Choice
from ..dataset import SingleTurnSample
from ..engines.base import JudgeRequest

if TYPE_CHECKING:  # only for hints: metrics.base imports the run core, which imports this module
    from ..metrics.base import Metric


# How a metric turns constrained answers into a value:
#   probability  from the judge's probability of each option (P(top rating) of the two templates combined,
#                mean P(yes) over claims)
#   argmax       from the answers themselves (rating / scale, share of "yes"): Ragas' semantics
# JSON answers (claims, questions, rubric grades) have no such distribution: both scorings use them as given.
SCORINGS = ("probability", "argmax")
DEFAULT_SCORING = "probability"  # chosen on held-out labelled sets (README, "How well the judge agrees")


def check_scoring(scoring: str) -> str:
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, not {scoring!r}")
    return scoring


@dataclass
class MetricResult:
    """A metric's score for one sample. `value` is None when the sample has nothing to score (for example
    a response with no claims, as Ragas' NaN); `reason` explains the score in words. `scores` holds the
    value under each scoring (SCORINGS); `value` is the one the run asked for."""

    value: Optional[float]
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    judge_calls: list[dict[str, Any]] = field(default_factory=list)  # raw judge outputs, in call order
    scores: dict[str, Optional[float]] = field(default_factory=dict)

    def scored_by(self, scoring: str) -> "MetricResult":
        """This result with `value` taken from `scoring` (a metric with one scoring has it under both)."""
        for name in SCORINGS:
            self.scores.setdefault(name, self.value)
        self.value = self.scores[scoring]
        return self

    def __float__(self) -> float:
        return math.nan if self.value is None else float(self.value)

    def __repr__(self) -> str:
        return f"MetricResult(value={self.value!r}, reason={self.reason[:60]!r})"


@dataclass(frozen=True)
class Embed:
    """A stage item asking for sentence embeddings of `texts` (unit-normalised vectors), all from one model:
    an embedder that routes by language (judges.LanguageEmbeddings) picks it by `lang`, the sample's."""

    texts: tuple[str, ...]
    lang: str = ""


StageItem = Union[JudgeRequest, Embed]
Plan = Generator[list[StageItem], list[Any], MetricResult]

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")

PROMPT_LANGUAGES = ("en", "zh")  # languages the metrics have prompts in
# Languages told apart from Chinese that have no prompts yet: they get the English prompts, and the requests
# that generate text (claims, questions, feedback) ask for it in the input's language.
LANGUAGE_NAMES = {"ja": "Japanese", "ko": "Korean"}


def detect_language(*texts: Optional[str]) -> str:
    """'en' unless the text is mostly CJK; then 'ko' when that is mostly hangul, 'ja' when it has kana (Japanese
    writes kanji with kana; Chinese never uses kana), else 'zh'. Prompts and generated text follow it."""
    text = " ".join(t for t in texts if t)
    if text.isascii():  # no CJK letter; answered without a pass over the text (once per sample and metric)
        return "en"
    letters = [c for c in text if c.isalpha()]
    cjk = [c for c in letters if _CJK.match(c)]
    if not letters or len(cjk) / len(letters) < 0.3:
        return "en"
    if sum(1 for c in cjk if _HANGUL.match(c)) * 2 > len(cjk):
        return "ko"
    return "ja" if sum(1 for c in cjk if _KANA.match(c)) * 10 >= len(cjk) else "zh"


def in_language(items: list[Any], lang: str) -> list[Any]:
    """A stage of English-prompt requests for an input in `lang`, a language without prompts of its own: each
    request that generates text (not a choice) is told, at the end of its user turn, to write it in `lang`."""
    name = LANGUAGE_NAMES.get(lang)
    if name is None:
        return items
    hint = f"\n\nThe input is in {name}: write the text you generate (claims, questions, feedback) in {name}."
    return [replace(r, messages=(*r.messages[:-1], (r.messages[-1][0], r.messages[-1][1] + hint)))
            if isinstance(r, JudgeRequest) and not isinstance(r.constraint, Choice) else r for r in items]


def plan_in(metric: "Metric", sample: SingleTurnSample, lang: str) -> Plan:
    """`metric.plan` for an input in `lang` (detected or forced): in its own prompts, else as `in_language`."""
    if lang in PROMPT_LANGUAGES:
        return (yield from metric.plan(sample, lang))
    plan, results = metric.plan(sample, "en"), None
    try:
        while True:
            results = yield in_language(plan.send(results), lang)
    except StopIteration as done:
        return done.value


def probes_in(metric: "Metric", sample: SingleTurnSample, lang: str) -> list[JudgeRequest]:
    """`metric.context_probes` as `plan_in` asks them."""
    return in_language(metric.context_probes(sample, lang if lang in PROMPT_LANGUAGES else "en"), lang)
