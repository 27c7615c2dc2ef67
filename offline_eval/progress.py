"""A rich progress bar for long runs: judge calls done / known so far, rate and ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as _Bar, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .run_state import Progress


class RichProgress(Progress):
    def __enter__(self) -> "RichProgress":
        self._bar = _Bar(
            TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TextColumn("calls"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), transient=False,
            console=Console(stderr=True),
        )
        self._bar.__enter__()
        self._task = self._bar.add_task("judging", total=0)
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def add_total(self, n: int) -> None:
        self._bar.update(self._task, total=(self._bar.tasks[0].total or 0) + n)

    def advance(self, n: int) -> None:
        self._bar.advance(self._task, n)
