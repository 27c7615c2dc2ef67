"""The command line: `offline-eval run`, `serve`, `compare`, `report`, `view`, `models` and `cache`.

Exit codes (each outcome has its own, with a one-line message and no traceback):
  0    success (and the gate passed)
  1    the gate failed (`run --fail-under` / `--baseline`; results are still written)
  2    bad input or usage (including a bad --fail-under or an unreadable baseline)
  3    engine or model failure (unknown model, missing weights, a judge server that fails or misbehaves)
  4    internal error: a bug in offline-eval; set OFFLINE_EVAL_DEBUG=1 to see the traceback, and report it
  5    the judge cache is unusable (locked by another process, corrupt, unwritable), at start or part-way
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM). Both stop alike: finished judge calls stay in the
       cache, finished rows in `<output>.partial`, and a vLLM server started for the run is stopped.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .constraints import ConstraintViolation
from .run.context_focus import DEFAULT_BUDGET
from .dataset import DataError
from .engines.base import EngineError
from .engines.registry import ENGINES, SERVER_MODES
from .engines.vllm_launch import OFFLINE_ENV
from .metrics import judge_constraints
from .models import ModelError, Registry
from .run.plan import DEFAULT_SCORING, SCORINGS
from .run.scheduler import DEFAULT_WINDOW

# No hub, no telemetry: set before anything imports huggingface_hub, transformers or vLLM.
for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Evaluate RAG answers with local, constrained judge models.")
models_app = typer.Typer(no_args_is_help=True, help="The judge and embedding models offline-eval knows.")
app.add_typer(models_app, name="models")
cache_app = typer.Typer(no_args_is_help=True, help="The judge-call cache: what it holds, and trimming it.")
app.add_typer(cache_app, name="cache")
CACHE_PATH = typer.Option(None, "--cache", help="The cache file. Default: $OFFLINE_EVAL_JUDGE_CACHE, else $OFFLINE_EVAL_CACHE_DIR/judge-cache.sqlite.")

# Messages are never wrapped (they are often piped or grepped); tables get room when not on a terminal.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 160)

EXIT_GATE = 1
EXIT_BAD_INPUT = 2
EXIT_ENGINE = 3
EXIT_INTERNAL = 4
EXIT_CACHE = 5
DEBUG_ENV = "OFFLINE_EVAL_DEBUG"


def _fail(message: str, code: int) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


# Ray placement options, shared by `run --ray` and `compare --ray`.
RAY_ADDRESS = typer.Option(None, "--ray-address", help="The Ray cluster for --ray (implies it): auto, HOST:PORT or ray://HOST:PORT.")
REPLICAS = typer.Option(1, "--replicas", min=1, help="--ray: judge replicas, one model each.")
REPLICA_CPUS = typer.Option(1.0, "--replica-cpus", min=0.0, help="--ray: CPUs per replica.")
REPLICA_GPUS = typer.Option(None, "--replica-gpus", min=0.0, help="--ray: GPUs per replica. Default: the model's tensor_parallel_size on a cluster with GPUs, else 0.")
SHOWN_ERRORS = 50  # invalid fields listed before "... and N more"
BLOCK_ROWS = typer.Option(64, "--block-rows", min=1, help="--ray: rows per block, the unit of work and of resume.")


@app.command()
def run(
    data: Path = typer.Argument(..., help="Dataset: .jsonl, .json, .csv, .tsv or .parquet"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Judge model (models.yaml name or a .gguf path). Default: the registry's default judge."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma-separated metric names (every row must have their fields). Default: every metric whose fields some row has, scored on the rows that have them (no value on the others)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Per-sample results: .jsonl, or .parquet. Default: <data file stem>.results.jsonl in the current directory."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Score the valid rows and record the invalid ones as skipped, instead of stopping."),
    embeddings: Optional[str] = typer.Option(None, "--embeddings", help="Embedding model (models.yaml name or a folder)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Override the model's engine: vllm (server), vllm-offline or transformers (in process) for a model with a Hugging Face folder."),
    server: str = typer.Option("auto", "--server", help="vLLM server models: auto (use the model's base_url if it answers, else start a server for the run), connect (only use a running one), start (always start one for the run)."),
    cache: Optional[Path] = CACHE_PATH,
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the judge-call cache."),
    resume: bool = typer.Option(False, "--resume", help="Finish an interrupted run: take the rows it finished from <output>.partial (same judge, metrics, data and settings) and the rest's judge calls from the cache; the old output stays until the new one is complete."),
    long_inputs: str = typer.Option("focus", "--long-inputs", help=f"Long retrieved contexts: focus (default; a sample whose contexts exceed {DEFAULT_BUDGET} tokens gets their passages most relevant to its question, response and reference; focus:N sets the budget), then truncate what is still too long for the judge's window; truncate (whole contexts, cut from the end only to fit the window; warn per row); error (no value for a row and metric that does not fit)."),
    fail_under: Optional[str] = typer.Option(None, "--fail-under", help="CI gate: exit 1 if a metric's mean is below its bar, e.g. faithfulness=0.9,answer_relevancy=0.8."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="CI gate: a previous run's --summary-json file or per-sample results; exit 1 if a metric's mean dropped by more than --max-drop."),
    max_drop: Optional[float] = typer.Option(None, "--max-drop", help="The largest allowed drop of a mean against --baseline (default 0.02)."),
    min_coverage: Optional[float] = typer.Option(None, "--min-coverage", help="CI gate: the smallest share of scored samples with a value that a metric checked by --fail-under or --baseline needs (default 0.9), so a mean over a few rows never passes."),
    summary_json: Optional[Path] = typer.Option(None, "--summary-json", help="Also write the per-metric summary as JSON (a --baseline for later runs)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="vLLM server models: the server's URL (up to /v1) instead of models.yaml's; several, comma-separated, make a fleet: each request goes to the least busy server, and a failed server's requests go to the others."),
    ray: bool = typer.Option(False, "--ray", help="Run on Ray: judge replicas (vLLM, or llama.cpp for a GGUF model, in process) score blocks of rows; each block is saved under <output>.parts/ (a rerun resumes from them), then all merge into the output (.parquet or JSONL). A local Ray on 127.0.0.1 unless --ray-address or RAY_ADDRESS names a cluster."),
    ray_address: Optional[str] = RAY_ADDRESS,
    replicas: int = REPLICAS,
    replica_cpus: float = REPLICA_CPUS,
    replica_gpus: Optional[float] = REPLICA_GPUS,
    block_rows: int = BLOCK_ROWS,
    window: int = typer.Option(DEFAULT_WINDOW, "--window", min=1, help="The most samples in flight at once: rows are read, judged and written as the run goes, so memory holds this many samples whatever the data's size. Identical judge calls within the window are sent once."),
    scoring: str = typer.Option(DEFAULT_SCORING, "--scoring", help="How a metric's value comes from its constrained judge answers: probability (from the judge's probability of each allowed answer: P(top rating) of the two templates combined, mean P(yes) over claims) or argmax (the answers alone, as Ragas). Every result records both."),
) -> None:
    """Score DATA with the judge and print a per-metric summary."""
    from .cache import CacheError, JudgeCache, default_path
    from .run.evaluation import row_record, scan_rows, score_rows
    from .run.results_io import ResultsStream, parquet_problem, partial_path
    from .run.resume import FinishedRows, run_identity, set_aside
    from .run.summary import RunSummary
    from .judges import close_judges, embedding_factory, llm_factory, resolve_judge
    from .reports.gate import GateError, load_baseline, parse_bars
    from .run.long_inputs import parse_policy

    if server not in SERVER_MODES:
        raise _fail(f"--server must be one of {', '.join(SERVER_MODES)}, not {server!r}", EXIT_BAD_INPUT)
    if engine is not None and engine not in ENGINES:
        raise _fail(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}", EXIT_BAD_INPUT)
    try:
        parse_policy(long_inputs)
    except ValueError as exc:
        raise _fail(f"--long-inputs: {exc}", EXIT_BAD_INPUT)
    if max_drop is not None and (baseline is None or max_drop < 0):
        raise _fail("--max-drop needs --baseline" if baseline is None else "--max-drop cannot be negative",
                    EXIT_BAD_INPUT)
    if min_coverage is not None and (not (fail_under or baseline) or not 0 <= min_coverage <= 1):
        raise _fail("--min-coverage needs --fail-under or --baseline" if not (fail_under or baseline)
                    else "--min-coverage must be between 0 and 1", EXIT_BAD_INPUT)
    if no_cache and (resume or cache):
        raise _fail(f"--no-cache contradicts {'--resume' if resume else '--cache'}: resuming reuses the cache",
                    EXIT_BAD_INPUT)
    if scoring not in SCORINGS:
        raise _fail(f"--scoring must be one of {', '.join(SCORINGS)}, not {scoring!r}", EXIT_BAD_INPUT)
    try:  # one pass over the data, keeping no rows: every bad row is found before any judge time
        with err.status(f"checking every row of {data} before any judge time") as status:
            scan = scan_rows(data, metrics.split(",") if metrics else None, kept=SHOWN_ERRORS,
                             on_rows=lambda n: status.update(f"checking every row of {data} before any judge "
                                                             f"time: {n:,} rows read"))
    except (DataError, ValueError) as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    chosen = scan.metrics
    for metric in chosen:  # the metrics travel to Ray replicas as they are
        metric.scoring = scoring
    if not scan.rows:
        raise _fail(f"{data} has no rows", EXIT_BAD_INPUT)
    try:  # checked before the judge loads, so a typo does not cost a run
        bars = parse_bars(fail_under, [m.name for m in chosen]) if fail_under else {}
        base = load_baseline(baseline) if baseline else None
    except GateError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    if scan.errors:
        more = scan.error_count - len(scan.errors)
        if skip_invalid:
            err.print(f"[yellow]skipping {scan.bad_rows} invalid row(s):[/]", highlight=False)
        else:
            err.print(f"[bold red]error:[/] {scan.error_count} invalid field(s) in {data}; nothing was evaluated:",
                      highlight=False)
        for e in scan.errors:
            err.print(f"  {e}", highlight=False)
        if more:
            err.print(f"  ... and {more} more", highlight=False)
        if not skip_invalid:
            err.print("Fix the rows, or pass --skip-invalid to evaluate the others.")
            raise typer.Exit(EXIT_BAD_INPUT)

    output = output or Path(f"{data.stem}.results.jsonl")
    if output.suffix == ".parquet" and (problem := parquet_problem()):
        raise _fail(problem, EXIT_BAD_INPUT)
    started = time.perf_counter()
    store = None
    results = None
    finished = None  # --resume: the rows an interrupted run finished
    scored = False
    ray = ray or ray_address is not None
    if ray and (engine or base_url or server != "auto"):
        raise _fail("--ray runs the judge in process on every replica (vLLM, or llama.cpp for a GGUF model): "
                    "--engine, --server and --base-url do not apply", EXIT_BAD_INPUT)
    urls = [u.strip() for u in base_url.split(",") if u.strip()] if base_url else []
    try:
        if ray:  # each replica opens the judge cache of its own node (or `--cache PATH`, a path every node has)
            from .scale.ray_run import Placement, RayRunError, run_on_ray

            err.print(f"running on Ray: {replicas} replica(s) of {model or Registry.load().get(None).name}, "
                      f"blocks of {block_rows} rows; parts in {output}.parts/", highlight=False)
            summary = RunSummary([m.name for m in chosen])

            def announce(b) -> None:
                if not b.get("reused"):
                    err.print(f"block of rows {b['rows'][0][0]}-{b['rows'][-1][0]} done on {b['host']} "
                              f"(node {b['node'][:8]}) in {b['seconds']:.1f} s", highlight=False)

            try:  # the rows stream from the file again: the driver never holds them all
                done = run_on_ray(
                    data, scan, model, Placement(replicas, replica_cpus, replica_gpus), output=output,
                    embeddings=embeddings, block_rows=block_rows, address=ray_address,
                    cache=False if no_cache else str(cache) if cache else True, long_inputs=long_inputs,
                    on_block=announce, on_record=summary.add)
            except RayRunError as exc:
                raise EngineError(str(exc)) from None
            summary.judge, summary.stats = done.judge, done.stats
            _print_summary(summary, time.perf_counter() - started)
            out.print(f"judge calls: {done.stats.judge_calls} new, {done.stats.cached} from the cache; "
                      f"{done.reused_rows} row(s) from earlier blocks", highlight=False)
            out.print(f"per-sample results: {output}", highlight=False)
            _print_warnings(summary)
            return _gate(summary, data, summary_json, bars, base, max_drop, min_coverage)
        # Opened before the judge loads, so an unusable cache fails fast.
        store = None if no_cache else JudgeCache(cache or default_path())
        if resume:
            err.print(f"resuming: {store.count()} cached judge calls in {store.path}", highlight=False)
        try:  # before any judge time: an output that cannot be written fails now, not after the run
            aside = set_aside(partial_path(output)) if resume else None  # the interrupted run's rows
            results = ResultsStream(output, [m.name for m in chosen])
        except OSError as exc:
            raise _fail(f"cannot write the results next to {output}: {exc}", EXIT_BAD_INPUT)
        err.print(f"loading judge {model or Registry.load().get(None).name} ...", highlight=False)
        fleet = {"base_urls": urls} if len(urls) > 1 else {"base_url": urls[0]} if urls else {}
        judge = llm_factory(model, engine=engine, server=server, **fleet)
        embedder = embedding_factory(embeddings) if any(m.needs_embeddings for m in chosen) else None
        summary = RunSummary([m.name for m in chosen])
        identity = run_identity(resolve_judge(judge).identity, chosen, long_inputs, data,
                                embeddings if embedder is not None else None)
        results.describe(identity)
        if aside is not None:
            finished = FinishedRows(aside, identity)
            if not finished.same_run:
                err.print(f"{aside} was written with another {', '.join(finished.changed)}: every row is "
                          "scored again (the cache answers what it holds)", highlight=False)

        def write(row, row_results, row_errors) -> None:
            record = row_record(row, row_results, [str(e) for e in row_errors] or None)
            results(record)
            summary.add(record)

        def write_finished(record) -> None:
            results(record)
            summary.add(record)

        used, summary.stats = score_rows(data, scan, write, llm=judge, embeddings=embedder, show_progress=True,
                                         cache=store, long_inputs=long_inputs, window=window,
                                         finished=finished, on_finished=write_finished)
        summary.judge = used.identity
        scored = True
    except CacheError as exc:
        raise _fail(str(exc) + _kept(results, None), EXIT_CACHE)
    except (ModelError, EngineError) as exc:
        raise _fail(str(exc) + _kept(results, store, "once the judge is back, "), EXIT_ENGINE)
    except DataError as exc:  # the file changed under the run (it was read whole once already)
        raise _fail(str(exc) + _kept(results, store), EXIT_BAD_INPUT)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (main() raises it as one): say what is kept
        err.print("stopping the run ..." + _kept(results, store), highlight=False)  # main() says why
        raise
    finally:
        close_judges()  # stops a vLLM server started for this run
        if store is not None:
            store.close()
        if results is not None and not scored:
            results.close()  # keeps the rows written in <output>.partial
        if finished is not None:
            finished.done(results.rows)
    results.finish()  # atomic: an existing output is replaced only by a complete one (.parquet or JSONL)
    _print_summary(summary, time.perf_counter() - started)
    out.print(f"judge calls: {summary.stats.judge_calls} new, {summary.stats.cached} from the cache "
              f"({store.path if store is not None else 'cache off'})", highlight=False)
    if finished is not None and finished.same_run:
        out.print(f"{finished.reused} row(s) taken as they were from the interrupted run's results",
                  highlight=False)
    out.print(f"per-sample results: {output}", highlight=False)
    _print_warnings(summary)
    _gate(summary, data, summary_json, bars, base, max_drop, min_coverage)


def _print_warnings(summary) -> None:
    for warning in summary.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if summary.more_warnings:
        err.print(f"[yellow]warning:[/] ... and {summary.more_warnings} more rows (details.long_input)",
                  highlight=False)


def _kept(partial, store, when: str = "") -> str:
    """What a run stopped part-way keeps, and how to go on without paying twice."""
    message = ""
    if partial is not None and partial.rows:
        message += f"\nThe {partial.rows} row(s) finished are in {partial.path}."
    if partial is not None and store is not None and store.count():
        message += f"\nEvery judge call that finished is in the cache {store.path}: {when}run the same command " \
                   "with --resume to finish."
    return message


def _gate(result, data: Path, summary_json: Optional[Path], bars, base, max_drop: Optional[float],
          min_coverage: Optional[float]) -> None:
    """Write the summary JSON, then check the bars, the baseline and coverage; exit 1 if the gate fails."""
    from .reports.gate import DEFAULT_MAX_DROP, DEFAULT_MIN_COVERAGE, check, summary_document, write_summary

    max_drop = DEFAULT_MAX_DROP if max_drop is None else max_drop
    min_coverage = DEFAULT_MIN_COVERAGE if min_coverage is None else min_coverage
    if summary_json:
        write_summary(summary_json, summary_document(result, str(data)))
        out.print(f"summary: {summary_json}", highlight=False)
    if not bars and base is None:
        return
    verdict = check(result.summary(), result.judge, bars, base, max_drop, min_coverage)
    for warning in verdict.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    title = f"gate (baseline {base.path}, max drop {max_drop:g})" if base else "gate"
    out.print(f"{title}:\n" + "\n".join(f"  {line}" for line in verdict.lines), highlight=False)
    if verdict.failed:
        err.print(f"[bold red]gate failed:[/] {'; '.join(verdict.failures)}", highlight=False)
        raise typer.Exit(EXIT_GATE)
    out.print("gate passed", highlight=False)


def _print_summary(result, seconds: float) -> None:
    table = Table(title=f"offline-eval — judge {result.judge.get('model')} ({result.judge.get('engine')})")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("scored", justify="right")
    table.add_column("no value", justify="right")
    for col in ("coverage", "failed calls", "calls", "cached", "prompt tok", "compl. tok", "seconds"):
        table.add_column(col, justify="right")
    for name, s in result.summary().items():
        mean = "n/a" if math.isnan(s["mean"]) else f"{s['mean']:.4f}"
        coverage = "n/a" if s["coverage"] is None else f"{s['coverage']:.0%}"
        m = result.stats.per_metric.get(name, {})
        table.add_row(name, mean, str(s["scored"]), str(s["no_value"]), coverage, str(s["failed_calls"]),
                      str(m.get("judge_calls", 0)), str(m.get("cached", 0)), str(m.get("prompt_tokens", 0)),
                      str(m.get("completion_tokens", 0)), f"{m.get('seconds', 0.0):.1f}")
    out.print(table)
    st = result.stats
    skipped = result.skipped_rows
    reused = f" ({st.prompt_tokens - st.reused_prompt_tokens} computed, the rest reused from the engine's " \
             f"prefix cache)" if st.reused_prompt_tokens else ""
    out.print(f"{result.scored_rows} samples scored, {skipped} skipped; {st.prompt_tokens} prompt{reused} + "
              f"{st.completion_tokens} completion tokens; {seconds:.1f} s", highlight=False)
    if result.focused:
        out.print(f"{result.focused} sample(s) with long contexts were judged on their passages most relevant to "
                  "the sample (details.context_focus; --long-inputs truncate judges whole contexts)",
                  highlight=False)


@app.command()
def serve(
    model: str = typer.Option(..., "--model", "-m", help="A vLLM model from models.yaml."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind. Keep the loopback default unless other hosts must reach the judge."),
    port: Optional[int] = typer.Option(None, "--port", help="Default: the port of the model's base_url (so `run` finds the server), else 8000."),
) -> None:
    """Start a vLLM server for MODEL with its models.yaml settings; stop it with Ctrl-C."""
    from .engines.vllm_launch import ManagedServer, host_port, is_up
    from .engines.vllm_server import api_key_from

    try:
        spec = Registry.load().get(model, "judge")
    except ModelError as exc:
        raise _fail(str(exc), EXIT_ENGINE)
    if spec.engine not in ("vllm", "vllm-offline"):
        raise _fail(f"{spec.name} is a {spec.engine} model; `serve` runs vLLM models only", EXIT_BAD_INPUT)
    base_url = spec.settings.get("base_url")
    port = port or (host_port(base_url)[1] if base_url else 8000)
    url = f"http://{host}:{port}/v1"
    if is_up(url, api_key=api_key_from(spec.settings)):
        raise _fail(f"something already answers at {url}; stop it or pick another --port", EXIT_BAD_INPUT)
    try:
        server = ManagedServer(spec, host=host, port=port, warm_up=judge_constraints()).start()
    except (ModelError, EngineError) as exc:
        raise _fail(str(exc), EXIT_ENGINE)
    out.print(f"serving {spec.name} at {server.url} (log: {server.log}); Ctrl-C stops it", highlight=False)
    if base_url and base_url.rstrip("/") != server.url:
        out.print(f"models.yaml's base_url for {spec.name} is {base_url}: point it here to use this server",
                  highlight=False)
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        err.print("stopping the vLLM server ...")
        server.stop()
        err.print("stopped")
        return
    raise _fail(f"the vLLM server exited with code {code}; its log ends with:\n{server.log_tail()}", EXIT_ENGINE)


@app.command()
def compare(
    models: Optional[str] = typer.Option(None, "--models", help="Comma-separated judges (models.yaml names or .gguf paths); each is loaded, run on the labelled rows and closed before the next."),
    labels: Path = typer.Option(..., "--labels", help="Human labels: a BEGIN TSV, or a .jsonl/.json/.csv/.tsv/.parquet file with the metric inputs and one <metric>_label column per metric (0/1 or graded)."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma-separated metrics. Default: every metric the labels cover."),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", "-o", help="Where compare.json/.md/.html and the per-judge results go. Default: compare-<labels name>."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Use N rows picked at random with --seed: a reproducible subset."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the subset, the calibration split and the bootstrap (default 0; with --from, the earlier comparison's)."),
    margin: float = typer.Option(0.02, "--margin", min=0.0, help="Recommend the smallest judge within this much of the best."),
    threshold: str = typer.Option("0.5", "--threshold", help="score >= threshold predicts the positive label; 'auto' chooses it on a seeded 50% calibration split and reports on the other half."),
    reruns: int = typer.Option(0, "--reruns", min=0, help="Run every judge N more times and report the share of identical scores."),
    resamples: int = typer.Option(1000, "--bootstrap", min=0, help="Bootstrap resamples for the 95% confidence intervals."),
    rank_by: str = typer.Option("auc", "--rank-by", help="The statistic that ranks judges: auc, balanced_accuracy, kappa, accuracy, spearman or kendall."),
    ray: bool = typer.Option(False, "--ray", help="Score each judge on Ray: its own --replicas (vLLM, or llama.cpp for a GGUF model, in process) take the whole cluster, then are released before the next judge's load. A local Ray on 127.0.0.1 unless --ray-address or RAY_ADDRESS names a cluster."),
    ray_address: Optional[str] = RAY_ADDRESS,
    replicas: int = REPLICAS,
    replica_cpus: float = REPLICA_CPUS,
    replica_gpus: Optional[float] = REPLICA_GPUS,
    block_rows: int = BLOCK_ROWS,
    reuse: Optional[Path] = typer.Option(None, "--from", help="Analyse the comparison in this output folder again (e.g. with another --threshold, --margin or --rank-by) from its saved results, without running any judge. Needs the same --labels file; --models, --metrics, --limit and --reruns do not apply (--limit only for a comparison made before offline-eval listed its rows); --seed defaults to the earlier comparison's."),
) -> None:
    """Compare judges against human labels: agreement with confidence intervals, cost, consistency, and the
    smallest judge close to the best."""
    from .comparison.compare import RANK_BY, CompareSettings, analyse, run_judges, write_outputs
    from .comparison.tables import all_tables, to_rich
    from .comparison.labels import load_labelled

    if (models is None) == (reuse is None):
        raise _fail("give --models (judges to run) or --from (an earlier comparison to analyse again), one of them",
                    EXIT_BAD_INPUT)
    names = [m.strip() for m in (models or "").split(",") if m.strip()]
    if models is not None and (not names or len(set(names)) != len(names)):
        raise _fail(f"--models needs distinct judge names, got {models!r}", EXIT_BAD_INPUT)
    if rank_by not in RANK_BY:
        raise _fail(f"--rank-by must be one of {', '.join(RANK_BY)}, not {rank_by!r}", EXIT_BAD_INPUT)
    try:
        cut: float | str = "auto" if threshold == "auto" else float(threshold)
    except ValueError:
        raise _fail(f"--threshold must be 'auto' or a number, not {threshold!r}", EXIT_BAD_INPUT)
    settings = CompareSettings(metrics=metrics.split(",") if metrics else None, threshold=cut, seed=seed or 0,
                               margin=margin, reruns=reruns, resamples=resamples, rank_by=rank_by,
                               show_progress=True)
    out_dir = output_dir or reuse or Path(f"compare-{labels.stem}")
    announce = lambda n: err.print(f"judge {names.index(n) + 1}/{len(names)}: loading {n} ...", highlight=False)  # noqa: E731
    try:
        every_label = load_labelled(labels)
        labelled = every_label.subset(limit, seed or 0)
        if reuse is not None:
            from .comparison.reuse import load_comparison

            labelled, runs, before = load_comparison(reuse, every_label, labelled)
            settings.reruns = before["reruns"]
            settings.seed = before["seed"] if seed is None else seed
        elif ray or ray_address is not None:
            from .scale.compare_ray import RayPlacement, run_judges_on_ray
            from .scale.ray_run import RayRunError

            placement = RayPlacement(ray_address, replicas, replica_cpus, replica_gpus, block_rows)
            try:
                runs = run_judges_on_ray(labelled, names, settings, placement, out_dir, on_judge=announce)
            except RayRunError as exc:
                raise EngineError(str(exc)) from None
        else:
            runs = run_judges(labelled, names, settings, on_judge=announce)
        analysis = analyse(labelled, runs, settings)
    except ConstraintViolation:  # a ValueError too, but a judge output that broke its constraint is no bad input
        raise
    except (DataError, ValueError) as exc:  # ValidationError is a ValueError: all bad rows are listed
        raise _fail(str(exc), EXIT_BAD_INPUT)
    except (ModelError, EngineError) as exc:
        raise _fail(str(exc), EXIT_ENGINE)
    paths = write_outputs(analysis, runs, out_dir)
    for table in all_tables(analysis):
        out.print(to_rich(table))
    out.print(f"recommended judge: {analysis['overall']['recommended']}", highlight=False)
    for kind, path in paths.items():
        out.print(f"{kind}: {path}", highlight=False)


@app.command()
def report(
    results: Path = typer.Argument(..., help="A results file written by `offline-eval run` (JSONL)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="The HTML report. Default: the results file with .html."),
    worst: int = typer.Option(10, "--worst", min=1, help="How many lowest-scored samples to show per metric."),
) -> None:
    """Render an HTML report of a results file: score distributions and the worst samples with their reasons."""
    import json

    from .reports.html import results_report

    try:
        lines = results.read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(f"cannot read {results}: {exc}", EXIT_BAD_INPUT)
    if not records or not all(isinstance(r, dict) and ("metrics" in r or "skipped" in r) for r in records):
        raise _fail(f"{results} is not an offline-eval results file (one JSON record per row with 'metrics')",
                    EXIT_BAD_INPUT)
    output = output or results.with_suffix(".html")
    output.write_text(results_report(records, str(results), worst), encoding="utf-8")
    out.print(f"report: {output}", highlight=False)


@app.command()
def view(
    results: Path = typer.Argument(..., help="A results file written by `offline-eval run` (JSONL)."),
    results_b: Optional[Path] = typer.Argument(None, help="A second run over the same rows (another judge, or after a change): shown side by side, largest score differences first."),
    labels: Optional[Path] = typer.Option(None, "--labels", help="The labels file to write (and resume from), in the format `compare --labels` reads. Default: RESULTS with .labels.jsonl."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="The port (0: any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind. Keep the loopback default: anyone who reaches another interface can read the results and change the labels."),
) -> None:
    """Browse, explain and label a results file in a local web page (no network, nothing fetched); Ctrl-C stops it."""
    from .viewer.server import Viewer, is_loopback, make_server

    try:
        viewer = Viewer.open(results, results_b, labels)
    except DataError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    try:
        server = make_server(viewer, host, port)
    except OSError as exc:
        raise _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port", EXIT_BAD_INPUT)
    if not is_loopback(host):
        err.print(f"[bold yellow]warning:[/] listening on {host}, not on loopback: other hosts can read these results "
                  "and change the labels", highlight=False)
    bound_host, bound_port = server.server_address[:2]
    if viewer.labels.warning:
        err.print(f"[bold yellow]warning:[/] {viewer.labels.warning}", highlight=False)
    out.print(f"{len(viewer.a)} rows; labels: {viewer.labels.path} ({len(viewer.labels.labelled_rows())} labelled)",
              highlight=False)
    out.print(f"open http://{bound_host}:{bound_port}/ ; Ctrl-C stops", highlight=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        err.print("stopped")
    finally:
        server.server_close()


@models_app.command("list")
def models_list() -> None:
    """List the models in models.yaml and whether their weights are ready."""
    try:
        registry = Registry.load()
    except ModelError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    table = Table(title=f"models ({registry.source})")
    for col in ("kind", "name", "engine", "weights", "description"):
        table.add_column(col)
    defaults = {registry.data.get("default_judge"), registry.data.get("default_embeddings")}
    for kind in ("judge", "embeddings"):
        for name in registry.names(kind):
            spec = registry.get(name, kind)
            label = name + (" (default)" if name in defaults else "")
            engine = spec.engine if kind == "judge" else spec.settings.get("runtime", "sentence-transformers")
            table.add_row(kind, label, engine, spec.weights_status(), spec.description)
    out.print(table)


@models_app.command("verify")
def models_verify(
    names: Optional[list[str]] = typer.Argument(None, help="Models to check (models.yaml names). Default: all; then entries that are simply absent are reported but do not fail."),
    models_dir: Optional[Path] = typer.Option(None, "--dir", help="The models dir to check. Default: OFFLINE_EVAL_MODELS_DIR, else models.yaml's models_dir."),
    no_hash: bool = typer.Option(False, "--no-hash", help="Check that files are present, without hashing them."),
) -> None:
    """Check staged weights: required files, SHA256SUMS, and models.yaml's sha256. Exit 1 if any is missing or corrupt."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from .model_check import CORRUPT, MISSING, OK, check_all, sha256_files

    try:
        registry = Registry.load()
    except ModelError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    root = (models_dir or registry.models_dir).expanduser()
    progress = Progress(TextColumn("sha256 {task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), console=err, transient=True)

    def hasher(paths: list[Path], label: str) -> str:
        task = progress.add_task(label, total=sum(p.stat().st_size for p in paths))
        try:
            return sha256_files(paths, on_bytes=lambda n: progress.advance(task, n))
        finally:
            progress.remove_task(task)

    try:
        with progress:
            results = check_all(registry, names or [], root, None if no_hash else hasher)
    except ModelError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    table = Table(title=f"model weights (models dir {root})")
    for col in ("kind", "model", "status", "detail"):
        table.add_column(col)
    colour = {OK: "green", MISSING: "red", CORRUPT: "bold red"}
    for r in results:
        table.add_row(r.kind, r.name, f"[{colour.get(r.status, 'dim')}]{r.status}[/]", r.detail)
    out.print(table)
    failed = [r.name for r in results if r.failed]
    out.print(f"{sum(r.status == OK for r in results)} ok, {len(failed)} failed, "
              f"{len(results) - len(failed) - sum(r.status == OK for r in results)} not staged", highlight=False)
    if failed:
        raise typer.Exit(1)


def _open_cache(path: Optional[Path]) -> "JudgeCache":
    from .cache import CacheError, JudgeCache, default_path

    where = path or default_path()
    if not where.exists():
        raise _fail(f"no judge cache at {where}", EXIT_BAD_INPUT)
    try:
        return JudgeCache(where)
    except CacheError as exc:
        raise _fail(str(exc), EXIT_CACHE)


def _mib(path: Path) -> str:
    """The cache's size on disk, with its write-ahead log."""
    files = [path, path.with_name(path.name + "-wal")]
    return f"{sum(f.stat().st_size for f in files if f.exists()) / 2**20:.1f} MiB"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


@cache_app.command("info")
def cache_info(cache: Optional[Path] = CACHE_PATH) -> None:
    """What the cache holds: judge calls per judge (with their age), embeddings, and the file's size."""
    with _open_cache(cache) as store:
        judges, vectors = store.judges(), store.vector_count()
    table = Table(title=f"judge cache {store.path} ({_mib(store.path)})")
    for col in ("model", "engine", "where", "calls", "oldest", "newest"):
        table.add_column(col)
    for j in judges:
        who = j["judge"]
        where = who.get("base_url") or who.get("base_urls") or who.get("weights") or ""
        table.add_row(str(who.get("model")), str(who.get("engine")), str(where), str(j["calls"]),
                      _when(j["oldest"]), _when(j["newest"]))
    out.print(table)
    out.print(f"{sum(j['calls'] for j in judges)} judge calls, {vectors} embeddings", highlight=False)


@cache_app.command("prune")
def cache_prune(
    cache: Optional[Path] = CACHE_PATH,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Only this judge's calls (its name as `cache info` shows it; every engine and server of that name)."),
    older_than: Optional[float] = typer.Option(None, "--older-than", min=0.0, help="Only entries stored more than this many days ago (embeddings too, unless --model is given)."),
    everything: bool = typer.Option(False, "--all", help="Every judge call and embedding."),
) -> None:
    """Delete judge calls (and embeddings) from the cache and shrink the file. Needs --model, --older-than or --all."""
    if not (model or older_than is not None or everything):
        raise _fail("say what to delete: --model NAME, --older-than DAYS, or --all", EXIT_BAD_INPUT)
    if everything and (model or older_than is not None):
        raise _fail("--all deletes everything: it takes neither --model nor --older-than", EXIT_BAD_INPUT)
    before = None if older_than is None else time.time() - older_than * 86400
    with _open_cache(cache) as store:
        judges = None
        if model:
            judges = [j["judge"] for j in store.judges() if j["judge"].get("model") == model]
            if not judges:
                raise _fail(f"the cache holds no calls of a judge named {model!r}; `offline-eval cache info` "
                            "lists them", EXIT_BAD_INPUT)
        calls, vectors = store.prune(judges, before, vectors=not model)
        left = store.count()
    out.print(f"deleted {calls} judge calls and {vectors} embeddings; {left} judge calls left in {store.path} "
              f"({_mib(store.path)})", highlight=False)


_stop_signal: Optional[int] = None  # the signal (SIGINT or SIGTERM) that stopped this process, if any


def _on_stop_signal(signum: int, frame: object) -> None:
    """Ctrl-C and SIGTERM alike: remember which, and raise KeyboardInterrupt where the program is, so every
    `finally` runs (a started vLLM server is stopped, the cache and the partial results are closed)."""
    global _stop_signal
    _stop_signal = signum
    raise KeyboardInterrupt


def _stop_word() -> str:
    return "terminated (SIGTERM)" if _stop_signal == signal.SIGTERM else "interrupted (Ctrl-C)"


def main() -> None:
    """The `offline-eval` command: the app, with every outcome mapped to its exit code (module docstring)."""
    signal.signal(signal.SIGINT, _on_stop_signal)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    try:
        app(prog_name="offline-eval")
    except SystemExit as exc:
        # Typer/Click turn KeyboardInterrupt into an exit of their own (130, or 1 with "Aborted!" in older
        # ones); a command that handled it and finished (`serve` stopping its server) keeps its 0.
        if _stop_signal is not None and exc.code not in (0, None):
            err.print(_stop_word(), highlight=False)
            sys.exit(128 + _stop_signal)
        raise
    except KeyboardInterrupt:  # before any command ran
        err.print(_stop_word(), highlight=False)
        sys.exit(128 + (_stop_signal or signal.SIGINT))
    except Exception as exc:  # noqa: BLE001 (anything else is a bug: one line, the traceback on request)
        if os.environ.get(DEBUG_ENV) == "1":
            traceback.print_exc()
        err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} (a bug in offline-eval: "
                  f"please report it with the command line; {DEBUG_ENV}=1 shows the traceback)", highlight=False)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
