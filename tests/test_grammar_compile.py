"""What each judge constraint costs vLLM's structured-outputs backend (xgrammar) to compile, for the default judge's
real vocabulary (Qwen2.5, 151,936 tokens, read from the shipped GGUF: scripts/bench_grammar_compile.py).

vLLM holds every request whose grammar is not compiled yet (waiting reason "deferred"); a grammar that took
minutes would stall a run again (issue 17), and one that grew slowly would only show on large vocabularies, never
with the SmolLM2 fixture. So each constraint the metrics use must compile, cold and as the vLLM engines send it,
within COMPILE_LIMIT_S seconds (measured on 2 shared CPU cores: ~0.01 s per choice, 6-12 s per JSON constraint).
Needs xgrammar (it comes with vLLM; skipped without it unless OFFLINE_EVAL_REQUIRE_VLLM=1) and the default judge's
model packages (requirements-models.txt). About 30-60 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from offline_eval.constraints import Choice, JsonSchema, array, obj, string
from offline_eval.metrics import judge_constraints
from vllm_support import need

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_grammar_compile", REPO / "scripts" / "bench_grammar_compile.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

COMPILE_LIMIT_S = float(os.environ.get("OFFLINE_EVAL_COMPILE_LIMIT_S", 30))


@pytest.fixture(scope="module")
def qwen_vocab():
    need("xgrammar")
    from offline_eval.models import ModelError, Registry

    registry = Registry.load()
    try:
        path = registry.get(None).weights_path()
    except ModelError as exc:
        pytest.skip(f"the default judge's weights are not installed: {exc}")
    vocab = bench.gguf_vocab(path)
    assert len(vocab["tokens"]) > 150_000, "the default judge is no longer a large-vocabulary model: pick one"
    return bench.tokenizer_info(vocab)


def test_the_gguf_header_gives_the_vocabulary_the_tokenizer_has():
    """The header reader against the gguf package's own reader, on the small fixture."""
    gguf = pytest.importorskip("gguf")
    from offline_eval.models import Registry

    path = Registry.load().get("smollm2-135m-instruct").weights_path()
    ours = bench.gguf_vocab(path)
    fields = gguf.GGUFReader(path).fields
    tokens = fields["tokenizer.ggml.tokens"]
    assert ours["tokens"] == [bytes(tokens.parts[i]).decode() for i in tokens.data]
    eos = fields["tokenizer.ggml.eos_token_id"]
    assert ours["eos"] == int(eos.parts[eos.data[0]][0]) and ours["model"] == "gpt2"


@pytest.mark.parametrize("constraint", judge_constraints(), ids=bench.label)
def test_every_judge_constraint_compiles_fast_for_a_large_vocabulary(qwen_vocab, constraint):
    seconds = bench.compile_seconds(qwen_vocab, constraint)
    print(f"{bench.label(constraint)}: {seconds:.2f} s")
    assert seconds < COMPILE_LIMIT_S, (
        f"{bench.label(constraint)} takes {seconds:.1f} s to compile for Qwen's vocabulary: vLLM holds every request "
        f"that uses it until then. Bound the schema more cheaply (see scripts/bench_grammar_compile.py)")


def test_the_limit_would_catch_a_costly_constraint(qwen_vocab):
    """The measurement is not vacuous: one plain choice is ~free, and a bounded string costs in proportion to its
    bound (up to xgrammar's unrolling threshold), which is what the limit above watches."""
    cheap = bench.compile_seconds(qwen_vocab, Choice(("yes", "no")))
    short = bench.compile_seconds(qwen_vocab, JsonSchema.of(obj(s=array(string(8, min_length=1), 2))))
    longer = bench.compile_seconds(qwen_vocab, JsonSchema.of(obj(s=array(string(64, min_length=1), 2))))
    assert cheap < 1.0 and short < longer, (cheap, short, longer)
