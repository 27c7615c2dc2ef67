"""`evaluate(dataset, metrics=[...])` and its result, as in Ragas."""

from __future__ import annotations

import math
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from ..cache import open_cache
from ..dataset import FIELDS, Row, RowError, ValidationError, check_row, iter_rows, load_rows, to_sample
from ..metrics import ALL, Metric, MetricResult, metric_by_name
from ..metrics.base import Metric as _Metric
from ..judges import resolve_judge
from .long_inputs import DEFAULT_POLICY
from .state import Progress, RunStats, failed_calls
from .results_io import record_line, results_writer
from .summary import RunSummary
from .scheduler import DEFAULT_WINDOW, stream_metrics

_ALIASES = {"answer_relevance": "answer_relevancy"}
DEFAULT_CANDIDATES = [cls for cls in ALL if cls.name != "rubrics_score"]  # the default metric set, if rows have fields


def default_metrics(rows: Iterable[Row]) -> list[Metric]:
    """Every metric (but the rubric score) whose required fields some row has. Each is scored on the rows that
    have its fields; the others get no value for it ("row lacks reference"), see `validate(partial=True)`."""
    present: set[frozenset[str]] = {_filled_fields(row) for row in rows if not check_row(row, ())}
    return [cls() for cls in DEFAULT_CANDIDATES if any(set(cls.required) <= fields for fields in present)]


def _filled_fields(row: Row) -> frozenset[str]:
    """The fields the row has, present and non-empty (for a row whose fields are well typed)."""
    data = row.data
    return frozenset(f for f in FIELDS if data.get(f) is not None and (
        any(c.strip() for c in data[f]) if f == "retrieved_contexts" else data[f].strip()))


def select_metrics(metrics: Optional[Sequence[Any]], rows: Iterable[Row]) -> list[Metric]:
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


def validate(rows: Iterable[Row], metrics: Sequence[Metric], partial: bool = False) -> list[RowError]:
    """Every field error of every row. A row must have the fields of every metric, or with `partial` (the
    default metric set) those of at least one: the others then give it no value, with the reason."""
    return [e for row in rows for e in row_errors(row, metrics, partial)]


def row_errors(row: Row, metrics: Sequence[Metric], partial: bool = False) -> list[RowError]:
    """`validate` for one row."""
    required = sorted({f for m in metrics for f in m.required}, key=FIELDS.index)
    if not partial:
        return check_row(row, required)
    wrong_types = check_row(row, ())  # errors either way
    if wrong_types:
        return wrong_types
    filled = _filled_fields(row)
    return [] if any(set(m.required) <= filled for m in metrics) else check_row(row, required)


@dataclass
class Scan:
    """What one pass over the data found, keeping no rows: the metrics to score, how many rows there are, and
    their field errors (the first `kept` of them, and how many there are in all)."""

    metrics: list[Metric]
    partial: bool  # the default metric set: a row needs the fields of one metric, not of all
    rows: int = 0
    errors: list[RowError] = field(default_factory=list)
    error_count: int = 0
    bad_rows: int = 0

    def errors_of(self, row: Row) -> list[RowError]:
        return row_errors(row, self.metrics, self.partial)


SCAN_REPORT_EVERY = 10_000  # rows between two calls of scan_rows's `on_rows`


def scan_rows(dataset: Any, metrics: Optional[Sequence[Any]] = None, kept: Optional[int] = None,
              on_rows: Callable[[int], None] = lambda n: None) -> Scan:
    """Validate every row of `dataset` (read with iter_rows, one row at a time: a file of any size) before any
    judge time, and choose the metrics (default: those whose fields some row has). Raises DataError for a
    file that cannot be read and ValueError for metrics that cannot be used; the row errors are returned,
    the first `kept` of them (default: all). `on_rows(n)` hears every SCAN_REPORT_EVERY rows how many were
    read (a million-row file takes tens of seconds)."""
    if metrics is not None:
        chosen = select_metrics(metrics, ())
        scan = Scan(chosen, partial=False)
        for row in _counted(iter_rows(dataset), on_rows):
            scan.rows += 1
            _count(scan, row, row_errors(row, chosen), kept)
        return scan
    # The default set depends on every row, and a row's errors on the set: one pass finds the fields each
    # well-typed row has; a row with no metric's fields is an error whatever the set, reported once it is known.
    present: set[frozenset[str]] = set()
    fieldless: list[Row] = []  # the first `kept` of them
    fieldless_fields: Counter[frozenset[str]] = Counter()  # all of them, by the fields they do have
    scan = Scan([], partial=True)
    for row in _counted(iter_rows(dataset), on_rows):
        scan.rows += 1
        wrong_types = check_row(row, ())
        filled = frozenset() if wrong_types else _filled_fields(row)
        if not wrong_types and not any(set(cls.required) <= filled for cls in DEFAULT_CANDIDATES):
            if kept is None or len(fieldless) < kept:
                fieldless.append(row)
            fieldless_fields[filled] += 1
            scan.bad_rows += 1
            continue
        present.add(filled)
        _count(scan, row, wrong_types, kept)
    scan.metrics = [cls() for cls in DEFAULT_CANDIDATES if any(set(cls.required) <= f for f in present)]
    if not scan.metrics:
        raise ValueError("the data has none of the fields any metric needs "
                         f"({', '.join(FIELDS)}, or their aliases)")
    required = {f for m in scan.metrics for f in m.required}
    scan.error_count += sum(n * len(required - filled) for filled, n in fieldless_fields.items())
    scan.errors += [e for row in fieldless for e in row_errors(row, scan.metrics, partial=True)]
    scan.errors.sort(key=lambda e: e.row.number)  # stable: a row's errors keep their order
    if kept is not None:
        del scan.errors[kept:]
    return scan


def checked_scan(dataset: Any, metrics: Optional[Sequence[Any]], skip_invalid: bool,
                 kept: Optional[int] = None) -> Scan:
    """`scan_rows`, raising a ValidationError that lists the row errors (the first `kept`) before any judge
    time, unless `skip_invalid`."""
    scan = scan_rows(dataset, metrics, kept)
    if scan.errors and not skip_invalid:
        raise ValidationError(scan.errors)
    return scan


def _counted(rows: Iterable[Row], on_rows: Callable[[int], None]) -> Iterator[Row]:
    for n, row in enumerate(rows, 1):
        if n % SCAN_REPORT_EVERY == 0:
            on_rows(n)
        yield row


def _count(scan: Scan, row: Row, errors: list[RowError], kept: Optional[int]) -> None:
    if errors:
        scan.bad_rows += 1
        scan.error_count += len(errors)
        scan.errors.extend(errors if kept is None else errors[:max(kept - len(scan.errors), 0)])


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
    window: Optional[int] = None,
) -> "EvaluationResult":
    """Score `dataset` (a file path, list of dicts, dict of columns, DataFrame or HF Dataset) with
    `metrics` (instances or names; default: every metric whose fields some row has, each scored on the rows
    that have its fields, the others getting no value for it, with the reason "row lacks reference").
    For data too large to hold, `evaluate_iter` streams the same records without keeping them.

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

    `on_record(record)` gets each row's results record (as `records()` has it) in row order, as soon as it and
    every row before it are done: the CLI writes them to the results file while the run goes on.

    `scoring`: "probability" (from the judge's option probabilities) or "argmax" (from its answers, as Ragas)
    decides each result's `value`; both are in every result's `scores`. Default: each metric's `scoring`.
    `window`: the most samples in flight at once (scheduler.DEFAULT_WINDOW)."""
    rows = load_rows(dataset)
    scan = checked_scan(rows, metrics, skip_invalid)
    by_row: dict[int, dict[str, MetricResult]] = {}
    errors: list[RowError] = []

    def keep(row: Row, results: Optional[dict[str, MetricResult]], row_errs: list[RowError]) -> None:
        if results is not None:
            by_row[row.number] = results
        errors.extend(row_errs)
        if on_record is not None:
            on_record(row_record(row, results, [str(e) for e in row_errs] or None))

    engine, stats = score_rows(rows, scan, keep, llm=llm, embeddings=embeddings, show_progress=show_progress,
                               progress=progress, cache=cache, long_inputs=long_inputs, scoring=scoring,
                               window=window)
    return EvaluationResult(rows, by_row, [m.name for m in scan.metrics], errors, stats, engine.identity)


def evaluate_iter(dataset: Any, metrics: Optional[Sequence[Any]] = None, *, skip_invalid: bool = False,
                  **options: Any) -> Iterator[dict[str, Any]]:
    """`evaluate` for data of any size: yields each row's results record (as `EvaluationResult.records()`) in
    row order as soon as it is done, holding at most a window of samples; a file is read one row at a time
    (twice: first to validate every row, before any judge time). `options` are `evaluate`'s (llm,
    embeddings, cache, long_inputs, scoring, window, show_progress, progress). The run goes on in a worker
    thread, at most a window of records ahead of the caller; closing the iterator stops it."""
    scan = checked_scan(dataset, metrics, skip_invalid, kept=1000)
    records: queue.Queue = queue.Queue(maxsize=options.get("window") or DEFAULT_WINDOW)
    stop = threading.Event()
    done = object()

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                return records.put(item, timeout=0.1)
            except queue.Full:
                continue
        raise _Stopped

    def work() -> None:
        try:
            score_rows(dataset, scan, lambda row, res, errs: put(row_record(row, res, [str(e) for e in errs] or None)),
                       **options)
            put(done)
        except _Stopped:
            pass
        except BaseException as exc:  # re-raised in the caller's thread
            try:
                put(_Failed(exc))
            except _Stopped:
                pass

    worker = threading.Thread(target=work, name="offline-eval-run", daemon=True)
    worker.start()
    try:
        while (item := records.get()) is not done:
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        worker.join()


class _Stopped(Exception):
    """The caller closed evaluate_iter's iterator: the worker stops at its next record."""


@dataclass
class _Failed:
    exc: BaseException


def score_rows(dataset: Any, scan: Scan, on_row: Callable[[Row, Optional[dict[str, MetricResult]], list[RowError]], None],
               llm: Any = None, embeddings: Any = None, show_progress: bool = True,
               progress: Optional[Progress] = None, cache: Any = False, long_inputs: str = DEFAULT_POLICY,
               scoring: Optional[str] = None, window: Optional[int] = None,
               stats: Optional[RunStats] = None, finished: Optional[Callable[[Row], Optional[dict]]] = None,
               on_finished: Optional[Callable[[dict], None]] = None) -> tuple[Any, RunStats]:
    """Read `dataset` again, row by row, and score its valid rows with the metrics `scan` chose; calls
    `on_row(row, results, errors)` for every row in row order (results None, with its errors, for an invalid
    row). `finished(row)`: an earlier run's record of `row` (resume.FinishedRows), which is then passed to
    `on_finished(record)`, in its place in row order, instead of scoring the row again. Returns the judge
    engine and the run's stats."""
    # One judge per run: the one given, else the first metric's, else the default.
    engine = resolve_judge(llm if llm is not None else next((m.llm for m in scan.metrics if m.llm is not None),
                                                            None))
    stats = stats if stats is not None else RunStats()

    def items() -> Iterator[tuple[tuple[Row, list[RowError], Optional[dict]], Any]]:
        for row in iter_rows(dataset):
            errors = scan.errors_of(row)
            record = finished(row) if finished is not None else None
            yield (row, errors, record), None if errors or record is not None else to_sample(row)

    def report(tag: tuple[Row, list[RowError], Optional[dict]], results: Any) -> None:
        row, errors, record = tag
        if record is not None:
            on_finished(record)
        else:
            on_row(row, results, errors)

    store, owned = open_cache(cache)
    try:
        stream_metrics(items(), scan.metrics, report, judge=engine,
                       embeddings=embeddings, progress=progress, stats=stats,
                       show_progress=show_progress and progress is None, cache=store, long_inputs=long_inputs,
                       scoring=scoring, window=window, total=scan.rows)
    finally:
        if owned:
            store.close()
    return engine, stats


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
        return self.run_summary().summary()

    def run_summary(self) -> RunSummary:
        """The summary a streamed run accumulates (run/summary.py), from this result's records."""
        summary = RunSummary(self.metric_names, self.judge, self.stats)
        for record in self.records():
            summary.add(record)
        return summary

    @property
    def warnings(self) -> list[str]:
        """Rows whose contexts were truncated to fit the judge, or not scored because they did not fit (the first
        summary.MAX_WARNINGS)."""
        return self.run_summary().warnings

    @property
    def focused(self) -> int:
        """Rows whose long contexts were focused on their most relevant passages (long_inputs="focus")."""
        return self.run_summary().focused

    @property
    def scored_rows(self) -> int:
        return len(self.results)

    @property
    def skipped_rows(self) -> int:
        return len({e.row.number for e in self.errors})

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
