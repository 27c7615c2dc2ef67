#!/usr/bin/env python
"""Prompt tokens computed and wall time per sample: this checkout's prompt layout against an earlier commit's,
side by side in one run, on long-context rows, all eight default metrics, the default judge on llama.cpp.

    python scripts/bench_prefix_reuse.py [--baseline 9c5c0a0] [-n 4] [--threads 1] [--model NAME]

The baseline is checked out into a temporary git worktree. Each side runs in its own process, both at once
with the same thread count, so they share the machine's load (a noisy, shared machine slows both alike) and
the wall-time ratio is fair. Neither side uses the judge cache.

Tokens computed are llama.cpp's own counters (llama_perf_context: prompt tokens evaluated in batches, plus
single-token evaluations, less the tokens sampled), read from the engine after the run, so both layouts are
counted the same way whatever their code reports.

Rows: built from WiCE dev (../shared/benchmarks/wice): each row's response and reference are a Wikipedia
claim, its contexts the first 4 passages of 100-200 words of the web article the claim cites (realistic RAG
passages: 3-5 of 100-200 words), and its question asks what the sources say about the claim's subject.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WICE = REPO.parent / "shared" / "benchmarks" / "wice" / "wice_dev_en.jsonl"
METRICS = ["answer_accuracy", "context_relevance", "response_groundedness", "faithfulness", "answer_relevancy",
           "context_precision", "context_recall", "answer_correctness"]


def passages(text: str, low: int = 100, high: int = 200) -> list[str]:
    """`text` cut at line ends into passages of `low` to `high` words (shorter lines are joined)."""
    out, words = [], []
    for line in text.splitlines():
        line_words = line.split()
        if words and len(words) + len(line_words) > high:
            if len(words) >= low:
                out.append(" ".join(words))
            words = []
        words += line_words[:high]
    if len(words) >= low:
        out.append(" ".join(words))
    return out


def long_rows(n: int, per_row: int = 4) -> list[dict]:
    rows = []
    for line in WICE.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        found = [p for article in row["retrieved_contexts"] for p in passages(article)]
        if len(found) < per_row:
            continue
        subject = " ".join(re.sub(r"[^\w\s'-]", "", row["response"]).split()[:6])
        rows.append({"user_input": f"What do the sources say about {subject}?", "response": row["response"],
                     "reference": row["response"], "retrieved_contexts": found[:per_row]})
        if len(rows) == n:
            break
    return rows


def worker(rows_path: str, model: str | None) -> None:
    """One side: score the rows with this interpreter's offline_eval (PYTHONPATH), print a JSON line."""
    import llama_cpp

    from offline_eval import evaluate, llm_factory

    rows = [json.loads(x) for x in Path(rows_path).read_text(encoding="utf-8").splitlines()]
    judge = llm_factory(model)
    ctx = judge._llm._ctx.ctx
    before = llama_cpp.llama_perf_context(ctx)
    p0, e0 = before.n_p_eval, before.n_eval
    started = time.perf_counter()
    # whole contexts on both sides (the focus of long contexts came later): this measures the layout alone
    result = evaluate(rows, metrics=METRICS, llm=judge, cache=False, show_progress=False, long_inputs="truncate")
    seconds = time.perf_counter() - started
    after = llama_cpp.llama_perf_context(ctx)
    st = result.stats
    print(json.dumps({
        "seconds": seconds, "judge_calls": st.judge_calls, "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        # every evaluated token is a prompt token or the input of a decode step (one per sampled token but
        # the last): what remains after those is the prompt tokens computed
        "computed": (after.n_p_eval - p0) + (after.n_eval - e0) - (st.completion_tokens - st.judge_calls),
        "reported": st.prompt_tokens - getattr(st, "reused_prompt_tokens", 0),  # what the engine said it computed
        "means": {m: s["mean"] for m, s in result.summary().items()},
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="9c5c0a0", help="the commit whose layout to compare against")
    parser.add_argument("-n", type=int, default=4, help="long-context rows")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads for each side")
    parser.add_argument("--model", default=None, help="judge from models.yaml (default: the default judge)")
    parser.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.model)

    rows = long_rows(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.jsonl"
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base), args.baseline],
                       check=True)
        try:
            sides = {"baseline " + args.baseline: base, "this checkout": REPO}
            procs = {}
            for name, root in sides.items():
                env = {**os.environ, "PYTHONPATH": str(root), "OFFLINE_EVAL_THREADS": str(args.threads)}
                cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(data)]
                cmd += ["--model", args.model] if args.model else []
                procs[name] = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, text=True)
            got = {}
            for name, proc in procs.items():
                out, _ = proc.communicate()
                if proc.returncode:
                    raise SystemExit(f"{name} failed (exit {proc.returncode})")
                got[name] = json.loads(out.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)

    words = sum(len(c.split()) for r in rows for c in r["retrieved_contexts"]) / len(rows)
    print(f"{len(rows)} long-context rows ({words:.0f} context words per row), {len(METRICS)} metrics, "
          f"llama.cpp, {args.threads} thread(s) per side, both sides at once\n")
    print("| layout | judge calls | prompt tokens sent / sample | computed / sample | wall s / sample |")
    print("|---|---|---|---|---|")
    for name, g in got.items():
        n = len(rows)
        print(f"| {name} | {g['judge_calls']} | {g['prompt_tokens'] / n:.0f} | {g['computed'] / n:.0f} | "
              f"{g['seconds'] / n:.1f} |")
    old, new = got.values()
    print(f"\nratio, this checkout / baseline: computed tokens {new['computed'] / old['computed']:.2f}, "
          f"wall time {new['seconds'] / old['seconds']:.2f}")
    print("means: " + "; ".join(f"{m} {old['means'][m]:.3f} -> {new['means'][m]:.3f}" for m in METRICS))


if __name__ == "__main__":
    main()
