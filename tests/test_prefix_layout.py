"""The prompt layout that lets an engine compute a sample's contexts once (metrics/base.py `request`), the
schedule that keeps a sample's requests together, and the count of prompt tokens the engine reused.

The prefix tests render prompts with the default judge's real tokenizer and chat template; the reuse test runs
the real llama.cpp engine and checks our count against llama.cpp's own counter of evaluated prompt tokens.
"""

from __future__ import annotations

import llama_cpp
import pytest

from offline_eval.metrics.base import CONTEXTS_HEADING, JUDGE_SYSTEM, JudgeRequest
from offline_eval.metrics.claims import check_claim
from offline_eval.metrics.collections import (ALL, AnswerCorrectness, ContextRelevance, Faithfulness,
                                              ResponseGroundedness)
from offline_eval.run.scheduler import RunStats, run_metrics
from offline_eval.dataset import to_sample, load_rows
from scripted import ScriptedJudge, TableEmbeddings, any_valid_answer

EN = dict(
    user_input="Where does the Danube end, and how long is it?",
    retrieved_contexts=["The Danube is Europe's second-longest river, about 2,850 km long. " * 6,
                        "It rises in the Black Forest and flows into the Black Sea through a delta. " * 5,
                        "Vienna, Budapest and Belgrade lie on its banks."],
    response="The Danube is about 2,850 km long and ends in the Black Sea.",
    reference="The Danube flows into the Black Sea; it is about 2,850 km long.",
)
ZH = dict(
    user_input="长江在哪里入海？它有多长？",
    retrieved_contexts=["长江全长约6300公里，是中国最长的河流。" * 6, "长江最终在上海附近注入东海。" * 5, "武汉和南京都位于长江沿岸。"],
    response="长江全长约6300公里，在上海附近注入东海。",
    reference="长江约6300公里长，在上海注入东海。",
)


def all_requests(sample: dict) -> list[JudgeRequest]:
    """Every judge request the eight default metrics (and the rubric score) make for `sample`."""
    judge = ScriptedJudge(any_valid_answer)
    texts = [sample["user_input"], sample["response"], sample["reference"], "generated?"]
    embeddings = TableEmbeddings({t: [1.0, float(i)] for i, t in enumerate(texts)})
    for metric_cls in ALL:
        metric_cls(llm=judge, embeddings=embeddings).score(**sample)
    return judge.requests


def common_prefix(rows: list[list[int]]) -> list[int]:
    n = 0
    while all(len(r) > n and r[n] == rows[0][n] for r in rows):
        n += 1
    return rows[0][:n]


@pytest.mark.parametrize("sample", [EN, ZH], ids=["en", "zh"])
def test_a_samples_context_requests_share_one_token_prefix_that_holds_every_context(qwen, sample):
    contexts = sample["retrieved_contexts"]
    shown = [r for r in all_requests(sample) if all(c in r.messages[-1][1] for c in contexts)]
    # context relevance and groundedness (two templates each), the rubric, and the claim checks of
    # faithfulness and context recall
    assert sorted({r.tag.split("[")[0] for r in shown}) == ["judge1", "judge2", "rubric", "verdict"]
    assert all(r.shows_contexts for r in shown)
    prompts = [qwen.prompt_ids(r) for r in shown]
    prefix = common_prefix(prompts)
    text = qwen._llm.detokenize(prefix).decode()
    assert all(c.strip() in text for c in contexts)


def test_requests_that_show_contexts_share_the_system_turn_and_the_others_keep_their_task_there():
    for sample, lang in ((EN, "en"), (ZH, "zh")):
        requests = all_requests(sample)
        for r in requests:
            (_, system), (_, user) = r.messages
            assert (system == JUDGE_SYSTEM[lang]) is user.startswith(CONTEXTS_HEADING[lang]), r.tag
        assert all(r.messages[0][1] == JUDGE_SYSTEM[lang] for r in requests if r.shows_contexts)
        assert any(r.messages[0][1] != JUDGE_SYSTEM[lang] for r in requests)  # claim extraction, ...


class SequentialJudge(ScriptedJudge):
    batch_size = 1  # like llama.cpp: one request at a time


def marked(i: int) -> dict:
    return dict(user_input=f"Marker {i}: what does the river do?", response=f"Marker {i} says the river floods.",
                retrieved_contexts=[f"Marker {i} text: the river floods every spring. " * 5, "Rivers flow."])


def test_a_sequential_engine_gets_one_sample_at_a_time_with_its_context_requests_back_to_back():
    judge = SequentialJudge(any_valid_answer)
    samples = [to_sample(r) for r in load_rows([marked(i) for i in range(3)])]
    # Faithfulness last: its claim extraction (no contexts) must still come before the context requests
    run_metrics(samples, [ResponseGroundedness(), ContextRelevance(), Faithfulness()], judge=judge)
    owner = [next(i for i in range(3) if f"Marker {i}" in r.messages[-1][1]) for r in judge.requests]
    assert owner == sorted(owner), owner  # sample 0's calls, then sample 1's, then sample 2's
    for i in range(3):
        calls = [r for r, o in zip(judge.requests, owner) if o == i]
        # the claim extraction first, then every call that shows the contexts in one unbroken run: the
        # ratings, then the claim checks of the next stage, which find the contexts still in the KV cache
        tags = [r.tag for r in calls]
        assert tags[0] == "claims" and sorted(tags[1:5]) == ["judge1", "judge1", "judge2", "judge2"], tags
        assert tags[5:] == ["verdict[0]"], tags
        assert [r.shows_contexts for r in calls] == [False] + [True] * 5


def test_prompt_tokens_reused_are_counted_as_llama_cpp_computes_them(smollm):
    contexts = ["The Danube is a river in Europe. " * 40, "It flows into the Black Sea. " * 30]
    claims = ["The Danube is in Europe.", "The Danube flows into the Black Sea.", "The Danube is in Asia."]
    smollm.generate([check_claim("Warm-up.", ["Another text."], "en")])

    def evaluated() -> int:  # llama.cpp's own count of the prompt tokens it computed
        return llama_cpp.llama_perf_context(smollm._llm._ctx.ctx).n_p_eval

    computed = []
    for claim in claims:
        before = evaluated()
        (out,) = smollm.generate([check_claim(claim, contexts, "en")])
        assert out.prompt_tokens - out.reused_prompt_tokens == evaluated() - before
        computed.append(out.prompt_tokens - out.reused_prompt_tokens)
    # the first check computed the contexts (it shares only the system turn with the warm-up); the others
    # computed only their claim and what follows it
    assert computed[0] > sum(smollm.count_tokens(contexts)) and max(computed[1:]) < 40, computed


def test_a_run_reports_the_prompt_tokens_its_engine_reused(smollm):
    stats = RunStats()
    samples = [to_sample(r) for r in load_rows([EN])]
    run_metrics(samples, [Faithfulness(), ResponseGroundedness(), ContextRelevance()], judge=smollm, stats=stats)
    contexts = sum(smollm.count_tokens(EN["retrieved_contexts"]))
    shown = stats.judge_calls - 1  # every call but the claim extraction shows the contexts
    # each context-showing call after the first takes the contexts from the KV cache
    assert stats.reused_prompt_tokens >= (shown - 1) * contexts
    assert stats.prompt_tokens - stats.reused_prompt_tokens < stats.prompt_tokens / 2


def test_claim_checks_against_the_reference_do_not_break_the_run_of_context_requests():
    """Answer Correctness checks claims against the reference and the response, not the contexts: in the
    verdict stage they go after the claim checks that continue the ratings' contexts."""
    judge = SequentialJudge(any_valid_answer)
    rows = [marked(i) | {"reference": f"Marker {i} reference: it floods."} for i in range(2)]
    texts = [t for r in rows for t in (r["response"], r["reference"])]
    embeddings = TableEmbeddings({t: [1.0, float(i)] for i, t in enumerate(texts)})
    metrics = [AnswerCorrectness(), Faithfulness(), ResponseGroundedness()]
    run_metrics([to_sample(r) for r in load_rows(rows)], metrics, judge=judge, embeddings=embeddings)
    for i in range(2):
        shown = "".join("T" if r.shows_contexts else "F" for r in judge.requests if f"Marker {i}" in r.messages[-1][1])
        assert shown.strip("F").count("F") == 0 and shown.count("T") == 3, shown  # 2 ratings, 1 claim check
