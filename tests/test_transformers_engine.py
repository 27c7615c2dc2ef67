"""The transformers engine (in process, constrained by outlines) on the converted SmolLM2 folder, on CPU.

The engine is built through models.yaml (`smollm2-135m-instruct-hf` run with engine transformers; ~15 s to load
on 2 cores). SmolLM2 answers "1" to everything: these tests check plumbing, not judging. The unconstrained
runs show the model answering outside each constraint, so the constrained tests would fail if the engine
dropped it. Skips without outlines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from offline_eval.constraints import Choice, ConstraintViolation, JsonSchema, array, obj, string
from offline_eval.engines.base import JudgeRequest
from vllm_support import BANANA, HF_ENTRY, POEM, REPO, SAMPLES, smollm_hf_dir

pytest.importorskip("outlines")
pytest.importorskip("transformers")

RATING = Choice(("0", "1", "2"))
YES_NO = Choice(("yes", "no"))
LINES = JsonSchema.of(obj(lines=array(string(40, min_length=1), 3, min_items=3)))
SHORT = JsonSchema.of(obj(word=string(12, min_length=1), ok={"type": "boolean"}))
THREADS = "1"  # on 2 shared cores torch's default of 2 threads ran 4x slower than 1


@pytest.fixture(scope="module")
def engine():
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    smollm_hf_dir()  # converts once if needed
    engine = load_engine(Registry.load().get(HF_ENTRY), engine="transformers", device="cpu", batch_size=4,
                         threads=int(THREADS))
    yield engine
    engine.close()


def free_text(engine, request: JudgeRequest, max_new_tokens: int) -> str:
    """The model's greedy answer to `request` with no constraint at all."""
    import torch

    ids = torch.tensor([engine.prompt_ids(request)])
    with torch.inference_mode():
        out = engine._model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                     do_sample=False, pad_token_id=engine._pad)
    return engine._tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_every_constraint_kind_in_one_batch(engine):
    reqs = [JudgeRequest(BANANA, RATING), JudgeRequest(POEM, RATING), JudgeRequest(BANANA, YES_NO),
            JudgeRequest(POEM, LINES)]
    done = []
    outs = engine.generate(reqs, done.append)
    assert sum(done) == len(reqs)
    rating, rating2, yes_no, lines = outs
    for out, choice in ((rating, RATING), (rating2, RATING), (yes_no, YES_NO)):
        assert out.text in choice.options and out.value == out.text and out.finish_reason == "stop"
        assert set(out.probabilities) == set(choice.options)  # every allowed option, renormalised over them
        assert sum(out.probabilities.values()) == pytest.approx(1.0)
        assert all(0 <= p <= 1 for p in out.probabilities.values())
        assert max(out.probabilities, key=out.probabilities.get) == out.value  # greedy under the mask
    assert lines.probabilities is None  # JSON has no option distribution
    value = json.loads(lines.text)
    assert value == lines.value and len(value["lines"]) == 3 and all(1 <= len(s) <= 40 for s in value["lines"])
    assert lines.text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # no whitespace

    # token counts: the chat-templated prompt, and the generated tokens (end of sequence included)
    assert [o.prompt_tokens for o in outs] == engine.count_prompt_tokens(reqs)
    assert all(o.prompt_tokens > 10 and 1 <= o.completion_tokens <= r.max_tokens for o, r in zip(outs, reqs))
    assert rating.completion_tokens == 2  # "1" and the end of sequence
    assert lines.completion_tokens >= len(engine._tokenizer.encode(lines.text, add_special_tokens=False))


def test_constraints_bite(engine):
    """Unconstrained, SmolLM2 answers outside every constraint; constrained, never."""
    banana = free_text(engine, JudgeRequest(BANANA, RATING), 20)
    assert banana.strip() not in RATING.options and banana.strip() not in YES_NO.options
    with pytest.raises(ConstraintViolation):
        RATING.parse(banana)
    poem = free_text(engine, JudgeRequest(POEM, LINES), 40)  # a poem, not JSON (not all of it: time)
    with pytest.raises(ConstraintViolation):
        LINES.parse(poem)
    # the same prompts through the engine
    rating, yes_no, lines = engine.generate([JudgeRequest(BANANA, RATING), JudgeRequest(BANANA, YES_NO),
                                             JudgeRequest(POEM, LINES)])
    assert rating.value in RATING.options and yes_no.value in YES_NO.options and lines.value is not None


def test_claims_schema(engine):
    """The bounded claims JSON the faithfulness metric asks for (maxItems, maxLength)."""
    from offline_eval.metrics.claims import CLAIMS

    (out,) = engine.generate([JudgeRequest(POEM, CLAIMS)])
    assert out.value == CLAIMS.parse(out.text) and out.completion_tokens <= CLAIMS.max_tokens()


def test_batch_gives_the_same_outputs_as_one_by_one(engine):
    reqs = [JudgeRequest(BANANA, RATING), JudgeRequest(POEM, RATING), JudgeRequest(POEM, YES_NO),
            JudgeRequest(BANANA, YES_NO), JudgeRequest((("user", "Is the sky green? Answer yes or no."),), YES_NO),
            JudgeRequest(POEM, SHORT), JudgeRequest(BANANA, SHORT)]
    together = engine.generate(reqs)  # left padded, several rows per generate call
    alone = [engine.generate([r])[0] for r in reqs]
    assert [o.text for o in together] == [o.text for o in alone]
    assert [o.completion_tokens for o in together] == [o.completion_tokens for o in alone]
    for a, b in zip(together, alone):  # padding changes the float sums a little, not the answer
        assert (a.probabilities is None) == (b.probabilities is None)
        if a.probabilities:
            assert a.probabilities == pytest.approx(b.probabilities, abs=1e-3)


def test_too_long_prompt_is_an_error_output(engine):
    long_text = "The sea is wide and deep. " * 1500  # ~10k tokens > max_model_len 8192
    too_long, ok = engine.generate([JudgeRequest((("user", long_text),), RATING), JudgeRequest(BANANA, RATING)])
    assert too_long.value is None and too_long.finish_reason == "error" and "too long" in too_long.meta["error"]
    assert ok.value in RATING.options


def test_identity_and_device(engine):
    assert engine.identity == {"engine": "transformers", "model": HF_ENTRY, "weights": str(smollm_hf_dir()),
                               "max_model_len": 8192, "dtype": "float32"}
    assert engine.device == "cpu" and engine._model.device.type == "cpu"
    assert engine.context_size == 8192


def test_a_gguf_model_cannot_run_on_transformers():
    from offline_eval.engines.base import EngineError
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    with pytest.raises(EngineError, match="GGUF"):
        load_engine(Registry.load().get("smollm2-135m-instruct"), engine="transformers")


def test_run_faithfulness_end_to_end(tmp_path):
    """`offline-eval run --engine transformers` as a user runs it, on a tiny data file."""
    smollm_hf_dir()
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES), encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "offline_eval.cli", "run", "data.jsonl", "--model", HF_ENTRY,
                          "--engine", "transformers", "--metrics", "faithfulness", "-o", "out.jsonl"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OFFLINE_EVAL_THREADS": THREADS})
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(SAMPLES)
    for record in records:
        result = record["metrics"]["faithfulness"]
        assert result["value"] is None or 0 <= result["value"] <= 1
    assert "transformers" in run.stdout


def test_the_models_yaml_entry_and_its_transformers_block():
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    smollm_hf_dir()
    spec = Registry.load().get("smollm2-135m-transformers")
    assert spec.engine == "transformers" and spec.settings["transformers"]["device"] == "auto"
    engine = load_engine(spec, threads=int(THREADS))
    try:
        assert engine.identity["engine"] == "transformers" and engine.identity["model"] == spec.name
        assert engine.max_batch == 8 and engine.max_model_len == 8192
        from offline_eval.engines.transformers_engine import DEFAULT_DTYPES, pick_device

        assert engine.device == pick_device() and engine.dtype == DEFAULT_DTYPES[engine.device]  # both auto
        (out,) = engine.generate([JudgeRequest(BANANA, RATING)])
        assert out.value in RATING.options
    finally:
        engine.close()
