"""HTTP to judge servers goes direct: never through a proxy named by the environment, unless asked.

httpx and urllib send requests, even to 127.0.0.1, through HTTP_PROXY / HTTPS_PROXY / ALL_PROXY when those are
set (measured with httpx 0.29), as they often are on company machines: a judge on loopback would then be
reached through the proxy, or not at all, and prompts would leave the machine. So every client of ours
ignores the environment (httpx `trust_env=False`, urllib without its proxy handler).

Set OFFLINE_EVAL_USE_PROXY=1 to reach judge servers through the environment's proxy settings instead (httpx then
also reads NO_PROXY, SSL_CERT_FILE and .netrc from it).
"""

from __future__ import annotations

import os
import urllib.request
from typing import Any, Optional

USE_PROXY_ENV = "OFFLINE_EVAL_USE_PROXY"


def trust_env() -> bool:
    """Whether to honour proxy variables (httpx's `trust_env`): only when the user asked for it."""
    return os.environ.get(USE_PROXY_ENV, "").strip().lower() in ("1", "true", "yes")


def urlopen(url: str, headers: Optional[dict[str, str]] = None, timeout: float = 2.0) -> Any:
    """urllib's urlopen, direct unless OFFLINE_EVAL_USE_PROXY is set."""
    handlers = [] if trust_env() else [urllib.request.ProxyHandler({})]
    return urllib.request.build_opener(*handlers).open(urllib.request.Request(url, headers=headers or {}),
                                                       timeout=timeout)


def bearer(api_key: Optional[str]) -> dict[str, str]:
    """The Authorization header for a server's --api-key (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
