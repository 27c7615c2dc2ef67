"""Human-labelled sets for comparing judges: the rows (metric inputs only) and, per metric, the labels.

Two formats:

- **Generic** (any file `dataset.load_rows` reads: .jsonl, .json, .csv, .tsv, .parquet): the metric input
  fields (Ragas names or their aliases) plus one label column per metric, named `<metric>_label`
  (`faithfulness_label`, `answer_accuracy_label`; metric aliases work too: `groundedness_label`). A label is
  a number: 0/1 (binary) or graded (e.g. 0/1/2 or 1-5). An empty cell or null means "not labelled for this
  metric": the row is left out of that metric's comparison.
- **BEGIN** (Dziri et al., the TSV files with columns model_name, data_source, knowledge, message, response,
  begin_label), detected by its header: knowledge -> retrieved_contexts=[knowledge], message -> user_input,
  response -> response. "Fully attributable" is 1; "Not fully attributable" and "Generic" are 0 — a generic
  response ("that sounds fun!") is not attributable to the knowledge, and BEGIN's own binary task groups it
  with the unattributable ones. The labels apply to faithfulness and response_groundedness.

Labels never reach a judge: they are kept apart from the rows, and the rows handed to `evaluate` carry only
the metric inputs and non-label columns (which `evaluate` copies to the results, never into prompts).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..dataset import DataError, Row, load_rows
from ..metrics import METRIC_ALIASES
from ..metrics.collections import ALL

LABEL_SUFFIX = "_label"
BEGIN_COLUMNS = ("model_name", "data_source", "knowledge", "message", "response", "begin_label")
BEGIN_LABELS = {"Fully attributable": 1.0, "Not fully attributable": 0.0, "Generic": 0.0}
BEGIN_METRICS = ("faithfulness", "response_groundedness")

_METRIC_NAMES = {cls.name for cls in ALL}


@dataclass
class LabelledSet:
    rows: list[Row]  # metric inputs in row.data; other non-label columns in row.extra
    labels: dict[str, list[Optional[float]]]  # metric -> one label per row (None: not labelled)
    source: str
    format: str  # "begin" or "generic"

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def metrics(self) -> list[str]:
        return list(self.labels)

    def labelled(self, metric: str) -> tuple[list[Row], np.ndarray]:
        """The rows labelled for `metric`, and their labels."""
        pairs = [(row, y) for row, y in zip(self.rows, self.labels[metric]) if y is not None]
        return [p[0] for p in pairs], np.array([p[1] for p in pairs], dtype=float)

    def subset(self, limit: Optional[int], seed: int = 0, offset: int = 0) -> "LabelledSet":
        """Rows `offset .. offset+limit` of a random order fixed by `seed` (the order pandas'
        `df.sample(frac=1, random_state=seed)` gives), so (seed, offset, limit) names a reproducible subset and
        subsets with one seed and disjoint offsets share no row. Row numbers stay those of the file."""
        if limit is None and offset == 0:
            return self
        order = np.random.RandomState(seed).permutation(len(self.rows))
        picked = order[offset:offset + limit if limit is not None else None]
        return replace(self, rows=[self.rows[i] for i in picked],
                       labels={m: [ys[i] for i in picked] for m, ys in self.labels.items()})


def load_labelled(path: str | Path) -> LabelledSet:
    """A labelled set from a BEGIN TSV (detected by its header) or a generic file with `<metric>_label`
    columns."""
    path = Path(path)
    if is_begin(path):
        return load_begin(path)
    rows = load_rows(path)
    labels: dict[str, list[Optional[float]]] = {}
    columns = {key for row in rows for key in row.extra}
    for column in sorted(columns):
        metric = label_metric(column)
        if metric is None:
            continue
        if metric in labels:
            raise DataError(f"{path}: two label columns for {metric} ({column} and another alias)")
        labels[metric] = [_label_value(row.extra.get(column), row, column) for row in rows]
    if not labels:
        known = ", ".join(sorted(_METRIC_NAMES))
        raise DataError(f"{path}: no label columns; name them <metric>{LABEL_SUFFIX} for a metric of: {known}")
    label_columns = {c for c in columns if label_metric(c)}
    clean = [replace(row, extra={k: v for k, v in row.extra.items() if k not in label_columns}) for row in rows]
    return LabelledSet(clean, labels, str(path), "generic")


def label_metric(column: str) -> Optional[str]:
    """The metric a `<metric>_label` column labels, or None if the column is not a label column."""
    if not column.endswith(LABEL_SUFFIX):
        return None
    name = column[: -len(LABEL_SUFFIX)].strip().lower()
    name = METRIC_ALIASES.get(name, name)
    return name if name in _METRIC_NAMES else None


def _label_value(value: Any, row: Row, column: str) -> Optional[float]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)  # bools, ints, floats and numeric strings ("1", "0.5")
    except (TypeError, ValueError):
        raise DataError(f"{row.where}: label '{column}' must be a number (0/1 or a graded score), "
                        f"got {value!r}") from None
    if math.isnan(number):
        return None
    return number


# ---- BEGIN ----------------------------------------------------------------------------------------------

def is_begin(path: Path) -> bool:
    """True if the file's header is BEGIN's (tab-separated, with knowledge, message, response, begin_label)."""
    if path.suffix.lower() not in (".tsv", ".csv", ".txt") or not path.is_file():
        return False
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        header = f.readline().rstrip("\r\n").split("\t")
    return {"knowledge", "message", "response", "begin_label"} <= {h.strip() for h in header}


def load_begin(path: str | Path) -> LabelledSet:
    path = Path(path)
    text = path.read_text(encoding="utf-8-sig")
    # BEGIN cells contain bare quotes: read tabs literally, with no quoting.
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    rows, labels = [], []
    for number, rec in enumerate(reader, 1):
        rec = {k.strip(): (v or "").strip() for k, v in rec.items() if k is not None}
        label = rec.get("begin_label", "")
        if label not in BEGIN_LABELS:
            raise DataError(f"{path} line {reader.line_num}: unknown begin_label {label!r}; "
                            f"expected one of {', '.join(BEGIN_LABELS)}")
        data = {"user_input": rec["message"], "retrieved_contexts": [rec["knowledge"]], "response": rec["response"]}
        extra = {k: rec[k] for k in ("model_name", "data_source") if k in rec}
        rows.append(Row(number, data, reader.line_num, extra))
        labels.append(BEGIN_LABELS[label])
    return LabelledSet(rows, {m: list(labels) for m in BEGIN_METRICS}, str(path), "begin")


def is_binary(labels: Sequence[float]) -> bool:
    return set(np.unique(np.asarray(labels, dtype=float)).tolist()) <= {0.0, 1.0}


def positive(labels: Sequence[float]) -> np.ndarray:
    """The positive class: label 1 for binary labels; for graded labels, a label strictly above the middle of
    the observed scale (0/1/2: only 2; 1-5: 4 and 5), i.e. "fully" good, as BEGIN's positive class."""
    y = np.asarray(labels, dtype=float)
    if is_binary(y):
        return y == 1.0
    return y > (y.min() + y.max()) / 2
