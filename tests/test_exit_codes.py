"""Every outcome of `offline-eval run` has its own exit code and a one-line message, never a traceback
(cli.py's docstring has the table): an unusable judge cache (5, at start and part-way), an internal error (4),
Ctrl-C (130) and SIGTERM (143), the last two stopping the run cleanly. The judge is the real llama.cpp
engine with SmolLM2."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run_support import stored_calls

EXAMPLES = Path(__file__).parent.parent / "examples"
RUN = ["run", "--model", "smollm2-135m-instruct", "--metrics", "faithfulness"]


def rows(n: int, tmp_path: Path) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join((EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines()[:n]) + "\n")
    return data


def start(*args: str, cwd: Path, prelude: str = "", **env: str) -> subprocess.Popen:
    """`offline-eval ARGS` as its console script runs it (cli.main), after `prelude` (Python) if given."""
    code = f"{prelude}\nfrom offline_eval.cli import main\nmain()"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "OFFLINE_EVAL_THREADS": "1", **env})


def wait_for_calls(proc: subprocess.Popen, cache: Path, n: int) -> None:
    deadline = time.monotonic() + 180
    while stored_calls(cache) < n:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_a_corrupt_cache_exits_5_before_any_judge_loads(tmp_path):
    (tmp_path / "cache.sqlite").write_bytes(b"this is not a SQLite database" * 100)
    proc = start(*RUN, "--cache", "cache.sqlite", str(rows(1, tmp_path)), cwd=tmp_path)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 5, stderr
    assert "not a usable SQLite database" in stderr and "loading judge" not in stderr
    assert "Traceback" not in stderr


def test_a_cache_locked_part_way_exits_5_and_keeps_what_finished(tmp_path):
    cache = tmp_path / "cache.sqlite"
    proc = start(*RUN, "--cache", cache.name, "-o", "out.jsonl", str(rows(4, tmp_path)), cwd=tmp_path)
    wait_for_calls(proc, cache, 2)
    with sqlite3.connect(cache, timeout=5) as other:  # another process takes the write lock and keeps it
        other.execute("BEGIN EXCLUSIVE")
        _, stderr = proc.communicate(timeout=180)  # the run waits for it (30 s), then gives up
        other.rollback()
    assert proc.returncode == 5, stderr
    assert "is locked by another process" in stderr and "Traceback" not in stderr
    assert stored_calls(cache) >= 2


def test_an_internal_error_exits_4_in_one_line_and_shows_the_traceback_on_request(tmp_path):
    # A judge output that breaks its constraint is impossible by construction (the engine decodes under it);
    # if one ever got through, it is a bug of ours: make the constraint check fail to see how it is reported.
    prelude = ("from offline_eval import constraints\n"
               "def broken(self, text): raise constraints.ConstraintViolation(f'expected a verdict, got {text!r}')\n"
               "constraints.Choice.parse = broken\nconstraints.JsonSchema.parse = broken")
    data = rows(1, tmp_path)
    proc = start(*RUN, "--no-cache", str(data), cwd=tmp_path, prelude=prelude)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 4, stderr
    assert "internal error: ConstraintViolation: expected a verdict" in stderr
    assert "OFFLINE_EVAL_DEBUG=1" in stderr and "report" in stderr and "Traceback" not in stderr

    proc = start(*RUN, "--no-cache", str(data), cwd=tmp_path, prelude=prelude, OFFLINE_EVAL_DEBUG="1")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 4 and "Traceback (most recent call last)" in stderr


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_and_sigterm_stop_the_run_cleanly(tmp_path, sig, code, word):
    cache = tmp_path / "cache.sqlite"
    proc = start(*RUN, "--cache", cache.name, "-o", "out.jsonl", str(rows(4, tmp_path)), cwd=tmp_path)
    wait_for_calls(proc, cache, 2)  # of 10: mid-run
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert word in stderr and "Traceback" not in stderr
    assert stored_calls(cache) >= 2 and f"Every judge call that finished is in the cache {cache.name}" in stderr
    assert "--resume" in stderr
    kept = (tmp_path / "out.jsonl.partial").read_text(encoding="utf-8").splitlines()  # kept, however many
    assert all(json.loads(line)["metrics"] for line in kept)
    assert (f"The {len(kept)} row(s) finished are in" in stderr) == bool(kept)
    assert not (tmp_path / "out.jsonl").exists()
