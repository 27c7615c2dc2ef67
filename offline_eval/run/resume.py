"""`run --resume`: the rows an interrupted run finished are taken from its partial results file instead of
being scored again.

A run writes its records in row order to `<output>.partial` and, beside it, `<output>.partial.meta.json`
(results_io.ResultsStream): what produced them (the judge's identity, the metrics, the scoring, the
long-input policy, the data file). On `--resume` that pair is set aside as `<output>.partial.resume` before
the new run starts its own partial file; once the judge is loaded, and only if the new run's identity is the
same, the set-aside records are reused for as long as each one is the next row of the data with the same
inputs (the first that is not, or a line torn by a kill, ends the reuse: that row and every later one are
scored, the cache answering what it holds). The set-aside file is dropped when the new partial file has
caught up with it, so a resume interrupted while copying loses nothing either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from ..dataset import FIELDS, Row
from ..metrics.base import Metric
from .results_io import META

ASIDE = ".resume"
# each field of a run's identity as a message names it
IDENTITY_FIELDS = {"judge": "judge", "metrics": "metric settings", "long_inputs": "long-input policy",
                   "embeddings": "embeddings", "data": "data file", "offline_eval": "offline-eval version"}


def run_identity(judge: dict[str, Any], metrics: Sequence[Metric], long_inputs: str, data: Path,
                 embeddings: Optional[str] = None) -> dict[str, Any]:
    """What must be the same for an earlier run's records to stand for this run's: the judge, each metric's
    settings (its scoring among them), the long-input policy, the embeddings, the data file, and the package
    version (its prompts: the judge cache tells prompt changes apart, records copied from a partial file do
    not)."""
    from .. import __version__

    return {"judge": judge, "metrics": [m.config() for m in metrics], "long_inputs": long_inputs,
            "embeddings": embeddings, "data": str(Path(data).resolve()), "offline_eval": __version__}


def _lines(path: Path) -> int:
    """Complete lines (a last one torn by a kill is no record)."""
    with path.open("rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def set_aside(partial: Path) -> Optional[Path]:
    """Move `partial` (and its identity) aside for a resume, unless what is already aside holds more rows
    (a resume interrupted while copying); returns the set-aside file, or None if there is none."""
    aside = Path(f"{partial}{ASIDE}")
    if partial.exists() and (not aside.exists() or _lines(partial) >= _lines(aside)):
        partial.replace(aside)
        meta = Path(f"{partial}{META}")
        if meta.exists():
            meta.replace(Path(f"{aside}{META}"))
        else:
            Path(f"{aside}{META}").unlink(missing_ok=True)
    return aside if aside.exists() else None


class FinishedRows:
    """The set-aside records, handed out row by row: `self(row)` is the earlier record of `row` while the
    records and the rows agree, else None (from then on, always None). `changed` names what differs from
    this run's identity when it is not the same run."""

    def __init__(self, aside: Path, identity: dict[str, Any]):
        self.path = aside
        self.reused = 0
        meta = Path(f"{aside}{META}")
        try:
            before = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        now = json.loads(json.dumps(identity, sort_keys=True, default=str))
        self.same_run = before == now
        # what differs, for the message: the fields either description has (an older release's may hold
        # fields this one dropped), or all of it when unreadable
        self.changed = ([IDENTITY_FIELDS.get(k, k) for k in {**before, **now} if before.get(k) != now.get(k)]
                        if isinstance(before, dict) else ["identity (its description is missing or unreadable)"])
        self._file = aside.open(encoding="utf-8") if self.same_run else None

    def __call__(self, row: Row) -> Optional[dict[str, Any]]:
        if self._file is None:
            return None
        line = self._file.readline()
        try:
            record = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            record = None
        if (record is None or record.get("row") != row.number
                or any(record.get(f) != row.data.get(f) for f in FIELDS)):
            self._stop()
            return None
        if "metrics" not in record:  # a row skipped as invalid: validated and recorded again, cheaply
            return None
        self.reused += 1
        return record

    def _stop(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def done(self, written: int) -> None:
        """The new partial file holds `written` rows: drop the set-aside file once they cover it."""
        self._stop()
        if written >= _lines(self.path):
            self.path.unlink(missing_ok=True)
            Path(f"{self.path}{META}").unlink(missing_ok=True)
