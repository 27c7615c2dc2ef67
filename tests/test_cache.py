"""The persistent judge-call cache, with scripted judges: keys, what is stored, chunked writes, resuming
after a failure mid-wave, concurrent use, and clear errors for unusable cache files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from offline_eval import evaluate
from offline_eval.cache import CacheError, JudgeCache, cache_key, default_path
from offline_eval.constraints import Choice
from offline_eval.engines.base import EngineError, JudgeOutput, JudgeRequest
from offline_eval.metrics.collections import ContextRelevance, Faithfulness
from scripted import ScriptedJudge, item_text, user_text

ROWS = [
    {"user_input": "Where is the Eiffel Tower?", "retrieved_contexts": ["The Eiffel Tower stands in Paris."],
     "response": "It is in Paris. It is 300 m tall."},
    {"user_input": "Who wrote Hamlet?", "retrieved_contexts": ["Shakespeare wrote Hamlet around 1600."],
     "response": "Shakespeare wrote it. He wrote it in 1600. He was French."},
]
SUPPORTED = ("It is in Paris.", "Shakespeare wrote it.", "He wrote it in 1600.")


def answer(request: JudgeRequest, verdict: str = "yes"):
    """Claims are the response's sentences; a claim is supported if listed in SUPPORTED (else `verdict`)."""
    text = user_text(request)
    if request.tag == "claims":
        response = text.rsplit("Text: ", 1)[1]
        return {"claims": [s.strip() + "." for s in response.split(".") if s.strip()]}
    if request.tag.startswith("verdict"):
        return "yes" if any(s in text for s in SUPPORTED) else verdict
    return "1"  # context relevance ratings


def judge(model: str = "judge-a", verdict: str = "no") -> ScriptedJudge:
    j = ScriptedJudge(lambda r: answer(r, verdict))
    j.identity = {"engine": "scripted", "model": model}
    return j


class FailingJudge(ScriptedJudge):
    """Outputs without a value (like an input that is too long) for the requests `fails` picks."""

    def __init__(self, fails):
        super().__init__(lambda r: answer(r, "no"))
        self.identity = {"engine": "scripted", "model": "judge-a"}
        self.fails = fails

    def generate(self, requests, progress=None):
        outputs = []
        for r in requests:
            failed = JudgeOutput(text="", value=None, finish_reason="length", meta={"error": "too long"})
            outputs += [failed] if self.fails(r) else super().generate([r])
        return outputs


def metrics():
    return [Faithfulness(), ContextRelevance()]


def test_a_rerun_is_answered_by_the_cache_with_identical_results(tmp_path):
    path = tmp_path / "cache.sqlite"
    first = evaluate(ROWS, metrics=metrics(), llm=judge(), show_progress=False, cache=path)
    assert first.stats.cached == 0 and first.stats.judge_calls == 2 + 5 + 4
    again_judge = judge()
    again = evaluate(ROWS, metrics=metrics(), llm=again_judge, show_progress=False, cache=path)
    assert again_judge.requests == []
    # the judge rates context relevance "1": P(top rating) 0 under the default scoring
    assert again.scores == first.scores == [{"faithfulness": 0.5, "context_relevance": 0.0},
                                            {"faithfulness": 2 / 3, "context_relevance": 0.0}]
    assert [r["metrics"]["faithfulness"]["details"] for r in again.records()] == \
        [r["metrics"]["faithfulness"]["details"] for r in first.records()]
    assert again.stats.judge_calls == 0 and again.stats.cached == 11
    assert again.stats.prompt_tokens == 0 and again.stats.completion_tokens == 0
    calls = [c for rec in again.records() for m in rec["metrics"].values() for c in m["judge_calls"]]
    assert len(calls) == 11 and all(c["cached"] is True and c["value"] is not None for c in calls)
    assert all("cached" not in c for rec in first.records() for m in rec["metrics"].values()
               for c in m["judge_calls"])
    for name, m in again.stats.per_metric.items():
        assert m["cached"] == m["judge_calls"] > 0 and m["prompt_tokens"] == 0 and m["seconds"] == 0, name
    assert first.stats.per_metric["faithfulness"] == pytest.approx(
        {"judge_calls": 7, "cached": 0, "prompt_tokens": 70, "completion_tokens": 14,
         "seconds": first.stats.per_metric["faithfulness"]["seconds"]})


def test_the_judge_model_is_part_of_the_key(tmp_path):
    path = tmp_path / "cache.sqlite"
    a = evaluate(ROWS, metrics=[Faithfulness()], llm=judge("judge-a", verdict="no"), show_progress=False,
                 cache=path)
    b_judge = judge("judge-b", verdict="yes")
    b = evaluate(ROWS, metrics=[Faithfulness()], llm=b_judge, show_progress=False, cache=path)
    assert len(b_judge.requests) == 7 and b.stats.cached == 0  # nothing answered by judge-a's outputs
    assert a.values("faithfulness") == [0.5, 2 / 3] and b.values("faithfulness") == [1.0, 1.0]
    with JudgeCache(path) as cache:
        assert cache.count() == 14

    request = JudgeRequest((("user", "q"),), Choice(("yes", "no")))
    assert cache_key({"model": "a", "engine": "x"}, request) == cache_key({"engine": "x", "model": "a"}, request)
    assert cache_key({"model": "a", "engine": "x"}, request) != cache_key({"model": "b", "engine": "x"}, request)
    assert cache_key({"model": "a", "weights": "/m/1.gguf"}, request) != \
        cache_key({"model": "a", "weights": "/m/2.gguf"}, request)


def test_outputs_round_trip_as_json(tmp_path):
    identity = {"engine": "scripted", "model": "m"}
    request = JudgeRequest((("system", "s"), ("user", "北京")), Choice(("yes", "no")))
    out = JudgeOutput(text='{"claims":["北京是首都。"]}', value={"claims": ["北京是首都。"]}, prompt_tokens=7,
                      completion_tokens=3, finish_reason="stop", meta={"engine_note": [1, 2]})
    with JudgeCache(tmp_path / "c.sqlite") as cache:
        assert cache.put_many(identity, [request], [out]) == 1
        (got,) = cache.get_many(identity, [request]).values()
    assert (got.text, got.value, got.prompt_tokens, got.completion_tokens, got.finish_reason) == \
        (out.text, out.value, 7, 3, "stop")
    assert got.meta == {"engine_note": [1, 2], "cached": True}
    assert b"\x80\x04" not in (tmp_path / "c.sqlite").read_bytes()  # JSON text, no pickles


def test_failed_calls_are_not_cached_and_a_rerun_retries_only_them(tmp_path):
    path = tmp_path / "cache.sqlite"
    flaky = FailingJudge(lambda r: "He was French." in user_text(r) and r.tag.startswith("verdict"))
    first = evaluate(ROWS, metrics=[Faithfulness()], llm=flaky, show_progress=False, cache=path)
    assert first.values("faithfulness") == [0.5, 1.0]  # the failed verdict has no vote
    with JudgeCache(path) as cache:
        assert cache.count() == 6
    healthy = judge()
    again = evaluate(ROWS, metrics=[Faithfulness()], llm=healthy, show_progress=False, cache=path)
    assert [user_text(r).rsplit("Claim: ", 1)[1].split("\n")[0] for r in healthy.requests] == ["He was French."]
    assert again.stats.judge_calls == 1 and again.stats.cached == 6
    assert again.values("faithfulness") == [0.5, 2 / 3]


def test_chunks_are_written_as_they_return_and_a_crash_loses_only_its_chunk(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLINE_EVAL_CHUNK", "2")
    path = tmp_path / "cache.sqlite"
    cache = JudgeCache(path)
    seen = []

    class Crashing(ScriptedJudge):
        def generate(self, requests, progress=None):
            seen.append((len(requests), cache.count(), [r.messages for r in requests]))
            if len(seen) == 4:
                raise EngineError("killed")
            return super().generate(requests, progress)

    crashing = Crashing(lambda r: answer(r, "no"))
    crashing.identity = judge().identity
    with pytest.raises(EngineError):
        evaluate(ROWS, metrics=[Faithfulness()], llm=crashing, show_progress=False, cache=cache)
    # wave 1: 2 extractions in one chunk; wave 2: 5 verdicts in chunks of 2, sorted; the 3rd chunk crashed
    assert [(n, stored) for n, stored, _ in seen] == [(2, 0), (2, 2), (2, 4), (1, 6)]
    verdicts = [m for _, _, ms in seen[1:] for m in ms]
    assert verdicts == sorted(verdicts)
    assert cache.count() == 6

    healthy = judge()
    result = evaluate(ROWS, metrics=[Faithfulness()], llm=healthy, show_progress=False, cache=cache)
    assert len(healthy.requests) == 1 and result.stats.cached == 6
    fresh = evaluate(ROWS, metrics=[Faithfulness()], llm=judge(), show_progress=False)
    assert result.scores == fresh.scores
    cache.close()


def test_concurrent_connections_read_and_write(tmp_path):
    identity = {"engine": "scripted", "model": "m"}
    requests = [JudgeRequest((("user", f"q{i}"),), Choice(("yes", "no"))) for i in range(3)]
    outputs = [JudgeOutput(text="yes", value="yes") for _ in requests]
    path = tmp_path / "cache.sqlite"
    writer, reader = JudgeCache(path), JudgeCache(path)
    # a long read transaction elsewhere (another process reading) does not block writes in WAL mode
    other = sqlite3.connect(path)
    other.execute("BEGIN")
    other.execute("SELECT COUNT(*) FROM judge_calls").fetchone()
    writer.put_many(identity, requests[:2], outputs[:2])
    assert len(reader.get_many(identity, requests)) == 2
    other.rollback()
    other.close()
    writer.close()
    reader.close()
    with JudgeCache(path) as reopened:
        assert reopened.count() == 2
        assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_corrupt_cache_is_a_clear_error(tmp_path):
    path = tmp_path / "cache.sqlite"
    path.write_bytes(b"this is not a database\n" * 100)
    with pytest.raises(CacheError, match=r"is not a usable SQLite database .*delete it, or pass --cache"):
        JudgeCache(path)
    with pytest.raises(CacheError, match="not a usable SQLite database"):
        evaluate(ROWS, metrics=[Faithfulness()], llm=judge(), show_progress=False, cache=path)


def test_a_locked_cache_is_a_clear_error(tmp_path):
    path = tmp_path / "cache.sqlite"
    JudgeCache(path).close()
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a write
    cache = JudgeCache(path, timeout=0.1)
    request = JudgeRequest((("user", "q"),), Choice(("yes", "no")))
    assert cache.get_many({"model": "m"}, [request]) == {}  # reading still works
    with pytest.raises(CacheError, match=r"is locked by another process \(waited 0.1 s\)"):
        cache.put_many({"model": "m"}, [request], [JudgeOutput(text="yes", value="yes")])
    holder.rollback()
    cache.put_many({"model": "m"}, [request], [JudgeOutput(text="yes", value="yes")])
    cache.close()
    holder.close()


def test_a_cache_from_another_schema_version_is_refused(tmp_path):
    path = tmp_path / "cache.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(CacheError, match="schema version 99"):
        JudgeCache(path)


def test_the_cache_is_off_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("OFFLINE_EVAL_JUDGE_CACHE")
    monkeypatch.setenv("OFFLINE_EVAL_CACHE_DIR", str(tmp_path / "cache-dir"))
    assert default_path() == tmp_path / "cache-dir" / "judge-cache.sqlite"
    evaluate(ROWS, metrics=[Faithfulness()], llm=judge(), show_progress=False)
    assert not default_path().exists()
    evaluate(ROWS, metrics=[Faithfulness()], llm=judge(), show_progress=False, cache=True)
    with JudgeCache(default_path()) as cache:
        assert cache.count() == 7
    monkeypatch.setenv("OFFLINE_EVAL_JUDGE_CACHE", str(tmp_path / "other.sqlite"))
    assert default_path() == tmp_path / "other.sqlite"


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offline_eval.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_cli_cache_flag_errors(tmp_path):
    proc = cli("run", "--no-cache", "--resume", "data.jsonl", cwd=tmp_path)
    assert proc.returncode == 2 and "--no-cache contradicts --resume" in proc.stderr

    data = tmp_path / "one.jsonl"
    data.write_text('{"user_input": "q", "retrieved_contexts": ["c"]}\n')
    (tmp_path / "bad.sqlite").write_bytes(b"garbage" * 200)
    proc = cli("run", "--model", "no-such-model", "--cache", "bad.sqlite", str(data), cwd=tmp_path)
    assert proc.returncode == 5 and "bad.sqlite is not a usable SQLite database" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_vllm_server_started_for_the_run_is_keyed_by_its_weights_not_its_port(tmp_path):
    pytest.importorskip("httpx")
    from types import SimpleNamespace

    from offline_eval.engines.vllm_server import VllmServerEngine

    managed = SimpleNamespace(spec=SimpleNamespace(weights_path=lambda: tmp_path / "Qwen2.5-7B-Instruct"))
    runs = [VllmServerEngine(f"http://127.0.0.1:{port}/v1", "qwen", managed=managed, check=False)
            for port in (41001, 41002)]
    assert runs[0].identity == runs[1].identity
    assert runs[0].identity["weights"] == str(tmp_path / "Qwen2.5-7B-Instruct") and "base_url" not in runs[0].identity
    connected = VllmServerEngine("http://gpu-box:8000/v1", "qwen", check=False)
    assert connected.identity["base_url"] == "http://gpu-box:8000/v1"


class CountingEmbeddings:
    """A named embedder (it has an identity, so its vectors are cached) that records what it embeds."""

    def __init__(self, name: str = "table"):
        self.identity = {"embeddings": name}
        self.texts: list[str] = []

    def embed(self, texts):
        import numpy as np

        self.texts += texts
        return np.stack([[1.0, len(t) / 10, 0.5] for t in texts]).astype(np.float32)


@pytest.mark.parametrize("pipelined", [False, True])
def test_embeddings_are_cached_per_model_and_text(tmp_path, pipelined):
    from offline_eval.metrics.collections import AnswerRelevancy
    from scripted import Pipelined

    def questions(request):
        return {"questions": [{"question": f"{item_text(request)}?", "noncommittal": 0}] * 3}

    def make_judge():
        judge = ScriptedJudge(questions)
        return Pipelined(judge) if pipelined else judge

    rows = [{"user_input": "Where is Paris?", "response": "In France."},
            {"user_input": "Who wrote Hamlet?", "response": "Shakespeare."}]
    path = tmp_path / "cache.sqlite"
    first_embedder = CountingEmbeddings()
    first = evaluate(rows, metrics=[AnswerRelevancy()], llm=make_judge(), embeddings=first_embedder,
                     show_progress=False, cache=path)
    assert len(first_embedder.texts) == 4  # two inputs and two distinct generated questions
    again_embedder = CountingEmbeddings()
    again = evaluate(rows, metrics=[AnswerRelevancy()], llm=make_judge(), embeddings=again_embedder,
                     show_progress=False, cache=path)
    assert again_embedder.texts == [] and again.scores == first.scores
    assert first.stats.embedded_texts == 4 and again.stats.embedded_texts == 0
    other_model = CountingEmbeddings("another model")
    evaluate(rows, metrics=[AnswerRelevancy()], llm=make_judge(), embeddings=other_model, show_progress=False,
             cache=path)
    assert len(other_model.texts) == 4  # vectors are never shared between embedding models
