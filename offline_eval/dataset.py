"""Samples, column aliases, loaders and validation.

Everything the evaluator reads becomes a list of `Row`s (the raw fields of one sample, with its row number
and, for files, its line), then `SingleTurnSample`s once the fields are checked. Validation runs before any
judge call: each problem is a `RowError` that names the row, the line and the field.
"""

from __future__ import annotations

import ast
import csv
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

FIELDS = ("user_input", "retrieved_contexts", "response", "reference")
RUBRIC_KEYS = tuple(f"score{i}_description" for i in range(1, 6))  # as RubricsScore expects them

# Ragas 0.1-era names and their Ragas 0.4 equivalents.
ALIASES = {
    "question": "user_input",
    "answer": "response",
    "contexts": "retrieved_contexts",
    "ground_truth": "reference",
    "ground_truths": "reference",
}


class DataError(ValueError):
    """The data cannot be read at all (missing file, malformed line, wrong encoding)."""


@dataclass
class SingleTurnSample:
    """One RAG interaction, with Ragas 0.4's field names."""

    user_input: Optional[str] = None
    retrieved_contexts: Optional[list[str]] = None
    response: Optional[str] = None
    reference: Optional[str] = None
    rubrics: Optional[dict[str, str]] = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class Row:
    number: int  # 1-based position in the dataset
    data: dict[str, Any]
    line: Optional[int] = None  # line in the source file, where there is one
    extra: dict[str, Any] = field(default_factory=dict)  # columns we do not score, kept in the output

    @property
    def where(self) -> str:
        return f"row {self.number}" + (f" (line {self.line})" if self.line else "")


@dataclass
class RowError:
    row: Row
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.row.where}: field '{self.field}' {self.message}"


class ValidationError(ValueError):
    def __init__(self, errors: list[RowError]):
        self.errors = errors
        shown = "\n".join(f"  {e}" for e in errors[:50])
        more = f"\n  ... and {len(errors) - 50} more" if len(errors) > 50 else ""
        super().__init__(f"{len(errors)} invalid field(s):\n{shown}{more}")


# ---- loading ------------------------------------------------------------------------------------------

def load_rows(source: Any) -> list[Row]:
    """Rows from a file path (.jsonl/.json/.csv/.parquet), a list of dicts, a dict of columns, a pandas
    DataFrame, a Hugging Face Dataset, or a list of SingleTurnSample."""
    if isinstance(source, list) and source and all(isinstance(r, Row) for r in source):
        return source  # already loaded (keeps file line numbers)
    return list(iter_rows(source))


def iter_rows(source: Any) -> Iterator[Row]:
    """`load_rows` one row at a time: a .jsonl, .csv or .tsv file is read line by line and a .parquet file in
    batches, so reading a file of any size holds one row (a batch) at a time. A .json file is one document,
    read whole."""
    if isinstance(source, (str, Path)):
        return _file_rows(Path(source))
    if isinstance(source, list) and source and all(isinstance(r, Row) for r in source):
        return iter(source)
    if isinstance(source, dict):
        return _from_columns(source)
    if hasattr(source, "to_pandas") and hasattr(source, "column_names"):  # datasets.Dataset
        return _from_records(source.to_pandas().to_dict("records"))
    if hasattr(source, "to_dict") and hasattr(source, "columns"):  # pandas.DataFrame
        return _from_records(source.to_dict("records"))
    if hasattr(source, "samples"):  # EvaluationDataset
        return iter_rows(source.samples)
    if isinstance(source, Iterable):
        return _from_records(s.to_dict() if isinstance(s, SingleTurnSample) else s for s in source)
    raise DataError(f"cannot read a dataset from {type(source).__name__}")


def _from_records(records: Iterable[Any]) -> Iterator[Row]:
    return _numbered((rec, None) for rec in records)


def _numbered(pairs: Iterable[tuple[Any, Optional[int]]]) -> Iterator[Row]:
    """Rows from (record, its line in the file or None), numbered from 1."""
    for i, (rec, line) in enumerate(pairs):
        if not isinstance(rec, dict):
            where = f"row {i + 1}" + (f" (line {line})" if line else "")
            raise DataError(f"{where}: expected an object with named fields, got {type(rec).__name__}")
        yield _make_row(i + 1, rec, line)


def _from_columns(columns: dict[str, Any]) -> Iterator[Row]:
    lengths = {k: len(v) for k, v in columns.items() if isinstance(v, (list, tuple))}
    if len(lengths) != len(columns):
        bad = [k for k in columns if k not in lengths]
        raise DataError(f"a dict of columns needs a list per column; not a list: {', '.join(bad)}")
    if len(set(lengths.values())) > 1:
        raise DataError(f"columns have different lengths: {lengths}")
    n = next(iter(lengths.values()), 0)
    return _from_records({k: columns[k][i] for k in columns} for i in range(n))


def _make_row(number: int, record: dict[str, Any], line: Optional[int]) -> Row:
    data: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in record.items():
        name = ALIASES.get(key, key)
        if name in FIELDS or name == "rubrics":
            value = _plain(value)
            if key == "ground_truths" and isinstance(value, (list, tuple)):
                value = "\n".join(str(v) for v in value)
            # a canonical name wins over its alias, in whichever order the columns come
            if data.get(name) is None or (key == name and value is not None):
                data[name] = value
        else:
            extra[key] = _plain(value)
    return Row(number, data, line, extra)


def _plain(value: Any) -> Any:
    """numpy arrays and NaN cells from DataFrames and HF datasets -> plain Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


PARQUET_BATCH = 1024  # rows read from a Parquet file at a time


def _file_rows(path: Path) -> Iterator[Row]:
    """A file's rows, lazily. Whether the file exists and its type are checked at once, not when the first
    row is asked for."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_rows(path)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(path)
    if suffix == ".json":
        return _json_rows(path)
    if suffix in (".csv", ".tsv"):
        return _csv_rows(path, "\t" if suffix == ".tsv" else ",")
    raise DataError(f"{path}: unknown file type {suffix!r} (use .jsonl, .json, .csv, .tsv or .parquet)")


def _parquet_rows(path: Path) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"{path}: reading Parquet needs pyarrow ({exc})") from None
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH)
    except Exception as exc:  # pyarrow raises its own types for a file that is not Parquet
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    return _from_records(record for batch in batches for record in batch.to_pylist())


def _decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line, decoded as UTF-8 (a BOM on the first line is dropped)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path} line {number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1}); save the file as UTF-8"
                ) from None


def _jsonl_rows(path: Path) -> Iterator[Row]:
    return _numbered((json_line(path, n, line), n) for n, line in _decoded_lines(path) if line.strip())


def json_line(path: Path, number: int, line: str | bytes) -> Any:
    """One JSONL line parsed; a DataError naming the file, line and column if it is not JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None


def _json_rows(path: Path) -> Iterator[Row]:
    text = "".join(line for _, line in _decoded_lines(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(data, dict):
        return _from_columns(data)
    if isinstance(data, list):
        return _from_records(data)
    raise DataError(f"{path}: expected a list of rows or a dict of columns")


def _csv_rows(path: Path, delimiter: str) -> Iterator[Row]:
    reader = csv.DictReader((line for _, line in _decoded_lines(path)), delimiter=delimiter)

    def records() -> Iterator[tuple[dict[str, Any], int]]:
        try:
            for rec in reader:
                yield {k: _csv_cell(k, v) for k, v in rec.items() if k is not None}, reader.line_num
        except csv.Error as exc:
            raise DataError(f"{path} line {reader.line_num}: {exc}") from None

    return _numbered(records())


_CSV_LISTS = {"retrieved_contexts", "ground_truths"}  # columns that hold lists (ground_truths: joined later)


def _csv_cell(column: str, value: Optional[str]) -> Any:
    """CSV cells are strings; a contexts (or ground_truths) column may hold a JSON list, or the Python list
    repr that pandas' to_csv writes (['a', 'b'])."""
    if value is None or value == "":
        return None
    if column in _CSV_LISTS or ALIASES.get(column, column) == "retrieved_contexts":
        stripped = value.strip()
        if stripped.startswith("["):
            for parse in (json.loads, ast.literal_eval):
                try:
                    parsed = parse(stripped)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    continue
                if isinstance(parsed, list):
                    return parsed
        return [value] if ALIASES.get(column, column) == "retrieved_contexts" else value
    return value


# ---- validation ---------------------------------------------------------------------------------------

def check_row(row: Row, required: Iterable[str]) -> list[RowError]:
    """Type-check every present field and require the given ones to be present and non-empty."""
    errors = []
    data = row.data
    for name in FIELDS:
        value = data.get(name)
        if value is None:
            continue
        if name == "retrieved_contexts":
            if not isinstance(value, (list, tuple)):
                errors.append(RowError(row, name, f"must be a list of strings, got {type(value).__name__}"))
            else:
                for i, ctx in enumerate(value):
                    if not isinstance(ctx, str):
                        errors.append(RowError(row, name, f"item {i} must be a string, got {type(ctx).__name__}"))
        elif not isinstance(value, str):
            errors.append(RowError(row, name, f"must be a string, got {type(value).__name__}"))
    bad = {e.field for e in errors}
    for name in required:
        if name in bad:
            continue
        value = data.get(name)
        if value is None:
            errors.append(RowError(row, name, "is missing"))
        elif name == "retrieved_contexts" and not any(isinstance(c, str) and c.strip() for c in value):
            errors.append(RowError(row, name, "is empty"))
        elif isinstance(value, str) and not value.strip():
            errors.append(RowError(row, name, "is empty"))
    rubrics = data.get("rubrics")
    if rubrics is not None and not isinstance(rubrics, dict):
        errors.append(RowError(row, "rubrics", f"must be an object, got {type(rubrics).__name__}"))
    elif rubrics is not None and set(rubrics) != set(RUBRIC_KEYS):
        errors.append(RowError(row, "rubrics", f"must have exactly the keys {', '.join(RUBRIC_KEYS)}"))
    return errors


def to_sample(row: Row) -> SingleTurnSample:
    """The row as a sample; a field that is blank (what validation calls empty) is None, as a missing one."""
    data = row.data
    contexts = data.get("retrieved_contexts")
    return SingleTurnSample(
        user_input=_filled(data.get("user_input")),
        retrieved_contexts=([c for c in contexts if c.strip()] or None) if contexts else None,
        response=_filled(data.get("response")),
        reference=_filled(data.get("reference")),
        rubrics=data.get("rubrics"),
    )


def _filled(text: Optional[str]) -> Optional[str]:
    return text if text is None or text.strip() else None


class EvaluationDataset:
    """A list of samples, as in Ragas (`EvaluationDataset.from_list(...)`)."""

    def __init__(self, samples: list[SingleTurnSample]):
        self.samples = samples

    @classmethod
    def from_list(cls, records: list[dict[str, Any]]) -> "EvaluationDataset":
        return cls([to_sample(r) for r in load_rows(records)])

    @classmethod
    def from_pandas(cls, df: Any) -> "EvaluationDataset":
        return cls([to_sample(r) for r in load_rows(df)])

    @classmethod
    def from_hf_dataset(cls, ds: Any) -> "EvaluationDataset":
        return cls([to_sample(r) for r in load_rows(ds)])

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self):
        return iter(self.samples)
