"""The command line: `offline-eval run` and `offline-eval models list`.

Exit codes: 0 success, 2 bad input or usage, 3 engine or model failure.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from .dataset import DataError, ValidationError
from .engines.base import EngineError
from .engines.registry import ENGINES, SERVER_MODES
from .models import ModelError, Registry

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Evaluate RAG answers with local, constrained judge models.")
models_app = typer.Typer(no_args_is_help=True, help="The judge and embedding models offline-eval knows.")
app.add_typer(models_app, name="models")

# Messages are never wrapped (they are often piped or grepped); tables get room when not on a terminal.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 160)

EXIT_BAD_INPUT = 2
EXIT_ENGINE = 3


def _fail(message: str, code: int) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


@app.command()
def run(
    data: Path = typer.Argument(..., help="Dataset: .jsonl, .json, .csv, .tsv or .parquet"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Judge model (models.yaml name or a .gguf path). Default: the registry's default judge."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma-separated metric names. Default: every metric the data's fields allow."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Per-sample results (JSONL). Default: <data>.results.jsonl in the current directory."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Score the valid rows and record the invalid ones as skipped, instead of stopping."),
    embeddings: Optional[str] = typer.Option(None, "--embeddings", help="Embedding model (models.yaml name or a folder)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Override the model's engine: vllm (server) or vllm-offline (in process) for a vLLM model."),
    server: str = typer.Option("auto", "--server", help="vLLM server models: auto (use the model's base_url if it answers, else start a server for the run), connect (only use a running one), start (always start one for the run)."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="The judge-call cache (SQLite). Default: $OFFLINE_EVAL_JUDGE_CACHE, else $OFFLINE_EVAL_CACHE_DIR/judge-cache.sqlite."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the judge-call cache."),
    resume: bool = typer.Option(False, "--resume", help="Finish an interrupted run: reuse its cached judge calls (any rerun with the cache on does); the old output stays until the new one is complete."),
) -> None:
    """Score DATA with the judge and print a per-metric summary."""
    from .cache import CacheError, JudgeCache, default_path
    from .dataset import load_rows
    from .evaluation import select_metrics, validate
    from .judges import close_judges, embedding_factory, llm_factory
    from . import evaluate

    if server not in SERVER_MODES:
        raise _fail(f"--server must be one of {', '.join(SERVER_MODES)}, not {server!r}", EXIT_BAD_INPUT)
    if engine is not None and engine not in ENGINES:
        raise _fail(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}", EXIT_BAD_INPUT)
    if no_cache and (resume or cache):
        raise _fail(f"--no-cache contradicts {'--resume' if resume else '--cache'}: resuming reuses the cache",
                    EXIT_BAD_INPUT)
    try:
        rows = load_rows(data)
        chosen = select_metrics(metrics.split(",") if metrics else None, rows)
        errors = validate(rows, chosen)
    except (DataError, ValueError) as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    if not rows:
        raise _fail(f"{data} has no rows", EXIT_BAD_INPUT)
    if errors and not skip_invalid:
        err.print(f"[bold red]error:[/] {len(errors)} invalid field(s) in {data}; nothing was evaluated:",
                  highlight=False)
        for e in errors:
            err.print(f"  {e}", highlight=False)
        err.print("Fix the rows, or pass --skip-invalid to evaluate the others.")
        raise typer.Exit(EXIT_BAD_INPUT)
    if errors:
        skipped = sorted({e.row.number for e in errors})
        err.print(f"[yellow]skipping {len(skipped)} invalid row(s):[/] " + ", ".join(map(str, skipped)))
        for e in errors:
            err.print(f"  {e}", highlight=False)

    output = output or Path(f"{data.stem}.results.jsonl")
    started = time.perf_counter()
    store = None
    try:
        # Opened before the judge loads, so an unusable cache fails fast.
        store = None if no_cache else JudgeCache(cache or default_path())
        if resume:
            err.print(f"resuming: {store.count()} cached judge calls in {store.path}", highlight=False)
        err.print(f"loading judge {model or Registry.load().get(None).name} ...", highlight=False)
        judge = llm_factory(model, engine=engine, server=server)
        embedder = embedding_factory(embeddings) if any(m.needs_embeddings for m in chosen) else None
        result = evaluate(rows, metrics=chosen, llm=judge, embeddings=embedder,
                          skip_invalid=skip_invalid, show_progress=True, cache=store)
    except CacheError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    except (ModelError, EngineError) as exc:
        raise _fail(str(exc), EXIT_ENGINE)
    finally:
        close_judges()  # stops a vLLM server started for this run
        if store is not None:
            store.close()
    result.write_jsonl(output)  # atomic: an existing output is replaced only by a complete one
    _print_summary(result, time.perf_counter() - started)
    out.print(f"judge calls: {result.stats.judge_calls} new, {result.stats.cached} from the cache "
              f"({store.path if store is not None else 'cache off'})", highlight=False)
    out.print(f"per-sample results: {output}", highlight=False)


def _print_summary(result, seconds: float) -> None:
    table = Table(title=f"offline-eval — judge {result.judge.get('model')} ({result.judge.get('engine')})")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("scored", justify="right")
    table.add_column("no value", justify="right")
    for col in ("calls", "cached", "prompt tok", "compl. tok", "seconds"):
        table.add_column(col, justify="right")
    for name, s in result.summary().items():
        mean = "n/a" if math.isnan(s["mean"]) else f"{s['mean']:.4f}"
        m = result.stats.per_metric.get(name, {})
        table.add_row(name, mean, str(s["scored"]), str(s["no_value"]), str(m.get("judge_calls", 0)),
                      str(m.get("cached", 0)), str(m.get("prompt_tokens", 0)), str(m.get("completion_tokens", 0)),
                      f"{m.get('seconds', 0.0):.1f}")
    out.print(table)
    st = result.stats
    skipped = len({e.row.number for e in result.errors})
    out.print(f"{len(result.results)} samples scored, {skipped} skipped; {st.prompt_tokens} prompt + "
              f"{st.completion_tokens} completion tokens; {seconds:.1f} s", highlight=False)


@app.command()
def serve(
    model: str = typer.Option(..., "--model", "-m", help="A vLLM model from models.yaml."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind. Keep the loopback default unless other hosts must reach the judge."),
    port: Optional[int] = typer.Option(None, "--port", help="Default: the port of the model's base_url (so `run` finds the server), else 8000."),
) -> None:
    """Start a vLLM server for MODEL with its models.yaml settings; stop it with Ctrl-C."""
    from .engines.vllm_launch import ManagedServer, host_port, is_up

    try:
        spec = Registry.load().get(model, "judge")
    except ModelError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT)
    if spec.engine not in ("vllm", "vllm-offline"):
        raise _fail(f"{spec.name} is a {spec.engine} model; `serve` runs vLLM models only", EXIT_BAD_INPUT)
    base_url = spec.settings.get("base_url")
    port = port or (host_port(base_url)[1] if base_url else 8000)
    url = f"http://{host}:{port}/v1"
    if is_up(url):
        raise _fail(f"something already answers at {url}; stop it or pick another --port", EXIT_BAD_INPUT)
    try:
        server = ManagedServer(spec, host=host, port=port).start()
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
            engine = spec.engine if kind == "judge" else "sentence-transformers"
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


if __name__ == "__main__":
    app()
