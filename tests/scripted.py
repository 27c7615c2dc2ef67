"""A scripted judge for testing scoring math and API shapes only (never engine behaviour).

It answers each request with `answer(request)` — a function of the request's tag and messages — and
parses the text through the request's constraint, exactly like a real engine does after decoding. For a
Choice, `answer` may give {option: probability}: the output is then the most probable option, with those
probabilities.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any, Callable, Optional, Sequence

import numpy as np

from offline_eval.constraints import Choice
from offline_eval.engines.base import JudgeOutput, JudgeRequest


class ScriptedJudge:
    def __init__(self, answer: Callable[[JudgeRequest], Any]):
        self.answer = answer
        self.requests: list[JudgeRequest] = []
        self.identity = {"engine": "scripted", "model": "scripted"}

    def generate(self, requests: Sequence[JudgeRequest], progress: Optional[Callable] = None):
        outputs = []
        for r in requests:
            self.requests.append(r)
            value = self.answer(r)
            probabilities = None
            if isinstance(r.constraint, Choice) and isinstance(value, dict):  # {option: probability}
                probabilities, value = value, max(value, key=value.get)
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            outputs.append(JudgeOutput(text=text, value=r.constraint.parse(text), prompt_tokens=10,
                                       completion_tokens=2, probabilities=probabilities))
            if progress:
                progress(1)
        return outputs

    def close(self) -> None:
        pass


FAIL = "<fail>"  # as an answer: the call fails, as when an input does not fit the judge's context


class TagJudge(ScriptedJudge):
    """Answers each request with `answers[request.tag]`; FAIL gives an output with no value."""

    def __init__(self, answers: dict[str, Any]):
        super().__init__(lambda request: answers[request.tag])
        self.answers = answers

    def generate(self, requests, progress=None):
        outputs = []
        for r in requests:
            if self.answers.get(r.tag) == FAIL:
                self.requests.append(r)
                outputs.append(JudgeOutput(text="", value=None, finish_reason="length",
                                           meta={"error": "input too long"}))
            else:
                outputs += super().generate([r])
            if progress:
                progress(1)
        return outputs


class Pipelined:
    """`judge` (a ScriptedJudge) with the async `session()` of a server engine, so the scheduler runs it
    pipelined. At most `max_concurrency` requests are in flight; each takes `delay(request)` seconds (default:
    0-4 ms by its key), so answers come back out of order, as from a server."""

    def __init__(self, judge: ScriptedJudge, max_concurrency: int = 4,
                 delay: Optional[Callable[[JudgeRequest], float]] = None):
        self.judge = judge
        self.max_concurrency = max_concurrency
        self.delay = delay or (lambda r: int(r.key[:2], 16) % 5 / 1000)
        self.in_flight = 0
        self.peak = 0  # the most requests in flight at once
        self.events: list[tuple[str, str]] = []  # ("start" | "end", request tag), in order

    def __getattr__(self, name: str) -> Any:  # identity, requests, generate, close: the judge's own
        return getattr(self.judge, name)

    @asynccontextmanager
    async def session(self):
        gate = asyncio.Semaphore(self.max_concurrency)

        async def submit(request: JudgeRequest) -> JudgeOutput:
            async with gate:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                self.events.append(("start", request.tag))
                try:
                    await asyncio.sleep(self.delay(request))
                    (out,) = self.judge.generate([request])
                finally:
                    self.in_flight -= 1
                self.events.append(("end", request.tag))
                return out

        yield submit


class TableEmbeddings:
    """Embeddings from a fixed table {text: vector}; unknown texts raise."""

    def __init__(self, table: dict[str, Sequence[float]]):
        self.table = {k: np.asarray(v, dtype=float) for k, v in table.items()}

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


def any_valid_answer(request: JudgeRequest) -> Any:
    """A valid answer to any stage of any metric."""
    if request.tag in ("claims", "reference_claims"):
        return {"claims": ["claim"]}
    if request.tag == "questions":
        return {"questions": [{"question": "generated?", "noncommittal": 0}] * 3}
    if request.tag == "rubric":
        return {"feedback": "ok", "score": 3}
    return request.constraint.options[0]


def user_text(request: JudgeRequest) -> str:
    return request.messages[-1][1]


def item_text(request: JudgeRequest) -> str:
    """The user turn's last paragraph: the item judged (after the contexts and the task's instructions)."""
    return user_text(request).split("\n\n")[-1]
