"""A scripted judge for testing scoring math and API shapes only (never engine behaviour).

It answers each request with `answer(request)` — a function of the request's tag and messages — and
parses the text through the request's constraint, exactly like a real engine does after decoding.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Sequence

import numpy as np

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
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            outputs.append(JudgeOutput(text=text, value=r.constraint.parse(text), prompt_tokens=10,
                                       completion_tokens=2))
            if progress:
                progress(1)
        return outputs

    def close(self) -> None:
        pass


class TableEmbeddings:
    """Embeddings from a fixed table {text: vector}; unknown texts raise."""

    def __init__(self, table: dict[str, Sequence[float]]):
        self.table = {k: np.asarray(v, dtype=float) for k, v in table.items()}

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


def user_text(request: JudgeRequest) -> str:
    return request.messages[-1][1]
