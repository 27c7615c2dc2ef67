"""`offline-eval serve` and `offline-eval run` against vLLM models, as a user runs them, with the real vLLM CPU
build and the converted SmolLM2. Each test starts its own server (~35-60 s on 2 cores). Skips without vllm.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from offline_eval.engines.vllm_launch import free_port, is_up
from vllm_support import HF_ENTRY, SAMPLES, need, smollm_hf_dir

need("vllm")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A models.yaml whose SmolLM2 vLLM entry points at a free port (nothing listens there yet)."""
    smollm_hf_dir()  # converts once if needed
    data = yaml.safe_load((REPO / "models.yaml").read_text(encoding="utf-8"))
    port = free_port()
    data["judges"][HF_ENTRY]["base_url"] = f"http://127.0.0.1:{port}/v1"
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_FILE", str(models))
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES), encoding="utf-8")
    return port


def cli(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offline_eval.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900, **kw)


def scores(path: Path) -> list[dict]:
    return [{m: r["metrics"][m]["value"] for m in r["metrics"]}
            for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def test_serve_then_run_connects_to_it_and_ctrl_c_stops_it(env, tmp_path):
    url = f"http://127.0.0.1:{env}/v1"
    serve = subprocess.Popen([sys.executable, "-m", "offline_eval.cli", "serve", "--model", HF_ENTRY],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not is_up(url) and time.time() < deadline and serve.poll() is None:
            time.sleep(1)
        assert is_up(url), serve.communicate(timeout=60)
        run = cli("run", "--model", HF_ENTRY, "--server", "connect", "--metrics", "faithfulness,response_groundedness",
                  "-o", "out.jsonl", "data.jsonl", cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert "starting a vLLM server" not in run.stderr  # it used the running one
        got = scores(tmp_path / "out.jsonl")
        assert len(got) == 2 and all(v is None or 0 <= v <= 1 for row in got for v in row.values())
        assert all(row["response_groundedness"] is not None for row in got)
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, err
    assert f"serving {HF_ENTRY} at {url}" in out and "stopped" in err
    assert not is_up(url)


def test_run_starts_a_server_for_the_run_and_stops_it(env, tmp_path):
    assert not is_up(f"http://127.0.0.1:{env}/v1")
    run = cli("run", "--model", HF_ENTRY, "--metrics", "answer_relevancy", "-o", "out.jsonl", "data.jsonl",
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    started = [line for line in run.stderr.splitlines() if "starting a vLLM server" in line]
    assert started, run.stderr
    managed_url = started[0].split(" at ")[1].split(" ")[0]
    assert not is_up(managed_url)  # stopped when the run ended
    log = Path(started[0].split("(log: ")[1].split(")")[0])
    assert log.name.startswith("offline-eval-vllm-") and not log.exists()  # and its log removed
    got = scores(tmp_path / "out.jsonl")
    assert len(got) == 2 and all(0 <= row["answer_relevancy"] <= 1 for row in got)

    # --server connect never starts one: a clear engine error (exit 3) instead
    proc = cli("run", "--model", HF_ENTRY, "--server", "connect", "data.jsonl", cwd=tmp_path)
    assert proc.returncode == 3 and "unreachable" in proc.stderr
