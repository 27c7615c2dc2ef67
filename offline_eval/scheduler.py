"""The scheduler: the only place that knows about batching.

It starts one plan per (sample, metric), then runs them in one of two ways:

- waves (in-process engines: llama.cpp, vllm-offline): each wave gathers the stage every unfinished plan
  (of every sample; of one sample at a time for an engine that runs requests one by one, like llama.cpp) is
  waiting on, deduplicates identical judge requests and embedding texts across all of them, sends the
  judge requests to the engine as one batch, and feeds each plan its results. Dependent stages (claims ->
  verdicts) simply come in the next wave. Large batches are what these engines need.
- pipelined (engines with an async `session()`: the vLLM server client; see pipeline.py): each plan runs
  as its own asyncio task and sends its next stage as soon as its own inputs are answered, so the server
  never idles at a wave boundary.

Both feed plans through `_deliver`, answer requests through `_Feed` (cache, then engine) and fill the same
RunStats, results and progress.

With a persistent cache (cache.py), a wave first takes what the cache has, then sends the rest to the engine
in chunks, sorted so shared prefixes stay together (engines/base.py prefix_order), and stores each chunk as soon as it returns:
a killed run loses at most one chunk, i.e. the calls in flight (a chunk is one batch of the engine: at most
chunk_size requests, and one for an engine that runs them one at a time, like llama.cpp). The pipelined path
asks the cache per request and stores each new output as soon as it returns.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .cache import JudgeCache
from .dataset import SingleTurnSample
from .engines.base import Engine, EngineError, JudgeOutput, JudgeRequest, abilities, prefix_order
from .long_inputs import fitted_plans
from .metrics.base import DEFAULT_SCORING, Embed, Metric, MetricResult, Plan, check_scoring


@dataclass
class RunStats:
    judge_calls: int = 0  # unique requests sent to the engine
    cached: int = 0  # unique requests answered by the persistent cache
    deduplicated: int = 0  # requests answered by an identical one in the same wave (pipelined: run)
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


@dataclass
class _Task:
    metric: Metric
    plan: Plan
    result: Optional[MetricResult] = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[Any] = field(default_factory=list)  # the stage this plan waits on
    seconds: float = 0.0  # its share of engine and embedding time
    on_done: Optional[Callable[[], None]] = None  # called once its result is set
    scoring: str = DEFAULT_SCORING  # which of the result's scores becomes its value


def run_metrics(
    samples: Sequence[SingleTurnSample],
    metrics: Sequence[Metric],
    judge: Any = None,
    embeddings: Any = None,
    progress: Optional[Progress] = None,
    stats: Optional[RunStats] = None,
    show_progress: bool = False,
    cache: Optional[JudgeCache] = None,
    chunk_size: Optional[int] = None,
    long_inputs: str = "truncate",
    pipeline: Optional[bool] = None,
    on_sample: Optional[Callable[[int, dict[str, MetricResult]], None]] = None,
    scoring: Optional[str] = None,
) -> list[dict[str, MetricResult]]:
    """Score every sample with every metric; returns, per sample, {metric name: result}. With `cache`,
    requests it holds are not sent to the engine, and new outputs are stored every `chunk_size` requests
    (default: $OFFLINE_EVAL_CHUNK, else 64). Contexts too long for the judge follow `long_inputs`
    ("truncate" or "error", see long_inputs.py). `pipeline`: run the plans pipelined (needs an engine with
    `session()`) or in waves; default: pipelined whenever the engine can. `on_sample(i, results)` is called as
    soon as sample i has every metric's result (in completion order), e.g. to write results as they come.
    `scoring` ("probability" or "argmax", metrics/base.py SCORINGS) decides every result's value; default: each
    metric's own `scoring`."""
    if scoring is not None:
        check_scoring(scoring)
    from .judges import resolve_embeddings, resolve_judge

    engine = resolve_judge(judge if judge is not None else _first(metrics, "llm"))
    embedder = None
    if any(m.needs_embeddings for m in metrics):
        embedder = resolve_embeddings(embeddings if embeddings is not None else _first(metrics, "embeddings"))
    stats = stats if stats is not None else RunStats()
    feed = _Feed(engine, cache, chunk_size or int(os.environ.get("OFFLINE_EVAL_CHUNK", 0)) or 64)
    can_pipeline = abilities(engine).session
    pipelined = can_pipeline if pipeline is None else pipeline
    if pipelined and not can_pipeline:
        raise ValueError(f"the {engine.identity.get('engine')} engine has no async session: it runs in waves")
    if progress is None and show_progress:
        from .progress import RichProgress

        with RichProgress() as bar:
            return _run(samples, metrics, feed, embedder, bar, stats, long_inputs, pipelined, on_sample, scoring)
    return _run(samples, metrics, feed, embedder, progress or Progress(), stats, long_inputs, pipelined, on_sample,
                scoring)


def _first(metrics: Sequence[Metric], attr: str) -> Any:
    return next((getattr(m, attr) for m in metrics if getattr(m, attr) is not None), None)


def _run(samples, metrics, feed: "_Feed", embedder, progress: Progress, stats: RunStats, long_inputs: str,
         pipelined: bool, on_sample=None, scoring: Optional[str] = None):
    started = time.perf_counter()
    tasks = [_start(metrics, sample, feed.engine, long_inputs, scoring) for sample in samples]
    if on_sample is not None:
        _report_samples(tasks, on_sample)
    live = [t for row in tasks for t in row if t.result is None]
    if pipelined:
        from .pipeline import run_pipelined

        run_pipelined(live, feed, embedder, progress, stats)
    elif abilities(feed.engine).batch_size == 1:
        # An engine that runs one request at a time gains nothing from wide waves, and reuses only the previous
        # prompt's prefix: run each sample's plans to the end before the next sample's, so its contexts are
        # computed once for all its metrics and stages (the waves order them last and back to back).
        for row in tasks:
            feed.contexts_last = False  # nothing of the previous sample is worth keeping: its contexts go last
            _run_waves([t for t in row if t.result is None], feed, embedder, progress, stats)
    else:
        _run_waves(live, feed, embedder, progress, stats)
    stats.seconds += time.perf_counter() - started
    for row in tasks:
        for t in row:
            _account(stats, t)
    return [{t.metric.name: t.result for t in row} for row in tasks]


def _report_samples(tasks: list[list[_Task]], on_sample: Callable[[int, dict[str, MetricResult]], None]) -> None:
    """Call on_sample for each sample whose plans are all done: now, or when its last plan finishes."""
    left = [sum(t.result is None for t in row) for row in tasks]

    def report(i: int) -> None:
        on_sample(i, {t.metric.name: t.result for t in tasks[i]})

    def one_done(i: int) -> None:
        left[i] -= 1
        if left[i] == 0:
            report(i)

    for i, row in enumerate(tasks):
        if left[i] == 0:
            report(i)
        for t in row:
            if t.result is None:
                t.on_done = functools.partial(one_done, i)


def _start(metrics: Sequence[Metric], sample: SingleTurnSample, engine: Engine, long_inputs: str,
           scoring: Optional[str]) -> list[_Task]:
    """The sample's plans, one per metric, each run up to its first stage; no plan for a metric whose fields
    the sample lacks (the default metric set scores each metric on the rows that have them:
    evaluation.validate)."""
    lacking = [[f for f in m.required if getattr(sample, f) is None] for m in metrics]
    scored = [m for m, missing in zip(metrics, lacking) if not missing]
    plans = iter(fitted_plans([(m, m.language_of(sample)) for m in scored], sample, engine, long_inputs))
    tasks = []
    for metric, missing in zip(metrics, lacking):
        task_scoring = scoring or metric.scoring
        if missing:
            result = MetricResult(None, f"row lacks {', '.join(missing)}").scored_by(task_scoring)
            tasks.append(_Task(metric, iter(()), result))
            continue
        task = _Task(metric, next(plans), scoring=task_scoring)
        _advance(task, None)
        tasks.append(task)
    return tasks


def _run_waves(tasks: list[_Task], feed: "_Feed", embedder, progress: Progress, stats: RunStats) -> None:
    while True:
        live = [t for t in tasks if t.result is None]
        if not live:
            break
        requests: dict[str, JudgeRequest] = {}
        texts: dict[tuple[str, str], None] = {}  # (embedding lane, text)
        for t in live:
            for item in t.waiting:
                if isinstance(item, Embed):
                    texts.update(dict.fromkeys((embedding_lane(embedder, item.lang), x) for x in item.texts))
                else:
                    stats.deduplicated += item.key in requests
                    requests.setdefault(item.key, item)
        outputs, cost = feed.generate(list(requests.values()), progress, stats)
        vectors: dict[tuple[str, str], np.ndarray] = {}
        for lane in dict.fromkeys(lane for lane, _ in texts):
            batch = [x for lane_of, x in texts if lane_of == lane]
            tic = time.perf_counter()
            got, computed = _embed(embedder_for(embedder, lane), batch, feed.cache)
            vectors.update(((lane, x), v) for x, v in zip(batch, got))
            cost.update(dict.fromkeys(((lane, x) for x in batch), (time.perf_counter() - tic) / len(batch)))
            stats.embedded_texts += computed
        for t in live:
            results, seconds = [], []
            for item in t.waiting:
                if isinstance(item, Embed):
                    keys = [(embedding_lane(embedder, item.lang), x) for x in item.texts]
                    results.append(np.stack([vectors[k] for k in keys]))
                    seconds.append(sum(cost[k] for k in keys))
                else:
                    results.append(outputs[item.key])
                    seconds.append(cost.get(item.key, 0.0))
            _deliver(t, results, seconds)


def _deliver(task: _Task, results: list[Any], seconds: list[float]) -> None:
    """Hand a plan the results of the stage it waits on (recording its judge calls and its share of the
    time), and run it to its next stage."""
    for item, result, s in zip(task.waiting, results, seconds):
        if isinstance(item, JudgeRequest):
            cached = {"cached": True} if result.meta.get("cached") else {}
            task.calls.append({"stage": item.tag, "value": result.value, **result.to_dict(), **cached})
        task.seconds += s
    _advance(task, results)


def _advance(task: _Task, results: Optional[list[Any]]) -> None:
    """Run the plan to its next stage (or its result)."""
    try:
        task.waiting = task.plan.send(results) if results is not None else next(task.plan)
    except StopIteration as done:
        task.result = done.value.scored_by(task.scoring)
        task.result.judge_calls = task.calls
        _note_failed_calls(task.result)
        task.waiting = []
        if task.on_done is not None:
            task.on_done()


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
class _Feed:
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


def _embed(embedder: Any, texts: list[str], cache: Optional[JudgeCache] = None) -> tuple[list[np.ndarray], int]:
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


def _account(stats: RunStats, task: _Task) -> None:
    m = stats.per_metric.setdefault(task.metric.name, {"judge_calls": 0, "cached": 0, "prompt_tokens": 0,
                                                       "completion_tokens": 0, "seconds": 0.0})
    new = [c for c in task.calls if not c.get("cached")]
    m["judge_calls"] += len(task.calls)
    m["cached"] += len(task.calls) - len(new)
    m["prompt_tokens"] += sum(c["prompt_tokens"] for c in new)
    m["completion_tokens"] += sum(c["completion_tokens"] for c in new)
    m["seconds"] += task.seconds


