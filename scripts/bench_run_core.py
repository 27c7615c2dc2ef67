#!/usr/bin/env python
"""The run core at scale: `offline-eval run` end to end over generated data sets against a warm judge cache,
this checkout and (optionally) an earlier commit side by side in one run; prints a markdown table.

    python scripts/bench_run_core.py [--sizes 10000,100000] [--baseline COMMIT] [--model smollm2-135m-instruct]
                                     [--metrics faithfulness,response_groundedness] [--base 8] [--keep DIR]
                                     [--ray]

Rows (realistic field sizes): a question, 3-5 retrieved contexts of 100-200 words (passages of the web
articles WiCE dev cites, ../shared/benchmarks/wice), a ~60-word response (the WiCE claim and what follows
from its first passage) and a reference (the claim). `--base` distinct rows are judged for real by the
model; row k of a data set is base row k mod B with the case of its first letters swapped by the bits of k
(bytes, sentences and case-blind terms unchanged, so the focus of long contexts keeps the same passages), so
every row's requests are new and neither deduplication nor a cache lookup of a repeated text can flatter the
run. The cache is then filled with those real outputs copied to each copy's requests (the Copying judge, as
scripts/bench_vs_ragas.py does with marked rows), so the measured run sends nothing to the model: it measures
reading, validating,
planning, cache lookups, scheduling, scoring and writing. The smaller data sets are prefixes of the largest.

Per run: wall seconds from process start (model load and the validation pass included), rows/s, peak RSS
(the process's maximum resident set, from wait4), and the time until the first row is in the output
(this checkout: `<output>.partial`; a baseline that writes only at the end: its output file). Each size
runs this checkout and the baseline one after the other, so both see the same machine load.

`--ray` runs `offline-eval run --ray` instead (a local Ray instance, one replica, blocks of 256 rows, the
same warm cache) and reports the driver's own peak RSS (VmHWM of the CLI process, read every 0.1 s while it
runs): the replica's memory does not depend on the data's size (one block at a time).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench_prefix_reuse import passages  # noqa: E402  (scripts/ is on the path: this script's folder)
WICE = REPO.parent / "shared" / "benchmarks" / "wice" / "wice_dev_en.jsonl"


def base_rows(n: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    rows = []
    for line in WICE.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        found = [p for article in row["retrieved_contexts"] for p in passages(article)]
        if len(found) < 5:
            continue
        contexts = found[:rng.randint(3, 5)]
        claim = row["response"]
        response = " ".join((claim + " " + contexts[0]).split()[:60])
        subject = " ".join(re.sub(r"[^\w\s'-]", "", claim).split()[:6])
        rows.append({"user_input": f"What do the sources say about {subject}?", "response": response,
                     "reference": claim, "retrieved_contexts": contexts})
        if len(rows) == n:
            break
    return rows


def flipped(text: str, k: int) -> str:
    """`text` with the case of its i-th ASCII letter swapped where bit i of k is set: a text of its own for
    each k, with the same bytes, sentences and (case-blind) terms, so the focus of long contexts picks the
    same passages for every copy."""
    out, bit = [], 0
    for ch in text:
        if k >> bit == 0:
            break
        if ch.isascii() and ch.isalpha():
            ch = ch.swapcase() if k >> bit & 1 else ch
            bit += 1
        out.append(ch)
    return "".join(out) + text[len(out):]


def marked(row: dict[str, Any], k: int) -> dict[str, Any]:
    return {"id": f"row-{k}", **{key: [flipped(c, k) for c in v] if isinstance(v, list) else flipped(v, k)
                                 for key, v in row.items()}}


def case_blind(request: Any) -> str:
    return dataclasses.replace(request, messages=tuple((role, text.lower()) for role, text in request.messages)).key


class Recording:
    """The real judge, keeping every output by its request's case-blind key."""

    def __init__(self, engine: Any):
        self.engine, self.outputs = engine, {}

    def __getattr__(self, name: str) -> Any:  # identity, context_size, count_tokens: the real judge's
        return getattr(self.engine, name)

    def generate(self, requests, progress=None):
        outputs = self.engine.generate(requests)
        self.outputs.update((case_blind(r), o) for r, o in zip(requests, outputs))
        return outputs


class Copying(Recording):
    """The real judge, except that a copy's request is answered with the output its base row's request got
    (the same request but for case); one the base rows never asked (none expected) goes to the real judge."""

    def __init__(self, engine: Any, outputs: dict[str, Any]):
        super().__init__(engine)
        self.outputs, self.real_calls = outputs, 0

    def generate(self, requests, progress=None):
        missing = [r for r in requests if case_blind(r) not in self.outputs]
        self.real_calls += len(missing)
        real = iter(self.engine.generate(missing) if missing else [])
        return [dataclasses.replace(self.outputs[key], meta={}) if (key := case_blind(r)) in self.outputs
                else next(real) for r in requests]


def fill_cache(model: str, metrics: list[str], base: list[dict], rows: int, data: Path, cache_path: Path) -> None:
    from offline_eval import llm_factory
    from offline_eval.cache import JudgeCache
    from offline_eval.dataset import SingleTurnSample
    from offline_eval.metrics import metric_by_name
    from offline_eval.run.scheduler import stream_metrics

    engine = llm_factory(model)
    chosen = [metric_by_name(m) for m in metrics]
    with JudgeCache(cache_path) as cache:
        started = time.perf_counter()
        recording = Recording(engine)  # no cache here: a kept cache would answer, and nothing would be recorded
        stream_metrics(enumerate(SingleTurnSample(**r) for r in base), chosen, lambda i, res: None,
                       judge=recording)
        print(f"judged {len(base)} base rows for real in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        copying = Copying(engine, recording.outputs)
        started = time.perf_counter()
        samples = (SingleTurnSample(**{f: v for f, v in marked(base[k % len(base)], k).items() if f != "id"})
                   for k in range(rows))  # every row, row 0 (base row 0 itself) too, answered from the recording
        stream_metrics(enumerate(samples), chosen, lambda i, res: None, judge=copying, cache=cache)
        print(f"filled the cache for {rows} rows in {time.perf_counter() - started:.0f} s "
              f"({copying.real_calls} requests judged for real)", file=sys.stderr)
    with data.open("w", encoding="utf-8") as f:
        for k in range(rows):
            f.write(json.dumps(marked(base[k % len(base)], k), ensure_ascii=False) + "\n")


def first_row_watch(paths: list[Path], started: float, stop: threading.Event) -> list[float]:
    seen: list[float] = []

    def watch() -> None:
        while not stop.is_set():
            if any(p.exists() and p.stat().st_size > 0 for p in paths):
                seen.append(time.perf_counter() - started)
                return
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return seen


def driver_peak_watch(pid: int, stop: threading.Event) -> list[int]:
    """The process's own peak RSS in kB (VmHWM), as last read before it exited."""
    peak = [0]

    def watch() -> None:
        while not stop.is_set():
            try:
                with open(f"/proc/{pid}/status", encoding="ascii") as f:
                    peak[0] = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), peak[0])
            except OSError:
                return
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    return peak


def measure(root: Path, data: Path, rows: int, model: str, metrics: list[str], cache: Path, out: Path,
            ray: bool = False) -> dict:
    for p in (out, Path(f"{out}.partial")):
        p.unlink(missing_ok=True)
    shutil.rmtree(f"{out}.parts", ignore_errors=True)  # --ray: no block of an earlier run is reused
    cmd = [sys.executable, "-m", "offline_eval.cli", "run", str(data), "--model", model, "--metrics",
           ",".join(metrics), "--cache", str(cache), "--output", str(out),
           *(["--ray", "--replicas", "1", "--block-rows", "256"] if ray else [])]
    env = {**os.environ, "PYTHONPATH": str(root), "OFFLINE_EVAL_PROGRESS": "0"}
    env.pop("RAY_ADDRESS", None)
    stop = threading.Event()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = first_row_watch([Path(f"{out}.partial"), out], started, stop)
    driver = driver_peak_watch(proc.pid, stop)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    stop.set()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{root}: offline-eval run failed:\n{output[-3000:]}")
    written = sum(1 for _ in out.open(encoding="utf-8"))
    if written != rows:
        raise SystemExit(f"{root}: {written} rows written, not {rows}")
    calls = re.search(r"judge calls: \d+ new, \d+ from the cache", output)
    return {"seconds": seconds, "rows_per_s": rows / seconds, "peak_rss_mb": usage.ru_maxrss / 1024,
            "driver_rss_mb": driver[0] / 1024, "first_row_s": first[0] if first else None,
            "calls": calls.group(0) if calls else "?"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated row counts")
    parser.add_argument("--baseline", default=None, help="an earlier commit to run side by side")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="judge from models.yaml")
    parser.add_argument("--metrics", default="faithfulness,response_groundedness")
    parser.add_argument("--base", type=int, default=8, help="distinct rows judged for real")
    parser.add_argument("--keep", default=None, help="a folder for the data and cache (reused if there)")
    parser.add_argument("--ray", action="store_true", help="run --ray (one local replica) instead")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    metrics = args.metrics.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        data, cache = work / f"rows-{sizes[-1]}.jsonl", work / "cache.sqlite"
        if not data.exists():
            fill_cache(args.model, metrics, base_rows(args.base), sizes[-1], data, cache)
        sides = {"this checkout": REPO}
        if args.baseline:
            base_tree = Path(tmp) / "baseline"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base_tree),
                            args.baseline], check=True)
            sides[f"baseline {args.baseline}"] = base_tree
        try:
            memory = "driver peak RSS MB" if args.ray else "peak RSS MB"
            print(f"| rows | code | wall s | rows/s | {memory} | first row in output s |")
            print("|---|---|---|---|---|---|")
            for n in sizes:
                sliced = work / f"rows-{n}.jsonl"
                if not sliced.exists():
                    with data.open(encoding="utf-8") as src, sliced.open("w", encoding="utf-8") as dst:
                        for _, line in zip(range(n), src):
                            dst.write(line)
                for name, root in sides.items():
                    m = measure(root, sliced, n, args.model, metrics, cache, Path(tmp) / f"out-{n}.jsonl", args.ray)
                    first = "-" if m["first_row_s"] is None else f"{m['first_row_s']:.1f}"
                    memory = m["driver_rss_mb"] if args.ray else m["peak_rss_mb"]
                    print(f"| {n:,} | {name} | {m['seconds']:.0f} | {m['rows_per_s']:,.0f} | "
                          f"{memory:,.0f} | {first} |", flush=True)
                    print(f"  ({m['calls']})", file=sys.stderr)
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)])


if __name__ == "__main__":
    main()
