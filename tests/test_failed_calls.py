"""Failed judge calls are never invisible: each affected sample's reason says so, each result record and the
summary (table and --summary-json) count them per metric. The judge is scripted (FAIL: a call with no value)."""

from __future__ import annotations

import pytest

from offline_eval import evaluate
from offline_eval.reports.gate import summary_document
from scripted import FAIL, TagJudge

ROW = dict(user_input="When was Einstein born?", response="Einstein was born in 1879.",
           retrieved_contexts=["Albert Einstein was born on 14 March 1879."])


def run(answers: dict, metrics: list[str], rows=(ROW,)):
    return evaluate(list(rows), metrics=metrics, llm=TagJudge(answers), show_progress=False)


def test_a_dual_judge_metric_with_one_failed_template_says_so():
    result = run({"judge1": "2", "judge2": FAIL}, ["context_relevance"])
    (res,) = [r["context_relevance"] for r in result.results.values()]
    assert res.value == 1.0  # the other template's rating, as Ragas does ...
    assert res.reason.endswith("; 1 of 2 judge calls failed: input too long")  # ... but not silently
    (record,) = result.records()
    assert record["metrics"]["context_relevance"]["failed_calls"] == 1
    assert result.summary()["context_relevance"]["failed_calls"] == 1


def test_a_failed_claim_verdict_is_counted_and_named():
    answers = {"claims": {"claims": ["Einstein was born in 1879.", "He was born in Ulm."]},
               "verdict[0]": "yes", "verdict[1]": FAIL}
    result = run(answers, ["faithfulness"], rows=[ROW, ROW | {"response": "Einstein was born in Ulm."}])
    assert result.values("faithfulness") == [1.0, 1.0]  # the failed verdict is left out of the ratio
    assert all("1 of 3 judge calls failed: input too long" in r["faithfulness"].reason
               for r in result.results.values())
    assert [rec["metrics"]["faithfulness"]["failed_calls"] for rec in result.records()] == [1, 1]
    assert summary_document(result, "data.jsonl")["metrics"]["faithfulness"]["failed_calls"] == 2


def test_a_clean_run_counts_no_failed_calls_and_keeps_its_reason():
    result = run({"judge1": "2", "judge2": "1"}, ["context_relevance"])
    (res,) = [r["context_relevance"] for r in result.results.values()]
    assert "failed" not in res.reason
    assert result.records()[0]["metrics"]["context_relevance"]["failed_calls"] == 0
    assert result.summary()["context_relevance"]["failed_calls"] == 0


def test_the_summary_table_has_a_failed_calls_column(capsys):
    from offline_eval.cli import _print_summary

    _print_summary(run({"judge1": FAIL, "judge2": FAIL}, ["context_relevance"]), 1.0)
    table = capsys.readouterr().out
    assert "failed calls" in table
    row = next(line for line in table.splitlines() if "context_relevance" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:6] == ["context_relevance", "n/a", "0", "1", "0%", "2"]  # ..., coverage, failed calls
