"""Results files: JSONL (one JSON record per line, the `run` format) or Parquet (`row`, one float column per
metric with its value, and `record`, the same JSON record as text, so nothing is lost). Parquet needs pyarrow
(`pip install 'offline-eval[parquet]'`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

def record_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, default=json_default) + "\n"


def json_default(value: Any) -> Any:
    """json.dumps' `default` for result records: numpy values as lists and numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def results_writer(path: Path, metric_names: Sequence[str], parquet: bool = False) -> Any:
    """A writer with write(line, record) and close(): Parquet if `parquet`, else JSONL."""
    return (ParquetOut if parquet else JsonlOut)(path, metric_names)


def parquet_problem() -> str | None:
    """Why Parquet cannot be written here, or None."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return "writing .parquet needs pyarrow: pip install 'offline-eval[parquet]' (or write .jsonl)"
    return None


class JsonlOut:
    def __init__(self, path: Path, metric_names: Sequence[str]):
        self.f = open(path, "w", encoding="utf-8")

    def write(self, line: str, record: dict[str, Any]) -> None:
        self.f.write(line + "\n")

    def close(self) -> None:
        self.f.close()


class ParquetOut:
    """row, one float column per metric, and the full JSON record as text; written in row groups."""

    GROUP = 4096

    def __init__(self, path: Path, metric_names: Sequence[str]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.names = list(metric_names)
        self.schema = pa.schema([("row", pa.int64()), *[(n, pa.float64()) for n in self.names],
                                 ("record", pa.string())])
        self.writer = pq.ParquetWriter(str(path), self.schema)
        self.buffer: list[dict[str, Any]] = []

    def write(self, line: str, record: dict[str, Any]) -> None:
        metrics = record.get("metrics", {})
        self.buffer.append({"row": record["row"], **{n: metrics.get(n, {}).get("value") for n in self.names},
                            "record": line})
        if len(self.buffer) >= self.GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            self.writer.write_table(self.pa.Table.from_pylist(self.buffer, schema=self.schema))
            self.buffer = []

    def close(self) -> None:
        self._flush()
        self.writer.close()


META = ".meta.json"  # beside <output>.partial: what produced its rows


def partial_path(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


class ResultsStream:
    """A run's results file, written as the rows finish: each row's record, in row order, is appended to
    `<output>.partial` (JSONL, readable while the run goes on, and kept if the run stops) and, for a .parquet
    output, to `<output>.tmp` in row groups. `finish()` then puts the complete file in place at once
    (a rename), so an existing output is only ever replaced by a complete one; `close()` keeps the partial
    file for a later `--resume`."""

    def __init__(self, output: str | Path, metric_names: Sequence[str], parquet: Optional[bool] = None):
        self.output = Path(output)
        self.path = partial_path(self.output)
        self.meta = Path(f"{self.path}{META}")
        self.rows = 0
        parquet = self.output.suffix == ".parquet" if parquet is None else parquet
        self._tmp = self.output.with_name(self.output.name + ".tmp") if parquet else None
        self._file = open(self.path, "w", encoding="utf-8")
        self._parquet = ParquetOut(self._tmp, metric_names) if self._tmp else None

    def __call__(self, record: dict[str, Any]) -> None:
        line = record_line(record)
        self._file.write(line)
        if self._parquet is not None:
            self._parquet.write(line.rstrip("\n"), record)
        self._file.flush()  # each row readable (and kept) as soon as it is done
        self.rows += 1

    def describe(self, identity: dict[str, Any]) -> None:
        """Say beside the partial file what produces its rows (resume.run_identity), for a later --resume."""
        self.meta.write_text(json.dumps(identity, sort_keys=True, default=str), encoding="utf-8")

    def finish(self) -> None:
        self.meta.unlink(missing_ok=True)
        self._file.close()
        if self._parquet is not None:
            self._parquet.close()
            self._tmp.replace(self.output)
            self.path.unlink()
        else:
            self.path.replace(self.output)

    def close(self) -> None:
        """Stop without finishing: the partial file keeps every row written; a Parquet file in the making is
        dropped (it is unreadable before its footer)."""
        if not self._file.closed:
            self._file.close()
        if self._parquet is not None and self._tmp.exists():
            self._parquet.writer.close()
            self._tmp.unlink()
