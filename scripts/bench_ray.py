"""1 vs N judge replicas on Ray, side by side in one run (offline_eval/scale/ray_run.py).

    python scripts/bench_ray.py [--model smollm2-135m-instruct-hf] [--rows 48] [--replicas 1,2] [--block-rows 8]
                                [--metrics answer_accuracy,response_groundedness] [--local] [--address ADDR]

Each configuration scores the same synthetic rows (distinct, so nothing is deduplicated) with no judge cache
and a fresh output, on one Ray instance (local on 127.0.0.1 unless --address). It prints the wall time, the
rows/s, and the split between loading the replicas and scoring (scoring: from the first block's start to the
last block's end). --local adds the same rows on one in-process engine without Ray, for Ray's overhead.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

FACTS = [("Where is the Eiffel Tower?", "It is in Paris.", "The Eiffel Tower is in Paris, France."),
         ("Who wrote Hamlet?", "Charles Dickens wrote it.", "Hamlet was written by William Shakespeare."),
         ("When did Apollo 11 land?", "In July 1969.", "Apollo 11 landed on the Moon on 20 July 1969."),
         ("What is the boiling point of water?", "50 degrees Celsius.", "Water boils at 100 degrees Celsius."),
         ("What is the capital of Japan?", "Tokyo.", "Tokyo is the capital of Japan."),
         ("Who painted the Mona Lisa?", "Leonardo da Vinci.", "Leonardo da Vinci painted the Mona Lisa.")]


def rows(n: int) -> list[dict]:
    return [{"user_input": q, "response": f"{a} (answer {i})", "reference": r, "retrieved_contexts": [r]}
            for i in range(n) for q, a, r in [FACTS[i % len(FACTS)]]]


def on_ray(args, data, replicas: int) -> dict:
    from offline_eval.scale.ray_run import evaluate_on_ray

    ends: list[tuple[float, float]] = []  # (finished at, seconds scoring) per block
    tic = time.perf_counter()
    evaluate_on_ray(data, args.metrics.split(","), args.model, replicas, output=Path(tempfile.mkdtemp()) / "r.jsonl",
                    block_rows=args.block_rows, address=args.address, cache=False, full_results=False,
                    on_block=lambda b: ends.append((time.perf_counter(), b["seconds"])))
    wall = time.perf_counter() - tic
    scoring = max(t for t, _ in ends) - min(t - s for t, s in ends)
    return {"setup": f"Ray, {replicas} replica(s)", "wall": wall, "load": wall - scoring, "scoring": scoring}


def local(args, data) -> dict:
    from offline_eval import evaluate
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    tic = time.perf_counter()
    spec = Registry.load().get(args.model)
    engine = load_engine(spec, engine="vllm-offline" if spec.engine.startswith("vllm") else None)
    loaded = time.perf_counter()
    try:
        evaluate(data, metrics=args.metrics.split(","), llm=engine, show_progress=False)
    finally:
        engine.close()
    end = time.perf_counter()
    return {"setup": "local, no Ray", "wall": end - tic, "load": loaded - tic, "scoring": end - loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct-hf")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--block-rows", type=int, default=8)
    parser.add_argument("--metrics", default="answer_accuracy,response_groundedness")
    parser.add_argument("--address", default=None)
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()
    from offline_eval.scale.ray_run import ray_connection

    data = rows(args.rows)
    results = [local(args, data)] if args.local else []
    with ray_connection(args.address):  # one Ray instance for every configuration
        results += [on_ray(args, data, int(n)) for n in args.replicas.split(",")]
    print(f"\n{args.rows} rows x {args.metrics} with {args.model}, blocks of {args.block_rows} rows")
    print(f"{'setup':<22}{'wall s':>9}{'rows/s':>9}{'load s':>9}{'scoring s':>11}{'rows/s scoring':>16}")
    for r in results:
        print(f"{r['setup']:<22}{r['wall']:>9.1f}{args.rows / r['wall']:>9.2f}{r['load']:>9.1f}{r['scoring']:>11.1f}"
              f"{args.rows / r['scoring']:>16.2f}")


if __name__ == "__main__":
    main()
