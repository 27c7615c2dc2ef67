"""Helpers for tests that run `offline-eval run` in a subprocess and watch its judge cache."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path


def summary_calls(stdout: str) -> tuple[int, int]:
    """(new, cached) judge calls from a finished run's summary."""
    new, cached = re.search(r"judge calls: (\d+) new, (\d+) from the cache", stdout).groups()
    return int(new), int(cached)


def stored_calls(cache: Path) -> int:
    """Judge calls in a cache file, read by a separate connection (as another process sees them)."""
    try:
        with sqlite3.connect(f"file:{cache}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM judge_calls").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0
