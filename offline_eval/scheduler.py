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

Both feed plans through `deliver`, answer requests through `Feed` (cache, then engine) and fill the same
RunStats, results and progress: that shared state lives in run_state.py, which both strategies import.

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
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from .cache import JudgeCache
from .dataset import SingleTurnSample
from .engines.base import Engine, JudgeRequest, abilities
from .judges import resolve_embeddings, resolve_judge
from .long_inputs import DEFAULT_POLICY, fitted_plans
from .pipeline import run_pipelined
from .plan import Embed, MetricResult, check_scoring
from .run_state import Feed, Progress, RunStats, Task, advance, deliver, embed_texts, embedder_for, embedding_lane

if TYPE_CHECKING:  # only for hints: metrics.base imports run_metrics from here
    from .metrics.base import Metric


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
    long_inputs: str = DEFAULT_POLICY,
    pipeline: Optional[bool] = None,
    on_sample: Optional[Callable[[int, dict[str, MetricResult]], None]] = None,
    scoring: Optional[str] = None,
) -> list[dict[str, MetricResult]]:
    """Score every sample with every metric; returns, per sample, {metric name: result}. With `cache`,
    requests it holds are not sent to the engine, and new outputs are stored every `chunk_size` requests
    (default: $OFFLINE_EVAL_CHUNK, else 64). Contexts too long for the judge follow `long_inputs`
    ("focus", "focus:N", "truncate" or "error", see long_inputs.py). `pipeline`: run the plans pipelined (needs an engine with
    `session()`) or in waves; default: pipelined whenever the engine can. `on_sample(i, results)` is called as
    soon as sample i has every metric's result (in completion order), e.g. to write results as they come.
    `scoring` ("probability" or "argmax", plan.py SCORINGS) decides every result's value; default: each
    metric's own `scoring`."""
    if scoring is not None:
        check_scoring(scoring)
    engine = resolve_judge(judge if judge is not None else _first(metrics, "llm"))
    embedder = None
    if any(m.needs_embeddings for m in metrics):
        embedder = resolve_embeddings(embeddings if embeddings is not None else _first(metrics, "embeddings"))
    stats = stats if stats is not None else RunStats()
    feed = Feed(engine, cache, chunk_size or int(os.environ.get("OFFLINE_EVAL_CHUNK", 0)) or 64)
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


def _run(samples, metrics, feed: Feed, embedder, progress: Progress, stats: RunStats, long_inputs: str,
         pipelined: bool, on_sample=None, scoring: Optional[str] = None):
    started = time.perf_counter()
    tasks = [_start(metrics, sample, feed.engine, long_inputs, scoring) for sample in samples]
    if on_sample is not None:
        _report_samples(tasks, on_sample)
    live = [t for row in tasks for t in row if t.result is None]
    if pipelined:
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


def _report_samples(tasks: list[list[Task]], on_sample: Callable[[int, dict[str, MetricResult]], None]) -> None:
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


