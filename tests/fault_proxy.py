"""A loopback HTTP proxy in front of a real vLLM server that injects faults into chat completions.

Every other path (/v1/models, /tokenize, /health) passes through untouched. For each chat completion the
proxy asks `fault(n)` (n counts the chat completions it received, from 1) what to do:
  None            forward it to the server
  ("status", c)   answer HTTP c without forwarding (a server error)
  ("delay", s)    wait s seconds, then forward (a slow server)
  ("hang", s)     wait s seconds and close the connection without an answer (longer than the client's
                  timeout: a timeout)
  ("drop",)       close the connection without an answer (a connection reset)
`log` records (n, action) for every chat completion, so a test can check that its faults were injected.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

Fault = Optional[tuple]


class FaultProxy:
    def __init__(self, upstream: str, fault: Callable[[int], Fault] = lambda n: None):
        """`upstream`: the server's root URL (http://127.0.0.1:PORT, without /v1)."""
        self.upstream = upstream.rstrip("/")
        self.fault = fault
        self.log: list[tuple[int, Fault]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                proxy._forward(self, None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not self.path.endswith("/chat/completions"):
                    return proxy._forward(self, body)
                with proxy._lock:
                    n = len(proxy.log) + 1
                    action = proxy.fault(n)
                    proxy.log.append((n, action))
                if action is None:
                    return proxy._forward(self, body)
                kind = action[0]
                if kind == "status":
                    payload = b'{"error": {"message": "injected fault"}}'
                    self.send_response(action[1])
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                elif kind == "delay":
                    time.sleep(action[1])
                    proxy._forward(self, body)
                elif kind == "hang":
                    time.sleep(action[1])
                    self.close_connection = True
                elif kind == "drop":
                    self.close_connection = True
                else:
                    raise ValueError(f"unknown fault {action!r}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def faults(self) -> list[tuple[int, Fault]]:
        return [(n, a) for n, a in self.log if a is not None and a[0] != "delay"]

    def _forward(self, handler: BaseHTTPRequestHandler, body: Optional[bytes]) -> None:
        headers = {k: v for k, v in handler.headers.items() if k.lower() in ("content-type", "authorization")}
        request = urllib.request.Request(self.upstream + handler.path, data=body, headers=headers,
                                         method=handler.command)
        try:
            with urllib.request.urlopen(request, timeout=600) as r:
                status, payload, kind = r.status, r.read(), r.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as exc:
            status, payload, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "application/json")
        except OSError:  # the server is gone: the client sees a reset connection, as without the proxy
            handler.close_connection = True
            return
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
