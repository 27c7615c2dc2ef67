"""Long retrieved contexts: the `long_inputs` policy.

"focus" (default; "focus:N" sets the budget, default context_focus.DEFAULT_BUDGET tokens): a sample whose
contexts hold more than N tokens gets only their passages most relevant to its question, response and
reference (context_focus.py), once for every metric; `details["context_focus"]` says what was kept. What
is then still too long for the judge's window is truncated as below.

Before a metric's plan starts, the requests that carry the retrieved contexts (`Metric.context_probes`: its
first stage, or for claim metrics a claim check with a claim as long as claims may be) are measured with the
judge's own tokenizer and chat template, and must fit its context size minus the call's output budget
(`max_tokens`). When one does not:

- "truncate" (also after "focus"): the contexts are cut from the end, longest first — every context above a common
  token level is cut down to that level — until every such prompt fits. The result says so in
  `details["long_input"]`, which `evaluate` reports as a warning naming the row and the field.
- "error": the metric gets no value for that sample, and its reason (and `details["long_input"]`) says why;
  the run goes on.

Other fields are never cut: a response too long for the judge still fails its own calls, as before. Engines
that cannot count tokens (no `count_tokens` or no `context_size`) are not measured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .context_focus import DEFAULT_BUDGET, focus_contexts
from ..dataset import SingleTurnSample
from ..engines.base import TEMPLATE_MARGIN, JudgeRequest, abilities, prompt_token_counts
from .plan import MetricResult, Plan, plan_in, probes_in

if TYPE_CHECKING:  # only for hints: metrics.base imports the run core
    from ..metrics.base import Metric

POLICIES = ("focus", "truncate", "error")
DEFAULT_POLICY = "focus"
SAFETY = 8  # tokens kept free: a claim check's claim is estimated, not known
MAX_ROUNDS = 8  # cuts are made in characters and re-measured; they converge in two or three rounds


@dataclass
class Fit:
    sample: Optional[SingleTurnSample]  # None: it cannot be scored
    note: str = ""  # what was cut, or why it cannot be scored


def parse_policy(policy: str) -> tuple[str, int]:
    """("focus", budget), ("truncate", 0) or ("error", 0) from "focus", "focus:N", "truncate" or "error";
    ValueError naming the choices otherwise."""
    mode, colon, budget = policy.partition(":")
    if mode in POLICIES and not colon:
        return mode, DEFAULT_BUDGET if mode == "focus" else 0
    if mode == "focus" and budget.isdigit() and int(budget) > 0:
        return mode, int(budget)
    raise ValueError(f"long_inputs must be one of {', '.join(POLICIES)} or focus:N (N tokens > 0), not {policy!r}")


def fitted_plans(metrics: Sequence[tuple[Metric, str]], sample: SingleTurnSample, engine: Any,
                 policy: str) -> list[Plan]:
    """Each (metric, language)'s plan on `sample`, with the contexts made to fit the judge under `policy`.
    Under "focus" and "truncate" the contexts are focused and cut once per sample, to fit the longest prompt of
    all the metrics: every metric sees the same contexts, so their requests keep one shared prefix
    (metrics/base.py `request`) and the engine computes the contexts once. Under "error" each metric is
    measured on its own."""
    mode, budget = parse_policy(policy)
    focus_note = ""
    if mode == "focus" and sample.retrieved_contexts:
        focus = focus_contexts(sample.retrieved_contexts, (sample.response, sample.reference, sample.user_input),
                               budget)
        if focus is not None:
            sample, focus_note = dataclasses.replace(sample, retrieved_contexts=focus.contexts), focus.note
    if mode == "error":
        fits = [fit_contexts([pair], sample, engine, mode) for pair in metrics]
    else:
        fit = fit_contexts(metrics, sample, engine, "truncate")
        fits = [fit if probes_in(m, sample, lang) else Fit(sample) for m, lang in metrics]
    return [_fitted(metric, fit, lang, focus_note) for (metric, lang), fit in zip(metrics, fits)]


def _fitted(metric: Metric, fit: Fit, lang: str, focus_note: str) -> Plan:
    if fit.sample is None:
        return MetricResult(None, f"not scored: {fit.note}", {"long_input": fit.note})
    result = yield from plan_in(metric, fit.sample, lang)
    if focus_note:
        result.details["context_focus"] = focus_note
    if fit.note:
        result.details["long_input"] = fit.note
    return result


def fit_contexts(metrics: Sequence[tuple[Metric, str]], sample: SingleTurnSample, engine: Any, policy: str) -> Fit:
    """`sample` with its contexts cut so that the context-showing prompts of every (metric, language) fit."""
    if policy not in ("truncate", "error"):
        raise ValueError(f"fit_contexts cuts ('truncate') or refuses ('error'), not {policy!r}")
    able = abilities(engine)
    size = able.context_size
    if not (sample.retrieved_contexts and able.measurable):
        return Fit(sample)
    probes = _probes(metrics, sample)
    if not probes or all(_surely_fits(r, size) for r in probes):
        return Fit(sample)
    over = _overflow(engine, probes, size)
    if over <= 0:
        return Fit(sample)
    if policy == "error":
        return Fit(None, f"retrieved_contexts too long for the judge's context window ({size} tokens): the "
                         f"longest prompt is {over} tokens over (long_inputs=error)")
    contexts = list(sample.retrieved_contexts)
    before = sizes = engine.count_tokens(contexts)
    for _ in range(MAX_ROUNDS):
        level = _level(sizes, over)
        contexts = [_cut(text, n, level) for text, n in zip(contexts, sizes)]
        if not any(c.strip() for c in contexts):
            break
        trial = dataclasses.replace(sample, retrieved_contexts=contexts)
        over = _overflow(engine, _probes(metrics, trial), size)
        sizes = engine.count_tokens(contexts)
        if over <= 0:
            cuts = ", ".join(f"context {i} from {a} to {b} tokens"
                             for i, (a, b) in enumerate(zip(before, sizes), 1) if b < a)
            return Fit(trial, f"retrieved_contexts truncated to fit the judge's context window ({size} tokens): "
                              f"{cuts}")
    return Fit(None, f"the prompt does not fit the judge's context window ({size} tokens) even with the "
                     f"retrieved_contexts cut to nothing: another field is too long")


def _probes(metrics: Sequence[tuple[Metric, str]], sample: SingleTurnSample) -> list[JudgeRequest]:
    return [probe for metric, lang in metrics for probe in probes_in(metric, sample, lang)]


def _surely_fits(request: JudgeRequest, size: int) -> bool:
    """Every token holds at least one byte, so a prompt with fewer bytes than room fits without counting.
    The prompt's bytes are bounded without rendering it (a regex pass over each text, a hot loop of the run
    core): neutralising a control-token spelling adds a 3-byte zero-width space, and every spelling starts
    with "<" or "[" (engines.base.control_pattern)."""
    text_bytes = sum((len(text) if text.isascii() else len(text.encode())) + 3 * (text.count("<") + text.count("["))
                     for _, text in request.messages)
    return text_bytes + 4 * TEMPLATE_MARGIN + request.max_tokens + SAFETY <= size


def _overflow(engine: Any, probes: Sequence[JudgeRequest], size: int) -> int:
    """Tokens by which the longest probe (with its output budget) exceeds the context window."""
    counts = prompt_token_counts(engine, probes)
    return max(n + r.max_tokens + SAFETY - size for n, r in zip(counts, probes))


def _level(sizes: Sequence[int], over: int) -> int:
    """The highest token level L such that cutting every context down to L removes at least `over` tokens
    (0 if even all of them are not enough)."""
    lo, hi = 0, max(sizes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(max(0, n - mid) for n in sizes) >= over:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cut(text: str, tokens: int, level: int) -> str:
    """`text` cut from the end to about `level` tokens (characters in proportion, a little under)."""
    if tokens <= level:
        return text
    return text[:int(len(text) * level / tokens * 0.95)].rstrip()
