"""The scheduler: the only place that knows about batching.

It starts one plan per (sample, metric), then runs them in waves: each wave gathers the stage every
unfinished plan is waiting on, deduplicates identical judge requests and embedding texts across all of
them, sends the judge requests to the engine as one batch, and feeds each plan its results. Dependent
stages (claims -> verdicts) simply come in the next wave.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .dataset import SingleTurnSample
from .engines.base import Engine, EngineError, JudgeOutput, JudgeRequest
from .metrics.base import Embed, Metric, MetricResult, Plan


@dataclass
class RunStats:
    judge_calls: int = 0  # unique requests sent to the engine
    deduplicated: int = 0  # requests answered by an identical one in the same wave
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedded_texts: int = 0
    seconds: float = 0.0
    per_metric: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Progress:
    """Progress callbacks; the CLI passes one that drives a progress bar."""

    def add_total(self, n: int) -> None: ...

    def advance(self, n: int) -> None: ...


@dataclass
class _Task:
    metric: Metric
    plan: Plan
    result: Optional[MetricResult] = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[Any] = field(default_factory=list)  # the stage this plan waits on


def run_metrics(
    samples: Sequence[SingleTurnSample],
    metrics: Sequence[Metric],
    judge: Any = None,
    embeddings: Any = None,
    progress: Optional[Progress] = None,
    stats: Optional[RunStats] = None,
    show_progress: bool = False,
) -> list[dict[str, MetricResult]]:
    """Score every sample with every metric; returns, per sample, {metric name: result}."""
    from .judges import resolve_embeddings, resolve_judge

    engine = resolve_judge(judge if judge is not None else _first(metrics, "llm"))
    embedder = None
    if any(m.needs_embeddings for m in metrics):
        embedder = resolve_embeddings(embeddings if embeddings is not None else _first(metrics, "embeddings"))
    stats = stats if stats is not None else RunStats()
    if progress is None and show_progress:
        from .progress import RichProgress

        with RichProgress() as bar:
            return _run(samples, metrics, engine, embedder, bar, stats)
    return _run(samples, metrics, engine, embedder, progress or Progress(), stats)


def _first(metrics: Sequence[Metric], attr: str) -> Any:
    return next((getattr(m, attr) for m in metrics if getattr(m, attr) is not None), None)


def _run(samples, metrics, engine: Engine, embedder, progress: Progress, stats: RunStats):
    started = time.perf_counter()
    tasks: list[list[_Task]] = []
    for sample in samples:
        row = []
        for metric in metrics:
            task = _Task(metric, metric.plan(sample, metric.language_of(sample)))
            _advance(task, None)
            row.append(task)
        tasks.append(row)

    while True:
        live = [t for row in tasks for t in row if t.result is None]
        if not live:
            break
        requests: dict[str, JudgeRequest] = {}
        texts: dict[str, None] = {}
        for t in live:
            for item in t.waiting:
                if isinstance(item, Embed):
                    texts.update(dict.fromkeys(item.texts))
                else:
                    stats.deduplicated += item.key in requests
                    requests.setdefault(item.key, item)
        unique = list(requests.values())
        progress.add_total(len(unique))
        outputs = dict(zip(requests, _generate(engine, unique, progress)))
        vectors = dict(zip(texts, _embed(embedder, list(texts)))) if texts else {}
        stats.judge_calls += len(unique)
        stats.embedded_texts += len(texts)
        for out in outputs.values():
            stats.prompt_tokens += out.prompt_tokens
            stats.completion_tokens += out.completion_tokens
        for t in live:
            results = []
            for item in t.waiting:
                if isinstance(item, Embed):
                    results.append(np.stack([vectors[x] for x in item.texts]))
                else:
                    out = outputs[item.key]
                    t.calls.append({"stage": item.tag, "value": out.value, **out.to_dict()})
                    results.append(out)
            _advance(t, results)

    stats.seconds += time.perf_counter() - started
    for row in tasks:
        for t in row:
            _account(stats, t)
    return [{t.metric.name: t.result for t in row} for row in tasks]


def _advance(task: _Task, results: Optional[list[Any]]) -> None:
    """Run the plan to its next stage (or its result)."""
    try:
        task.waiting = task.plan.send(results) if results is not None else next(task.plan)
    except StopIteration as done:
        task.result = done.value
        task.result.judge_calls = task.calls
        task.waiting = []


def _generate(engine: Engine, requests: list[JudgeRequest], progress: Progress) -> list[JudgeOutput]:
    if not requests:
        return []
    outputs = engine.generate(requests, progress.advance)
    if len(outputs) != len(requests):
        raise EngineError(f"engine returned {len(outputs)} outputs for {len(requests)} requests")
    return outputs


def _embed(embedder: Any, texts: list[str]) -> list[np.ndarray]:
    if embedder is None:
        raise ValueError("this metric needs embeddings: pass embeddings=... or use the default model")
    return list(embedder.embed(texts))


def _account(stats: RunStats, task: _Task) -> None:
    m = stats.per_metric.setdefault(task.metric.name, {"judge_calls": 0, "prompt_tokens": 0,
                                                       "completion_tokens": 0})
    m["judge_calls"] += len(task.calls)
    m["prompt_tokens"] += sum(c["prompt_tokens"] for c in task.calls)
    m["completion_tokens"] += sum(c["completion_tokens"] for c in task.calls)


