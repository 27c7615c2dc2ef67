"""The pipelined strategy of the scheduler, for engines with an async `session()` (the vLLM server client).

Every sample of the window runs as its own asyncio task, and each of its (metric) plans sends a stage, waits
for that stage's answers only, and sends its next stage at once. A sample's claim verdicts go out while other
samples still wait for their claims, so the server always has `max_concurrency` requests to batch, instead of
draining to zero at the end of every wave. A new sample is read as soon as the oldest one is reported.

Same contract as the waves in scheduler.py, through the state both share (state.py):
- identical requests are sent once within the window: the first asker's future is shared by every later one,
  and forgotten once no sample in the window asked for it;
- the persistent cache answers before the engine, and each new output is stored (committed) as soon as it
  returns, so a killed run loses only the requests in flight;
- embedding texts asked for within EMBED_WINDOW seconds are embedded in one call, in a worker thread so
  the judge keeps working meanwhile;
- results, RunStats and progress callbacks have the same shape.

An engine session is an async context manager yielding `submit(request) -> JudgeOutput`; it bounds the
requests in flight itself. We hold a gate of the same size on our side, so we know when a request really
starts and can charge each plan its share of the time (a request holds one of `slots` for `t` seconds:
t / slots of the wall time, exact while all slots are busy). The gate hands a free slot to the oldest
sample's waiting request, not to the request that waited longest: in first-come order a window's first
stages (a thousand samples' claims) would all go before the first sample's verdicts, and no row would be
finished until the window's whole first stage was. The engine is kept as busy either way.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

import numpy as np

from ..engines.aio import run_sync
from ..engines.base import JudgeOutput, JudgeRequest, abilities
from .plan import Embed
from .state import (Feed, Progress, RunStats, SampleRun, Task, deliver, embed_texts, embedder_for,
                        embedding_lane)

EMBED_WINDOW = 0.02  # seconds: long enough to batch every plan that reaches its embedding stage together
DEFAULT_SLOTS = 64  # when an engine does not say how many requests it keeps in flight


def stream_pipelined(items: Iterable[Any], begin: Callable[[Any], SampleRun], report: Callable[[SampleRun], None],
                     window: int, feed: Feed, embedder: Any, progress: Progress, stats: RunStats,
                     begin_in_thread: bool = False) -> None:
    """Read `items` lazily, `begin` each into a SampleRun (in a worker thread with `begin_in_thread`: measuring
    its prompts may ask the server), drive its plans, and `report` the samples in input order, with at most
    `window` samples begun and not yet reported."""
    run_sync(lambda: _stream(items, begin, report, window, feed, embedder, progress, stats, begin_in_thread))


_END = object()


async def _stream(items, begin, report, window: int, feed: Feed, embedder: Any, progress: Progress,
                  stats: RunStats, begin_in_thread: bool) -> None:
    async with feed.engine.session() as submit:
        slots = abilities(feed.engine).max_concurrency
        judge = _Judge(submit, DEFAULT_SLOTS if slots is None else slots, feed, progress, stats)
        embed = _Embedder(embedder, feed.cache, stats)
        room = asyncio.Semaphore(window)
        begun: asyncio.Queue = asyncio.Queue()  # (run, its future) in input order; None after the last
        live: set[asyncio.Future] = set()
        failure = asyncio.get_running_loop().create_future()  # the first error of any sample, at once

        def watch(future: asyncio.Future) -> None:
            live.discard(future)
            if not future.cancelled() and future.exception() is not None and not failure.done():
                failure.set_exception(future.exception())

        admitted = itertools.count()  # each sample's place in the input: its requests' rank at the gate

        async def admit() -> None:
            source = iter(items)
            while True:
                await room.acquire()  # before reading: the window bounds what was read, not only what runs
                if (item := next(source, _END)) is _END:
                    break
                run = await asyncio.to_thread(begin, item) if begin_in_thread else begin(item)
                future = asyncio.ensure_future(_drive_sample(run, next(admitted), judge, embed))
                live.add(future)
                future.add_done_callback(watch)
                begun.put_nowait((run, future))
            begun.put_nowait(None)

        async def emit() -> None:
            while (entry := await begun.get()) is not None:
                run, future = entry
                await future
                report(run)
                judge.release(run.asked)
                embed.release(run.asked)
                room.release()

        feeder = asyncio.ensure_future(admit())
        feeder.add_done_callback(watch)
        emitter = asyncio.ensure_future(emit())
        try:
            await asyncio.wait([emitter, failure], return_when=asyncio.FIRST_COMPLETED)
            if failure.done():
                failure.result()  # raises it
            emitter.result()
        except BaseException:  # an engine error or Ctrl-C: stop every request still out
            pending = [feeder, emitter, *live, *judge.answers.values(), *embed.batches]
            for r in pending:
                r.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise
        finally:
            if not failure.done():
                failure.cancel()


async def _drive_sample(run: SampleRun, rank: int, judge: "_Judge", embed: "_Embedder") -> None:
    await asyncio.gather(*(_drive(t, rank, judge, embed, run.asked) for t in run.live()))


async def _drive(task: Task, rank: int, judge: "_Judge", embed: "_Embedder", asked: list[Any]) -> None:
    """Run one plan of the sample ranked `rank` to its result, one stage at a time; `asked` gets the keys of
    what it asked."""
    while task.result is None:
        answers = await asyncio.gather(*(embed(item.texts, item.lang, asked) if isinstance(item, Embed)
                                         else judge(item, rank, asked) for item in task.waiting))
        deliver(task, [a for a, _ in answers], [s for _, s in answers])


class OldestFirst:
    """At most `slots` holders at once; a freed slot goes to the waiter of the lowest rank (the earliest
    sample), then the earliest asked."""

    def __init__(self, slots: int):
        self.free = slots
        self.waiting: list[tuple[int, int, asyncio.Future]] = []  # a heap of (rank, ask order, its turn)
        self.asked = itertools.count()

    async def acquire(self, rank: int) -> None:
        if self.free and not self.waiting:
            self.free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (rank, next(self.asked), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given the slot, then cancelled: hand it on
                self.release()
            raise

    def release(self) -> None:
        while self.waiting:
            _, _, turn = heapq.heappop(self.waiting)
            if not turn.done():  # a cancelled waiter's turn is done already: skip it
                turn.set_result(None)
                return
        self.free += 1


class _Judge:
    """Answers one request at a time: shared if already asked, else from the cache, else from the engine."""

    def __init__(self, submit: Callable[[JudgeRequest], Awaitable[JudgeOutput]], slots: int, feed: Feed,
                 progress: Progress, stats: RunStats):
        self.submit = submit
        self.slots = max(int(slots), 1)
        self.gate = OldestFirst(self.slots)
        self.feed = feed
        self.progress = progress
        self.stats = stats
        self.answers: dict[str, asyncio.Future] = {}  # request key -> (output, seconds charged)
        self.askers: dict[str, int] = {}  # request key -> samples in the window that asked it

    def __call__(self, request: JudgeRequest, rank: int, asked: list[Any]) -> asyncio.Future:
        asked.append(request.key)
        self.askers[request.key] = self.askers.get(request.key, 0) + 1
        answer = self.answers.get(request.key)
        if answer is not None:
            self.stats.deduplicated += 1
            return answer
        found = self.feed.lookup([request], self.stats)
        if found:  # answered at once: a warm rerun makes no task per request
            answer = asyncio.get_running_loop().create_future()
            answer.set_result((found[request.key], 0.0))
        else:
            answer = asyncio.ensure_future(self._ask_engine(request, rank))
        self.answers[request.key] = answer
        return answer

    async def _ask_engine(self, request: JudgeRequest, rank: int) -> tuple[JudgeOutput, float]:
        self.progress.add_total(1)
        await self.gate.acquire(rank)
        try:
            tic = time.perf_counter()
            out = await self.submit(request)
            held = time.perf_counter() - tic
        finally:
            self.gate.release()
        self.progress.advance(1)
        self.feed.record([request], [out], self.stats)  # counted, and committed to the cache at once
        return out, held / self.slots

    def release(self, keys: Sequence[Any]) -> None:
        """A reported sample's keys: answers no sample in the window asked for are forgotten (the cache keeps
        them), so the run's memory is the window's."""
        _release(self.askers, self.answers, (k for k in keys if isinstance(k, str)))


class _Embedder:
    """Embeds texts in batches: each text once per run, texts asked for close together in one call."""

    def __init__(self, embedder: Any, cache: Any, stats: RunStats):
        self.embedder = embedder
        self.cache = cache
        self.stats = stats
        self.vectors: dict[tuple[str, str], asyncio.Future] = {}  # (lane, text) -> (vector, seconds charged)
        self.askers: dict[tuple[str, str], int] = {}  # (lane, text) -> samples in the window that asked it
        self.waiting: list[tuple[str, str]] = []  # (lane, text) for the next batch
        self.batches: list[asyncio.Task] = []
        self.lock = asyncio.Lock()  # one batch at a time in the worker thread

    async def __call__(self, texts: Sequence[str], lang: str, asked: list[Any]) -> tuple[np.ndarray, float]:
        loop = asyncio.get_running_loop()
        keys = [(embedding_lane(self.embedder, lang), text) for text in texts]
        for key in keys:
            asked.append(key)
            self.askers[key] = self.askers.get(key, 0) + 1
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

    def release(self, keys: Sequence[Any]) -> None:
        """As _Judge.release, for the (lane, text) keys."""
        _release(self.askers, self.vectors, (k for k in keys if isinstance(k, tuple)))


def _release(askers: dict[Any, int], answers: dict[Any, asyncio.Future], keys: Iterable[Any]) -> None:
    for key in keys:
        askers[key] -= 1
        if not askers[key]:
            del askers[key]
            answers.pop(key, None)
