"""A run's summary, accumulated one results record at a time: a streamed run keeps no list of its results.

`RunSummary.add(record)` takes each row's record (`evaluation.row_record`: what the results file holds) in row
order; `summary()` is the per-metric table the CLI prints, the gate checks and `--summary-json` writes.
`EvaluationResult.summary()` is computed by the same class, so the two never disagree.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from .state import RunStats

MAX_WARNINGS = 1000  # warnings kept (each names a row); the rest are counted


class RunSummary:
    def __init__(self, metric_names: Sequence[str], judge: Optional[dict[str, Any]] = None,
                 stats: Optional[RunStats] = None):
        self.metric_names = list(metric_names)
        self.judge = judge or {}
        self.stats = stats if stats is not None else RunStats()
        self.scored_rows = 0
        self.skipped_rows = 0
        self.focused = 0  # rows judged on their most relevant passages (long_inputs="focus")
        self.warnings: list[str] = []  # the first MAX_WARNINGS: rows whose contexts were cut or did not fit
        self.more_warnings = 0
        self._totals = {name: {"sum": 0.0, "scored": 0, "no_value": 0, "failed_calls": 0}
                        for name in self.metric_names}

    def add(self, record: dict[str, Any]) -> None:
        if "metrics" not in record:
            self.skipped_rows += 1
            return
        self.scored_rows += 1
        focused = False
        for name in self.metric_names:
            result = record["metrics"][name]
            totals = self._totals[name]
            if result["value"] is None:
                totals["no_value"] += 1
            else:
                totals["sum"] += result["value"]
                totals["scored"] += 1
            totals["failed_calls"] += result["failed_calls"]
            details = result["details"]
            focused = focused or "context_focus" in details
            if "long_input" in details:
                self._warn(f"{_where(record)}: {name}: {details['long_input']}")
        self.focused += focused

    def _warn(self, warning: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(warning)
        else:
            self.more_warnings += 1

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per metric: the mean (NaN if no sample has a value), the samples with and without a value, the
        coverage (share of scored samples with a value; None without samples) and the failed judge calls."""
        out = {}
        for name, t in self._totals.items():
            rows = t["scored"] + t["no_value"]
            out[name] = {"mean": t["sum"] / t["scored"] if t["scored"] else math.nan, "scored": t["scored"],
                         "no_value": t["no_value"], "coverage": t["scored"] / rows if rows else None,
                         "failed_calls": t["failed_calls"]}
        return out


def _where(record: dict[str, Any]) -> str:
    """As dataset.Row.where."""
    return f"row {record['row']}" + (f" (line {record['line']})" if record.get("line") else "")
