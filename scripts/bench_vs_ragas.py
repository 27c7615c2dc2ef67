#!/usr/bin/env python
"""offline-eval vs Ragas 0.4.3, side by side on one vLLM server, model and data set; prints markdown tables.

    python scripts/bench_vs_ragas.py [-n 12] [--data FILE] [--model smollm2-135m-instruct-hf] [--server start]
                                     [--concurrency N] [--ragas-python PY] [--ragas-n 4] [--sweep 8,16,32,64]
                                     [--cached-n 1000]
    python scripts/bench_vs_ragas.py --base-url http://HOST:8000/v1 --model SERVED_NAME ...   # a running server

Metrics: AnswerAccuracy, ContextRelevance, ResponseGroundedness, Faithfulness, AnswerRelevancy (Ragas:
`ragas.metrics.collections`, `llm_factory(NAME, client=AsyncOpenAI(...))`, embeddings from the same local
all-MiniLM-L6-v2 folder). Phases, each after resetting the server's prefix cache:

1. offline-eval, pipelined (what `offline-eval run` does against a server), judge cache off;
2. offline-eval, waves (the in-process engines' scheduler, against the same server: what pipelining gains);
3. engine ceiling: the unique requests phase 1 sent, straight to the server with no stages waiting on
   each other: all at once, and at the same concurrency; "share of ceiling" is against the faster of the two;
4. Ragas on the first `--ragas-n` samples: one `ascore` per (sample, metric), all gathered at once as its
   docs show. Ragas itself bounds nothing here, so its OpenAI client gets the same cap on requests in flight
   (httpx max_connections) as offline-eval's `max_concurrency`: the same concurrency opportunity. Its own
   defaults (max_tokens 1024, temperature 0.01, retries on unparsable output) stay, as a user would run it.
5. cached reruns of `--cached-n` samples against a warm judge cache, through the pipelined path: (a) the
   benchmark rows repeated (in-run deduplication leaves a few hundred lookups), (b) as many DISTINCT samples
   (marked copies of the rows), whose cache entries are phase 1's real outputs copied to the copies' requests
   (judging 1,000 distinct samples for real takes ~1 h with SmolLM2 on 2 CPU cores).

Judge calls and tokens come from the server's Prometheus counters (/metrics: vllm:request_success_total,
vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:prefix_cache_*) before and after each phase, so
both sides are counted the same way, Ragas' retries included. The prefix cache reset (POST
/reset_prefix_cache) needs a server started with VLLM_SERVER_DEV_MODE=1 (this script sets it for a server it
starts); otherwise the tables say so.

Data: a .jsonl/.json file with Ragas fields (default: examples/quickstart.jsonl; rows are reused with a
"⟨k⟩" marker on every text, so every request is new and deduplication cannot flatter offline-eval), or a
BEGIN .tsv (columns knowledge, message, response): user_input = message, response = response,
retrieved_contexts = [knowledge] and reference = knowledge (BEGIN has no reference answer).

Ragas needs its own environment (it pins openai and instructor versions that vLLM's does not match):
`--ragas-python` names that interpreter, with ragas==0.4.3 instructor==1.17.0 openai==3.3.0
langchain-community==0.4.1 and sentence-transformers. `--ragas-n 0` leaves Ragas out.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
METRICS = ["answer_accuracy", "context_relevance", "response_groundedness", "faithfulness", "answer_relevancy"]
RAGAS_CLASSES = ["AnswerAccuracy", "ContextRelevance", "ResponseGroundedness", "Faithfulness", "AnswerRelevancy"]
FIELDS = {  # what each Ragas metric's ascore takes
    "AnswerAccuracy": ("user_input", "response", "reference"),
    "ContextRelevance": ("user_input", "retrieved_contexts"),
    "ResponseGroundedness": ("response", "retrieved_contexts"),
    "Faithfulness": ("user_input", "response", "retrieved_contexts"),
    "AnswerRelevancy": ("user_input", "response"),
}


# ---- data ---------------------------------------------------------------------------------------------

def load_rows(path: Path, n: int) -> list[dict[str, Any]]:
    """n distinct rows with user_input, response, retrieved_contexts and reference."""
    if path.suffix == ".tsv":
        with open(path, encoding="utf-8", newline="") as f:
            rows = [{"user_input": r["message"], "response": r["response"], "retrieved_contexts": [r["knowledge"]],
                     "reference": r["knowledge"]} for r in csv.DictReader(f, delimiter="\t")
                    if r["message"].strip() and r["response"].strip() and r["knowledge"].strip()]
    else:
        text = path.read_text(encoding="utf-8")
        rows = json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    if len(rows) >= n:
        return rows[:n]
    return [_marked(rows[i % len(rows)], i // len(rows)) for i in range(n)]


MARK = re.compile(r"⟨\d+⟩ ")  # not "[k]": numbered contexts in prompts look like that


def _marked(row: dict[str, Any], k: int) -> dict[str, Any]:
    """The row with "⟨k⟩ " before every text, so its requests differ from the other copies'."""
    if k == 0:
        return row
    mark = f"⟨{k}⟩ "
    return {key: [mark + c for c in v] if isinstance(v, list) else mark + v if isinstance(v, str) else v
            for key, v in row.items()}


# ---- the server ------------------------------------------------------------------------------------------

def root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1")


def counters(base_url: str) -> dict[str, float]:
    """The server's request and token counters (summed over labels)."""
    wanted = {"vllm:request_success_total": "requests", "vllm:prompt_tokens_total": "prompt",
              "vllm:generation_tokens_total": "completion", "vllm:prefix_cache_queries_total": "cache_queries",
              "vllm:prefix_cache_hits_total": "cache_hits"}
    totals = dict.fromkeys(wanted.values(), 0.0)
    with urllib.request.urlopen(f"{root(base_url)}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                totals[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return totals


def reset_prefix_cache(base_url: str) -> bool:
    try:
        req = urllib.request.Request(f"{root(base_url)}/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class Phase:
    name: str
    seconds: float
    samples: int
    usage: dict[str, float]  # server counter deltas
    bad_outputs: Optional[int] = None
    no_value: Optional[int] = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds else math.nan


def measured(base_url: str, name: str, samples: int, run) -> Phase:
    """Run `run()` (returning (bad_outputs, no_value, notes)) between two counter readings."""
    reset = reset_prefix_cache(base_url)
    before = counters(base_url)
    tic = time.perf_counter()
    bad, none, notes = run()
    seconds = time.perf_counter() - tic
    after = counters(base_url)
    phase = Phase(name, seconds, samples, {k: after[k] - before[k] for k in after}, bad, none, list(notes))
    if not reset:
        phase.notes.append("prefix cache not reset (server not in VLLM_SERVER_DEV_MODE)")
    print(f"  {name}: {seconds:.1f} s, {phase.usage['requests']:.0f} requests", file=sys.stderr, flush=True)
    return phase


def repeated(base_url: str, samples: int, runs: dict[str, Any], times: int, before=None) -> list[Phase]:
    """Each run `times` times, in interleaved rounds (the machine's load drifts); the median phase of each."""
    rounds = []
    for _ in range(times):
        if before:
            before()
        rounds.append([measured(base_url, name, samples, run) for name, run in runs.items()])
    medians = []
    for same in zip(*rounds):
        ordered = sorted(same, key=lambda p: p.seconds)
        phase = ordered[len(ordered) // 2]
        if times > 1:
            phase.notes.append("median of " + ", ".join(f"{p.seconds:.1f}" for p in same) + " s")
        medians.append(phase)
    return medians


# ---- offline-eval ------------------------------------------------------------------------------------------

class Recording:
    """The engine, remembering every request sent through its session and its output (for the ceiling phase
    and the cached rerun)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[tuple[Any, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    @asynccontextmanager
    async def session(self):
        async with self.engine.session() as submit:
            async def record(request):
                out = await submit(request)
                self.calls.append((request, out))
                return out

            yield record


class Copying:
    """A judge that answers a marked copy's request with the real output its original row's request got (from
    the cache): fills the cache for many distinct samples with real judge outputs at no judge cost."""

    def __init__(self, cache: Any, identity: dict[str, Any]):
        self.cache = cache
        self.identity = identity

    def generate(self, requests, progress=None):
        originals = [dataclasses.replace(r, messages=tuple((role, MARK.sub("", text)) for role, text in r.messages))
                     for r in requests]
        found = self.cache.get_many(self.identity, originals)
        return [dataclasses.replace(found[o.key], meta={}) for o in originals]


def our_metrics():
    from offline_eval.metrics import metric_by_name

    return [metric_by_name(name) for name in METRICS]


def ours(rows, engine, embedder, pipeline: bool, cache=None, stats=None):
    """Score rows with the five metrics; returns (bad outputs, no value, notes)."""
    from offline_eval.dataset import SingleTurnSample
    from offline_eval.run.scheduler import RunStats, run_metrics

    stats = stats if stats is not None else RunStats()
    results = run_metrics([SingleTurnSample(**r) for r in rows], our_metrics(), judge=engine, embeddings=embedder,
                          stats=stats, cache=cache, pipeline=pipeline)
    calls = [c for row in results for r in row.values() for c in r.judge_calls]
    bad = sum(c["value"] is None for c in calls)
    none = [r for row in results for r in row.values() if r.value is None]
    no_claims = sum("no factual claims" in r.reason for r in none)
    notes = [f"{no_claims} of the valueless scores: a response without factual claims"] if no_claims else []
    return bad, len(none), notes


def ceiling(engine_at, requests, concurrency: Optional[int]) -> tuple[int, None, list[str]]:
    """The requests straight to the server: no plans, no stages waiting on each other; concurrency None: all
    at once."""
    engine = engine_at(concurrency or max(len(requests), 1))
    outputs = engine.generate(requests)
    return sum(o.value is None for o in outputs), None, [f"{len(requests)} requests, {engine.max_concurrency} in flight"]


# ---- Ragas (runs in its own interpreter) --------------------------------------------------------------------

def ragas_phase(python: str, base_url: str, model: str, rows, concurrency: int, embeddings_dir: str):
    job = {"base_url": base_url, "model": model, "rows": rows, "concurrency": concurrency,
           "embeddings_dir": embeddings_dir}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    env = dict(os.environ, RAGAS_DO_NOT_TRACK="true", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # Ragas' imports take a while: the worker waits for "go" on stdin, so only scoring is timed.
    proc = subprocess.Popen([python, __file__, "--ragas-worker", f.name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)
    ready = proc.stdout.readline()
    if ready.strip() != "ready":
        proc.kill()
        raise SystemExit(f"the Ragas worker did not start (is ragas installed in {python}?)")
    result: dict[str, Any] = {}

    def run():
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result.update(json.loads(proc.stdout.readline()))
        proc.wait()
        notes = [f"{result['raised']} raised ({result['first_error']})"] if result["raised"] else []
        return result["raised"] + result["nan"], result["raised"] + result["nan"], notes

    return run


def ragas_worker(job_path: str) -> None:
    """Score the job's rows with Ragas' collections metrics; print one JSON line."""
    import httpx
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient
    from ragas.embeddings import HuggingFaceEmbeddings
    from ragas.llms import llm_factory
    import ragas.metrics.collections as collections

    job = json.loads(Path(job_path).read_text())
    c = job["concurrency"]
    http = DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=c, max_keepalive_connections=c))
    client = AsyncOpenAI(base_url=job["base_url"], api_key="x", http_client=http, timeout=600.0)
    llm = llm_factory(job["model"], client=client)
    embeddings = HuggingFaceEmbeddings(model=job["embeddings_dir"])
    metrics = {name: getattr(collections, name)(llm=llm) for name in RAGAS_CLASSES if name != "AnswerRelevancy"}
    metrics["AnswerRelevancy"] = collections.AnswerRelevancy(llm=llm, embeddings=embeddings)
    print("ready", flush=True)
    sys.stdin.readline()

    async def one(name, row):
        try:
            result = await metrics[name].ascore(**{k: row[k] for k in FIELDS[name]})
            value = result.value
            return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else "ok"
        except Exception as exc:  # a parse failure after Ragas' retries, or a server error
            return f"raised: {type(exc).__name__}: {str(exc)[:200]}"

    async def main():
        return await asyncio.gather(*(one(name, row) for row in job["rows"] for name in RAGAS_CLASSES))

    outcomes = asyncio.run(main())
    raised = [o for o in outcomes if o.startswith("raised")]
    print(json.dumps({"nan": outcomes.count("nan"), "raised": len(raised),
                      "first_error": raised[0][8:] if raised else ""}), flush=True)


# ---- tables ---------------------------------------------------------------------------------------------

def table(phases: list[Phase], ragas: Optional[Phase], top: Optional[Phase], n_scores: int) -> str:
    lines = ["| phase | wall s | samples/s | x Ragas | share of ceiling | judge calls | calls/sample | "
             "prompt tok/sample | x Ragas | compl. tok/sample | prefix-cache hits | invalid outputs | "
             "scores without value |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in phases:
        per = {k: v / p.samples for k, v in p.usage.items()}
        vs = f"{p.rate / ragas.rate:.1f}" if ragas and p is not ragas else ""
        share = f"{p.rate / top.rate:.2f}" if top and not p.name.startswith("engine ceiling") and p is not ragas else ""
        tok = (f"{per['prompt'] / (ragas.usage['prompt'] / ragas.samples):.2f}"
               if ragas and p is not ragas and ragas.usage["prompt"] else "")
        none = "" if p.no_value is None else f"{p.no_value} of {n_scores}"
        bad = "" if p.bad_outputs is None else str(p.bad_outputs)
        hits = f"{p.usage['cache_hits'] / p.usage['cache_queries']:.0%}" if p.usage["cache_queries"] else ""
        lines.append(f"| {p.name} | {p.seconds:.1f} | {p.rate:.2f} | {vs} | {share} | {p.usage['requests']:.0f} | "
                     f"{per['requests']:.1f} | {per['prompt']:.0f} | {tok} | {per['completion']:.0f} | {hits} | "
                     f"{bad} | {none} |")
    notes = [f"- {p.name}: {'; '.join(p.notes)}" for p in phases if p.notes]
    return "\n".join(lines + ([""] + notes if notes else []))


# ---- main -------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=12, help="samples (default 12: ~40 s per phase on 2 CPU cores)")
    parser.add_argument("--data", type=Path, default=REPO / "examples" / "quickstart.jsonl")
    parser.add_argument("--model", default="smollm2-135m-instruct-hf",
                        help="models.yaml entry; with --base-url, the server's model name")
    parser.add_argument("--server", choices=("start", "connect"), default="start",
                        help="start a server for the entry (default) or connect to its base_url")
    parser.add_argument("--base-url", help="a running OpenAI-compatible vLLM server, up to /v1")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="requests in flight, both sides (default: the engine's max_concurrency)")
    parser.add_argument("--ragas-python", default=sys.executable, help="the interpreter that has Ragas")
    parser.add_argument("--ragas-n", type=int, default=4,
                        help="Ragas scores the first N of the samples (0: skip Ragas; default 4: with SmolLM2 on 2 "
                             "CPU cores Ragas needs ~2 minutes per sample)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run offline-eval's phases and the ceiling R times, interleaved; report medians")
    parser.add_argument("--sweep", default="", help="also run offline-eval pipelined at these concurrencies")
    parser.add_argument("--cached-n", type=int, default=1000, help="samples in the cached reruns (0: skip)")
    parser.add_argument("--ragas-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ragas_worker:
        return ragas_worker(args.ragas_worker)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from offline_eval.engines.vllm_server import VllmServerEngine
    from offline_eval.judges import embedding_factory
    from offline_eval.models import Registry

    server = None
    if args.base_url:
        base_url, served = args.base_url.rstrip("/"), args.model
    else:
        from offline_eval.engines.vllm_launch import ManagedServer, served_name

        spec = Registry.load().get(args.model, "judge")
        served = served_name(spec)
        if args.server == "start":
            os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # for /reset_prefix_cache between phases
            server = ManagedServer(spec).start()
            base_url = server.url
        else:
            base_url = spec.settings["base_url"].rstrip("/")
    try:
        run_all(args, base_url, served, VllmServerEngine, embedding_factory)
    finally:
        if server is not None:
            server.stop()


def run_all(args, base_url: str, served: str, VllmServerEngine, embedding_factory) -> None:
    from offline_eval.models import Registry

    def engine(concurrency: int):
        return VllmServerEngine(base_url, served, name=served, max_concurrency=concurrency)

    concurrency = args.concurrency or VllmServerEngine(base_url, served).max_concurrency
    rows = load_rows(args.data, args.n)
    embedder = embedding_factory("all-minilm-l6-v2")
    embedder.embed(["warm up"])
    n, n_scores = len(rows), len(rows) * len(METRICS)
    print(f"{n} samples from {args.data.name} x {len(METRICS)} metrics, {served} at {base_url}, "
          f"{concurrency} requests in flight", file=sys.stderr)

    recorder = Recording(engine(concurrency))
    ours_phases = {"offline-eval (pipelined)": lambda: ours(rows, recorder, embedder, True),
                   "offline-eval (waves)": lambda: ours(rows, engine(concurrency), embedder, False)}
    # The ceiling: phase 1's unique requests with no dependencies, all at once (as the issue defines it) and at
    # the same concurrency (on a CPU server, all at once can be slower); shares are against the faster one.
    unique = lambda: list({r.key: r for r, _ in recorder.calls}.values())  # noqa: E731
    ceilings = {f"engine ceiling, {name}": lambda c=c: ceiling(engine, unique(), c)
                for name, c in (("all at once", None), (f"{concurrency} in flight", concurrency))}
    phases = repeated(base_url, n, {**ours_phases, **ceilings}, args.repeat, before=recorder.calls.clear)
    top = min(phases[2:], key=lambda p: p.seconds)
    ragas = None
    if args.ragas_n:
        folder = str(Registry.load().get("all-minilm-l6-v2", "embeddings").weights_path())
        subset = rows[:args.ragas_n]
        ragas = measured(base_url, "Ragas 0.4.3", len(subset),
                         ragas_phase(args.ragas_python, base_url, served, subset, concurrency, folder))
        phases.append(ragas)
    subset_note = f"; Ragas on the first {ragas.samples}" if ragas and ragas.samples < n else ""
    print(f"\n### offline-eval vs Ragas 0.4.3: {n} samples{subset_note}, {len(METRICS)} metrics, {served}, "
          f"at most {concurrency} requests in flight\n")
    print(table(phases, ragas, top, n_scores))

    if args.sweep:
        sweep = [measured(base_url, f"pipelined, {c} in flight", n,
                          lambda c=c: ours(rows, engine(c), embedder, True)) for c in map(int, args.sweep.split(","))]
        print(f"\n### max_concurrency sweep ({n} samples)\n")
        print(table(sweep, None, top, n_scores))

    if args.cached_n:
        reruns = cached_reruns(args.cached_n, rows, recorder, engine(concurrency), embedder, base_url)
        print(f"\n### cached rerun of {args.cached_n} samples\n")
        print(reruns)


def cached_reruns(count: int, rows, recorder: Recording, engine, embedder, base_url: str) -> str:
    """Time reruns of `count` samples against a warm judge cache: (a) the benchmark rows cycled, (b) `count`
    distinct samples (marked copies of the rows), the cache filled by Copying from the rows' real outputs."""
    from offline_eval.cache import JudgeCache
    from offline_eval.dataset import SingleTurnSample
    from offline_eval.run.scheduler import RunStats, run_metrics

    repeated = [rows[i % len(rows)] for i in range(count)]
    distinct = [_marked(rows[i % len(rows)], i // len(rows)) for i in range(count)]
    phases = []
    with tempfile.TemporaryDirectory() as tmp, JudgeCache(Path(tmp) / "cache.sqlite") as cache:
        # the real outputs of phase 1, stored as `offline-eval run` would have stored them
        cache.put_many(engine.identity, [r for r, _ in recorder.calls], [o for _, o in recorder.calls])
        tic = time.perf_counter()
        run_metrics([SingleTurnSample(**r) for r in distinct], our_metrics(), judge=Copying(cache, engine.identity),
                    embeddings=embedder, cache=cache)
        fill = time.perf_counter() - tic
        for name, data in ((f"{count} = the {len(rows)} rows repeated", repeated),
                           (f"{count} distinct samples", distinct)):
            stats = RunStats()
            phase = measured(base_url, name, count, lambda: ours(data, engine, embedder, True, cache, stats))
            phase.notes.append(f"{stats.judge_calls} judge calls, {stats.cached} answered by the cache, "
                               f"{stats.deduplicated} deduplicated in the run, {stats.embedded_texts} texts embedded")
            phases.append(phase)
        entries = cache.count()
    note = (f"\nThe cache held {entries} judge calls: phase 1's real outputs, copied to the marked copies, "
            f"and their embeddings ({fill:.1f} s, no judge calls).")
    return table(phases, None, None, count * len(METRICS)) + note


if __name__ == "__main__":
    main()
