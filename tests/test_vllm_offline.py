"""The in-process vLLM engine (vllm.LLM) on the converted SmolLM2 folder. Skips without vllm.

The engine is built through models.yaml (`smollm2-135m-instruct-hf` with engine vllm-offline), loads in ~30 s, and the
whole batch goes to vLLM as one llm.chat call. The unconstrained run shows the model answering outside the
allowed set, so the choice test would fail if the engine dropped the constraint.
"""

from __future__ import annotations

import json

import pytest

from offline_eval.constraints import Choice, JsonSchema, array, obj, string
from offline_eval.engines.base import JudgeRequest
from vllm_support import BANANA, HF_ENTRY, POEM, need, smollm_hf_dir

need("vllm")

RATING = Choice(("0", "1", "2"))
LINES = JsonSchema.of(obj(lines=array(string(40, min_length=1), 3, min_items=3)))


@pytest.fixture(scope="module")
def offline():
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    smollm_hf_dir()  # converts once if needed
    engine = load_engine(Registry.load().get(HF_ENTRY), engine="vllm-offline")
    yield engine
    engine.close()


def test_choice_and_json_in_one_batch(offline):
    from vllm.sampling_params import SamplingParams

    free = offline._llm.chat(JudgeRequest(BANANA, RATING).chat(), SamplingParams(temperature=0, max_tokens=40),
                             use_tqdm=False)
    assert free[0].outputs[0].text.strip() not in RATING.options  # unconstrained, the model says more

    long_text = "The sea is wide and deep. " * 1500  # ~10k tokens > max_model_len 8192
    reqs = [JudgeRequest(BANANA, RATING), JudgeRequest(POEM, LINES), JudgeRequest(POEM, Choice(("yes", "no"))),
            JudgeRequest((("user", long_text),), RATING)]
    done = []
    rating, lines, yes_no, too_long = offline.generate(reqs, done.append)
    assert sum(done) == len(reqs)

    assert rating.text in RATING.options and rating.value == rating.text and rating.finish_reason == "stop"
    assert rating.prompt_tokens > 10 and rating.completion_tokens >= 1
    assert yes_no.value in ("yes", "no")
    for out, choice in ((rating, RATING), (yes_no, Choice(("yes", "no")))):  # the options' probabilities
        assert set(out.probabilities) == set(choice.options)
        assert sum(out.probabilities.values()) == pytest.approx(1.0)
        assert max(out.probabilities, key=out.probabilities.get) == out.value
    assert lines.probabilities is None  # JSON has no option distribution

    value = json.loads(lines.text)
    assert value == lines.value and len(value["lines"]) == 3
    assert all(1 <= len(line) <= 40 for line in value["lines"])
    assert lines.text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert lines.completion_tokens <= LINES.max_tokens()

    assert too_long.value is None and too_long.finish_reason == "error"
    assert "too long" in too_long.meta["error"]


def test_identity(offline):
    assert offline.identity["engine"] == "vllm-offline"
    assert offline.identity["model"] == HF_ENTRY
    assert offline.identity["weights"] == str(smollm_hf_dir())
