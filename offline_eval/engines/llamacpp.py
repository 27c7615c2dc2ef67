"""llama.cpp in process (llama-cpp-python, GGUF weights, CPU).

Constraints use llama.cpp's own GBNF grammars: they need no compile step, work for any vocabulary and are
enforced inside the sampler (see scripts/bench_constraints.py for the comparison with outlines).
Requests run one after another: on a CPU the model is compute-bound, and consecutive requests that share
a prompt prefix reuse llama.cpp's KV cache.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..constraints import Choice
from .base import EngineError, JudgeOutput, JudgeRequest, Progress, control_pattern, prefix_order


class LlamaCppEngine:
    batch_size = 1  # requests run one after another: with a cache, each is stored as soon as it finishes

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: Optional[str] = None,
        n_ctx: int = 8192,
        n_threads: Optional[int] = None,
        seed: int = 0,
    ):
        try:
            from llama_cpp import Llama
        except ImportError:
            raise EngineError(
                "the llama.cpp engine needs llama-cpp-python: pip install 'offline-eval[cpu]'"
            ) from None
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise EngineError(f"GGUF file not found: {self.model_path}")
        threads = n_threads or int(os.environ.get("OFFLINE_EVAL_THREADS", 0)) or os.cpu_count() or 1
        try:
            self._llm = Llama(
                model_path=str(self.model_path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                seed=seed,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"llama.cpp could not load {self.model_path}: {exc}") from None
        self.n_ctx = self.context_size = n_ctx
        # create_chat_completion renders the chat template to text and tokenizes it with control tokens parsed:
        # every control token of this vocabulary is neutralised in message text (JudgeRequest.chat).
        self._controls = control_pattern(self._control_tokens())
        self._template = self._chat_template()
        self.identity = {
            "engine": "llamacpp",
            "model": name or self.model_path.stem,
            "weights": str(self.model_path),
            "weights_size": self.model_path.stat().st_size,
        }
        self._grammars: dict[str, Any] = {}
        self._first: dict[str, tuple[list[str], np.ndarray]] = {}  # per Choice: its allowed first tokens
        self._lock = threading.Lock()  # one Llama context: calls must not interleave

    def _grammar(self, request: JudgeRequest) -> Any:
        from llama_cpp import LlamaGrammar

        key = request.constraint.key
        if key not in self._grammars:
            self._grammars[key] = LlamaGrammar.from_string(request.constraint.gbnf(), verbose=False)
        return self._grammars[key]

    def _control_tokens(self) -> list[str]:
        from llama_cpp import LLAMA_TOKEN_ATTR_CONTROL

        model = self._llm._model
        return [model.token_get_text(i) for i in range(self._llm.n_vocab())
                if model.token_get_attr(i) & LLAMA_TOKEN_ATTR_CONTROL]

    def _chat_template(self) -> Any:
        """The GGUF's chat template as llama-cpp-python renders it (its built-in formats are only chosen when
        they equal this template); None for a GGUF without one."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        model, eos, bos = self._llm._model, self._llm.token_eos(), self._llm.token_bos()
        return Jinja2ChatFormatter(template=template, eos_token=model.token_get_text(eos) if eos != -1 else "",
                                   bos_token=model.token_get_text(bos) if bos != -1 else "")

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(self._llm.tokenize(t.encode(), add_bos=False, special=False)) for t in texts]

    def prompt_ids(self, request: JudgeRequest) -> list[int]:
        """The prompt's token ids as create_chat_completion builds them (needs the GGUF's chat template)."""
        rendered = self._template(messages=request.chat(controls=self._controls))
        return self._llm.tokenize(rendered.prompt.encode(), add_bos=not rendered.added_special, special=True)

    def count_prompt_tokens(self, requests: Sequence[JudgeRequest]) -> Optional[list[int]]:
        if self._template is None:
            return None
        return [len(self.prompt_ids(r)) for r in requests]

    def generate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        # llama.cpp reuses the KV cache of the longest prefix shared with the previous prompt, so run
        # requests that share instructions (and contexts) back to back, then restore the caller's order.
        order = sorted(range(len(requests)), key=lambda i: prefix_order(requests[i]))
        outputs: list[Optional[JudgeOutput]] = [None] * len(requests)
        with self._lock:
            for i in order:
                outputs[i] = self._one(requests[i])
                if progress:
                    progress(1)
        return outputs  # type: ignore[return-value]

    def _first_tokens(self, choice: Choice) -> tuple[list[str], np.ndarray]:
        """The tokens a Choice allows first: every option prefix that is one token ("y", "ye", "yes"), as
        (texts, ids)."""
        if choice.key not in self._first:
            pairs = choice.first_tokens(lambda text: self._llm.tokenize(text.encode(), add_bos=False, special=False))
            self._first[choice.key] = (list(pairs.values()), np.array(list(pairs), dtype=np.intp))
        return self._first[choice.key]

    def _reusable_prefix(self, request: JudgeRequest) -> int:
        """How many of the prompt's tokens llama-cpp-python will take from the KV cache the previous call left:
        the longest prefix shared with it, less one token when that is the whole prompt (Llama.generate
        recomputes one for fresh logits). 0 for a GGUF without a chat template (the prompt cannot be built)."""
        if self._template is None:
            return 0
        prompt, held = self.prompt_ids(request), self._llm.input_ids[:self._llm.n_tokens]
        shared = 0
        for a, b in zip(held, prompt):
            if a != b:
                break
            shared += 1
        return shared - 1 if shared == len(prompt) else shared

    def _one(self, request: JudgeRequest) -> JudgeOutput:
        first_logits: list[np.ndarray] = []
        texts, ids = self._first_tokens(request.constraint) if isinstance(request.constraint, Choice) else ([], None)

        def watch(_input_ids: Any, logits: np.ndarray) -> np.ndarray:
            # llama-cpp-python runs this first in its sampler chain, before the grammar masks anything:
            # `logits` are the model's own, indexed by token id. Only the answer position is kept.
            if not first_logits:
                first_logits.append(np.array(logits[ids], dtype=np.float64))
            return logits
        reused = self._reusable_prefix(request)
        try:
            result = self._llm.create_chat_completion(
                messages=request.chat(controls=self._controls),
                grammar=self._grammar(request),
                temperature=request.sampling.temperature,
                seed=request.sampling.seed,
                max_tokens=request.max_tokens,
                logits_processor=[watch] if ids is not None else None,
            )
        except ValueError as exc:  # e.g. prompt + max_tokens exceed the context window
            return JudgeOutput(text="", value=None, finish_reason="error", meta={"error": str(exc)})
        choice = result["choices"][0]
        text = choice["message"]["content"] or ""
        usage = result.get("usage", {})
        out = JudgeOutput(
            text=text,
            value=None,
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            reused_prompt_tokens=reused,
            finish_reason=choice.get("finish_reason") or "stop",
        )
        if out.finish_reason == "length":  # llama.cpp shrinks max_tokens to what the context has left
            out.meta["error"] = (
                f"input too long: {out.prompt_tokens} prompt tokens leave less than the "
                f"{request.max_tokens} output tokens this judge call may need (n_ctx {self.n_ctx})"
            )
            return out
        # The grammar makes anything else impossible; a violation means the constraint did not bite.
        out.value = request.constraint.parse(text)
        if first_logits:  # logits are log-probabilities up to a constant, which renormalising removes
            out.probabilities = request.constraint.distribution(zip(texts, first_logits[0].tolist()))
        return out

    def close(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.close()
