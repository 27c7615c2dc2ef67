"""The state both scheduling strategies share: what a run is made of, whichever way it is scheduled.

scheduler.py (waves, and the `run_metrics` entry point) and pipeline.py (pipelined) each decide *when* a plan's
stage is sent; this module holds what they both use to do it: a plan in progress (`Task`) and handing it its
results (`deliver`), answering judge requests from the cache or the engine (`Feed`), embedding texts
(`embed_texts`, by embedding lane), and what the run reports (`RunStats`, `Progress`, `failed_calls`). It imports no
strategy, so the two strategies never import each other's internals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from ..cache import JudgeCache
from ..engines.base import Engine, EngineError, JudgeOutput, JudgeRequest, abilities, prefix_order
from .plan import DEFAULT_SCORING, MetricResult, Plan

if TYPE_CHECKING:  # only for hints: metrics.base imports the run core
    from ..metrics.base import Metric


@dataclass
class RunStats:
    judge_calls: int = 0  # unique requests sent to the engine
    cached: int = 0  # unique requests answered by the persistent cache
    deduplicated: int = 0  # requests answered by an identical one asked in the same window
    prompt_tokens: int = 0  # tokens of the requests sent to the engine (cached calls cost nothing)
    reused_prompt_tokens: int = 0  # of those, the ones the engine took from its prefix cache, not computed
    completion_tokens: int = 0
    embedded_texts: int = 0  # texts the embedding model embedded (not those the cache had)
    seconds: float = 0.0
    # per metric: judge_calls (all its calls), cached (of those), prompt/completion tokens of its new calls,
    # seconds (its share of engine and embedding time). A call shared by two metrics counts for both.
    per_metric: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Progress:
    """Progress callbacks; the CLI passes one that drives a progress bar."""

    def add_total(self, n: int) -> None: ...  # n more engine calls are coming (cached ones are not counted)

    def advance(self, n: int) -> None: ...

    def rows_done(self, n: int) -> None: ...  # n more samples reported (rows passed through included)


@dataclass
class Task:
    """One (sample, metric) plan in progress: the stage it waits on, its judge calls so far, its result."""

    metric: Metric
    plan: Plan
    result: Optional[MetricResult] = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[Any] = field(default_factory=list)  # the stage this plan waits on
    seconds: float = 0.0  # its share of engine and embedding time
    scoring: str = DEFAULT_SCORING  # which of the result's scores becomes its value


@dataclass
class SampleRun:
    """One sample in a run's window: its plans (None: a row passed through unscored) and, pipelined, the
    request and embedding keys it asked, released once it is reported."""

    tag: Any
    tasks: Optional[list[Task]]
    asked: list[Any] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(t.result is not None for t in self.tasks or ())

    def live(self) -> list[Task]:
        return [t for t in self.tasks or () if t.result is None]

    def results(self) -> Optional[dict[str, MetricResult]]:
        return None if self.tasks is None else {t.metric.name: t.result for t in self.tasks}


def deliver(task: Task, results: list[Any], seconds: list[float]) -> None:
    """Hand a plan the results of the stage it waits on (recording its judge calls and its share of the
    time), and run it to its next stage."""
    for item, result, s in zip(task.waiting, results, seconds):
        if isinstance(item, JudgeRequest):
            cached = {"cached": True} if result.meta.get("cached") else {}
            task.calls.append({"stage": item.tag, "value": result.value, **result.to_dict(), **cached})
        task.seconds += s
    advance(task, results)


def advance(task: Task, results: Optional[list[Any]]) -> None:
    """Run the plan to its next stage (or its result); `results` None starts it."""
    try:
        task.waiting = task.plan.send(results) if results is not None else next(task.plan)
    except StopIteration as done:
        task.result = done.value.scored_by(task.scoring)
        task.result.judge_calls = task.calls
        _note_failed_calls(task.result)
        task.waiting = []


def failed_calls(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The judge call records that gave no value (e.g. an input too long for the judge's context)."""
    return [c for c in calls if c.get("value") is None or "error" in c]


def _note_failed_calls(result: MetricResult) -> None:
    """Say in the reason when judge calls failed: metrics fall back on the calls that worked (the other
    template, the other claims), which must never look like a complete score."""
    failed = failed_calls(result.judge_calls)
    if failed:
        errors = "; ".join(dict.fromkeys(str(c.get("error") or "no value") for c in failed))
        note = f"{len(failed)} of {len(result.judge_calls)} judge calls failed: {errors}"
        result.reason = f"{result.reason}; {note}" if result.reason else note


@dataclass
class Feed:
    """Answers a wave's unique requests: from the cache when it has them, else from the engine."""

    engine: Engine
    cache: Optional[JudgeCache]
    chunk_size: int
    contexts_last: bool = False  # the last request sent showed a sample's contexts (prefix_order)

    def lookup(self, requests: Sequence[JudgeRequest], stats: RunStats) -> dict[str, JudgeOutput]:
        """What the cache holds of `requests`, by request key."""
        found = self.cache.get_many(self.engine.identity, requests) if self.cache is not None else {}
        stats.cached += len(found)
        return found

    def record(self, requests: Sequence[JudgeRequest], outputs: Sequence[JudgeOutput], stats: RunStats) -> None:
        """Count new engine outputs and store them in the cache (committed at once: a killed run keeps them)."""
        if self.cache is not None:
            self.cache.put_many(self.engine.identity, requests, outputs)
        stats.judge_calls += len(requests)
        stats.prompt_tokens += sum(o.prompt_tokens for o in outputs)
        stats.reused_prompt_tokens += sum(o.reused_prompt_tokens for o in outputs)
        stats.completion_tokens += sum(o.completion_tokens for o in outputs)

    def generate(self, requests: list[JudgeRequest], progress: Progress,
                 stats: RunStats) -> tuple[dict[str, JudgeOutput], dict[str, float]]:
        """Outputs by request key, and each new request's share of engine time in seconds."""
        outputs = self.lookup(requests, stats)
        todo = [r for r in requests if r.key not in outputs]
        progress.add_total(len(todo))  # the bar counts engine calls only, so its rate and ETA are real
        # Without a cache one batch per wave lets the engine batch freely; with one, chunks bound the loss
        # of a kill. Sorting keeps requests that share a prompt prefix in the same chunk, back to back.
        size = min(self.chunk_size, abilities(self.engine).batch_size or self.chunk_size) \
            if self.cache is not None else max(len(todo), 1)
        todo.sort(key=lambda r: prefix_order(r, self.contexts_last))
        if todo:
            self.contexts_last = todo[-1].shows_contexts
        cost: dict[str, float] = {}
        for start in range(0, len(todo), size):
            chunk = todo[start:start + size]
            tic = time.perf_counter()
            got = _generate(self.engine, chunk, progress)
            cost.update(dict.fromkeys((r.key for r in chunk), (time.perf_counter() - tic) / len(chunk)))
            self.record(chunk, got, stats)
            outputs.update((r.key, o) for r, o in zip(chunk, got))
        return outputs, cost


def _generate(engine: Engine, requests: list[JudgeRequest], progress: Progress) -> list[JudgeOutput]:
    if not requests:
        return []
    outputs = engine.generate(requests, progress.advance)
    if len(outputs) != len(requests):
        raise EngineError(f"engine returned {len(outputs)} outputs for {len(requests)} requests")
    return outputs


def embedding_lane(embedder: Any, lang: str) -> str:
    """Which of the embedder's models embeds an Embed item of language `lang`: the language, for an embedder
    that routes by language (`for_language`); else "" (one model for all)."""
    return lang if hasattr(embedder, "for_language") else ""


def embedder_for(embedder: Any, lane: str) -> Any:
    return embedder.for_language(lane) if hasattr(embedder, "for_language") else embedder


def embed_texts(embedder: Any, texts: list[str], cache: Optional[JudgeCache] = None) -> tuple[list[np.ndarray], int]:
    """Embeddings of `texts`, and how many the model computed: with a cache, only the ones it lacks
    (for embedders with an `identity` to key them by)."""
    if embedder is None:
        raise ValueError("this metric needs embeddings: pass embeddings=... or use the default model")
    identity = getattr(embedder, "identity", None)
    if cache is None or identity is None:
        return list(embedder.embed(texts)), len(texts)
    found = cache.get_vectors(identity, texts)
    todo = [t for t in texts if t not in found]
    if todo:
        new = embedder.embed(todo)
        cache.put_vectors(identity, todo, new)
        found.update(zip(todo, new))
    return [found[t] for t in texts], len(todo)
