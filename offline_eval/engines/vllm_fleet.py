"""A fleet of vLLM servers as one judge engine: several base URLs serving the same model.

For vLLM replicas behind no load balancer (one per GPU host), or next to one. models.yaml: `base_urls:
[http://gpu1:8000/v1, http://gpu2:8000/v1]` on a `engine: vllm` entry; CLI: `run --base-url URL,URL,...`.

- Start: each endpoint is a `VllmServerEngine` (engines/vllm_server.py), whose own start-up check asks
  /v1/models for the served model, then `verify_constraints()` (it really applies constraints). An endpoint
  that fails either is reported on stderr and skipped, as long as one is healthy; none healthy is an
  EngineError naming each endpoint's problem.
- Requests: every request goes to the live endpoint with the least outstanding requests (relative to its
  max_concurrency), through that endpoint's own `session()`: its request body, constraint handling, retries
  with backoff and response parsing. Nothing of that is repeated here.
- Failure: when an endpoint's request fails (after its own retries), the endpoint's health is checked
  (/v1/models, with the endpoint's API key). If it no longer answers, it is marked down for the rest of the
  engine's life and the request is sent to another endpoint; its other in-flight requests do the same as
  they fail. If it does answer, the error was the request's own (e.g. a rejected request) and is raised, as
  a single server would. So a lost endpoint loses no request; only when every endpoint is down does the run
  stop.
- Identity (cache keys): like a single server's, the served model, the weights the servers loaded (or, for
  servers that do not say, all the configured URLs, so an endpoint being down does not change the key) and
  the context length.
- The scheduler runs it pipelined (it has `session()`), with the fleet's total concurrency in flight.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from .base import EngineError, JudgeOutput, JudgeRequest
from .vllm_launch import is_up
from .vllm_server import VllmServerEngine

Submit = Callable[[JudgeRequest], Awaitable[JudgeOutput]]


class VllmFleetEngine:
    def __init__(self, base_urls: Sequence[str], model: str, *, name: Optional[str] = None,
                 endpoint: Callable[..., VllmServerEngine] = VllmServerEngine, **options: Any):
        """`options` go to every endpoint's VllmServerEngine (max_concurrency, timeout, max_retries, ...)."""
        urls = list(dict.fromkeys(u.rstrip("/") for u in base_urls))
        if not urls:
            raise EngineError("a vLLM fleet needs at least one base URL")
        self.endpoints: list[VllmServerEngine] = []
        self.down: dict[str, str] = {}  # base_url -> why it was dropped
        for url in urls:
            try:
                e = endpoint(url, model, name=name, **options)
                if options.get("check", True):
                    e.verify_constraints()
                self.endpoints.append(e)
            except EngineError as exc:
                self._drop(url, f"failed its start-up check: {exc}")
        if not self.endpoints:
            raise EngineError(f"no vLLM endpoint of the fleet is usable: {self._problems()}")
        self.outstanding = {e.base_url: 0 for e in self.endpoints}
        self.served = {e.base_url: 0 for e in self.endpoints}  # requests each endpoint answered
        self.resubmitted = 0  # requests sent again after their endpoint went down
        lengths = {e.max_model_len for e in self.endpoints}
        self.max_model_len = min(n for n in lengths if n) if any(lengths) else None
        first = self.endpoints[0]
        self.identity = {**first.identity, "max_model_len": self.max_model_len}
        if "base_url" in self.identity:  # servers that do not say what they loaded: named by all their URLs
            del self.identity["base_url"]
            self.identity["base_urls"] = urls

    # ---- the engine protocol, as a single server provides it ----------------------------------------------
    # generate() and agenerate() only need session(): borrow the single server's, which batch requests
    # through it (prefix-sorted, with progress).
    generate = VllmServerEngine.generate
    agenerate = VllmServerEngine.agenerate

    @property
    def max_concurrency(self) -> int:
        return sum(e.max_concurrency for e in self.live)

    @property
    def live(self) -> list[VllmServerEngine]:
        return [e for e in self.endpoints if e.base_url not in self.down]

    @property
    def context_size(self) -> Optional[int]:
        return self.max_model_len

    def body(self, request: JudgeRequest) -> dict[str, Any]:
        return self.live[0].body(request)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._on_any(lambda e: e.count_tokens(texts))

    def count_prompt_tokens(self, requests: Sequence[JudgeRequest]) -> list[int]:
        return self._on_any(lambda e: e.count_prompt_tokens(requests))

    def _on_any(self, call: Callable[[VllmServerEngine], Any]) -> Any:
        """`call` on the first live endpoint that can answer it."""
        while True:
            endpoint = self._pick()
            try:
                return call(endpoint)
            except EngineError as exc:
                if is_up(endpoint.base_url, api_key=endpoint.api_key):
                    raise
                self._drop(endpoint.base_url, str(exc))

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Submit]:
        """`submit(request) -> JudgeOutput` over the live endpoints, least outstanding first."""
        async with AsyncExitStack() as stack:
            submits: dict[str, Submit] = {}
            for e in self.live:
                submits[e.base_url] = await stack.enter_async_context(e.session())

            async def submit(request: JudgeRequest) -> JudgeOutput:
                while True:
                    endpoint = self._pick()
                    url = endpoint.base_url
                    self.outstanding[url] += 1
                    try:
                        out = await submits[url](request)
                    except EngineError as exc:
                        if url in self.down or not await asyncio.to_thread(is_up, url, 2.0, endpoint.api_key):
                            self._drop(url, str(exc))
                            self.resubmitted += 1
                            continue
                        raise  # the endpoint is fine: the request itself failed
                    finally:
                        self.outstanding[url] -= 1
                    self.served[url] += 1
                    return out

            yield submit

    def _pick(self) -> VllmServerEngine:
        live = self.live
        if not live:
            raise EngineError(f"every vLLM endpoint of the fleet is down: {self._problems()}")
        return min(live, key=lambda e: self.outstanding[e.base_url] / e.max_concurrency)

    def _drop(self, url: str, why: str) -> None:
        if url not in self.down:
            self.down[url] = why
            print(f"vLLM endpoint {url} is out of the fleet: {why}", file=sys.stderr)

    def _problems(self) -> str:
        return "; ".join(f"{url}: {why}" for url, why in self.down.items())

    def close(self) -> None:
        for e in self.endpoints:
            e.close()
