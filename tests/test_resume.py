"""The judge-call cache with the real SmolLM2 engine: a cached rerun is identical and calls no model, and a
CLI run killed with SIGKILL resumes with --resume to the same scores as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from offline_eval import evaluate
from run_support import stored_calls, summary_calls

EXAMPLES = Path(__file__).parent.parent / "examples"


def first_rows(n: int, path: Path) -> Path:
    lines = (EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_cached_rerun_is_identical_and_calls_no_model(smollm, tmp_path, monkeypatch):
    data, cache = first_rows(2, tmp_path / "two.jsonl"), tmp_path / "cache.sqlite"
    sent = []
    generate = smollm.generate
    monkeypatch.setattr(smollm, "generate", lambda requests, progress=None: (
        sent.append(len(requests)), generate(requests, progress))[1])
    metrics = ["faithfulness", "context_relevance"]
    fresh = evaluate(data, metrics=metrics, llm=smollm, show_progress=False, cache=cache)
    assert sum(sent) == fresh.stats.judge_calls > 0 and fresh.stats.cached == 0
    sent.clear()
    again = evaluate(data, metrics=metrics, llm=smollm, show_progress=False, cache=cache)
    assert sent == [] and again.stats.judge_calls == 0 and again.stats.cached == fresh.stats.judge_calls
    assert again.scores == fresh.scores
    for a, b in zip(fresh.records(), again.records()):
        for name in metrics:
            assert a["metrics"][name]["details"] == b["metrics"][name]["details"]
            assert [{k: v for k, v in c.items() if k != "cached"} for c in b["metrics"][name]["judge_calls"]] == \
                a["metrics"][name]["judge_calls"]


def run_cli(*args: str, cwd: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "OFFLINE_EVAL_THREADS": "1"}
    command = [sys.executable, "-m", "offline_eval.cli", "run", "--model", "smollm2-135m-instruct",
               "--metrics", "faithfulness", "--long-inputs", "error", *args]
    return subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)


def finish(proc: subprocess.Popen) -> tuple[int, int]:
    """Wait for a CLI run; its (new, cached) judge calls from the summary."""
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return summary_calls(stdout)


def scores(path: Path) -> list[dict]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [{k: r["metrics"]["faithfulness"][k] for k in ("value", "details")} for r in records]


def test_a_killed_run_resumes_to_the_same_scores(tmp_path):
    data = first_rows(4, tmp_path / "five.jsonl")
    # row 1's context cannot fit the judge (n_ctx 8192): with --long-inputs error it is done before any judge
    # call, so the killed run has surely written a row (rows are written in order) to its partial file
    lines = data.read_text(encoding="utf-8").splitlines()
    long_row = {**json.loads(lines[0]), "retrieved_contexts": ["The sea is wide and deep. " * 1500]}
    data.write_text("\n".join([json.dumps(long_row), *lines]) + "\n", encoding="utf-8")
    full_new, full_cached = finish(run_cli("--cache", "full.sqlite", "-o", "full.jsonl", str(data), cwd=tmp_path))
    assert full_cached == 0 and full_new > 4

    output = tmp_path / "resumed.jsonl"
    output.write_text("previous results\n")
    killed = run_cli("--cache", "resume.sqlite", "-o", output.name, str(data), cwd=tmp_path)
    partial = tmp_path / f"{output.name}.partial"  # the rows it finished, in row order
    deadline, seen = time.monotonic() + 120, set()
    while max(seen, default=0) < 4 or not (partial.exists() and partial.read_text(encoding="utf-8")):
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()[1]
        seen.add(stored_calls(tmp_path / "resume.sqlite"))
        time.sleep(0.05)
    # each call was committed as it finished (llama.cpp runs one at a time), not in chunks: the counts went up
    # one by one (a poll may miss one when two calls finish within 50 ms)
    assert len(seen & {1, 2, 3}) >= 2, sorted(seen)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    stored = stored_calls(tmp_path / "resume.sqlite")
    assert 4 <= stored < full_new
    assert output.read_text() == "previous results\n"  # kept: the killed run never wrote a partial file
    finished = [json.loads(line) for line in partial.read_text(encoding="utf-8").splitlines()]
    rows_done = [r["row"] for r in finished]
    assert rows_done == list(range(1, len(rows_done) + 1)) and len(finished) < 5

    resumed = run_cli("--cache", "resume.sqlite", "--resume", "-o", output.name, str(data), cwd=tmp_path)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    new, cached = summary_calls(stdout)
    # the finished rows are taken from the partial file as they were: their calls are not even looked up
    assert f"{len(finished)} row(s) taken as they were" in stdout
    reused_calls = sum(len(m["judge_calls"]) for r in finished for m in r["metrics"].values())
    assert cached == stored - reused_calls and new == full_new - stored and new < full_new
    assert scores(output) == scores(tmp_path / "full.jsonl")
    final = {r["row"]: r for r in map(json.loads, output.read_text(encoding="utf-8").splitlines())}
    for r in finished:
        assert {k: final[r["row"]]["metrics"]["faithfulness"][k] for k in ("value", "reason")} == \
            {k: r["metrics"]["faithfulness"][k] for k in ("value", "reason")}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(output.name)) == [output.name]
