"""Running a coroutine from synchronous code, whether or not the calling thread already runs an event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(make())`; from inside a running loop (Jupyter, an async caller) the coroutine runs on its
    own loop in a worker thread instead, since loops cannot nest."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = asyncio.run(make())
        except BaseException as exc:  # re-raised in the caller's thread
            box["exc"] = exc

    t = threading.Thread(target=run, name="offline-eval-loop")
    t.start()
    t.join()
    if "exc" in box:
        raise box["exc"]
    return box["out"]
