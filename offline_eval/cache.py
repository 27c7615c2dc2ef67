"""A persistent judge-call cache: SQLite (WAL), one row per successful judge call, stored as JSON text.

The key is the sha256 of the judge's identity (model name, weights path or served model and base_url,
engine kind) and the request's own key (messages, constraint, temperature, seed, max_tokens). The model is
part of the key on purpose: two judges asked the same question must not share answers.

Only outputs with a value are stored: a failed call (value None) is retried by the next run. The scheduler
commits each call as it returns (a whole batch for vLLM in process), so a killed run loses only its calls in
flight, and rerunning with the cache on resumes where it stopped. `offline-eval cache info|prune` inspects
and trims the file (per judge, by age).

Sentence embeddings are kept beside the judge calls (table `embeddings`, keyed by the embedding model's
identity and the text, float32), so a warm rerun computes no model output at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from .engines.base import JudgeOutput, JudgeRequest
from .models import cache_dir

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_calls (
    key TEXT PRIMARY KEY,       -- sha256 of (judge identity, request key)
    judge TEXT NOT NULL,        -- the judge identity as canonical JSON, for inspection and pruning
    output TEXT NOT NULL,       -- the JudgeOutput fields as JSON
    created REAL NOT NULL
)
"""
_VECTORS = """
CREATE TABLE IF NOT EXISTS embeddings (
    key TEXT PRIMARY KEY,       -- sha256 of (embedding model identity, text)
    vector BLOB NOT NULL,       -- float32, native byte order
    created REAL NOT NULL
)
"""


class CacheError(RuntimeError):
    """The cache file cannot be used (not a SQLite database, locked, unwritable)."""


def default_path() -> Path:
    """$OFFLINE_EVAL_JUDGE_CACHE, else judge-cache.sqlite in the cache dir (next to assembled weights)."""
    return Path(os.environ.get("OFFLINE_EVAL_JUDGE_CACHE") or cache_dir() / "judge-cache.sqlite").expanduser()


def identity_json(identity: dict[str, Any]) -> str:
    return json.dumps(identity, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def cache_key(identity: dict[str, Any], request: JudgeRequest) -> str:
    return _key(identity_json(identity), request.key)


def _key(judge: str, request_key: str) -> str:
    return hashlib.sha256(f"{judge}\n{request_key}".encode()).hexdigest()


class JudgeCache:
    """The cache at `path`. `timeout`: seconds to wait for another process's write lock."""

    def __init__(self, path: str | Path | None = None, timeout: float = 30.0):
        self.path = Path(path) if path is not None else default_path()
        self.timeout = timeout
        self._lock = threading.Lock()  # one connection, shared by the threads of this process
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the judge cache folder {self.path.parent}: {exc}") from None
        with self._errors():
            self._db = sqlite3.connect(self.path, timeout=timeout, check_same_thread=False)
            try:
                self._open()
            except BaseException:
                self._db.close()
                raise

    def _open(self) -> None:
        # WAL: readers never block the writer or each other. synchronous=NORMAL: a commit survives the
        # process being killed (only an OS crash or power loss can take the last ones), and costs ~40 us
        # instead of ~400 us with an fsync each (measured here), so every judge call can be its own commit.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise CacheError(f"the judge cache {self.path} has schema version {version}, this offline-eval "
                             f"uses {SCHEMA_VERSION}: delete the file or pass another --cache path")
        with self._db:
            if version == 0:
                self._db.execute(_SCHEMA)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute(_VECTORS)  # added within schema version 1: older files just gain the table

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite errors as CacheErrors that say what to do."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise CacheError(f"the judge cache {self.path} is locked by another process (waited "
                                 f"{self.timeout:g} s); wait for it, or pass --cache with another path or "
                                 "--no-cache") from None
            raise CacheError(f"cannot use the judge cache {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise CacheError(f"the judge cache {self.path} is not a usable SQLite database ({exc}); delete it, "
                             "or pass --cache with another path or --no-cache") from None

    def get_many(self, identity: dict[str, Any], requests: Sequence[JudgeRequest]) -> dict[str, JudgeOutput]:
        """Cached outputs by request key (JudgeRequest.key), for the requests that have one."""
        judge = identity_json(identity)
        keys = {_key(judge, k): k for k in (r.key for r in requests)}  # JudgeRequest.key hashes: once each
        return {keys[key]: _output(json.loads(output)) for key, output in self._select("judge_calls", "output", keys)}

    def put_many(self, identity: dict[str, Any], requests: Sequence[JudgeRequest],
                 outputs: Sequence[JudgeOutput]) -> int:
        """Store the successful outputs and commit; returns how many were stored."""
        judge, now = identity_json(identity), time.time()
        rows = [(_key(judge, r.key), judge, _row(o), now) for r, o in zip(requests, outputs)
                if o.value is not None]
        if rows:
            with self._lock, self._errors(), self._db:
                self._db.executemany("INSERT OR REPLACE INTO judge_calls VALUES (?, ?, ?, ?)", rows)
        return len(rows)

    def get_vectors(self, identity: dict[str, Any], texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Cached embeddings by text, for the texts that have one."""
        model = identity_json(identity)
        keys = {_key(model, t): t for t in texts}
        return {keys[key]: np.frombuffer(blob, dtype=np.float32) for key, blob in self._select("embeddings", "vector", keys)}

    def _select(self, table: str, column: str, keys: Sequence[str]) -> list[tuple[str, Any]]:
        """(key, column) of the rows of `table` whose key is one of `keys`."""
        keys = list(keys)
        found: list[tuple[str, Any]] = []
        with self._lock, self._errors():
            for start in range(0, len(keys), 500):  # stay under SQLite's bound-parameter limit
                part = keys[start:start + 500]
                found += self._db.execute(
                    f"SELECT key, {column} FROM {table} WHERE key IN ({','.join('?' * len(part))})", part).fetchall()
        return found

    def put_vectors(self, identity: dict[str, Any], texts: Sequence[str], vectors: Sequence[np.ndarray]) -> None:
        model, now = identity_json(identity), time.time()
        rows = [(_key(model, t), np.asarray(v, dtype=np.float32).tobytes(), now) for t, v in zip(texts, vectors)]
        if rows:
            with self._lock, self._errors(), self._db:
                self._db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?)", rows)

    def count(self) -> int:
        """How many judge calls the cache holds."""
        with self._lock, self._errors():
            return self._db.execute("SELECT COUNT(*) FROM judge_calls").fetchone()[0]

    def judges(self) -> list[dict[str, Any]]:
        """Per judge identity: its calls and when the oldest and newest were stored (epoch seconds)."""
        with self._lock, self._errors():
            rows = self._db.execute("SELECT judge, COUNT(*), MIN(created), MAX(created) FROM judge_calls "
                                    "GROUP BY judge ORDER BY MAX(created) DESC").fetchall()
        return [{"judge": json.loads(j), "calls": n, "oldest": lo, "newest": hi} for j, n, lo, hi in rows]

    def vector_count(self) -> int:
        with self._lock, self._errors():
            return self._db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]

    def prune(self, judges: Optional[Sequence[dict[str, Any]]] = None, before: Optional[float] = None,
              vectors: bool = False) -> tuple[int, int]:
        """Delete the judge calls of `judges` (identities as `judges()` lists them; None: every judge) stored
        before `before` (epoch seconds; None: whenever), and with `vectors` the embeddings stored before
        `before` too; then give the space back to the file system. Returns (calls, vectors) deleted."""
        where, args = [], []
        if judges is not None:
            where.append(f"judge IN ({','.join('?' * len(judges))})")
            args += [identity_json(j) for j in judges]
        if before is not None:
            where.append("created < ?")
            args.append(before)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._lock, self._errors():
            with self._db:
                calls = self._db.execute(f"DELETE FROM judge_calls{clause}", args).rowcount if judges != [] else 0
                removed = self._db.execute("DELETE FROM embeddings" + ("" if before is None else " WHERE created < ?"),
                                           [] if before is None else [before]).rowcount if vectors else 0
            self._db.execute("VACUUM")
        return calls, removed

    def close(self) -> None:
        db, self._db = getattr(self, "_db", None), None
        if db is not None:
            db.close()

    def __enter__(self) -> "JudgeCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_cache(cache: Any) -> tuple[Optional[JudgeCache], bool]:
    """`evaluate`'s cache argument as (cache or None, whether the caller must close it)."""
    if cache is None or cache is False:
        return None, False
    if isinstance(cache, JudgeCache):
        return cache, False
    return JudgeCache(None if cache is True else cache), True


def _row(output: JudgeOutput) -> str:
    return json.dumps({"text": output.text, "value": output.value, "prompt_tokens": output.prompt_tokens,
                       "completion_tokens": output.completion_tokens, "finish_reason": output.finish_reason,
                       "probabilities": output.probabilities, "meta": output.meta}, ensure_ascii=False, default=str)


def _output(data: dict[str, Any]) -> JudgeOutput:
    return JudgeOutput(text=data["text"], value=data["value"], prompt_tokens=data["prompt_tokens"],
                       completion_tokens=data["completion_tokens"], finish_reason=data["finish_reason"],
                       probabilities=data.get("probabilities"), meta={**data.get("meta", {}), "cached": True})
