"""`evaluate(dataset, metrics=[...])` and its result, as in Ragas."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .cache import open_cache
from .dataset import FIELDS, Row, RowError, ValidationError, check_row, load_rows, to_sample
from .metrics import ALL, Metric, MetricResult, metric_by_name
from .metrics.base import Metric as _Metric
from .judges import resolve_judge
from .long_inputs import DEFAULT_POLICY
from .run_state import Progress, RunStats, failed_calls
from .scheduler import run_metrics

_ALIASES = {"answer_relevance": "answer_relevancy"}


def default_metrics(rows: Sequence[Row]) -> list[Metric]:
    """Every metric (but the rubric score) whose required fields some row has. Each is scored on the rows that
    have its fields; the others get no value for it ("row lacks reference"), see `validate(partial=True)`."""
    return [cls() for cls in ALL if cls.name != "rubrics_score" and any(_has_fields(row, cls.required)
                                                                          for row in rows)]


def _has_fields(row: Row, fields: Sequence[str]) -> bool:
    """The row has every field, present, non-empty and well typed."""
    return not check_row(row, fields)


def select_metrics(metrics: Optional[Sequence[Any]], rows: Sequence[Row]) -> list[Metric]:
    if metrics is None:
        chosen = default_metrics(rows)
        if not chosen:
            raise ValueError("the data has none of the fields any metric needs "
                             f"({', '.join(FIELDS)}, or their aliases)")
        return chosen
    chosen = [metric_by_name(m) if isinstance(m, str) else m for m in metrics]
    for m in chosen:
        if not isinstance(m, _Metric):
            raise TypeError(f"not a metric: {m!r}")
    names = [m.name for m in chosen]
    if len(set(names)) != len(names):
        raise ValueError(f"metrics listed twice: {names}")
    return chosen


def validate(rows: Sequence[Row], metrics: Sequence[Metric], partial: bool = False) -> list[RowError]:
    """Every field error of every row. A row must have the fields of every metric, or with `partial` (the
    default metric set) those of at least one: the others then give it no value, with the reason."""
    required = sorted({f for m in metrics for f in m.required}, key=FIELDS.index)
    if not partial:
        return [e for row in rows for e in check_row(row, required)]
    return [e for row in rows for e in check_row(row, ())  # wrong types are errors either way
            or ([] if any(_has_fields(row, m.required) for m in metrics) else check_row(row, required))]


def evaluate(
    dataset: Any,
    metrics: Optional[Sequence[Any]] = None,
    llm: Any = None,
    embeddings: Any = None,
    skip_invalid: bool = False,
    show_progress: bool = True,
    progress: Optional[Progress] = None,
    cache: Any = False,
    long_inputs: str = DEFAULT_POLICY,
    on_record: Optional[Callable[[dict[str, Any]], None]] = None,
    scoring: Optional[str] = None,
) -> "EvaluationResult":
    """Score `dataset` (a file path, list of dicts, dict of columns, DataFrame or HF Dataset) with
    `metrics` (instances or names; default: every metric whose fields some row has, each scored on the rows
    that have its fields, the others getting no value for it, with the reason "row lacks reference").

    Every row is validated before the first judge call. Invalid rows (one that lacks a field of a metric
    named in `metrics`, or a field of the wrong type) raise `ValidationError` listing them all, unless
    `skip_invalid`, which scores the rest and records the skipped rows in the result.

    `cache`: True (the default cache file), a path, or a `JudgeCache`: judge calls already in it are not run
    again, and new ones are stored as they finish, so rerunning an interrupted evaluation resumes it.

    `long_inputs`: "focus" (the default; "focus:N" sets the budget, 1024 tokens by default) gives a sample whose
    contexts are longer than the budget only their passages most relevant to its question, response and
    reference (`details["context_focus"]` says what was kept; `result.focused` counts such rows); contexts
    still too long for the judge's context window are cut to fit ("truncate": whole contexts, cut only for the
    window) or leave that sample without a value ("error"); either way `result.warnings` names the row.

    `on_record(record)` gets each row's results record (as `records()` has it) as soon as all its metrics are
    done, in completion order: the CLI appends them to a partial results file while the run goes on.

    `scoring`: "probability" (from the judge's option probabilities) or "argmax" (from its answers, as Ragas)
    decides each result's `value`; both are in every result's `scores`. Default: each metric's `scoring`."""
    rows, chosen, errors, good = scorable_rows(dataset, metrics, skip_invalid)
    # One judge per run: the one given, else the first metric's, else the default.
    engine = resolve_judge(llm if llm is not None else next((m.llm for m in chosen if m.llm is not None), None))
    stats = RunStats()
    store, owned = open_cache(cache)
    try:
        on_sample = None if on_record is None else lambda i, res: on_record(row_record(good[i], res))
        results = run_metrics([to_sample(r) for r in good], chosen, judge=engine, embeddings=embeddings,
                              progress=progress, stats=stats, show_progress=show_progress and progress is None,
                              cache=store, long_inputs=long_inputs, on_sample=on_sample, scoring=scoring)
    finally:
        if owned:
            store.close()
    by_row: dict[int, dict[str, MetricResult]] = {r.number: res for r, res in zip(good, results)}
    return EvaluationResult(rows, by_row, [m.name for m in chosen], errors, stats, engine.identity)


def scorable_rows(dataset: Any, metrics: Optional[Sequence[Any]], skip_invalid: bool,
                  ) -> tuple[list[Row], list[Metric], list[RowError], list[Row]]:
    """The dataset's rows, the chosen metrics, every row error, and the rows to score. Invalid rows raise a
    ValidationError listing them all, before any judge time, unless `skip_invalid`."""
    rows = load_rows(dataset)
    chosen = select_metrics(metrics, rows)
    errors = validate(rows, chosen, partial=metrics is None)
    if errors and not skip_invalid:
        raise ValidationError(errors)
    bad = {e.row.number for e in errors}
    return rows, chosen, errors, [r for r in rows if r.number not in bad]


def row_record(row: Row, results: Optional[dict[str, MetricResult]],
               errors: Optional[list[str]] = None) -> dict[str, Any]:
    """One row's JSON-ready record: its inputs, and per metric value, reason, details and raw judge outputs
    (or, for a row not scored, why)."""
    rec: dict[str, Any] = {"row": row.number, **({"line": row.line} if row.line else {}), **row.extra}
    rec.update({f: row.data.get(f) for f in FIELDS if row.data.get(f) is not None})
    if results is None:
        rec["skipped"] = errors or ["not scored"]
    else:
        rec["metrics"] = {name: {"value": r.value, "scores": r.scores, "reason": r.reason, "details": r.details,
                                 "failed_calls": len(failed_calls(r.judge_calls)), "judge_calls": r.judge_calls}
                          for name, r in results.items()}
    return rec


class EvaluationResult:
    def __init__(self, rows: list[Row], results: dict[int, dict[str, MetricResult]], metric_names: list[str],
                 errors: list[RowError], stats: RunStats, judge: dict[str, Any]):
        self.rows = rows
        self.results = results
        self.metric_names = metric_names
        self.errors = errors
        self.stats = stats
        self.judge = judge

    @property
    def scores(self) -> list[dict[str, Optional[float]]]:
        """Per scored sample: {metric: value}."""
        return [{n: res[n].value for n in self.metric_names} for res in self.results.values()]

    def values(self, name: str) -> list[Optional[float]]:
        name = _ALIASES.get(name, name)
        if name not in self.metric_names:
            raise KeyError(f"{name!r} was not evaluated; metrics: {', '.join(self.metric_names)}")
        return [res[name].value for res in self.results.values()]

    def __getitem__(self, name: str) -> float:
        """The mean over samples that have a value (NaN if none has)."""
        valid = [v for v in self.values(name) if v is not None]
        return sum(valid) / len(valid) if valid else math.nan

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per metric: the mean (NaN if no sample has a value), the samples with and without a value, the
        coverage (share of scored samples with a value; None without samples) and the failed judge calls."""
        out = {}
        for name in self.metric_names:
            values = self.values(name)
            valid = [v for v in values if v is not None]
            failed = sum(len(failed_calls(res[name].judge_calls)) for res in self.results.values())
            out[name] = {"mean": self[name], "scored": len(valid), "no_value": len(values) - len(valid),
                         "coverage": len(valid) / len(values) if values else None, "failed_calls": failed}
        return out

    @property
    def warnings(self) -> list[str]:
        """Rows whose contexts were truncated to fit the judge, or not scored because they did not fit."""
        return [f"{row.where}: {name}: {res.details['long_input']}"
                for row in self.rows for name, res in self.results.get(row.number, {}).items()
                if "long_input" in res.details]

    @property
    def focused(self) -> int:
        """Rows whose long contexts were focused on their most relevant passages (long_inputs="focus")."""
        return sum(any("context_focus" in res.details for res in self.results.get(row.number, {}).values())
                   for row in self.rows)

    def __repr__(self) -> str:
        return repr({n: round(self[n], 4) for n in self.metric_names})

    def to_pandas(self):
        import pandas as pd

        records = []
        for row in self.rows:
            res = self.results.get(row.number)
            rec = {**row.extra, **{f: row.data.get(f) for f in FIELDS if f in row.data}}
            for name in self.metric_names:
                value = res[name].value if res else None
                rec[name] = math.nan if value is None else value
            records.append(rec)
        return pd.DataFrame.from_records(records)

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready record per input row: inputs, and per metric value, reason, details and the
        raw judge outputs; skipped rows carry their validation errors instead."""
        row_errors: dict[int, list[str]] = {}
        for e in self.errors:
            row_errors.setdefault(e.row.number, []).append(str(e))
        return [row_record(row, self.results.get(row.number), row_errors.get(row.number)) for row in self.rows]

    def write(self, path: str | Path, parquet: Optional[bool] = None) -> None:
        """The per-row records, atomically, in row order: Parquet (results_io.py) for a .parquet path or with
        `parquet`, else JSONL."""
        from .results_io import results_writer

        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        out = results_writer(tmp, self.metric_names, parquet=path.suffix == ".parquet" if parquet is None else parquet)
        try:
            for rec in self.records():
                out.write(record_line(rec).rstrip("\n"), rec)
        finally:
            out.close()
        tmp.replace(path)

    def write_jsonl(self, path: str | Path) -> None:
        self.write(path, parquet=False)


def record_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, default=json_default) + "\n"


class PartialResults:
    """`<output>.partial`: each row's record appended (and flushed) as soon as the row is done, so a long run's
    finished rows can be read, and survive, before the run ends. Removed once the complete output is written
    (which is written whole, atomically, in row order)."""

    def __init__(self, output: str | Path):
        self.path = Path(output).with_name(Path(output).name + ".partial")
        self.rows = 0
        self._file = open(self.path, "w", encoding="utf-8")

    def __call__(self, record: dict[str, Any]) -> None:
        self._file.write(record_line(record))
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        self._file.close()

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def json_default(value: Any) -> Any:
    """json.dumps' `default` for result records: numpy values as lists and numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
