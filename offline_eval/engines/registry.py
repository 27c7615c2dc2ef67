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


def _vllm(spec: ModelSpec, **options: Any) -> Engine:
    """A running vLLM server: `base_url`, `served_model` (default: the entry's name), `max_concurrency`,
    `timeout`, `max_retries`, `json_mode`, `api_key_env`. See engines/vllm_server.py."""
    from .vllm_server import VllmServerEngine, api_key_from

    settings = {k: spec.settings[k] for k in ("max_concurrency", "timeout", "max_retries", "json_mode")
                if k in spec.settings}
    settings.update(options)
    base_url = settings.pop("base_url", spec.settings.get("base_url"))
    if not base_url:
        raise EngineError(f"model {spec.name!r} (engine vllm) needs a base_url, e.g. http://127.0.0.1:8011/v1")
    model = settings.pop("served_model", spec.settings.get("served_model", spec.name))
    settings.setdefault("api_key", api_key_from(spec.settings))
    return VllmServerEngine(base_url, model, name=spec.name, **settings)


def vllm_offline_dir(spec: ModelSpec):
    """The HF folder of a vllm-offline entry: `weights:` if given, else $OFFLINE_EVAL_CACHE_DIR/hf/<hf_dir>."""
    from ..models import ModelError, cache_dir

    if spec.settings.get("weights"):
        try:
            return spec.weights_path()
        except ModelError as exc:
            raise EngineError(str(exc)) from None
    return cache_dir() / "hf" / spec.settings.get("hf_dir", spec.name)


def _vllm_offline(spec: ModelSpec, **options: Any) -> Engine:
    """vLLM in process on a Hugging Face folder. See engines/vllm_offline.py."""
    from .vllm_offline import VllmOfflineEngine

    path = vllm_offline_dir(spec)
    if not (path / "config.json").is_file():
        source = spec.settings.get("convert_from", "MODEL")
        raise EngineError(f"model {spec.name!r}: no converted Hugging Face folder at {path}; make it with "
                          f"`python scripts/convert_gguf_to_hf.py {source} --out {path}`")
    settings = {k: spec.settings[k] for k in ("max_model_len", "dtype", "kv_cache_gb", "backend")
                if k in spec.settings}
    settings.update(options)
    return VllmOfflineEngine(path, name=spec.name, **settings)


ENGINES: dict[str, Callable[..., Engine]] = {"llamacpp": _llamacpp, "vllm": _vllm, "vllm-offline": _vllm_offline}


def load_engine(spec: ModelSpec, **options: Any) -> Engine:
    try:
        factory = ENGINES[spec.engine]
    except KeyError:
        raise EngineError(
            f"model {spec.name!r} asks for engine {spec.engine!r}; available: {', '.join(ENGINES)}"
        ) from None
    return factory(spec, **options)
