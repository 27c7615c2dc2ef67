"""The engine protocol: many judge requests in, one output per request out.

Metrics build `JudgeRequest`s, the scheduler hands them to an engine in large batches, and the engine returns
`JudgeOutput`s in the same order. Nothing else in the package knows which engine is behind a judge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from ..constraints import Constraint


@dataclass(frozen=True)
class Sampling:
    """Sampling settings. The defaults make a run deterministic: greedy decoding, fixed seed."""

    temperature: float = 0.0
    seed: int = 0
    max_tokens: Optional[int] = None  # None: the constraint's worst case, so output is never cut off


@dataclass(frozen=True)
class JudgeRequest:
    """One judge call. `messages` are (role, content) pairs: the shared instructions come first and the
    sample-specific text last, so engines with prefix caching reuse the common part."""

    messages: tuple[tuple[str, str], ...]
    constraint: Constraint
    sampling: Sampling = Sampling()
    tag: str = field(default="", compare=False)  # which stage asked (for reports); not part of the key

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens or self.constraint.max_tokens()

    def chat(self, merge_system: bool = False) -> list[dict[str, str]]:
        """OpenAI-style messages. `merge_system` folds the system turn into the first user turn, for chat
        templates that have no system role (Gemma 2 raises on one)."""
        messages = [{"role": role, "content": content} for role, content in self.messages]
        if merge_system and len(messages) > 1 and messages[0]["role"] == "system" and messages[1]["role"] == "user":
            system, first = messages[0], messages[1]
            messages[1:2] = [{"role": "user", "content": f"{system['content']}\n\n{first['content']}"}]
            del messages[0]
        return messages

    @property
    def key(self) -> str:
        """A stable digest of everything that determines the output (the model aside)."""
        payload = json.dumps(
            [self.messages, self.constraint.key, self.sampling.temperature, self.sampling.seed,
             self.max_tokens],
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class JudgeOutput:
    text: str
    value: Any  # the parsed, constraint-checked value (choice string or JSON); None if the call failed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            **({"error": self.meta["error"]} if "error" in self.meta else {}),
        }


Progress = Callable[[int], None]  # called with the number of requests just finished


class EngineError(RuntimeError):
    """The engine could not produce outputs (model missing, server down, ...). Exit code 3 in the CLI."""


@runtime_checkable
class Engine(Protocol):
    """What every engine provides. `identity` names the model and engine for cache keys and reports."""

    identity: dict[str, Any]

    def generate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        """Run all requests under their constraints; return outputs in request order."""
        ...

    def close(self) -> None:
        ...


async def agenerate(engine: Engine, requests: Sequence[JudgeRequest]) -> list[JudgeOutput]:
    """Async facade for engines whose `generate` blocks (in-process ones)."""
    return await asyncio.to_thread(engine.generate, list(requests))
