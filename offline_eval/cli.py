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
) -> None:
    """Score DATA with the judge and print a per-metric summary."""
    from .dataset import load_rows
    from .evaluation import select_metrics, validate
    from .judges import embedding_factory, llm_factory
    from . import evaluate

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
    try:
        err.print(f"loading judge {model or Registry.load().get(None).name} ...", highlight=False)
        judge = llm_factory(model)
        embedder = embedding_factory(embeddings) if any(m.needs_embeddings for m in chosen) else None
        result = evaluate(rows, metrics=chosen, llm=judge, embeddings=embedder,
                          skip_invalid=skip_invalid, show_progress=True)
    except (ModelError, EngineError) as exc:
        raise _fail(str(exc), EXIT_ENGINE)
    result.write_jsonl(output)
    _print_summary(result, time.perf_counter() - started)
    out.print(f"per-sample results: {output}", highlight=False)


def _print_summary(result, seconds: float) -> None:
    table = Table(title=f"offline-eval — judge {result.judge.get('model')} ({result.judge.get('engine')})")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("scored", justify="right")
    table.add_column("no value", justify="right")
    for name, s in result.summary().items():
        mean = "n/a" if math.isnan(s["mean"]) else f"{s['mean']:.4f}"
        table.add_row(name, mean, str(s["scored"]), str(s["no_value"]))
    out.print(table)
    st = result.stats
    skipped = len({e.row.number for e in result.errors})
    out.print(f"{len(result.results)} samples scored, {skipped} skipped; {st.judge_calls} judge calls, "
              f"{st.prompt_tokens} prompt + {st.completion_tokens} completion tokens; {seconds:.1f} s",
              highlight=False)


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


if __name__ == "__main__":
    app()
