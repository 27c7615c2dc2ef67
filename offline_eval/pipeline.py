"""The pipelined strategy of the scheduler, for engines with an async `session()` (the vLLM server client).

Every (sample, metric) plan runs as its own asyncio task: it sends a stage, waits for that stage's answers
only, and sends its next stage at once. A sample's claim verdicts go out while other samples still wait
for their claims, so the server always has `max_concurrency` requests to batch, instead of draining to zero
at the end of every wave.

Same contract as the waves in scheduler.py, through the state both share (run_state.py):
- identical requests are sent once per run: the first asker's future is shared by every later one;
- the persistent cache answers before the engine, and each new output is stored (committed) as soon as it
  returns, so a killed run loses only the requests in flight;
- embedding texts asked for within EMBED_WINDOW seconds are embedded in one call, in a worker thread so
  the judge keeps working meanwhile;
- results, RunStats and progress callbacks have the same shape.

An engine session is an async context manager yielding `submit(request) -> JudgeOutput`; it bounds the
requests in flight itself. We hold a gate of the same size on our side, so we know when a request really
starts and can charge each plan its share of the time (a request holds one of `slots` for `t` seconds:
t / slots of the wall time, exact while all slots are busy).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional, Sequence

import numpy as np

from .engines.aio import run_sync
from .engines.base import JudgeOutput, JudgeRequest, abilities
from .plan import Embed
from .run_state import Feed, Progress, RunStats, Task, deliver, embed_texts, embedder_for, embedding_lane

EMBED_WINDOW = 0.02  # seconds: long enough to batch every plan that reaches its embedding stage together
DEFAULT_SLOTS = 64  # when an engine does not say how many requests it keeps in flight


def run_pipelined(tasks: Sequence[Task], feed: Feed, embedder: Any, progress: Progress, stats: RunStats) -> None:
    run_sync(lambda: _pipeline(tasks, feed, embedder, progress, stats))


async def _pipeline(tasks: Sequence[Task], feed: Feed, embedder: Any, progress: Progress,
                    stats: RunStats) -> None:
    async with feed.engine.session() as submit:
        slots = abilities(feed.engine).max_concurrency
        judge = _Judge(submit, DEFAULT_SLOTS if slots is None else slots, feed, progress, stats)
        embed = _Embedder(embedder, feed.cache, stats)
        runs = [asyncio.ensure_future(_drive(t, judge, embed)) for t in tasks]
        try:
            await asyncio.gather(*runs)
        except BaseException:  # an engine error or Ctrl-C: stop every request still out
            pending = [*runs, *judge.answers.values(), *embed.batches]
            for r in pending:
                r.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise


async def _drive(task: Task, judge: "_Judge", embed: "_Embedder") -> None:
    """Run one plan to its result, one stage at a time."""
    while task.result is None:
        answers = await asyncio.gather(*(embed(item.texts, item.lang) if isinstance(item, Embed) else judge(item)
                                         for item in task.waiting))
        deliver(task, [a for a, _ in answers], [s for _, s in answers])


class _Judge:
    """Answers one request at a time: shared if already asked, else from the cache, else from the engine."""

    def __init__(self, submit: Callable[[JudgeRequest], Awaitable[JudgeOutput]], slots: int, feed: Feed,
                 progress: Progress, stats: RunStats):
        self.submit = submit
        self.slots = max(int(slots), 1)
        self.gate = asyncio.Semaphore(self.slots)
        self.feed = feed
        self.progress = progress
        self.stats = stats
        self.answers: dict[str, asyncio.Future] = {}  # request key -> (output, seconds charged)

    def __call__(self, request: JudgeRequest) -> asyncio.Future:
        answer = self.answers.get(request.key)
        if answer is not None:
            self.stats.deduplicated += 1
            return answer
        found = self.feed.lookup([request], self.stats)
        if found:  # answered at once: a warm rerun makes no task per request
            answer = asyncio.get_running_loop().create_future()
            answer.set_result((found[request.key], 0.0))
        else:
            answer = asyncio.ensure_future(self._ask_engine(request))
        self.answers[request.key] = answer
        return answer

    async def _ask_engine(self, request: JudgeRequest) -> tuple[JudgeOutput, float]:
        self.progress.add_total(1)
        async with self.gate:
            tic = time.perf_counter()
            out = await self.submit(request)
            held = time.perf_counter() - tic
        self.progress.advance(1)
        self.feed.record([request], [out], self.stats)  # counted, and committed to the cache at once
        return out, held / self.slots


class _Embedder:
    """Embeds texts in batches: each text once per run, texts asked for close together in one call."""

    def __init__(self, embedder: Any, cache: Any, stats: RunStats):
        self.embedder = embedder
        self.cache = cache
        self.stats = stats
        self.vectors: dict[tuple[str, str], asyncio.Future] = {}  # (lane, text) -> (vector, seconds charged)
        self.waiting: list[tuple[str, str]] = []  # (lane, text) for the next batch
        self.batches: list[asyncio.Task] = []
        self.lock = asyncio.Lock()  # one batch at a time in the worker thread

    async def __call__(self, texts: Sequence[str], lang: str = "") -> tuple[np.ndarray, float]:
        loop = asyncio.get_running_loop()
        keys = [(embedding_lane(self.embedder, lang), text) for text in texts]
        new = [k for k in dict.fromkeys(keys) if k not in self.vectors]
        for key in new:
            self.vectors[key] = loop.create_future()
        if new and not self.waiting:  # the first text of a batch schedules it
            self.batches.append(asyncio.ensure_future(self._batch()))
        self.waiting += new
        got = [await self.vectors[k] for k in keys]
        return np.stack([v for v, _ in got]), sum(s for _, s in got)

    async def _batch(self) -> None:
        await asyncio.sleep(EMBED_WINDOW)
        batch, self.waiting = self.waiting, []
        for lane in dict.fromkeys(lane for lane, _ in batch):  # one call per model
            await self._embed([k for k in batch if k[0] == lane])

    async def _embed(self, keys: list[tuple[str, str]]) -> None:
        async with self.lock:
            tic = time.perf_counter()
            try:
                vectors, computed = await asyncio.to_thread(embed_texts, embedder_for(self.embedder, keys[0][0]),
                                                            [text for _, text in keys], self.cache)
            except Exception as exc:  # each waiting plan raises it (e.g. no embeddings configured)
                for key in keys:
                    self.vectors[key].set_exception(exc)
                return
        each = (time.perf_counter() - tic) / len(keys)
        self.stats.embedded_texts += computed
        for key, vector in zip(keys, vectors):
            self.vectors[key].set_result((vector, each))
