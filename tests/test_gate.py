"""The CI gate: --fail-under bars, baselines in both formats, drops, and the exit codes of `run`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offline_eval.reports.gate import DEFAULT_MIN_COVERAGE, GateError, check, load_baseline, parse_bars, summary_document

EXAMPLES = Path(__file__).parent.parent / "examples"
JUDGE = {"engine": "llamacpp", "model": "smollm2-135m-instruct"}


def summary(**means) -> dict:
    return {name: {"mean": math.nan if m is None else m, "scored": 0 if m is None else 4,
                   "no_value": 4 if m is None else 0} for name, m in means.items()}


def test_bars_parse_with_aliases_and_spaces():
    assert parse_bars("faithfulness=0.9, answer_relevance = 0.8", ["faithfulness", "answer_relevancy"]) == {
        "faithfulness": 0.9, "answer_relevancy": 0.8}


@pytest.mark.parametrize("spec, message", [
    ("faithfulness:0.9", "expected METRIC=NUMBER"),
    ("faithfulness=high", "expected METRIC=NUMBER"),
    ("faithfulness=nan", "expected METRIC=NUMBER"),
    ("faithfulness=0.9,", "expected METRIC=NUMBER"),
    ("=0.9", "expected METRIC=NUMBER"),
    ("context_recall=0.5", "'context_recall' is not a metric of this run"),
    ("nosuch=0.5", "'nosuch' is not a metric of this run"),
    ("faithfulness=0.9,faithfulness=0.8", "given twice"),
])
def test_bad_bars_are_usage_errors(spec, message):
    with pytest.raises(GateError, match=message):
        parse_bars(spec, ["faithfulness"])


def test_a_mean_below_its_bar_fails_and_at_the_bar_passes():
    verdict = check(summary(faithfulness=0.85, answer_relevancy=0.8), JUDGE,
                    {"faithfulness": 0.9, "answer_relevancy": 0.8})
    assert verdict.failed and verdict.failures == ["faithfulness below 0.9"]
    assert verdict.lines[0].startswith("FAIL faithfulness: mean 0.8500") and verdict.lines[1].startswith("ok")


def test_a_metric_without_scored_samples_fails_and_says_why():
    verdict = check(summary(faithfulness=None), JUDGE, {"faithfulness": 0.0})
    assert verdict.failed and "no scored samples (4 without a value)" in verdict.lines[0]


def covered(mean: float, scored: int, no_value: int) -> dict:
    return {"mean": mean, "scored": scored, "no_value": no_value}


def test_a_good_mean_over_too_few_rows_fails_on_coverage():
    run = {"faithfulness": covered(0.95, 1, 99)}  # 99 rows failed or had no value
    verdict = check(run, JUDGE, {"faithfulness": 0.9})
    assert verdict.failures == ["faithfulness has a value on only 1 of 100 samples"]
    assert "FAIL faithfulness: coverage 1/100 samples with a value (1%) < 90%" in verdict.lines


@pytest.mark.parametrize("scored, no_value, min_coverage, ok", [
    (9, 1, 0.9, True),  # exactly the default minimum passes
    (8, 2, 0.9, False),
    (8, 2, 0.8, True),  # a lower minimum, as --min-coverage gives
    (1, 99, 0.0, True),
])
def test_coverage_minimum(scored, no_value, min_coverage, ok):
    verdict = check({"faithfulness": covered(0.95, scored, no_value)}, JUDGE, {"faithfulness": 0.9},
                    min_coverage=min_coverage)
    assert verdict.failed is not ok


def test_metrics_compared_with_a_baseline_need_coverage_too(tmp_path):
    base = load_baseline(write_summary(tmp_path / "s.json", faithfulness=0.9, answer_relevancy=0.5))
    verdict = check({"faithfulness": covered(0.9, 5, 5), "answer_relevancy": covered(0.5, 10, 0)}, JUDGE, {}, base)
    assert verdict.failures == ["faithfulness has a value on only 5 of 10 samples"]
    assert "ok   answer_relevancy: coverage 10/10 samples with a value (100%) >= 90%" in verdict.lines


def test_the_default_minimum_coverage_is_documented():
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    assert DEFAULT_MIN_COVERAGE == 0.9 and "`--min-coverage` (default 0.9)" in readme


def write_summary(path: Path, judge=JUDGE, **means) -> Path:
    metrics = {n: {"mean": m, "scored": 3, "no_value": 0} for n, m in means.items()}
    path.write_text(json.dumps({"format": "offline-eval-summary", "version": 1, "judge": judge,
                                "metrics": metrics}))
    return path


def test_drops_beyond_the_allowance_fail_and_every_drop_is_shown(tmp_path):
    base = load_baseline(write_summary(tmp_path / "s.json", faithfulness=0.90, answer_relevancy=0.80,
                                       context_recall=0.5))
    verdict = check(summary(faithfulness=0.87, answer_relevancy=0.78, answer_accuracy=0.5), JUDGE, {}, base, 0.02)
    assert verdict.failures == ["faithfulness dropped 0.0300"]
    text = "\n".join(verdict.lines)
    assert "faithfulness: baseline 0.9000 -> 0.8700, drop +0.0300 (over 0.02)" in text
    assert "answer_relevancy: baseline 0.8000 -> 0.7800, drop +0.0200 (within 0.02)" in text  # exactly at it
    assert "not compared (in only one of run and baseline): answer_accuracy, context_recall" in text
    assert not verdict.warnings


def test_improvements_pass_and_a_different_judge_is_warned_about(tmp_path):
    base = load_baseline(write_summary(tmp_path / "s.json", {"model": "qwen2.5-7b-instruct", "engine": "vllm"},
                                       faithfulness=0.5))
    verdict = check(summary(faithfulness=0.9), JUDGE, {}, base)
    assert not verdict.failed and "drop -0.4000" in verdict.lines[0]
    assert "judged by qwen2.5-7b-instruct (vllm), this run by smollm2-135m-instruct" in verdict.warnings[0]


def test_no_value_now_fails_against_a_baseline_and_no_value_then_is_not_compared(tmp_path):
    base = load_baseline(write_summary(tmp_path / "s.json", faithfulness=0.9, context_recall=None))
    verdict = check(summary(faithfulness=None, context_recall=0.2), JUDGE, {}, base)
    assert verdict.failures == ["faithfulness has no scored samples"]
    assert any("context_recall: not compared, the baseline has no value" in line for line in verdict.lines)


def test_results_jsonl_is_a_baseline_too(tmp_path):
    records = [
        {"row": 1, "metrics": {"faithfulness": {"value": 1.0}, "answer_relevancy": {"value": 0.6}}},
        {"row": 2, "metrics": {"faithfulness": {"value": 0.5}, "answer_relevancy": {"value": None}}},
        {"row": 3, "skipped": ["row 3: field 'response' is empty"]},
    ]
    path = tmp_path / "previous.results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    base = load_baseline(path)
    assert base.means == {"faithfulness": 0.75, "answer_relevancy": 0.6} and base.judge is None
    verdict = check(summary(faithfulness=0.75), JUDGE, {}, base)
    assert not verdict.failed and "does not name its judge" in verdict.warnings[0]


def test_a_one_row_results_file_is_read_as_results(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"row": 1, "metrics": {"faithfulness": {"value": 0.5}}}) + "\n")
    assert load_baseline(path).means == {"faithfulness": 0.5}


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("not json\n", "neither a summary JSON nor results JSONL"),
    ('{"metrics": {"faithfulness": 0.9}}', "not an offline-eval summary"),
    ('{"metrics": {"faithfulness": {"mean": "high"}}}', "not an offline-eval summary"),
    ('[1, 2]\n', "line 1 is not a per-sample result"),
    ('{"row": 1, "metrics": {}}\n{"other": 2}\n', "line 2 is not a per-sample result"),
])
def test_unreadable_baselines_are_usage_errors(tmp_path, content, message):
    path = tmp_path / "base.json"
    path.write_text(content)
    with pytest.raises(GateError, match=message):
        load_baseline(path)
    with pytest.raises(GateError, match="cannot read the baseline"):
        load_baseline(tmp_path / "missing.json")


def test_summary_document_round_trips_as_a_baseline(tmp_path):
    class Result:
        judge = JUDGE
        scored_rows = 2
        skipped_rows = 0

        @staticmethod
        def summary():
            return summary(faithfulness=0.5, context_recall=None)

    doc = summary_document(Result, "data.jsonl")
    assert doc["metrics"]["context_recall"]["mean"] is None and doc["samples"] == 2
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))  # strict JSON: no NaN
    base = load_baseline(path)
    assert base.means == {"faithfulness": 0.5, "context_recall": None} and base.judge == JUDGE


# ---- the command line, with the real SmolLM2 judge on 2 rows --------------------------------------------

def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OFFLINE_EVAL_THREADS="1", OFFLINE_EVAL_CACHE_DIR=str(cwd / "cache"))
    return subprocess.run([sys.executable, "-m", "offline_eval.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env)


def test_run_exits_1_below_a_bar_and_0_against_its_own_baseline(tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text("".join((EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines(True)[:2]),
                    encoding="utf-8")
    run = ("run", "--model", "smollm2-135m-instruct", "--metrics", "context_relevance", str(data))
    failed = cli(*run, "--fail-under", "context_relevance=1.01", "--summary-json", "s.json", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert "FAIL context_relevance: mean" in failed.stdout and "< 1.01" in failed.stdout
    assert "gate failed: context_relevance below 1.01" in failed.stderr
    assert len((tmp_path / "two.results.jsonl").read_text().splitlines()) == 2  # results still written
    written = json.loads((tmp_path / "s.json").read_text())["metrics"]["context_relevance"]
    assert written["scored"] == 2 and written["coverage"] == 1.0 and written["failed_calls"] == 0

    passed = cli(*run, "--fail-under", "context_relevance=0", "--baseline", "s.json", "--max-drop", "0",
                 cwd=tmp_path)  # same judge, same data, deterministic: no drop
    assert passed.returncode == 0, passed.stderr
    assert "ok   context_relevance: baseline" in passed.stdout and "gate passed" in passed.stdout
    assert "ok   context_relevance: coverage 2/2 samples with a value (100%) >= 90%" in passed.stdout


@pytest.mark.parametrize("args, message", [
    (("--fail-under", "nosuch=0.5"), "'nosuch' is not a metric of this run"),
    (("--fail-under", "context_relevance"), "expected METRIC=NUMBER"),
    (("--baseline", "missing.json"), "cannot read the baseline"),
    (("--max-drop", "0.1"), "--max-drop needs --baseline"),
    (("--min-coverage", "0.5"), "--min-coverage needs --fail-under or --baseline"),
    (("--fail-under", "context_relevance=0.5", "--min-coverage", "1.5"), "--min-coverage must be between 0 and 1"),
    (("--long-inputs", "shorten"), "--long-inputs: long_inputs must be one of focus, truncate, error or focus:N"),
])
def test_bad_gate_flags_exit_2_before_any_model_loads(tmp_path, args, message):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"user_input": "q", "retrieved_contexts": ["c"]}) + "\n")
    proc = cli("run", "--model", "no-such-model", "--metrics", "context_relevance", *args, str(data), cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
