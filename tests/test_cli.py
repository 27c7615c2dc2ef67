"""The command line as a user runs it: exit codes, messages, and the results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offline_eval.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_run_writes_per_sample_results_and_prints_a_summary(tmp_path):
    data = tmp_path / "two.jsonl"
    lines = (EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = cli("run", "--model", "smollm2-135m-instruct", "--metrics", "faithfulness,context_relevance",
               str(data), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "faithfulness" in proc.stdout and "context_relevance" in proc.stdout
    out = tmp_path / "two.results.jsonl"
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2
    calls = records[0]["metrics"]["context_relevance"]["judge_calls"]
    assert [c["stage"] for c in calls] == ["judge1", "judge2"] and calls[0]["text"] in ("0", "1", "2")
    assert not (tmp_path / "two.results.jsonl.partial").exists()  # the rows as they finished: gone once complete


def one_row(tmp_path: Path) -> Path:
    """The example's first row as a data file."""
    data = tmp_path / "one.jsonl"
    data.write_text((EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines()[0] + "\n")
    return data


def test_an_unwritable_output_fails_before_any_judge_loads(tmp_path):
    data = one_row(tmp_path)
    proc = cli("run", "--model", "smollm2-135m-instruct", "-o", str(tmp_path / "missing" / "out.jsonl"), str(data),
               cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the results next to" in proc.stderr and "loading judge" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_rows_are_all_listed_and_nothing_runs(tmp_path):
    data = tmp_path / "bad.jsonl"
    rows = [
        {"user_input": "q1", "response": "a1", "retrieved_contexts": ["c1"]},
        {"user_input": "q2", "response": "", "retrieved_contexts": ["c2"]},
        {"user_input": "q3", "response": "a3", "retrieved_contexts": "not a list"},
        {"question": "q4", "answer": "a4"},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    proc = cli("run", "--model", "no-such-model", "--metrics", "faithfulness", str(data), cwd=tmp_path)
    assert proc.returncode == 2
    assert "row 2 (line 2): field 'response' is empty" in proc.stderr
    assert "row 3 (line 3): field 'retrieved_contexts' must be a list of strings" in proc.stderr
    assert "row 4 (line 4): field 'retrieved_contexts' is missing" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "bad.results.jsonl").exists()


def test_skip_invalid_scores_the_rest_and_records_the_skipped(tmp_path):
    data = tmp_path / "mixed.jsonl"
    rows = [{"user_input": "Where is Ulm?", "retrieved_contexts": ["Ulm is a city in Germany."]},
            {"user_input": "", "retrieved_contexts": ["x"]}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    proc = cli("run", "--model", "smollm2-135m-instruct", "--skip-invalid", "-o", "out.jsonl", str(data),
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert "metrics" in records[0] and list(records[0]["metrics"]) == ["context_relevance"]
    assert records[1]["skipped"] == ["row 2 (line 2): field 'user_input' is empty"]


def test_malformed_jsonl_and_non_utf8_name_the_line(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"user_input": "q", "response": "a"}\n{"user_input": "q2", \n', encoding="utf-8")
    proc = cli("run", str(broken), cwd=tmp_path)
    assert proc.returncode == 2 and "line 2: not valid JSON" in proc.stderr and "Traceback" not in proc.stderr

    latin = tmp_path / "latin.csv"
    latin.write_bytes("user_input,response\nq,ok\nq2,caf\xe9\n".encode("latin-1"))
    proc = cli("run", str(latin), cwd=tmp_path)
    assert proc.returncode == 2 and "line 3: not valid UTF-8" in proc.stderr


def test_unknown_model_is_a_clear_engine_error(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"user_input": "q", "retrieved_contexts": ["c"]}) + "\n")
    proc = cli("run", "--model", "no-such-model", str(data), cwd=tmp_path)
    assert proc.returncode == 3 and "unknown judge model 'no-such-model'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_models_list_shows_the_embedded_defaults(tmp_path):
    proc = cli("models", "list", cwd=tmp_path)
    assert proc.returncode == 0
    for name in ("qwen2.5-coder-1.5b", "smollm2-135m", "all-minilm-l6-v2"):
        assert name in proc.stdout


def test_cache_info_lists_judges_and_prune_deletes_by_judge_and_age(tmp_path):
    data = one_row(tmp_path)
    def run():
        return cli("run", "--model", "smollm2-135m-instruct", "--metrics", "context_relevance", "--cache", "c.sqlite",
                   str(data), cwd=tmp_path)

    assert run().returncode == 0
    info = cli("cache", "info", "--cache", "c.sqlite", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert "smollm2-135m-instruct" in info.stdout and "2 judge calls, 0 embeddings" in info.stdout
    assert cli("cache", "prune", "--cache", "c.sqlite", cwd=tmp_path).returncode == 2  # nothing said: nothing done
    old = cli("cache", "prune", "--cache", "c.sqlite", "--older-than", "1", cwd=tmp_path)
    assert old.returncode == 0 and "deleted 0 judge calls" in old.stdout and "2 judge calls left" in old.stdout
    other = cli("cache", "prune", "--cache", "c.sqlite", "--model", "qwen2.5-7b-instruct", cwd=tmp_path)
    assert other.returncode == 2 and "no calls of a judge named 'qwen2.5-7b-instruct'" in other.stderr
    mine = cli("cache", "prune", "--cache", "c.sqlite", "--model", "smollm2-135m-instruct", cwd=tmp_path)
    assert mine.returncode == 0 and "deleted 2 judge calls" in mine.stdout and "0 judge calls left" in mine.stdout
    assert "judge calls: 2 new, 0 from the cache" in run().stdout  # pruned calls are judged again


def test_parquet_output_holds_the_values_and_the_full_records(tmp_path):
    import pyarrow.parquet as pq

    data = one_row(tmp_path)
    proc = cli("run", "--model", "smollm2-135m-instruct", "--metrics", "context_relevance", "-o", "out.parquet",
               str(data), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert len(table) == 1 and set(table[0]) == {"row", "context_relevance", "record"}
    record = json.loads(table[0]["record"])
    assert record["row"] == 1 and record["metrics"]["context_relevance"]["value"] == table[0]["context_relevance"]


def test_ray_refuses_the_flags_of_a_server_judge(tmp_path):
    data = one_row(tmp_path)
    proc = cli("run", "--ray", "--base-url", "http://127.0.0.1:9/v1", str(data), cwd=tmp_path)
    assert proc.returncode == 2 and "--engine, --server and --base-url do not apply" in proc.stderr
