"""Whole evaluations through the real llama.cpp engine and real sentence-transformers embeddings.

SmolLM2-135M is a plumbing fixture (it is no judge), so those tests check shapes, ranges, languages and
determinism. The Chinese case uses the default judge, Qwen2.5-Coder-1.5B, whose verdicts are meaningful.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from offline_eval import evaluate
from offline_eval.metrics.collections import AnswerRelevancy, Faithfulness

EXAMPLES = Path(__file__).parent.parent / "examples"
CJK = re.compile(r"[\u4e00-\u9fff]")


class Recording:
    """The real engine, keeping every request it is sent."""

    def __init__(self, engine):
        self.engine, self.requests = engine, []

    def generate(self, requests, progress=None):
        self.requests += requests
        return self.engine.generate(requests, progress)

    def __getattr__(self, name):  # identity, token counting, context size: the engine's own
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def recorded(smollm):
    return Recording(smollm)


@pytest.fixture(scope="module")
def quickstart_result(recorded, minilm):
    metrics = ["answer_accuracy", "context_relevance", "response_groundedness", "faithfulness",
               "answer_relevancy", "context_precision", "context_recall", "answer_correctness",
               "rubrics_score"]
    return evaluate(EXAMPLES / "quickstart.jsonl", metrics=metrics, llm=recorded, embeddings=minilm,
                    show_progress=False)


def test_every_metric_runs_end_to_end(quickstart_result, tmp_path):
    result = quickstart_result
    assert result.judge["engine"] == "llamacpp"
    for name in result.metric_names:
        values = result.values(name)
        assert len(values) == 6
        hi = 5 if name == "rubrics_score" else 1
        lo = 1 if name == "rubrics_score" else (-1 if name in ("answer_relevancy", "answer_correctness") else 0)
        assert all(v is None or lo <= v <= hi for v in values), (name, values)
    out = tmp_path / "results.jsonl"
    result.write_jsonl(out)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["row"] for r in records] == [1, 2, 3, 4, 5, 6]
    for rec in records:
        for name, m in rec["metrics"].items():
            assert m["reason"], name
            assert m["judge_calls"], name
            assert all(c["finish_reason"] == "stop" and c["value"] is not None for c in m["judge_calls"])
    assert result.stats.judge_calls > 0 and result.stats.prompt_tokens > 0


def test_chinese_rows_get_chinese_prompts(quickstart_result, recorded):
    beijing = next(r for r in quickstart_result.records() if r["user_input"] == "介绍一下北京。")
    asked = [r for r in recorded.requests if beijing["response"] in r.messages[-1][1]]
    # every metric that shows the response asked about it, each time with Chinese instructions
    assert {r.tag for r in asked} >= {"judge1", "judge2", "claims", "questions", "rubric"}
    assert all(CJK.match(r.messages[0][1].strip()) for r in asked), [r.messages[0][1][:30] for r in asked]
    claims = beijing["metrics"]["faithfulness"]["details"].get("claims") or []
    assert all(CJK.search(c) for c in claims)  # what it wrote, if anything, is Chinese


def test_reruns_give_identical_scores(quickstart_result, smollm, minilm):
    again = evaluate(EXAMPLES / "quickstart.jsonl", metrics=quickstart_result.metric_names, llm=smollm,
                     embeddings=minilm, show_progress=False)
    assert again.scores == quickstart_result.scores


def test_chinese_end_to_end_with_the_default_judge(qwen, minilm):
    """The article's Beijing example: claim 3 (population over 50 million) contradicts the context."""
    sample = dict(
        user_input="介绍一下北京。",
        response="北京是中国的首都，拥有故宫等著名景点，常住人口超过5000万。",
        retrieved_contexts=["北京是中华人民共和国首都，著名景点包括故宫、天坛。2024年统计常住人口约为2185万人。"],
    )
    faith = Faithfulness(llm=qwen).score(**sample)
    assert faith.scores["argmax"] == pytest.approx(2 / 3)
    verdicts = dict(zip(faith.details["claims"], faith.details["verdicts"]))
    assert [v for c, v in verdicts.items() if "5000" in c] == [False]
    # The default (probability) scoring: the mean P(yes) over the claims, the false one well below 0.5.
    p_yes = [c["probabilities"]["yes"] for c in faith.judge_calls if c["stage"].startswith("verdict")]
    assert faith.value == pytest.approx(sum(p_yes) / 3)
    assert sorted(p_yes)[0] < 0.5 < sorted(p_yes)[1]

    relevancy = AnswerRelevancy(llm=qwen, embeddings=minilm).score(**sample)
    questions = relevancy.details["questions"]
    assert len(questions) == 3 and all(CJK.search(q) for q in questions)
    assert 0 < relevancy.value <= 1


@pytest.mark.parametrize("response, quoted", [
    ('He appeared in the 2016 Grammy-nominated documentary film about DJ Steve Aoki, titled "I\'ll Sleep When '
     'I\'m Dead".', "Sleep When"),
    ('the word "ski" is one of a handful of words norway has exported', "ski"),
])
def test_a_quoted_title_is_copied_into_claims_whole_by_the_default_judge(qwen, response, quoted):
    """A double quote cannot appear in a constrained claim. Shown the quotes as they were, the default judge
    closed the claim at the quote and wrote on after it (claims 'The word ', ']}```{' for the second text; the
    first one's single claim ended at "titled "); shown single quotes, it copies each claim from the text."""
    from offline_eval.metrics.claims import claims_of, extract_claims

    (out,) = qwen.generate([extract_claims(response, "en")])
    claims = claims_of(out)
    assert claims and any(quoted in c for c in claims), claims
    words = set(re.findall(r"\w+", response.lower()))
    for claim in claims:  # every claim is a sentence made of the text's words, not a JSON fragment
        said = re.findall(r"\w+", claim.lower())
        assert len(said) >= 3 and sum(w in words for w in said) >= 0.8 * len(said), claims


def test_offline_eval_threads_bounds_the_embeddings_threads_too():
    import subprocess
    import sys

    probe = ("import torch; from offline_eval import embedding_factory; "
             "before = torch.get_num_threads(); embedding_factory('all-minilm-l6-v2'); "
             "print(before, torch.get_num_threads())")
    env = {**os.environ, "OFFLINE_EVAL_THREADS": "1", "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1"]


def test_each_row_record_is_handed_over_once_as_soon_as_the_row_is_done(smollm):
    rows = [json.loads(line) for line in (EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines()[:2]]
    got = []
    result = evaluate(rows, metrics=["faithfulness", "context_relevance"], llm=smollm, show_progress=False,
                      on_record=got.append)
    assert sorted(got, key=lambda r: r["row"]) == result.records()
