"""The engine protocol: many judge requests in, one output per request out.

Metrics build `JudgeRequest`s, the scheduler hands them to an engine in large batches, and the engine returns
`JudgeOutput`s in the same order. Nothing else in the package knows which engine is behind a judge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, runtime_checkable

from ..constraints import Constraint


@dataclass(frozen=True)
class Sampling:
    """Sampling settings. The defaults make a run deterministic: greedy decoding, fixed seed."""

    temperature: float = 0.0
    seed: int = 0
    max_tokens: Optional[int] = None  # None: the constraint's worst case, so output is never cut off


# Control-token spellings of the chat templates judges use: ChatML/Qwen (<|im_end|>, <|endoftext|>), Llama 3
# (<|eot_id|>), Phi (<|end|>), DeepSeek (<｜...｜>), Gemma (<start_of_turn>), SentencePiece (<s>, </s>) and
# Mistral ([INST]). Chat templates paste message text next to their own control tokens and the engines then
# tokenize the whole string with control tokens parsed, so such text in a response or a context would become a
# real end-of-turn or a fake system turn. Engines add their own vocabulary's control tokens (control_pattern).
_CONTROL_LIKE = (r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>\s]{1,40}｜>|</?s>|<(?:bos|eos|pad|unk|start_of_turn|end_of_turn)>"
                 r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CALLS)\]")
ZERO_WIDTH_SPACE = "\u200b"


def control_pattern(tokens: Iterable[str] = ()) -> re.Pattern:
    """A pattern for the common control-token spellings plus `tokens` (a model's own control tokens; only
    markup-like ones, so a vocabulary's whitespace or plain-word entries never alter text)."""
    markup = sorted({t for t in tokens if len(t) >= 3 and t[0] in "<[" and not any(c.isspace() for c in t)},
                    key=len, reverse=True)
    return re.compile("|".join([*map(re.escape, markup), _CONTROL_LIKE]))


CONTROL_TOKENS = control_pattern()


def neutralise(text: str, controls: re.Pattern = CONTROL_TOKENS) -> str:
    """`text` with every control-token spelling broken by a zero-width space after its first character: it
    reads the same, but no tokenizer can turn it into a control token."""
    return controls.sub(lambda m: m[0][0] + ZERO_WIDTH_SPACE + m[0][1:], text)


@dataclass(frozen=True)
class JudgeRequest:
    """One judge call. `messages` are (role, content) pairs: what many calls share comes first (the system
    turn, then a sample's contexts), so engines with prefix caching reuse the common part."""

    messages: tuple[tuple[str, str], ...]
    constraint: Constraint
    sampling: Sampling = Sampling()
    tag: str = field(default="", compare=False)  # which stage asked (for reports); not part of the key
    # The user turn opens with a sample's retrieved contexts (metrics/base.py request): schedules run such
    # requests after the others and back to back, so the contexts stay in the engine's prefix cache.
    shows_contexts: bool = field(default=False, compare=False)

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens or self.constraint.max_tokens()

    def chat(self, merge_system: bool = False, controls: re.Pattern = CONTROL_TOKENS) -> list[dict[str, str]]:
        """OpenAI-style messages, with control-token spellings neutralised (`controls`: the engine's pattern).
        `merge_system` folds the system turn into the first user turn, for chat templates that have no system
        role (Gemma 2 raises on one)."""
        messages = [{"role": role, "content": neutralise(content, controls)} for role, content in self.messages]
        if merge_system and len(messages) > 1 and messages[0]["role"] == "system" and messages[1]["role"] == "user":
            system, first = messages[0], messages[1]
            messages[1:2] = [{"role": "user", "content": f"{system['content']}\n\n{first['content']}"}]
            del messages[0]
        return messages

    @cached_property  # a hash of the whole prompt, asked for several times per request
    def key(self) -> str:
        """A stable digest of everything that determines the output (the model aside)."""
        payload = json.dumps(
            [self.messages, self.constraint.key, self.sampling.temperature, self.sampling.seed,
             self.max_tokens],
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode()).hexdigest()


def prefix_order(request: JudgeRequest, contexts_first: bool = False) -> tuple:
    """A sort key that keeps requests sharing a prompt prefix back to back, with the ones that show a sample's
    contexts after the others (or before them, `contexts_first`). Sorting each stage of a sample so that its
    first requests are of the kind the previous stage ended with lets an engine that reuses the previous
    prompt's prefix (llama.cpp) carry the sample's contexts from one stage (ratings) into the next (claim
    checks)."""
    return request.shows_contexts != contexts_first, request.messages


def prompt_identity(chat_template_kwargs: Optional[dict[str, Any]], merge_system: bool) -> dict[str, Any]:
    """The models.yaml settings that change the prompt a judge sees beyond its messages (chat_template_kwargs,
    `system_role: merge`), for an engine's identity and so its cache keys. Left out at their defaults, so
    the keys of judges without them stay as they were."""
    out: dict[str, Any] = {}
    if chat_template_kwargs:
        out["chat_template_kwargs"] = dict(chat_template_kwargs)
    if merge_system:
        out["system_role"] = "merge"
    return out


@dataclass
class JudgeOutput:
    text: str
    value: Any  # the parsed, constraint-checked value (choice string or JSON); None if the call failed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those the engine reused from its prefix cache instead of computing them (llama.cpp's
    # KV cache, vLLM's prefix cache); 0 where the engine does not say.
    reused_prompt_tokens: int = 0
    finish_reason: str = "stop"
    # For a Choice: the judge's probability of each option at the answer position, renormalised over the
    # options (Choice.distribution); None for JSON outputs and failed calls.
    probabilities: Optional[dict[str, float]] = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            **({"probabilities": self.probabilities} if self.probabilities is not None else {}),
            **({"error": self.meta["error"]} if "error" in self.meta else {}),
        }


Progress = Callable[[int], None]  # called with the number of requests just finished

TOP_LOGPROBS = 20  # logprobs asked of vLLM for a Choice (its default --max-logprobs): more than any Choice's first tokens


class EngineError(RuntimeError):
    """The engine could not produce outputs (model missing, server down, ...). Exit code 3 in the CLI."""


@runtime_checkable
class Engine(Protocol):
    """What every engine provides. `identity` names the model and engine for cache keys and reports.

    Optional abilities, which an engine declares by having them (read them through `abilities(engine)`, the one
    place that looks; a user's own duck-typed judge needs none of them):
      session() -> async context manager yielding `submit(request) -> JudgeOutput`   runs pipelined (the vLLM
          server client; pipeline.py); `max_concurrency: int` says how many requests it keeps in flight
      batch_size: int      how many requests it runs together at most (llama.cpp: 1, one after another); with a
          cache the scheduler hands it no more at a time, so each finished call is stored at once
      context_size: int | None and count_tokens(texts) -> list[int]   the judge's context window and plain-text
          token counts: long inputs are fitted to it (long_inputs.py); engines without both are never measured
      count_prompt_tokens(requests) -> list[int] | None   full prompts, chat template included (None: cannot
          render; prompt_token_counts then adds TEMPLATE_MARGIN)
    Choice probabilities are per output, not an ability: `JudgeOutput.probabilities` is None where the engine
    gave none, and scoring falls back on the answer (metrics/base.py p_yes).
    """

    identity: dict[str, Any]

    def generate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        """Run all requests under their constraints; return outputs in request order."""
        ...

    def close(self) -> None:
        ...


@dataclass(frozen=True)
class Abilities:
    """The optional abilities of one engine (see Engine), as read now: a fleet's concurrency follows its live
    servers, so read them where they are used."""

    session: bool = False
    max_concurrency: Optional[int] = None
    batch_size: Optional[int] = None
    context_size: Optional[int] = None
    count_tokens: bool = False
    count_prompt_tokens: bool = False

    @property
    def measurable(self) -> bool:
        """Prompts can be measured against the context window (long_inputs.py)."""
        return bool(self.context_size) and self.count_tokens


def abilities(engine: Any) -> Abilities:
    """What `engine` can do beyond generate(): the only place that inspects an engine for it."""
    return Abilities(session=hasattr(engine, "session"), max_concurrency=getattr(engine, "max_concurrency", None),
                     batch_size=getattr(engine, "batch_size", None),
                     context_size=getattr(engine, "context_size", None),
                     count_tokens=hasattr(engine, "count_tokens"),
                     count_prompt_tokens=hasattr(engine, "count_prompt_tokens"))


TEMPLATE_MARGIN = 32  # tokens a chat template may add around the messages, when it cannot be rendered


def prompt_token_counts(engine: Any, requests: Sequence[JudgeRequest]) -> list[int]:
    """Each request's prompt size in the judge's tokens: the rendered chat template where the engine can
    render it, else the messages' text plus TEMPLATE_MARGIN."""
    counts = engine.count_prompt_tokens(requests) if abilities(engine).count_prompt_tokens else None
    if counts is not None:
        return counts
    texts = ["\n".join(m["content"] for m in r.chat()) for r in requests]
    return [n + TEMPLATE_MARGIN for n in engine.count_tokens(texts)]


async def agenerate(engine: Engine, requests: Sequence[JudgeRequest]) -> list[JudgeOutput]:
    """Async facade for engines whose `generate` blocks (in-process ones)."""
    return await asyncio.to_thread(engine.generate, list(requests))
