"""Hugging Face transformers in process, constrained by outlines: any torch device (cuda, mps, cpu).

Weights: a Hugging Face folder (the same folders the vLLM engines run; `weights: {converted: ...}` for one made
from a GGUF by scripts/convert_gguf_to_hf.py). It is loaded with local_files_only and never with remote code.
Settings (models.yaml `transformers:` block): `device` (auto: cuda if available, else mps, else cpu), `dtype`
(auto: bfloat16 on cuda, float16 on mps, float32 on cpu, where bf16 matmuls are slow without bf16
instructions), `batch_size` (rows per model.generate call, default 8), `max_model_len` (default the model's
max_position_embeddings), `chat_template_kwargs`, `threads` (torch's CPU threads for the whole process; default
$OFFLINE_EVAL_THREADS, else torch's own choice: on a busy machine fewer threads can be much faster).

Constraints are outlines output types: `Literal[options]` for a Choice and `outlines.types.JsonSchema(schema,
whitespace_pattern="")` for a JsonSchema (no optional whitespace, so `constraint.max_tokens()` bounds the
output: outlines' strings allow only the two-byte escapes like \\n, within the 4 bytes a character is
budgeted). outlines turns each into a regex, outlines_core compiles it for this vocabulary once, and its
logits processor masks `model.generate`'s logits, one guide per row of a batch. `constraint.parse` checks every
output, so a constraint that did not bite is an error, never a score.

Batches: requests with the same constraint and sampling go through one `model.generate` call (left padded,
shortest prompts together). A Choice's probabilities come from the model's raw logits at the first generated
position (before the mask), over the tokens that begin an option (Choice.first_tokens), renormalised: the
same readout as the llama.cpp engine. Prompts longer than the context are answered with value None and
meta["error"], as in the vLLM engine; completion_tokens counts the generated tokens, end-of-sequence included.
"""

from __future__ import annotations

import gc
import os
import threading
from itertools import groupby
from pathlib import Path
from typing import Any, Optional, Sequence

from ..constraints import Choice, Constraint
from .base import EngineError, JudgeOutput, JudgeRequest, Progress, control_pattern, prompt_identity
from .hf_tokenizer import chat_ids, special_tokens

DEFAULT_DTYPES = {"cuda": "bfloat16", "mps": "float16", "cpu": "float32"}


def pick_device(device: str = "auto") -> str:
    """`device`, or for "auto" the best torch has here: cuda, else mps, else cpu."""
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


def output_type(constraint: Constraint) -> Any:
    """The outlines output type of a constraint."""
    from typing import Literal

    import outlines

    if isinstance(constraint, Choice):
        return Literal[constraint.options]
    return outlines.types.JsonSchema(constraint.schema, whitespace_pattern="")


def constraint_regex(constraint: Constraint) -> str:
    """The regular expression outlines makes of the constraint's output type."""
    from outlines.types.dsl import python_types_to_terms, to_regex

    return to_regex(python_types_to_terms(output_type(constraint)))


class TransformersEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: Optional[str] = None,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 8,
        max_model_len: Optional[int] = None,
        chat_template_kwargs: Optional[dict[str, Any]] = None,
        merge_system: bool = False,
        threads: Optional[int] = None,
    ):
        self.model_dir = Path(model_dir).expanduser()
        if not (self.model_dir / "config.json").is_file():
            raise EngineError(
                f"no Hugging Face model folder at {self.model_dir} (config.json missing): convert a GGUF with "
                f"`python scripts/convert_gguf_to_hf.py MODEL --out {self.model_dir}`")
        try:
            import outlines
            import torch
            from outlines.backends.outlines_core import OutlinesCoreBackend
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as transformers_logging
        except ImportError as exc:
            raise EngineError(f"the transformers engine needs torch, transformers and outlines ({exc}): "
                              f"pip install 'offline-eval[transformers]'") from None
        self.device = pick_device(device)
        threads = threads or int(os.environ.get("OFFLINE_EVAL_THREADS", 0))
        if threads and self.device == "cpu":  # torch's threads are per process: only when asked for
            torch.set_num_threads(threads)
        self.dtype = DEFAULT_DTYPES.get(self.device.split(":")[0], "float32") if dtype == "auto" else dtype
        self.max_batch = max(1, int(batch_size))
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.merge_system = merge_system
        folder = str(self.model_dir)
        bar = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()  # no "Loading weights" bar inside our own progress display
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
            self._model = AutoModelForCausalLM.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False, dtype=getattr(torch, self.dtype),
            ).to(self.device).eval()
        except Exception as exc:  # missing files, unknown architecture (no remote code), device errors
            raise EngineError(f"transformers could not load {self.model_dir}: {type(exc).__name__}: {exc}") from None
        finally:
            if bar:
                transformers_logging.enable_progress_bar()
        self._eos = self._tokenizer.eos_token_id  # the end outlines' guides allow once the output is complete
        if self._eos is None:
            raise EngineError(f"{self.model_dir}: the tokenizer has no eos_token")
        self._pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else self._eos
        # outlines' vocabulary of this tokenizer, built once; each constraint's index is compiled once
        self._backend = OutlinesCoreBackend(outlines.from_transformers(self._model, self._tokenizer))
        self._processors: dict[str, Any] = {}
        self._first: dict[str, dict[int, str]] = {}
        self.max_model_len = self.context_size = int(
            max_model_len or getattr(self._model.config, "max_position_embeddings", None) or 8192)
        self._controls = control_pattern(special_tokens(self._tokenizer))
        self.identity = {
            "engine": "transformers",
            "model": name or self.model_dir.name,
            "weights": str(self.model_dir),
            "max_model_len": self.max_model_len,
            "dtype": self.dtype,
            **prompt_identity(self.chat_template_kwargs, merge_system),
        }
        self._lock = threading.Lock()

    # ---- token counting (long_inputs.py) ----

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(self._tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def prompt_ids(self, request: JudgeRequest) -> list[int]:
        return chat_ids(self._tokenizer, request.chat(self.merge_system, self._controls), self.chat_template_kwargs)

    def count_prompt_tokens(self, requests: Sequence[JudgeRequest]) -> list[int]:
        return [len(self.prompt_ids(r)) for r in requests]

    # ---- generation ----

    def _processor(self, constraint: Constraint) -> Any:
        """outlines' logits processor for the constraint (its index compiled on first use), reset for a new
        generate call."""
        if constraint.key not in self._processors:
            self._processors[constraint.key] = self._backend.get_regex_logits_processor(constraint_regex(constraint))
        processor = self._processors[constraint.key]
        processor.reset()
        return processor

    def _first_tokens(self, choice: Choice) -> dict[int, str]:
        if choice.key not in self._first:
            self._first[choice.key] = choice.first_tokens(
                lambda text: self._tokenizer.encode(text, add_special_tokens=False))
        return self._first[choice.key]

    def generate(
        self, requests: Sequence[JudgeRequest], progress: Optional[Progress] = None
    ) -> list[JudgeOutput]:
        outputs: list[Optional[JudgeOutput]] = [None] * len(requests)
        prompts: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            ids = self.prompt_ids(request)
            if len(ids) >= self.max_model_len:
                outputs[i] = JudgeOutput(text="", value=None, prompt_tokens=len(ids), finish_reason="error", meta={
                    "error": f"input too long: {len(ids)} prompt tokens, max_model_len {self.max_model_len}"})
            else:
                prompts[i] = ids
        if progress and len(prompts) < len(requests):
            progress(len(requests) - len(prompts))

        # One generate call per constraint and sampling, prompts of similar length together (less padding).
        def batch_key(i: int) -> tuple:
            r = requests[i]
            return r.constraint.key, r.max_tokens, r.sampling.temperature, r.sampling.seed
        order = sorted(prompts, key=lambda i: (batch_key(i), len(prompts[i])))
        with self._lock:
            for _, group in groupby(order, key=batch_key):
                group = list(group)
                for start in range(0, len(group), self.max_batch):
                    chunk = group[start:start + self.max_batch]
                    for i, out in zip(chunk, self._batch([requests[i] for i in chunk], [prompts[i] for i in chunk])):
                        outputs[i] = out
                    if progress:
                        progress(len(chunk))
        return outputs  # type: ignore[return-value]

    def _batch(self, requests: list[JudgeRequest], prompts: list[list[int]]) -> list[JudgeOutput]:
        """One model.generate call for requests that share constraint and sampling."""
        import torch
        from transformers import LogitsProcessorList

        first, sampling = requests[0], requests[0].sampling
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self._pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        room = self.max_model_len - width
        sample = sampling.temperature > 0
        if sample:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode():
            result = self._model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                logits_processor=LogitsProcessorList([self._processor(first.constraint)]),
                max_new_tokens=min(first.max_tokens, room),
                do_sample=sample,
                **({"temperature": sampling.temperature, "top_p": 1.0, "top_k": 0} if sample else {}),
                repetition_penalty=1.0,  # only the model's own distribution, whatever its generation_config says
                pad_token_id=self._pad,
                eos_token_id=self._eos,
                return_dict_in_generate=True,
                output_logits=True,  # raw logits, before the mask: the options' probabilities
            )
        generated = result.sequences[:, width:].tolist()
        first_logits = result.logits[0].float()
        choice = first.constraint if isinstance(first.constraint, Choice) else None
        first_ids = self._first_tokens(choice) if choice else {}
        picked = first_logits[:, list(first_ids)].double().cpu().tolist() if first_ids else None
        outs = []
        for row, (request, prompt, tokens) in enumerate(zip(requests, prompts, generated)):
            stopped = self._eos in tokens
            tokens = tokens[:tokens.index(self._eos) + 1] if stopped else tokens
            text = self._tokenizer.decode([t for t in tokens if t != self._eos], skip_special_tokens=False)
            out = JudgeOutput(text=text, value=None, prompt_tokens=len(prompt), completion_tokens=len(tokens),
                              finish_reason="stop" if stopped else "length")
            if not stopped:
                out.meta["error"] = (
                    f"input too long: {out.prompt_tokens} prompt tokens leave less than the {request.max_tokens} "
                    f"output tokens this judge call may need (max_model_len {self.max_model_len})"
                    if room < request.max_tokens else f"no end of output within {request.max_tokens} tokens")
                outs.append(out)
                continue
            out.value = request.constraint.parse(text)
            if picked is not None:
                out.probabilities = choice.distribution(zip(first_ids.values(), picked[row]))
            outs.append(out)
        return outs

    def close(self) -> None:
        model, self._model = getattr(self, "_model", None), None
        self._processors.clear()
        if model is None:
            return
        del model
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass
