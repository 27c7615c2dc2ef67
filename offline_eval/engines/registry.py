"""Engines by name: builds the engine a models.yaml entry asks for."""

from __future__ import annotations

from typing import Any, Callable

from ..models import ModelSpec
from .base import Engine, EngineError


def _llamacpp(spec: ModelSpec, **options: Any) -> Engine:
    from .llamacpp import LlamaCppEngine

    settings = {k: spec.settings[k] for k in ("n_ctx", "n_threads") if k in spec.settings}
    settings.update(options)
    return LlamaCppEngine(spec.weights_path(), name=spec.name, **settings)


ENGINES: dict[str, Callable[..., Engine]] = {"llamacpp": _llamacpp}


def load_engine(spec: ModelSpec, **options: Any) -> Engine:
    try:
        factory = ENGINES[spec.engine]
    except KeyError:
        raise EngineError(
            f"model {spec.name!r} asks for engine {spec.engine!r}; available: {', '.join(ENGINES)}"
        ) from None
    return factory(spec, **options)
