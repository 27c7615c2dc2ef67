"""Constrained decoding on llama.cpp: native GBNF grammars (what the engine uses) vs outlines.

For each model, one llama_cpp.Llama (n_ctx 4096, greedy) runs the same judge requests with both backends:

  rating   Choice("0","1","2")  5 Context Relevance prompts (judge 1), 4 English + 1 Chinese
  yes/no   Choice("yes","no")   5 claim-verification prompts, 4 English + 1 Chinese
  claims   JsonSchema CLAIMS    3 claim-extraction prompts (offline_eval/metrics/claims.py), 2 English + 1 Chinese

  gbnf      LlamaGrammar.from_string(constraint.gbnf()) passed as `grammar=` (as offline_eval/engines/llamacpp.py)
  outlines  outlines.from_llamacpp(llm) + outlines.Generator(model, output_type), where output_type is
            typing.Literal[options] for a Choice and outlines.types.JsonSchema(CLAIMS.schema, whitespace_pattern="")
            for JSON (no optional whitespace, i.e. the same language as our GBNF). Default backend: outlines_core.

Both backends call Llama.create_chat_completion with the same messages (outlines' LlamaCpp model does that for
a Chat input), so the chat template and the prompt tokens are identical; max_tokens is the constraint's worst case.
outlines' LlamaCpp.generate() calls llm.reset() after every call, which throws away llama.cpp's prompt (KV)
cache, so every call here starts from llm.reset() for both backends: latencies are cold-prompt latencies.

Columns: setup s = GBNF parse (from_string), or outlines Generator construction (vocabulary + regex + index
compile); the one-off outlines costs (from_llamacpp vocabulary scan, numba JIT of the mask kernel) are in the
"(once)" row. mean call s = mean wall time of one generate call; valid = constraint.parse accepted the text;
masked = calls in which outlines' logits processor actually ran (the mask was applied). The "(once)" row
also counts the token ids outlines' llama.cpp vocabulary loses (byte-fallback / partial UTF-8 pieces).

The numba pitfall: outlines' numpy mask kernels (outlines_core.kernels.numpy) need numba. The import happens
inside the logits processor, which llama-cpp-python runs as a ctypes callback; a ctypes callback cannot raise,
so the ImportError is only printed to stderr and decoding continues *unconstrained*. The probe at the end
re-runs the rating prompts in a subprocess where `import numba` fails (sys.modules["numba"] = None; nothing is
uninstalled) to show it.

  python scripts/bench_constraints.py --threads 1   (OFFLINE_EVAL_CACHE_DIR=DIR: where the weights are assembled)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from offline_eval.constraints import ConstraintViolation, JsonSchema  # noqa: E402
from offline_eval.dataset import SingleTurnSample  # noqa: E402
from offline_eval.metrics.claims import CLAIMS, check_claim, extract_claims  # noqa: E402
from offline_eval.metrics.context_relevance import RATING, ContextRelevance  # noqa: E402
from offline_eval.metrics.base import YES_NO  # noqa: E402
from offline_eval.models import Registry  # noqa: E402

DEFAULT_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct"]

# ---- workloads: real judge requests built by the metrics ------------------------------------------------

RELEVANCE = [  # (question, context, lang)
    ("When was the Eiffel Tower completed?", "The Eiffel Tower was completed in March 1889 for the World's Fair.", "en"),
    ("What is the capital of Australia?", "Sydney is the largest city in Australia and home to the Opera House.", "en"),
    ("How many moons does Mars have?", "Bananas are rich in potassium and are a popular breakfast fruit.", "en"),
    ("Who wrote Pride and Prejudice?", "Pride and Prejudice is an 1813 novel by Jane Austen.", "en"),
    ("长城有多长？", "长城是中国古代的军事防御工程，总长度超过两万公里。", "zh"),
]
VERIFY = [  # (claim, source, lang)
    ("The Eiffel Tower was completed in 1889.", "The Eiffel Tower was completed in March 1889 for the World's Fair.", "en"),
    ("Canberra is the largest city in Australia.", "Sydney is the largest city in Australia.", "en"),
    ("Water boils at 100 degrees Celsius at sea level.", "At sea level, water boils at 100 °C.", "en"),
    ("Jane Austen wrote Emma in 1850.", "Emma is a novel by Jane Austen, first published in 1815.", "en"),
    ("北京是中国的首都。", "北京是中华人民共和国的首都，也是全国的政治和文化中心。", "zh"),
]
EXTRACT = [  # (text, lang)
    ("Marie Curie was a physicist and chemist. She won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.",
     "en"),
    ("Python was created by Guido van Rossum and first released in 1991. It emphasises readable code.", "en"),
    ("上海位于长江入海口，是中国最大的城市之一，常住人口约2500万。", "zh"),
]


def workloads() -> list[tuple[str, typing.Any, list[list[dict[str, str]]]]]:
    """(label, constraint, list of chat message lists)."""
    rating = []
    for question, context, lang in RELEVANCE:
        plan = ContextRelevance().plan(SingleTurnSample(user_input=question, retrieved_contexts=[context]), lang)
        rating.append(next(plan)[0].chat())  # judge 1 of the dual judge
    yes_no = [check_claim(claim, [source], lang).chat() for claim, source, lang in VERIFY]
    claims = [extract_claims(text, lang).chat() for text, lang in EXTRACT]
    return [("rating 0/1/2", RATING, rating), ("yes/no", YES_NO, yes_no), ("claims json", CLAIMS, claims)]


# ---- helpers ------------------------------------------------------------------------------------------------

def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def is_valid(constraint, text: str) -> bool:
    try:
        constraint.parse(text)
        return True
    except ConstraintViolation:
        return False


def load_llama(name: str, threads: int):
    from llama_cpp import Llama

    path = Registry.load().get(name).weights_path()
    return Llama(model_path=str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, seed=0,
                 verbose=False)


def outlines_type(constraint):
    import outlines

    if isinstance(constraint, JsonSchema):
        return outlines.types.JsonSchema(constraint.schema, whitespace_pattern="")
    return typing.Literal[constraint.options]  # Literal[("0", "1", "2")] == Literal["0", "1", "2"]


def numba_jit_warmup() -> float:
    """Compile outlines_core's numba mask kernel (done lazily on the first masked token otherwise)."""
    import numpy as np
    from outlines_core.kernels.numpy import allocate_token_bitmask, apply_token_bitmask_inplace

    _, seconds = timed(apply_token_bitmask_inplace, np.zeros((1, 64), np.float32), allocate_token_bitmask(64))
    return seconds


# ---- the benchmark ----------------------------------------------------------------------------------------

def bench_model(name: str, threads: int, show: bool) -> list[dict]:
    import outlines
    from llama_cpp import LlamaGrammar

    rows: list[dict] = []
    llm, load_s = timed(load_llama, name, threads)
    print(f"[{name}] loaded in {load_s:.1f}s", file=sys.stderr)

    def generate(messages, max_tokens, **kw) -> str:
        llm.reset()  # cold prompt for both backends (outlines resets after each call anyway)
        out = llm.create_chat_completion(messages=messages, temperature=0.0, seed=0, max_tokens=max_tokens, **kw)
        return out["choices"][0]["message"]["content"] or ""

    def run(backend, label, constraint, setup_s, prompts, call, processor=None):
        times, valid, masked = [], 0, 0
        for messages in prompts:
            if processor is not None:
                processor.reset()
            text, seconds = timed(call, messages)
            times.append(seconds)
            valid += is_valid(constraint, text)
            masked += processor is not None and not processor.is_first_token  # its _setup ran: mask applied
            if show:
                print(f"  {backend:8} {label:12} {seconds:6.2f}s {text!r}", file=sys.stderr)
        rows.append(dict(model=name, backend=backend, constraint=label, setup=setup_s,
                         mean=statistics.mean(times), valid=f"{valid}/{len(prompts)}",
                         masked=f"{masked}/{len(prompts)}" if processor is not None else "-"))
        print(f"[{name}] {backend} {label}: setup {setup_s:.3f}s, mean call {statistics.mean(times):.2f}s, "
              f"valid {valid}/{len(prompts)}", file=sys.stderr)

    jobs = workloads()

    # GBNF: what offline_eval.engines.llamacpp does.
    for label, constraint, prompts in jobs:
        grammar, setup_s = timed(LlamaGrammar.from_string, constraint.gbnf(), verbose=False)
        run("gbnf", label, constraint, setup_s, prompts,
            lambda m: generate(m, constraint.max_tokens(), grammar=grammar))

    # outlines: one wrapper per model, one Generator (compiled index) per output type.
    model, wrap_s = timed(outlines.from_llamacpp, llm)
    jit_s = numba_jit_warmup()
    # outlines keys its llama.cpp vocabulary by decoded piece (errors="replace"): byte-fallback and partial
    # UTF-8 tokens collapse or vanish, so text that needs them (e.g. rarer CJK characters) cannot be produced.
    dropped = llm.n_vocab() - len(set(model.tokenizer.vocabulary.values()))
    rows.append(dict(model=name, backend="outlines", constraint="(once)", setup=wrap_s + jit_s, mean=None,
                     valid="-", masked="-", note=f"from_llamacpp {wrap_s:.1f}s + numba JIT {jit_s:.1f}s; "
                     f"{dropped} of {llm.n_vocab()} token ids missing from outlines' vocabulary"))
    for label, constraint, prompts in jobs:
        generator, setup_s = timed(outlines.Generator, model, outlines_type(constraint))
        processor = generator.logits_processor

        def call(messages, generator=generator, constraint=constraint):
            llm.reset()
            return generator(outlines.inputs.Chat(messages), max_tokens=constraint.max_tokens(),
                             temperature=0.0, seed=0)

        run("outlines", label, constraint, setup_s, prompts, call, processor)

    llm.close()
    return rows


def probe_without_numba(name: str, threads: int) -> None:
    """Subprocess body: make `import numba` fail, run outlines on the rating prompts, print a JSON summary."""
    sys.modules["numba"] = None  # type: ignore[assignment]  # import numba -> ImportError; nothing uninstalled
    import outlines

    llm = load_llama(name, threads)
    label, constraint, prompts = workloads()[0]
    generator = outlines.Generator(outlines.from_llamacpp(llm), outlines_type(constraint))
    texts, masked = [], 0
    for messages in prompts:
        generator.logits_processor.reset()
        texts.append(generator(outlines.inputs.Chat(messages), max_tokens=32, temperature=0.0, seed=0))
        masked += not generator.logits_processor.is_first_token
    valid = sum(is_valid(constraint, t) for t in texts)
    print(json.dumps({"model": name, "constraint": label, "valid": valid, "masked": masked, "total": len(texts),
                      "outputs": texts}, ensure_ascii=False))
    llm.close()


def run_probe(name: str, threads: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--probe-no-numba", name, "--threads", str(threads)],
                          capture_output=True, text=True, timeout=600)
    result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"error": proc.stderr[-2000:]}
    result["callback_errors"] = proc.stderr.count("Exception ignored on calling ctypes callback function")
    result["import_error_seen"] = "numba" in proc.stderr and "ImportError" in proc.stderr
    return result


def print_table(rows: list[dict]) -> None:
    head = f"{'model':28} {'backend':8} {'constraint':12} {'setup s':>8} {'mean call s':>11} {'valid':>6} {'masked':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        mean = "-" if r["mean"] is None else f"{r['mean']:.2f}"
        line = (f"{r['model']:28} {r['backend']:8} {r['constraint']:12} {r['setup']:8.4f} {mean:>11} "
                f"{r['valid']:>6} {r['masked']:>6}")
        print(line + (f"   {r['note']}" if r.get("note") else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="a judge name from models.yaml (repeatable); "
                        f"default: {' and '.join(DEFAULT_MODELS)}")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--show", action="store_true", help="print every output")
    parser.add_argument("--skip-probe", action="store_true", help="skip the no-numba probe")
    parser.add_argument("--probe-no-numba", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.probe_no_numba:
        probe_without_numba(args.probe_no_numba, args.threads)
        return

    models = args.model or DEFAULT_MODELS
    import llama_cpp
    import outlines  # noqa: F401
    try:
        import numba
        numba_state = f"numba {numba.__version__} importable"
    except ImportError:
        numba_state = "numba NOT importable: outlines will run UNCONSTRAINED on llama.cpp"
    from importlib.metadata import version
    print(f"llama-cpp-python {llama_cpp.__version__}, outlines {version('outlines')}, "
          f"outlines-core {version('outlines_core')}, {numba_state}; threads {args.threads}")

    start = time.perf_counter()
    rows = [row for name in models for row in bench_model(name, args.threads, args.show)]
    print()
    print_table(rows)

    if not args.skip_probe and importlib.util.find_spec("numba") is not None:
        probe = run_probe(models[0], args.threads)
        print(f"\nno-numba probe ({models[0]}, rating, outlines; `import numba` made to fail): "
              + (f"valid {probe['valid']}/{probe['total']}, mask applied {probe['masked']}/{probe['total']}, "
                 f"ctypes callback errors swallowed: {probe['callback_errors']}, "
                 f"outputs {probe['outputs']}" if "valid" in probe else f"probe failed: {probe['error']}"))
    print(f"\ntotal wall time {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
