"""The viewer's HTTP side: one page and a small JSON API, served by the standard library.

  GET  /                   the page (page.html)
  GET  /api/meta           files, metrics, label scales, and the row the reviewer stopped at
  GET  /api/rows           a page of rows: ?offset, limit, metric, lo, hi, failed, disagree, sort, desc
  GET  /api/sample?row=N   one sample's full records (both runs) with its labels and note
  POST /api/label          {"row", "metric", "value"} (value null unlabels); saved before the answer
  POST /api/note           {"row", "note"}
"""

from __future__ import annotations

import ipaddress
import json
import math
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

import numpy as np

from ..dataset import FIELDS, DataError
from .index import UNSURE_BELOW, Query, ResultsIndex
from .labels_store import LabelsStore, default_path, scale

PAGE = Path(__file__).with_name("page.html")
MAX_PAGE = 500
CLIP = 300  # characters of each input shown in the list; the detail shows all


@dataclass
class Viewer:
    """What the server serves: one run (and optionally a second over the same rows) and the labels."""

    a: ResultsIndex
    labels: LabelsStore
    b: Optional[ResultsIndex] = None

    def __post_init__(self) -> None:
        self.lock = threading.Lock()  # label writes one at a time

    @classmethod
    def open(cls, results: Path, results_b: Optional[Path] = None, labels: Optional[Path] = None) -> "Viewer":
        """Index the run(s) and load the labels; a DataError says what is wrong with which file."""
        a = ResultsIndex.build(results)
        b = ResultsIndex.build(results_b) if results_b is not None else None
        if b is not None and (problem := a.same_rows(b)):
            raise DataError(f"the two runs are not over the same rows: {problem}. `view A B` compares two runs of "
                            "one data set (two judges, or before and after a change)")
        return cls(a, LabelsStore(labels or default_path(Path(results)), a), b)

    def meta(self) -> dict[str, Any]:
        labelled = self.labels.labelled_rows()
        start = next((i for i, r in enumerate(self.a.rows.tolist()) if r not in labelled), 0)
        return {"source": str(self.a.path), "source_b": str(self.b.path) if self.b else None, "rows": len(self.a),
                "metrics": self.a.metrics, "scales": {m: scale(m) for m in self.a.metrics},
                "unsure_below": UNSURE_BELOW,
                "labels_path": str(self.labels.path), "labelled": len(labelled), "start": start,
                "warning": self.labels.warning}

    def rows(self, params: dict[str, str]) -> dict[str, Any]:
        query = Query(metric=params.get("metric") or None, lo=_number(params.get("lo")), hi=_number(params.get("hi")),
                      failed=params.get("failed") == "1", disagree=params.get("disagree") == "1",
                      unsure=_number(params.get("unsure")),
                      sort=params.get("sort") or "row", descending=params.get("desc") == "1")
        positions = self.a.select(query, self.b)
        offset = max(0, int(params.get("offset") or 0))
        limit = min(MAX_PAGE, max(1, int(params.get("limit") or 50)))
        page = positions[offset:offset + limit]
        return {"total": len(positions), "offset": offset,
                "rows": [self._summary(p, rec) for p, rec in zip(page.tolist(), self.a.records(page))]}

    def _summary(self, position: int, record: dict[str, Any]) -> dict[str, Any]:
        row = record["row"]
        out = {"row": row, "inputs": {f: _clip(record.get(f)) for f in FIELDS if record.get(f) is not None},
               "scores": {m: _finite(self.a.values[m][position]) for m in self.a.metrics},
               "failed": {m: int(self.a.failed[m][position]) for m in self.a.metrics},
               "confidence": {m: _finite(self.a.confidence[m][position]) for m in self.a.metrics},
               "skipped": record.get("skipped"), "labels": self.labels.labels(row), "note": self.labels.note(row)}
        if self.b is not None:
            b_position = self.b.position(row)
            out["scores_b"] = {m: _finite(self.b.values[m][b_position]) if m in self.b.values else None
                               for m in self.a.metrics}
        return out

    def sample(self, row: int) -> dict[str, Any]:
        position = self.a.position(row)
        if position is None:
            raise KeyError(row)
        return {"record": _json_safe(self.a.record(position)),
                "record_b": _json_safe(self.b.record(self.b.position(row))) if self.b else None,
                "labels": self.labels.labels(row), "note": self.labels.note(row)}

    def label(self, body: dict[str, Any]) -> dict[str, Any]:
        row, value = int(body["row"]), body.get("value")
        with self.lock:
            self.labels.set_label(row, str(body["metric"]), None if value is None else float(value))
        return {"labels": self.labels.labels(row), "labelled": len(self.labels.labelled_rows())}

    def note(self, body: dict[str, Any]) -> dict[str, Any]:
        row = int(body["row"])
        with self.lock:
            self.labels.set_note(row, str(body.get("note") or ""))
        return {"note": self.labels.note(row)}


def _number(text: Optional[str]) -> Optional[float]:
    return float(text) if text not in (None, "") else None


def _finite(value: Any) -> Optional[float]:
    value = float(value)
    return None if math.isnan(value) else value


def _json_safe(value: Any) -> Any:
    """NaN and infinities (which Python's json writes and reads) as null: a browser's JSON.parse refuses them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _clip(value: Any) -> str:
    text = "\n---\n".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= CLIP else text[:CLIP] + " …"


LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}


def make_handler(viewer: Viewer, loopback: bool) -> type[BaseHTTPRequestHandler]:
    page = PAGE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        server_version = "offline-eval-view"

        def parse_request(self) -> bool:
            """On loopback, answer only requests addressed to loopback: a web page whose own host name is
            made to resolve to 127.0.0.1 (DNS rebinding) must not read the results or change the labels."""
            if not super().parse_request():
                return False
            if loopback and urlsplit("//" + self.headers.get("Host", "")).hostname not in LOOPBACK_NAMES:
                self._send(403, b"this viewer answers requests to 127.0.0.1 or localhost only", "text/plain")
                return False
            return True

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            params = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path == "/":
                self._send(200, page, "text/html; charset=utf-8")
            elif url.path == "/api/meta":
                self._json(viewer.meta)
            elif url.path == "/api/rows":
                self._json(lambda: viewer.rows(params))
            elif url.path == "/api/sample":
                self._json(lambda: viewer.sample(int(params.get("row", ""))))
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            actions = {"/api/label": viewer.label, "/api/note": viewer.note}
            action = actions.get(urlsplit(self.path).path)
            if action is None:
                return self._send(404, b"not found", "text/plain")
            # Only the page itself posts: a JSON body is a request other sites' forms cannot make.
            if self.headers.get("Content-Type", "").split(";")[0] != "application/json":
                return self._send(415, b"expected application/json", "text/plain")
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._send(400, b"not JSON", "text/plain")
            self._json(lambda: action(body))

        def _json(self, make: Any) -> None:
            try:
                data = make()
            except KeyError as exc:
                return self._send(404, json.dumps({"error": f"not found: {exc}"}).encode(), "application/json")
            except (ValueError, TypeError) as exc:
                return self._send(400, json.dumps({"error": str(exc)}).encode(), "application/json")
            body = json.dumps(data, ensure_ascii=False, default=_plain).encode("utf-8")
            self._send(200, body, "application/json")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise here
            pass

    return Handler


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot send {type(value).__name__} as JSON")


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(viewer: Viewer, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A server bound to host:port (port 0: any free one; `server.server_address` says which)."""
    server = ThreadingHTTPServer((host, port), make_handler(viewer, is_loopback(host)))
    server.daemon_threads = True
    return server
