"""Results files: JSONL (one JSON record per line, the `run` format) or Parquet (`row`, one float column per
metric with its value, and `record`, the same JSON record as text, so nothing is lost). Parquet needs pyarrow
(`pip install 'offline-eval[parquet]'`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


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
