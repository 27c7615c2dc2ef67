"""A byte-offset index of a JSONL results file: where each record starts, and only the few numbers that sort
and filter need (per metric its value, failed calls, whether a dual judge's two ratings disagree, and the
judge's confidence). The records themselves stay on disk and are read back a page at a time, so a 100k-row
file costs a few MB; the columns grow in typed arrays while the file is scanned, not in Python lists."""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..dataset import FIELDS, DataError, json_line

SORTS = ("row", "score", "diff")
UNSURE_BELOW = 0.75  # the default "low confidence" cut: some constrained answer of the metric had P(answer) < it


def confidence(entry: dict[str, Any]) -> float:
    """How sure the judge was of a metric's answers: the lowest probability it gave the answer it chose, over
    the metric's constrained choices (ratings, verdicts); NaN when no call carries probabilities (argmax-only
    engines, claim lists, rubrics)."""
    sure = [max(p.values()) for call in entry.get("judge_calls") or []
            if isinstance(p := call.get("probabilities"), dict) and p]
    return min(sure) if sure else math.nan


def inputs_digest(record: dict[str, Any]) -> int:
    """A fingerprint of a record's metric inputs: two files hold the same sample when their rows have equal
    row numbers and equal digests."""
    text = json.dumps([record.get(f) for f in FIELDS], ensure_ascii=False, sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass
class Query:
    metric: Optional[str] = None  # the metric that `lo`/`hi`, `failed`, `disagree` and the score sorts use
    lo: Optional[float] = None
    hi: Optional[float] = None
    failed: bool = False  # only rows with a failed judge call (for `metric`, or any metric without one)
    disagree: bool = False  # only rows whose two judge templates gave different ratings
    unsure: Optional[float] = None  # only rows where the judge's confidence (for `metric`, or any) is below this
    sort: str = "row"  # row, score (of `metric`) or diff (|A - B| of `metric`, with a second run)
    descending: bool = False


class ResultsIndex:
    def __init__(self, path: Path, offsets: list[int], rows: list[int], digests: list[int],
                 values: dict[str, Any], failed: dict[str, Any], disagree: dict[str, Any],
                 confidence: dict[str, Any]):
        self.path = path
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.digests = np.asarray(digests, dtype=np.uint64)
        self.metrics = list(values)
        self.values = {m: np.asarray(v, dtype=float) for m, v in values.items()}
        self.failed = {m: np.asarray(v, dtype=np.int32) for m, v in failed.items()}
        self.disagree = {m: np.asarray(v, dtype=bool) for m, v in disagree.items()}
        self.confidence = {m: np.asarray(v, dtype=float) for m, v in confidence.items()}
        self._by_row = np.argsort(self.rows, kind="stable")  # positions in row-number order, to find a row
        self._sorted_rows = self.rows[self._by_row]

    def position(self, row: int) -> Optional[int]:
        """The position of results row `row` in the file, or None if the file has no such row."""
        i = int(np.searchsorted(self._sorted_rows, row))
        if i < len(self.rows) and self._sorted_rows[i] == row:
            return int(self._by_row[i])
        return None

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def build(cls, path: str | Path) -> "ResultsIndex":
        """Scan the file once. A line that is not a results record stops with a DataError naming the line."""
        path = Path(path)
        if path.suffix.lower() == ".parquet":
            raise DataError(f"{path}: `view` reads JSONL results; write them with `run -o NAME.jsonl`")
        offsets, rows, digests = array("q"), array("q"), array("Q")
        columns: dict[str, tuple[array, ...]] = {}  # metric -> (values, failed, disagree, confidence), one per row
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
        with f:
            offset, number = 0, 0
            for raw in f:
                number += 1
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                record = _parse(path, number, raw)
                row = record["row"]
                for metric in record.get("metrics", {}):
                    if metric not in columns:  # a metric first seen here: earlier rows have no value for it
                        n = len(rows)
                        columns[metric] = (array("d", [math.nan]) * n, array("i", [0]) * n, array("b", [0]) * n,
                                           array("d", [math.nan]) * n)
                for metric, (values, failed, disagree, sure) in columns.items():
                    entry = record.get("metrics", {}).get(metric) or {}
                    value = entry.get("value")
                    values.append(float(value) if isinstance(value, (int, float)) else math.nan)
                    failed.append(int(entry.get("failed_calls") or 0))
                    ratings = (entry.get("details") or {}).get("ratings")
                    disagree.append(isinstance(ratings, list) and None not in ratings and len(set(map(str, ratings))) > 1)
                    sure.append(confidence(entry))
                offsets.append(start)
                rows.append(row)
                digests.append(inputs_digest(record))
        if not rows:
            raise DataError(f"{path} has no records: an offline-eval results file has one JSON record per row")
        _check_unique(path, np.asarray(rows, dtype=np.int64), np.asarray(offsets, dtype=np.int64))
        return cls(path, offsets, rows, digests, *({m: c[k] for m, c in columns.items()} for k in range(4)))

    def record(self, position: int) -> dict[str, Any]:
        """The full record at `position` (0-based, file order), read from disk."""
        return self.records([position])[0]

    def records(self, positions: Any) -> list[dict[str, Any]]:
        with open(self.path, "rb") as f:
            out = []
            for p in positions:
                f.seek(int(self.offsets[p]))
                out.append(json.loads(f.readline()))
            return out

    def select(self, query: Query, other: Optional["ResultsIndex"] = None) -> np.ndarray:
        """Positions matching `query`, in its order. Rows with no value sort last in either direction.
        `other` (a second run over the same rows) gives the `diff` sort."""
        metric = query.metric
        if metric is not None and metric not in self.values:
            raise ValueError(f"no metric {metric!r}; metrics: {', '.join(self.metrics)}")
        keep = np.ones(len(self), dtype=bool)
        if metric is not None and (query.lo is not None or query.hi is not None):
            values = self.values[metric]
            keep &= ~np.isnan(values)
            if query.lo is not None:
                keep &= values >= query.lo
            if query.hi is not None:
                keep &= values <= query.hi
        if query.failed:
            failed = [self.failed[metric]] if metric else list(self.failed.values())
            keep &= np.any([f > 0 for f in failed], axis=0) if failed else False
        if query.disagree:
            disagree = [self.disagree[metric]] if metric else list(self.disagree.values())
            keep &= np.any(disagree, axis=0) if disagree else False
        if query.unsure is not None:
            sure = [self.confidence[metric]] if metric else list(self.confidence.values())
            keep &= np.any([c < query.unsure for c in sure], axis=0) if sure else False  # NaN: never unsure
        positions = np.flatnonzero(keep)
        if query.sort == "row" or metric is None:
            key = self.rows[positions].astype(float)
        elif query.sort == "score":
            key = self.values[metric][positions]
        elif query.sort == "diff" and other is not None:
            key = np.abs(self.values[metric] - other.values_like(self, metric))[positions]
        else:
            raise ValueError(f"sort must be one of {', '.join(SORTS)} (diff needs a second run)")
        # NaN last either way: sort by (is NaN, key or -key), stable so ties keep file order
        order = np.lexsort((-key if query.descending else key, np.isnan(key)))
        return positions[order]

    def values_like(self, other: "ResultsIndex", metric: str) -> np.ndarray:
        """This run's values of `metric` in the row order of `other` (which holds the same rows)."""
        if metric not in self.values:
            return np.full(len(other), math.nan)
        mine = self._by_row[np.searchsorted(self._sorted_rows, other.rows)]  # same_rows() checked they all exist
        return self.values[metric][mine]

    def same_rows(self, other: "ResultsIndex") -> Optional[str]:
        """None if `other` holds the same samples (row numbers and inputs), else what differs."""
        mine = dict(zip(self.rows.tolist(), self.digests.tolist()))
        theirs = dict(zip(other.rows.tolist(), other.digests.tolist()))
        only_a, only_b = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
        changed = sorted(r for r in set(mine) & set(theirs) if mine[r] != theirs[r])
        problems = [f"{len(rows)} row(s) {what} (e.g. row {rows[0]})"
                    for rows, what in ((only_a, f"only in {self.path}"), (only_b, f"only in {other.path}"),
                                       (changed, "with different inputs")) if rows]
        return "; ".join(problems) or None


def _check_unique(path: Path, rows: np.ndarray, offsets: np.ndarray) -> None:
    """A row number twice is an error naming both lines (found after the scan, so the scan keeps no dict)."""
    order = np.argsort(rows, kind="stable")
    same = np.flatnonzero(rows[order][1:] == rows[order][:-1])
    if not len(same):
        return
    first, again = sorted(order[same[0]:same[0] + 2].tolist())
    lines = [_line_at(path, int(offsets[p])) for p in (first, again)]
    raise DataError(f"{path} line {lines[1]}: row {rows[again]} again (first on line {lines[0]})")


def _line_at(path: Path, offset: int) -> int:
    """The line number of the line starting at byte `offset`: one more than the newlines before it."""
    count, left = 1, offset
    with open(path, "rb") as f:
        while left > 0:
            block = f.read(min(left, 1 << 20))
            if not block:
                break
            count, left = count + block.count(b"\n"), left - len(block)
    return count


def _parse(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    try:
        record = json_line(path, number, raw)
    except UnicodeDecodeError:
        raise DataError(f"{path} line {number}: not valid UTF-8; results files are UTF-8 JSONL") from None
    if not isinstance(record, dict) or not isinstance(record.get("row"), int) or not (
            isinstance(record.get("metrics"), dict) or "skipped" in record):
        raise DataError(f"{path} line {number}: not an offline-eval results record (a JSON object with 'row' "
                        "and 'metrics' or 'skipped', as `offline-eval run` writes)")
    return record
