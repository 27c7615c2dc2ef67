"""The pipelined scheduler (pipeline.py) against the wave scheduler, with scripted judges: the same results,
stats, progress and cache behaviour; deduplication across samples and metrics; bounded concurrency; and no
wave barrier (a sample's verdicts go out while another sample's claims are still being extracted)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from offline_eval import evaluate
from offline_eval.cache import JudgeCache
from offline_eval.engines.base import EngineError
from offline_eval.metrics.collections import ALL, AnswerRelevancy, ContextRecall, Faithfulness
from offline_eval.run.scheduler import Progress, run_metrics
from offline_eval.dataset import SingleTurnSample
from scripted import Pipelined, ScriptedJudge, user_text

ROWS = [
    {"user_input": "Where is the Eiffel Tower?", "retrieved_contexts": ["The Eiffel Tower stands in Paris."],
     "response": "It is in Paris. It is 300 m tall.", "reference": "The Eiffel Tower is in Paris."},
    {"user_input": "Who wrote Hamlet?", "retrieved_contexts": ["Shakespeare wrote Hamlet.", "It is a tragedy."],
     "response": "Shakespeare wrote it. He was French.", "reference": "William Shakespeare wrote Hamlet."},
    {"user_input": "What is the boiling point of water?", "retrieved_contexts": ["Water boils at 100 C."],
     "response": "I don't know.", "reference": "100 C at sea level."},
]
ROWS = ROWS + ROWS[:2]  # repeated samples: their requests are deduplicated


def sentences(text: str) -> list[str]:
    return [s.strip() + "." for s in text.split(".") if s.strip() and "know" not in s]


def answer(request):
    """A valid answer to every stage of every metric that depends on the sample's text."""
    text, digest = user_text(request), int(hashlib.sha256(user_text(request).encode()).hexdigest(), 16)
    if request.tag in ("claims", "reference_claims", "response_claims"):
        return {"claims": sentences(text.rsplit(": ", 1)[1])}
    if request.tag == "questions":
        return {"questions": [{"question": f"q{digest % 7}?", "noncommittal": 0},
                              {"question": f"q{digest % 5}?", "noncommittal": digest % 2},
                              {"question": "q?", "noncommittal": 0}]}
    if request.tag == "rubric":
        return {"feedback": "fine", "score": digest % 5 + 1}
    options = request.constraint.options
    return options[digest % len(options)]


class HashEmbeddings:
    """A fixed vector per text; counts its calls."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest()[:8], dtype=np.uint8) + 1.0
                         for t in texts])


class Recorder(Progress):
    def __init__(self):
        self.total = self.done = 0

    def add_total(self, n):
        self.total += n

    def advance(self, n):
        self.done += n


def run(judge, metrics=None, **options):
    progress = Recorder()
    result = evaluate(ROWS, metrics=metrics or [cls() for cls in ALL], llm=judge, embeddings=HashEmbeddings(),
                      show_progress=False, progress=progress, **options)
    return result, progress


def comparable(stats) -> dict:
    """RunStats without the timings."""
    d = stats.to_dict()
    d.pop("seconds")
    d["per_metric"] = {m: {k: v for k, v in s.items() if k != "seconds"} for m, s in d["per_metric"].items()}
    return d


def test_pipelined_results_stats_and_progress_equal_the_waves():
    waves, wave_progress = run(ScriptedJudge(answer))
    pipelined_judge = Pipelined(ScriptedJudge(answer))
    pipelined, progress = run(pipelined_judge)
    assert pipelined.records() == waves.records()  # values, reasons, details and every judge call, in order
    assert comparable(pipelined.stats) == comparable(waves.stats)
    assert set(pipelined.stats.per_metric) == {cls.name for cls in ALL}
    assert all(s["seconds"] >= 0 for s in pipelined.stats.per_metric.values())
    assert progress.total == progress.done == pipelined.stats.judge_calls == wave_progress.total
    assert pipelined_judge.peak == pipelined_judge.max_concurrency  # the engine was kept busy


@pytest.mark.parametrize("metrics", [[Faithfulness, ContextRecall], [Faithfulness]])
def test_identical_requests_are_sent_once_across_samples_and_metrics(metrics):
    row = {"user_input": "Who wrote Hamlet?", "retrieved_contexts": ["Shakespeare wrote Hamlet around 1600."],
           "response": "Shakespeare wrote Hamlet. It was around 1600.",
           "reference": "Shakespeare wrote Hamlet. It was around 1600."}  # reference == response
    judge = Pipelined(ScriptedJudge(answer))
    result = evaluate([row, row], metrics=[m() for m in metrics], llm=judge, show_progress=False)
    assert len(judge.requests) == 3 == result.stats.judge_calls  # one extraction, two verdicts
    assert result.stats.deduplicated == 3 * (2 * len(metrics) - 1)
    assert all(len(res.judge_calls) == 3 for r in result.results.values() for res in r.values())


def test_a_sample_does_not_wait_for_the_others_claims():
    slow = "It is in Paris. It is 300 m tall."
    judge = Pipelined(ScriptedJudge(answer), max_concurrency=8,
                      delay=lambda r: 0.3 if r.tag == "claims" and slow in user_text(r) else 0.001)
    evaluate(ROWS[:2], metrics=[Faithfulness()], llm=judge, show_progress=False)
    last_claims_end = max(i for i, e in enumerate(judge.events) if e == ("end", "claims"))
    first_verdict = judge.events.index(("start", "verdict[0]"))
    assert first_verdict < last_claims_end  # waves would hold every verdict until all claims are in


def test_the_first_rows_finish_first_instead_of_after_the_whole_windows_first_stage():
    """Free engine slots go to the earliest sample's requests: the first row's verdicts do not queue behind
    the claims of every sample in the window, so rows come out from the start of a run."""
    rows = [{"user_input": f"Question {i}?", "retrieved_contexts": [f"Fact {i} is true. Fact {i} is old."],
             "response": f"Fact {i} is true. Fact {i} is old."} for i in range(24)]
    judge = Pipelined(ScriptedJudge(answer), max_concurrency=2, delay=lambda r: 0.002)
    ended_at_first_row = []
    evaluate(rows, metrics=[Faithfulness()], llm=judge, show_progress=False,
             on_record=lambda record: ended_at_first_row.append(sum(e[0] == "end" for e in judge.events)))
    assert len(judge.requests) == 24 * 3  # per row: claims, then two verdicts
    # The first row needs its own 3 requests; the slots its claims and the second row's free go to the next
    # rows' claims before its verdicts are asked (6-8 requests have ended when it is done). In first-come
    # order it would wait for all 24 claims (26 ended).
    assert ended_at_first_row[0] <= 8


def test_embeddings_are_batched_and_each_text_embedded_once():
    embeddings = HashEmbeddings()
    rows = [{"user_input": f"Question {i}?", "response": f"Answer {i}."} for i in range(6)] * 2
    result = evaluate(rows, metrics=[AnswerRelevancy()], llm=Pipelined(ScriptedJudge(answer), max_concurrency=16),
                      embeddings=embeddings, show_progress=False)
    texts = [t for call in embeddings.calls for t in call]
    assert len(texts) == len(set(texts)) == result.stats.embedded_texts
    assert len(embeddings.calls) < 6  # batched, not one call per sample
    assert all(v is not None for v in result.values("answer_relevancy"))


def test_a_cached_rerun_asks_the_engine_nothing(tmp_path):
    path = tmp_path / "cache.sqlite"
    first, _ = run(Pipelined(ScriptedJudge(answer)), cache=path)
    again_judge = Pipelined(ScriptedJudge(answer))
    again, progress = run(again_judge, cache=path)
    assert again_judge.requests == [] and progress.total == 0
    assert again.stats.judge_calls == 0 and again.stats.cached == first.stats.judge_calls
    assert again.scores == first.scores


def test_an_engine_error_stops_the_run_and_keeps_what_returned(tmp_path):
    class Failing(ScriptedJudge):
        def generate(self, requests, progress=None):
            if len(self.requests) == 6:
                raise EngineError("the server went away")
            return super().generate(requests, progress)

    path = tmp_path / "cache.sqlite"
    failing = Pipelined(Failing(answer))
    with JudgeCache(path) as cache, pytest.raises(EngineError, match="went away"):
        run_metrics([SingleTurnSample(**r) for r in ROWS], [Faithfulness()], judge=failing, cache=cache,
                    chunk_size=4)
    with JudgeCache(path) as cache:
        assert cache.count() == 6  # every answer that came back before the error, not only full chunks
    healthy = Pipelined(ScriptedJudge(answer))
    result, _ = run(healthy, metrics=[Faithfulness()], cache=path)
    assert result.stats.cached == 6 and len(healthy.requests) == result.stats.judge_calls


def test_the_path_can_be_chosen():
    samples = [SingleTurnSample(**r) for r in ROWS[:2]]
    judge = Pipelined(ScriptedJudge(answer))
    run_metrics(samples, [Faithfulness()], judge=judge, pipeline=False)
    assert judge.peak == 0  # waves: through generate(), not the session
    with pytest.raises(ValueError, match="no async session"):
        run_metrics(samples, [Faithfulness()], judge=ScriptedJudge(answer), pipeline=True)
