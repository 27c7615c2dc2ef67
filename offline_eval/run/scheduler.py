"""The scheduler: the only place that knows about batching.

A run streams: `stream_metrics` reads its samples lazily, starts one plan per (sample, metric), and reports each
sample's results in input order as soon as it and every sample before it are done. At most `window` samples
are read and not yet reported, so a run over a million rows holds a window's plans, never the data set's.
Within the window it runs the plans in one of two ways:

- waves (in-process engines: llama.cpp, vllm-offline): each wave gathers the stage every unfinished plan of
  the window is waiting on (an engine that runs requests one by one, like llama.cpp: of one sample at a time),
  deduplicates identical judge requests and embedding texts across all of them, sends the judge requests to
  the engine as one batch, and feeds each plan its results. Dependent stages (claims -> verdicts) simply come
  in the next wave. Large batches are what these engines need.
- pipelined (engines with an async `session()`: the vLLM server client; see pipeline.py): each sample runs as
  its own asyncio task and each plan sends its next stage as soon as its own inputs are answered, so the
  server never idles at a wave boundary.

Both feed plans through `deliver`, answer requests through `Feed` (cache, then engine) and fill the same
RunStats and progress: that shared state lives in state.py, which both strategies import.

With a persistent cache (cache.py), a wave first takes what the cache has, then sends the rest to the engine
in chunks, sorted so shared prefixes stay together (engines/base.py prefix_order), and stores each chunk as soon as it returns:
a killed run loses at most one chunk, i.e. the calls in flight (a chunk is one batch of the engine: at most
chunk_size requests, and one for an engine that runs them one at a time, like llama.cpp). The pipelined path
asks the cache per request and stores each new output as soon as it returns.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ..cache import JudgeCache
from ..dataset import SingleTurnSample
from ..engines.base import Engine, JudgeRequest, abilities
from ..judges import resolve_embeddings, resolve_judge
from .long_inputs import DEFAULT_POLICY, fitted_plans
from .pipeline import stream_pipelined
from .plan import Embed, MetricResult, check_scoring
from .state import (Feed, Progress, RunStats, SampleRun, Task, advance, deliver, embed_texts, embedder_for,
                        embedding_lane)

if TYPE_CHECKING:  # only for hints: metrics.base imports run_metrics from here
    from ..metrics.base import Metric


DEFAULT_WINDOW = 1000  # samples read but not yet reported: what bounds a run's memory (scripts/bench_run_core.py)


def run_metrics(
    samples: Sequence[SingleTurnSample],
    metrics: Sequence[Metric],
    on_sample: Optional[Callable[[int, dict[str, MetricResult]], None]] = None,
    **options: Any,
) -> list[dict[str, MetricResult]]:
    """Score every sample with every metric; returns, per sample, {metric name: result}: `stream_metrics` over
    a list, with the same `options` (judge, embeddings, cache, window, ...). `on_sample(i, results)` is
    called as soon as sample i and every sample before it are done."""
    out: list[dict[str, MetricResult]] = []

    def keep(i: int, results: Optional[dict[str, MetricResult]]) -> None:
        out.append(results)
        if on_sample is not None:
            on_sample(i, results)

    stream_metrics(enumerate(samples), metrics, keep, **options)
    return out


def stream_metrics(
    items: Iterable[tuple[Any, Optional[SingleTurnSample]]],
    metrics: Sequence[Metric],
    on_sample: Callable[[Any, Optional[dict[str, MetricResult]]], None],
    judge: Any = None,
    embeddings: Any = None,
    progress: Optional[Progress] = None,
    stats: Optional[RunStats] = None,
    show_progress: bool = False,
    cache: Optional[JudgeCache] = None,
    chunk_size: Optional[int] = None,
    long_inputs: str = DEFAULT_POLICY,
    pipeline: Optional[bool] = None,
    scoring: Optional[str] = None,
    window: Optional[int] = None,
    total: Optional[int] = None,
) -> RunStats:
    """Score each `(tag, sample)` of `items` with every metric, reading `items` lazily, and call
    `on_sample(tag, {metric name: result})` for each in the order of `items` (a None sample passes through
    as `on_sample(tag, None)`). At most `window` samples (default DEFAULT_WINDOW) are read and not yet reported,
    so memory is bounded whatever the length of `items`; within the window identical requests are sent once.

    With `cache`, requests it holds are not sent to the engine, and new outputs are stored every `chunk_size`
    requests (default: $OFFLINE_EVAL_CHUNK, else 64). Contexts too long for the judge follow `long_inputs`
    ("focus", "focus:N", "truncate" or "error", see long_inputs.py). `pipeline`: run the plans pipelined (needs
    an engine with `session()`) or in waves; default: pipelined whenever the engine can. `scoring`
    ("probability" or "argmax", plan.py SCORINGS) decides every result's value; default: each metric's own
    `scoring`. `total`: how many items there are, if known, for the progress bar's rows and their ETA.
    Returns the run's stats (`stats`, if given, is filled)."""
    if scoring is not None:
        check_scoring(scoring)
    window = window or DEFAULT_WINDOW
    if window < 1:
        raise ValueError(f"window must be at least 1 sample, not {window}")
    engine = resolve_judge(judge if judge is not None else _first(metrics, "llm"))
    embedder = None
    if any(m.needs_embeddings for m in metrics):
        embedder = resolve_embeddings(embeddings if embeddings is not None else _first(metrics, "embeddings"))
    stats = stats if stats is not None else RunStats()
    feed = Feed(engine, cache, chunk_size or int(os.environ.get("OFFLINE_EVAL_CHUNK", 0)) or 64)
    can = abilities(engine)
    pipelined = can.session if pipeline is None else pipeline
    if pipelined and not can.session:
        raise ValueError(f"the {engine.identity.get('engine')} engine has no async session: it runs in waves")

    def begin(item: tuple[Any, Optional[SingleTurnSample]]) -> SampleRun:
        tag, sample = item
        return SampleRun(tag, None if sample is None else _start(metrics, sample, engine, long_inputs, scoring))

    bar = progress or Progress()

    def report(run: SampleRun) -> None:
        for task in run.tasks or ():
            _account(stats, task)
        on_sample(run.tag, run.results())
        bar.rows_done(1)

    def go() -> None:
        started = time.perf_counter()
        try:
            if pipelined:  # measuring a sample's prompts asks the server: off the event loop
                stream_pipelined(items, begin, report, window, feed, embedder, bar, stats,
                                 begin_in_thread=can.measurable)
            else:
                # An engine that runs one request at a time gains nothing from wide waves, and reuses only the
                # previous prompt's prefix: it runs each sample's plans to the end before the next sample's,
                # so its contexts are computed once for all its metrics and stages.
                _stream_waves(items, begin, report, 1 if can.batch_size == 1 else window, feed, embedder, bar,
                              stats, one_by_one=can.batch_size == 1)
        finally:
            stats.seconds += time.perf_counter() - started

    if progress is None and show_progress:
        from .progress import RichProgress

        with RichProgress(rows=total) as bar:
            go()
    else:
        go()
    return stats


def _first(metrics: Sequence[Metric], attr: str) -> Any:
    return next((getattr(m, attr) for m in metrics if getattr(m, attr) is not None), None)


def _stream_waves(items: Iterable[Any], begin: Callable[[Any], SampleRun], report: Callable[[SampleRun], None],
                  window: int, feed: Feed, embedder: Any, progress: Progress, stats: RunStats,
                  one_by_one: bool) -> None:
    """The waves over a window: each wave serves every unfinished plan of the window's samples, then the
    finished samples at its head are reported and as many new ones read. `one_by_one`: the window's first
    sample runs to its end instead, its contexts last (prefix_order: nothing before it is worth keeping)."""
    source = iter(items)
    pending: deque[SampleRun] = deque()
    more = True
    while more or pending:
        while more and len(pending) < window:
            item = next(source, _END)
            if item is _END:
                more = False
            else:
                pending.append(begin(item))
        while pending and pending[0].done:
            report(pending.popleft())
        if not pending:
            continue
        if one_by_one:
            feed.contexts_last = False
            _run_waves(pending[0].live(), feed, embedder, progress, stats)
        else:
            _wave([t for run in pending for t in run.live()], feed, embedder, progress, stats)


_END = object()


def _start(metrics: Sequence[Metric], sample: SingleTurnSample, engine: Engine, long_inputs: str,
           scoring: Optional[str]) -> list[Task]:
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
            tasks.append(Task(metric, iter(()), result))
            continue
        task = Task(metric, next(plans), scoring=task_scoring)
        advance(task, None)
        tasks.append(task)
    return tasks


def _run_waves(tasks: list[Task], feed: Feed, embedder, progress: Progress, stats: RunStats) -> None:
    """Waves until every one of `tasks` has its result."""
    while any(t.result is None for t in tasks):
        _wave([t for t in tasks if t.result is None], feed, embedder, progress, stats)


def _wave(live: list[Task], feed: Feed, embedder, progress: Progress, stats: RunStats) -> None:
    """One wave: the stage each of `live` waits on, identical requests and texts once, then each plan fed."""
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
        got, computed = embed_texts(embedder_for(embedder, lane), batch, feed.cache)
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
        deliver(t, results, seconds)


def _account(stats: RunStats, task: Task) -> None:
    m = stats.per_metric.setdefault(task.metric.name, {"judge_calls": 0, "cached": 0, "prompt_tokens": 0,
                                                       "completion_tokens": 0, "seconds": 0.0})
    new = [c for c in task.calls if not c.get("cached")]
    m["judge_calls"] += len(task.calls)
    m["cached"] += len(task.calls) - len(new)
    m["prompt_tokens"] += sum(c["prompt_tokens"] for c in new)
    m["completion_tokens"] += sum(c["completion_tokens"] for c in new)
    m["seconds"] += task.seconds


