"""The streaming run core (scheduler.stream_metrics, evaluation.evaluate_iter, dataset.iter_rows, scan_rows), with
scripted judges: this is scheduling logic. A run holds at most a window of samples, reports them in input
order whichever finishes first, scores exactly as an unwindowed run does, and forgets answers once no sample
in the window needs them; rows are read lazily and validated in one pass that keeps none."""

from __future__ import annotations

import dataclasses
import json

import pytest

from offline_eval import evaluate
from offline_eval.dataset import DataError, iter_rows
from offline_eval.run.evaluation import evaluate_iter, scan_rows
from offline_eval.metrics.collections import AnswerRelevancy, ContextRecall, Faithfulness
from offline_eval.run.scheduler import run_metrics, stream_metrics
from offline_eval.dataset import SingleTurnSample
from scripted import Pipelined, ScriptedJudge
from test_pipeline import ROWS, HashEmbeddings, answer

SAMPLES = [SingleTurnSample(**r) for r in ROWS * 4]  # 20 samples, each text five times over
METRICS = [Faithfulness(), ContextRecall(), AnswerRelevancy()]


def judges():
    return {"waves": ScriptedJudge(answer), "pipelined": Pipelined(ScriptedJudge(answer), max_concurrency=3)}


def values(results):
    return [{name: (r.value, r.reason, r.details) for name, r in res.items()} for res in results]


@pytest.mark.parametrize("strategy", ["waves", "pipelined"])
def test_a_window_bounds_the_samples_read_and_not_reported(strategy):
    read, reported, peak = [0], [], [0]

    def items():
        for i, sample in enumerate(SAMPLES):
            read[0] += 1
            peak[0] = max(peak[0], read[0] - len(reported))
            yield i, sample

    stream_metrics(items(), METRICS, lambda i, res: reported.append((i, res)), judge=judges()[strategy],
                   embeddings=HashEmbeddings(), window=3)
    assert peak[0] == 3  # reached, never passed
    assert [i for i, _ in reported] == list(range(len(SAMPLES)))  # input order, however they finished


@pytest.mark.parametrize("strategy", ["waves", "pipelined"])
def test_windowed_scores_equal_a_whole_data_set_window(strategy):
    whole = run_metrics(SAMPLES, METRICS, judge=judges()[strategy], embeddings=HashEmbeddings(),
                        window=len(SAMPLES))
    for window in (1, 2, 7):
        assert values(run_metrics(SAMPLES, METRICS, judge=judges()[strategy], embeddings=HashEmbeddings(),
                                  window=window)) == values(whole)


@pytest.mark.parametrize("strategy", ["waves", "pipelined"])
def test_identical_requests_are_sent_once_within_the_window_only(strategy):
    # ROWS repeats rows 1-2 as rows 4-5: three rows apart. A window of five holds both copies; a window of
    # one has forgotten the first copy's answers (without a cache) by the time the second comes.
    sent = {}
    for window in (1, 5):
        judge = judges()[strategy]
        run_metrics(SAMPLES[:5], [Faithfulness()], judge=judge, window=window)
        sent[window] = len(judge.requests)
    run_metrics(SAMPLES[:3], [Faithfulness()], judge=(judge := ScriptedJudge(answer)))  # the distinct rows
    assert sent[5] == len(judge.requests) < sent[1], sent


def test_pipelined_answers_are_forgotten_once_their_samples_are_reported():
    from offline_eval.run import pipeline

    seen = []
    original = pipeline._release

    def release(askers, answers, keys):
        original(askers, answers, keys)
        seen.append(len(answers))

    pipeline._release = release
    try:
        run_metrics(SAMPLES, [Faithfulness()], judge=judges()["pipelined"], window=2)
    finally:
        pipeline._release = original
    assert seen and seen[-1] == 0  # all answers forgotten after the last sample
    # never more answers kept than two samples' worth (a faithfulness plan asks 1 + its claims)
    assert max(seen) <= 2 * max(1 + len(s.response.split(".")) for s in SAMPLES)


def test_evaluate_iter_streams_evaluates_records_in_row_order(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS * 4), encoding="utf-8")
    whole = evaluate(str(path), metrics=[Faithfulness()], llm=ScriptedJudge(answer), show_progress=False)
    streamed = list(evaluate_iter(str(path), metrics=[Faithfulness()], llm=ScriptedJudge(answer),
                                  show_progress=False, window=2))
    assert [r["row"] for r in streamed] == list(range(1, 21))
    assert streamed == whole.records()


def test_closing_evaluate_iter_stops_the_run():
    judge = ScriptedJudge(answer)
    records = evaluate_iter([*ROWS] * 40, metrics=[Faithfulness()], llm=judge, show_progress=False, window=2)
    first = next(records)
    records.close()
    assert first["row"] == 1
    assert len(judge.requests) < 40  # a few samples past the first (the window and the queue), not 200


def test_evaluate_iter_raises_the_runs_error_in_the_caller():
    def broken(request):
        raise RuntimeError("judge down")

    with pytest.raises(RuntimeError, match="judge down"):
        list(evaluate_iter(ROWS, metrics=[Faithfulness()], llm=ScriptedJudge(broken), show_progress=False))


def test_a_file_is_read_lazily(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n{broken\n", encoding="utf-8")
    rows = iter_rows(path)
    assert [next(rows).number, next(rows).number] == [1, 2]  # before the bad line is read
    with pytest.raises(DataError, match="line 3"):
        next(rows)


def test_a_scan_counts_every_error_and_keeps_the_first(tmp_path):
    path = tmp_path / "rows.jsonl"
    bad = {"user_input": "q", "response": 5}  # response of the wrong type
    path.write_text("".join(json.dumps(r) + "\n" for r in [ROWS[0], *[bad] * 100, {"other": 1}]),
                    encoding="utf-8")
    scan = scan_rows(str(path), kept=5)
    assert scan.rows == 102 and scan.bad_rows == 101 and len(scan.errors) == 5
    assert [e.row.number for e in scan.errors] == [2, 3, 4, 5, 6]
    # the last row has no field of any default metric: one error per missing field of the chosen metrics
    full = scan_rows(str(path))
    assert full.error_count == scan.error_count == len(full.errors)
    assert {m.name for m in scan.metrics} == {m.name for m in full.metrics}


def test_a_scan_says_how_far_it_has_read(monkeypatch):
    import offline_eval.run.evaluation as evaluation

    monkeypatch.setattr(evaluation, "SCAN_REPORT_EVERY", 10)
    heard: list[int] = []
    for metrics in (None, ["faithfulness"]):
        heard.clear()
        scan = scan_rows([ROWS[0]] * 35, metrics, on_rows=heard.append)
        assert scan.rows == 35 and heard == [10, 20, 30]


def test_a_resume_takes_finished_rows_while_they_match_the_data(tmp_path):
    from offline_eval.run.evaluation import row_record
    from offline_eval.run.resume import FinishedRows, run_identity, set_aside
    from offline_eval.run.results_io import ResultsStream

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    rows = list(iter_rows(data))
    identity = run_identity({"model": "m"}, [Faithfulness()], "focus", data)

    def interrupted(done: int) -> ResultsStream:
        """A run that wrote `done` rows, then a line torn by a kill."""
        stream = ResultsStream(tmp_path / "out.jsonl", ["faithfulness"])
        stream.describe(identity)
        for row in rows[:done]:
            stream(row_record(row, {}))
        stream.close()
        with stream.path.open("a", encoding="utf-8") as f:
            f.write('{"row": %d, "metr' % (done + 1))
        return stream

    stream = interrupted(3)
    aside = set_aside(stream.path)
    assert aside is not None and not stream.path.exists()
    finished = FinishedRows(aside, identity)
    assert [finished(r) is not None for r in rows] == [True, True, True, False, False]
    assert finished.reused == 3
    finished.done(written=3)  # the new run's partial file holds them again: the set-aside copy goes
    assert not aside.exists()

    # the data's second row changed since: the reuse ends there
    changed = [rows[0], dataclasses.replace(rows[1], data={**rows[1].data, "response": "Another answer."})]
    finished = FinishedRows(set_aside(interrupted(3).path), identity)
    assert [finished(r) is not None for r in changed + rows[2:]] == [True, False, False, False, False]
    # another judge's rows are never taken, and a shorter new partial file keeps the longer one aside
    interrupted(1)
    assert set_aside(stream.path) == aside and sum(1 for _ in aside.open()) == 4
    other = FinishedRows(aside, {**identity, "judge": {"model": "other"}})
    assert not other.same_run and [other(r) for r in rows] == [None] * len(rows)
    assert other.changed == ["judge"]  # the message names what differs
    # nor those of the same metric with other settings: another prompt language, or the other scoring
    for settings in ({"language": "en"}, {"scoring": "argmax"}):
        changed_metric = run_identity({"model": "m"}, [Faithfulness(**settings)], "focus", data)
        assert changed_metric != identity and not FinishedRows(aside, changed_metric).same_run
        assert FinishedRows(aside, changed_metric).changed == ["metric settings"]
    # a description with a field this release dropped (the separate "scoring" before 2026-12-07) is named too
    from offline_eval.run.results_io import META

    meta = aside.with_name(aside.name + META)
    meta.write_text(json.dumps({**json.loads(meta.read_text(encoding="utf-8")), "scoring": "probability"}))
    assert FinishedRows(aside, identity).changed == ["scoring"]


@pytest.mark.parametrize("strategy", ["waves", "pipelined"])
def test_progress_counts_each_row_as_it_is_reported(strategy):
    from offline_eval.run.state import Progress

    class Rows(Progress):
        done: list[int] = []

        def rows_done(self, n):
            self.done.append(len(reported))  # after the row's report

    reported: list = []
    stream_metrics(((i, None if i == 2 else s) for i, s in enumerate(SAMPLES)), [Faithfulness()],
                   lambda i, res: reported.append(i), judge=judges()[strategy], progress=Rows(), window=3)
    assert Rows.done == list(range(1, len(SAMPLES) + 1))  # one per row, a passed-through row included
