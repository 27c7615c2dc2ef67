"""The llama.cpp engine with a real model (SmolLM2-135M GGUF) and real grammar constraints.

Each constraint test first shows that, unconstrained, the model answers outside the allowed set, so the
test would fail if the engine dropped the constraint.
"""

from __future__ import annotations

import json

import pytest

from offline_eval.constraints import Choice, JsonSchema, array, obj, string
from offline_eval.engines.base import JudgeRequest

BANANA = (("system", "You are a helpful assistant."),
          ("user", "Reply with the single word banana and nothing else."))
POEM = (("system", "You are a poet."), ("user", "Write a four-line poem about the sea."))


def unconstrained(engine, messages, max_tokens=40) -> str:
    chat = [{"role": r, "content": c} for r, c in messages]
    out = engine._llm.create_chat_completion(messages=chat, temperature=0, max_tokens=max_tokens)
    return out["choices"][0]["message"]["content"]


def test_choice_constraint_bites(smollm):
    rating = Choice(("0", "1", "2"))
    assert unconstrained(smollm, BANANA).strip() not in rating.options
    (out,) = smollm.generate([JudgeRequest(BANANA, rating)])
    assert out.text in rating.options and out.value == out.text
    assert out.finish_reason == "stop" and out.completion_tokens >= 1 and out.prompt_tokens > 10


def test_json_constraint_bites_and_bounds_the_output(smollm):
    lines = JsonSchema.of(obj(lines=array(string(40, min_length=1), 3, min_items=3)))
    free = unconstrained(smollm, POEM)
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)
    (out,) = smollm.generate([JudgeRequest(POEM, lines)])
    assert out.finish_reason == "stop"
    value = json.loads(out.text)
    assert value == out.value and len(value["lines"]) == 3
    assert all(1 <= len(line) <= 40 for line in value["lines"])
    assert out.completion_tokens <= lines.max_tokens()


def test_outputs_are_deterministic_and_in_request_order(smollm):
    reqs = [JudgeRequest(BANANA, Choice(("0", "1", "2"))), JudgeRequest(POEM, Choice(("yes", "no"))),
            JudgeRequest(BANANA, Choice(("yes", "no")))]
    first = smollm.generate(reqs)
    second = smollm.generate(list(reversed(reqs)))[::-1]
    assert [o.text for o in first] == [o.text for o in second]
    assert first[1].text in ("yes", "no") and first[0].text in ("0", "1", "2")


def test_input_longer_than_the_context_is_an_error_output_not_a_crash(tmp_path):
    from offline_eval.engines.llamacpp import LlamaCppEngine
    from offline_eval.models import Registry

    path = Registry.load().get("smollm2-135m-instruct").weights_path()
    engine = LlamaCppEngine(path, n_ctx=256)
    try:
        long_text = "The sea is wide and deep. " * 200
        (out,) = engine.generate([JudgeRequest((("user", long_text),), Choice(("yes", "no")))])
        assert out.value is None and out.finish_reason == "error"
        assert "context" in out.meta["error"].lower()
    finally:
        engine.close()
