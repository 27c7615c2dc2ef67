"""Retrieved contexts longer than the judge's context window: truncate or error per row, never a crash.

The unit tests use a scripted judge whose "tokens" are words; the last tests run SmolLM2 through llama.cpp
with a 512-token context, measured with its own tokenizer and chat template.
"""

from __future__ import annotations

import pytest

from offline_eval import SingleTurnSample, evaluate
from offline_eval.engines.base import prompt_token_counts
from offline_eval.run.long_inputs import fit_contexts
from offline_eval.metrics.collections import ContextPrecision, ContextRelevance, Faithfulness
from scripted import ScriptedJudge, user_text

SIZE = 400  # the scripted judge's context window, in words


class CountingJudge(ScriptedJudge):
    """A scripted judge that counts words as tokens and has a context window of SIZE of them."""

    context_size = SIZE

    def count_tokens(self, texts):
        return [len(t.split()) for t in texts]


def answer(request):
    if request.tag == "claims":
        return {"claims": ["The Danube ends in the Black Sea."]}
    return "yes" if "yes" in request.constraint.options else request.constraint.options[-1]


def words(n: int, word: str = "river") -> str:
    return " ".join([word] * n)


ROWS = [
    {"user_input": "Where does the Danube end?", "response": "It ends in the Black Sea.",
     "retrieved_contexts": [words(1000), "The Danube ends in the Black Sea."], "reference": "The Black Sea."},
    {"user_input": "Where is Ulm?", "response": "Ulm is in Germany.",
     "retrieved_contexts": ["Ulm is a city in Germany."], "reference": "In Germany."},
]


def fits(judge, request) -> bool:
    (n,) = prompt_token_counts(judge, [request])
    return n + request.max_tokens <= SIZE


@pytest.mark.parametrize("metric", ["context_relevance", "faithfulness", "context_precision"])
def test_truncate_cuts_the_contexts_to_fit_and_warns_per_row(metric):
    judge = CountingJudge(answer)
    result = evaluate(ROWS, metrics=[metric], llm=judge, show_progress=False, long_inputs="truncate")
    assert all(s[metric] is not None for s in result.scores)
    assert all(fits(judge, r) for r in judge.requests if r.tag != "claims")  # those carry no contexts
    (warning,) = result.warnings
    assert warning.startswith(f"row 1: {metric}: retrieved_contexts truncated to fit the judge's context window "
                              f"(400 tokens): context 1 from 1000 to ")
    assert "context 2" not in warning  # the short context is left alone
    assert "long_input" in result.records()[0]["metrics"][metric]["details"]


def test_truncate_cuts_the_contexts_once_per_sample_so_every_metric_shows_the_same():
    judge = CountingJudge(answer)
    metrics = ["context_relevance", "faithfulness", "response_groundedness"]
    result = evaluate(ROWS[:1], metrics=metrics, llm=judge, show_progress=False, long_inputs="truncate")
    shown = {user_text(r).split("\n\n")[0] for r in judge.requests if r.shows_contexts}
    assert len(shown) == 1 and words(1000) not in next(iter(shown))  # one cut, shared by all three
    assert all(fits(judge, r) for r in judge.requests if r.shows_contexts)
    assert [w.split(": ")[1] for w in result.warnings] == metrics  # each metric still says it was cut


def test_truncate_cuts_longest_first_from_the_end():
    contexts = [words(300, "alpha"), words(250, "beta"), "short one"]
    sample = SingleTurnSample(user_input="q", retrieved_contexts=contexts)
    fit = fit_contexts([(ContextRelevance(), "en")], sample, CountingJudge(answer), "truncate")
    first, second, third = fit.sample.retrieved_contexts
    assert contexts[0].startswith(first) and contexts[1].startswith(second) and third == "short one"
    assert abs(len(first.split()) - len(second.split())) <= 20  # both cut down to a common level
    assert "context 1 from 300 to" in fit.note and "context 2 from 250 to" in fit.note


def test_error_policy_records_the_row_as_failed_and_scores_the_rest():
    judge = CountingJudge(answer)
    result = evaluate(ROWS, metrics=["context_relevance", "answer_accuracy"], llm=judge, show_progress=False,
                      long_inputs="error")
    first, second = result.records()
    relevance = first["metrics"]["context_relevance"]
    assert relevance["value"] is None and relevance["judge_calls"] == []
    assert relevance["reason"].startswith("not scored: retrieved_contexts too long for the judge's context window")
    assert first["metrics"]["answer_accuracy"]["value"] is not None  # a metric without contexts is unaffected
    assert second["metrics"]["context_relevance"]["value"] is not None
    assert result.warnings == [f"row 1: context_relevance: {relevance['details']['long_input']}"]
    assert result.summary()["context_relevance"]["no_value"] == 1


def test_a_prompt_too_long_without_contexts_is_an_error_even_when_truncating():
    judge = CountingJudge(answer)
    row = {"user_input": words(600), "retrieved_contexts": ["Ulm is in Germany."]}
    result = evaluate([row], metrics=["context_relevance"], llm=judge, show_progress=False)
    assert result.scores == [{"context_relevance": None}] and judge.requests == []
    assert "even with the retrieved_contexts cut to nothing" in result.warnings[0]


def test_inputs_that_fit_are_untouched_and_engines_that_cannot_count_are_not_measured():
    judge = CountingJudge(answer)
    result = evaluate(ROWS[1:], metrics=["context_relevance", "faithfulness"], llm=judge, show_progress=False)
    assert result.warnings == []
    plain = ScriptedJudge(answer)  # no count_tokens: the engine's own "input too long" handling applies
    result = evaluate(ROWS, metrics=["context_relevance"], llm=plain, show_progress=False, long_inputs="truncate")
    assert result.warnings == [] and any(words(1000) in user_text(r) for r in plain.requests)


def test_unknown_policy_is_rejected():
    for policy in ("shorten", "focus:", "focus:0", "focus:many", "truncate:100"):
        with pytest.raises(ValueError, match="long_inputs must be one of focus, truncate, error or focus:N"):
            evaluate(ROWS, metrics=["context_relevance"], llm=CountingJudge(answer), show_progress=False,
                     long_inputs=policy)


def test_claim_metrics_measure_a_claim_as_long_as_claims_may_be():
    from offline_eval.metrics.claims import MAX_CLAIM_CHARS

    sample = SingleTurnSample(user_input="q", response="Short.", retrieved_contexts=["c1", "c2"])
    (probe,) = Faithfulness().context_probes(sample, "en")
    assert probe.tag == "verdict" and f"Claim: {('Short. ' * 30)[:MAX_CLAIM_CHARS]}\n" in user_text(probe)
    assert len(ContextPrecision().context_probes(sample, "en")) == 2


# ---- the real thing: SmolLM2 through llama.cpp with n_ctx=512 ------------------------------------------

@pytest.fixture(scope="module")
def small_ctx():
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    engine = load_engine(Registry.load().get("smollm2-135m-instruct"), n_ctx=512)
    yield engine
    engine.close()


LONG_ROW = {"user_input": "Where does the Danube end?",
            "retrieved_contexts": [" ".join(f"Fact {i}: the Danube flows through ten countries." for i in range(300)),
                                   "The Danube ends in the Black Sea."]}


def test_llamacpp_counts_with_its_own_tokenizer_and_template(small_ctx):
    from offline_eval.engines.base import JudgeRequest
    from offline_eval.metrics.base import YES_NO

    assert small_ctx.context_size == 512
    request = JudgeRequest((("system", "Answer yes or no."), ("user", "Is the sea wide?")), YES_NO)
    (counted,) = small_ctx.count_prompt_tokens([request])
    (out,) = small_ctx.generate([request])
    assert counted == out.prompt_tokens  # what create_chat_completion really sent
    assert small_ctx.count_tokens(["hello world", ""]) == [2, 0]


def test_llamacpp_truncate_scores_and_warns(small_ctx):
    result = evaluate([LONG_ROW], metrics=["context_relevance"], llm=small_ctx, show_progress=False,
                      long_inputs="truncate")
    record = result.records()[0]["metrics"]["context_relevance"]
    assert record["value"] is not None and all("error" not in c for c in record["judge_calls"])
    assert all(c["prompt_tokens"] + 1 <= 512 for c in record["judge_calls"])
    (warning,) = result.warnings
    assert warning.startswith("row 1: context_relevance: retrieved_contexts truncated to fit the judge's "
                              "context window (512 tokens): context 1 from ")


def test_llamacpp_error_policy_fails_the_row_only(small_ctx):
    short = {"user_input": "Where is Ulm?", "retrieved_contexts": ["Ulm is a city in Germany."]}
    result = evaluate([LONG_ROW, short], metrics=["context_relevance"], llm=small_ctx, show_progress=False,
                      long_inputs="error")
    assert result.scores[0] == {"context_relevance": None} and result.scores[1]["context_relevance"] is not None
    assert "too long for the judge's context window (512 tokens)" in result.warnings[0]


def test_llamacpp_focus_then_fits_the_window_and_keeps_the_short_context_whole(small_ctx):
    """The default: the 300-fact context is focused on its passages about the question, then cut to the
    512-token window; both notes are recorded, and the focus alone is no warning."""
    result = evaluate([LONG_ROW], metrics=["context_relevance"], llm=small_ctx, show_progress=False)
    record = result.records()[0]["metrics"]["context_relevance"]
    assert record["value"] is not None and all("error" not in c for c in record["judge_calls"])
    assert record["details"]["context_focus"].startswith("retrieved_contexts focused on the passages most "
                                                         "relevant to the sample: kept ")
    assert result.focused == 1 and len(result.warnings) == 1  # the focus is no warning; the window cut is


def test_a_prompt_full_of_control_token_spellings_is_never_taken_to_fit_without_counting():
    """The quick bound skips counting tokens only when even one token per byte of the neutralised prompt fits;
    neutralising adds a zero-width space (3 bytes) to each control-token spelling, so the bound must count
    them without rendering."""
    from offline_eval.constraints import Choice
    from offline_eval.engines.base import TEMPLATE_MARGIN, JudgeRequest
    from offline_eval.run.long_inputs import SAFETY, _surely_fits

    text = "Context: " + "<|im_end|>[INST]<s>" * 50 + " plain text [1] <b>"
    request = JudgeRequest((("system", "Rate it."), ("user", text)), Choice(("yes", "no")))
    rendered = sum(len(m["content"].encode()) for m in request.chat())
    assert rendered > sum(len(t.encode()) for _, t in request.messages) + 400  # 150 spellings neutralised
    room = 4 * TEMPLATE_MARGIN + request.max_tokens + SAFETY
    assert not _surely_fits(request, rendered + room - 1)
    assert _surely_fits(request, rendered + room + 3 * 2)  # the bound also counts "[1]" and "<b>" (not controls)
