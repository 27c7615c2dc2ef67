"""The reviewer's labels, kept as a generic labels file (labels.py) that `offline-eval compare --labels` reads:
JSONL, one line per labelled sample with its metric inputs, one `<metric>_label` per labelled metric, and two
columns compare keeps but never shows a judge: `results_row` (the sample's row in the results file, which
ties the labels to it) and `note`.

Every change rewrites the file whole, to a temporary file that is fsynced and then renamed over the old
one, so after a crash the file is the old one or the new one, never a mix. A partial last line (a file cut
short by something else: a full disk, a copy) is tolerated on reading: the complete lines are kept."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

from ..dataset import FIELDS, DataError
from ..comparison.labels import LABEL_SUFFIX, label_metric
from .index import ResultsIndex, inputs_digest

ROW_KEY = "results_row"
NOTE_KEY = "note"
SCALES = {"rubrics_score": (1, 2, 3, 4, 5)}  # graded metrics; every other metric: 0/1 (not supported / supported)


def scale(metric: str) -> tuple[int, ...]:
    return SCALES.get(metric, (0, 1))


def default_path(results: Path) -> Path:
    return results.with_name(results.name.removesuffix(".jsonl") + ".labels.jsonl")


class LabelsStore:
    def __init__(self, path: Path, index: ResultsIndex):
        self.path = Path(path)
        self.index = index
        self.entries: dict[int, dict[str, Any]] = {}  # results row -> its line in the labels file
        self.warning: Optional[str] = None
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read the labels file {self.path}: {exc}") from None
        lines = text.split("\n")
        mismatched = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                if number == len(lines):  # no newline after it: cut short while written; its label is lost
                    self.warning = f"{self.path} line {number} is cut short; it was left out"
                    continue
                raise DataError(f"{self.path} line {number}: not valid JSON ({exc.msg})") from None
            row = entry.get(ROW_KEY) if isinstance(entry, dict) else None
            if not isinstance(row, int):
                raise DataError(f"{self.path} line {number}: no '{ROW_KEY}'; `view` reads the labels files it "
                                "writes (give a new --labels path to start one)")
            position = self.index.position(row)
            if position is None or int(self.index.digests[position]) != inputs_digest(entry):
                mismatched.append(row)
            self.entries[row] = entry
        if mismatched:
            raise DataError(f"{self.path} is not labels for {self.index.path}: {len(mismatched)} of its "
                            f"{len(self.entries)} rows (e.g. results row {mismatched[0]}) have no row with the "
                            "same inputs there. Labels from another data set? Give another --labels path.")

    def labels(self, row: int) -> dict[str, float]:
        """{metric: label} of a results row."""
        entry = self.entries.get(row, {})
        return {m: v for k, v in entry.items() if (m := label_metric(k)) and v is not None}

    def note(self, row: int) -> str:
        return self.entries.get(row, {}).get(NOTE_KEY) or ""

    def labelled_rows(self) -> set[int]:
        return {row for row in self.entries if self.labels(row)}

    def set_label(self, row: int, metric: str, value: Optional[float]) -> None:
        """Label (or with None, unlabel) `metric` of results row `row`, and save."""
        if metric not in self.index.metrics:
            raise ValueError(f"no metric {metric!r} in {self.index.path}")
        if value is not None and (not math.isfinite(value) or value not in scale(metric)):
            raise ValueError(f"a {metric} label is one of {', '.join(map(str, scale(metric)))}, not {value}")
        entry = self._entry(row)
        entry[metric + LABEL_SUFFIX] = None if value is None else int(value)  # every scale is whole numbers
        self._save()

    def set_note(self, row: int, note: str) -> None:
        self._entry(row)[NOTE_KEY] = note.strip() or None
        self._save()

    def _entry(self, row: int) -> dict[str, Any]:
        if row not in self.entries:
            position = self.index.position(row)
            if position is None:
                raise ValueError(f"no row {row} in {self.index.path}")
            record = self.index.record(position)
            self.entries[row] = {ROW_KEY: row, **{f: record[f] for f in FIELDS if f in record}}
        return self.entries[row]

    def _save(self) -> None:
        """Write-temp, fsync, rename, fsync the folder: a crash leaves the old file or the new one."""
        kept = {row: {k: v for k, v in e.items() if v is not None} for row, e in sorted(self.entries.items())}
        kept = {row: e for row, e in kept.items() if set(e) - {ROW_KEY, *FIELDS}}  # something labelled or noted
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in kept.values())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename itself durable
            folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        self.entries = kept
