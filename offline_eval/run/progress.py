"""A rich progress bar for long runs: rows done of the data's rows (when their number is known) with their
ETA, and judge calls done of those known so far (a streaming run learns its calls as its window moves, so
only the rows' ETA covers the whole run)."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress as _Bar, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from .state import Progress


class RichProgress(Progress):
    def __init__(self, rows: Optional[int] = None):
        self.rows = rows

    def __enter__(self) -> "RichProgress":
        self._bar = _Bar(
            TextColumn("{task.description:>11}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), transient=False, console=Console(stderr=True),
        )
        self._bar.__enter__()
        self._rows = self._bar.add_task("rows", total=self.rows) if self.rows else None
        self._calls = self._bar.add_task("judge calls", total=0)
        self._known_calls = 0
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def add_total(self, n: int) -> None:
        self._known_calls += n
        self._bar.update(self._calls, total=self._known_calls)

    def advance(self, n: int) -> None:
        self._bar.advance(self._calls, n)

    def rows_done(self, n: int) -> None:
        if self._rows is not None:
            self._bar.advance(self._rows, n)
