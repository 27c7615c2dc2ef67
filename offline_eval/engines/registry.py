"""Engines by name: builds the engine a models.yaml entry asks for."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..models import ModelSpec
from .base import Engine, EngineError


def _llamacpp(spec: ModelSpec, **options: Any) -> Engine:
    from .llamacpp import LlamaCppEngine

    settings = {k: spec.settings[k] for k in ("n_ctx", "n_threads") if k in spec.settings}
    settings.update(options)
    return LlamaCppEngine(spec.weights_path(), name=spec.name, **settings)


SERVER_MODES = ("auto", "connect", "start")


def _vllm(spec: ModelSpec, server: str = "auto", **options: Any) -> Engine:
    """A vLLM server: `base_url`, `served_model` (default: the entry's name), `max_concurrency`, `timeout`,
    `max_retries`, `backoff`, `json_mode`, `api_key_env`, plus the `vllm:` block's chat_template_kwargs; or a fleet of
    servers: `base_urls` (a list; an explicit `base_url` option overrides it).
    server="connect" uses the running server at base_url; "start" starts one for this engine on a free
    loopback port; "auto" connects if base_url answers, else starts one. A started server stops on close()."""
    from .vllm_launch import ManagedServer, is_up, json_mode_of, served_name, vllm_settings
    from .vllm_server import VllmServerEngine, api_key_from

    if server not in SERVER_MODES:
        raise EngineError(f"server must be one of {', '.join(SERVER_MODES)}, not {server!r}")
    settings = {k: spec.settings[k] for k in ("max_concurrency", "timeout", "max_retries", "backoff", "json_mode")
                if k in spec.settings}
    settings["chat_template_kwargs"] = vllm_settings(spec).get("chat_template_kwargs")
    settings["json_mode"] = json_mode_of(spec)
    settings["merge_system"] = spec.settings.get("system_role") == "merge"
    settings.update(options)
    fleet = settings.pop("base_urls", None) or spec.settings.get("base_urls")
    if fleet and "base_url" not in options:  # several servers: engines/vllm_fleet.py (connects only)
        if server == "start":
            raise EngineError(f"model {spec.name!r} names a fleet of servers (base_urls); it cannot start one")
        from .vllm_fleet import VllmFleetEngine

        settings.setdefault("api_key", api_key_from(spec.settings))
        return VllmFleetEngine(fleet, served_name(spec), name=spec.name, **settings)
    base_url = settings.pop("base_url", spec.settings.get("base_url"))
    settings.setdefault("api_key", api_key_from(spec.settings))
    managed = None
    # (a server behind --api-key answers only with its key)
    if server == "start" or (server == "auto" and not (base_url and is_up(base_url, api_key=settings["api_key"]))):
        managed = ManagedServer(spec, keep_log=False).start()  # a server for this run only: its log goes with it
        base_url = managed.url
    if not base_url:
        raise EngineError(f"model {spec.name!r} (engine vllm) needs a base_url, e.g. http://127.0.0.1:8000/v1")
    try:
        engine = VllmServerEngine(base_url, served_name(spec), name=spec.name, managed=managed, **settings)
        if settings.get("check", True):  # before any judge time: a server that ignores constraints is no judge
            engine.verify_constraints()
    except BaseException:
        if managed:
            managed.stop()
        raise
    return engine


def _vllm_offline(spec: ModelSpec, **options: Any) -> Engine:
    """vLLM in process on the entry's Hugging Face folder, with its `vllm:` settings. See vllm_offline.py."""
    from ..models import ModelError
    from .vllm_launch import vllm_settings
    from .vllm_offline import VllmOfflineEngine

    try:
        path = spec.weights_path()
    except ModelError as exc:
        raise EngineError(f"model {spec.name!r}: {exc}") from None
    vllm = vllm_settings(spec)
    settings: dict[str, Any] = {k: vllm[k] for k in ("max_model_len", "dtype", "quantization",
                                                     "tensor_parallel_size", "gpu_memory_utilization",
                                                     "enforce_eager", "chat_template_kwargs") if vllm.get(k) is not None}
    if vllm.get("structured_outputs_backend"):
        settings["backend"] = vllm["structured_outputs_backend"]
    if vllm.get("cpu_kvcache_gb") is not None:
        settings["kv_cache_gb"] = vllm["cpu_kvcache_gb"]
    settings["merge_system"] = spec.settings.get("system_role") == "merge"
    settings["trust_remote_code"] = spec.settings.get("trust_remote_code") is True
    settings.update(options)
    return VllmOfflineEngine(path, name=spec.name, **settings)


def _transformers(spec: ModelSpec, **options: Any) -> Engine:
    """transformers in process on the entry's Hugging Face folder, constrained by outlines, with its
    `transformers:` settings (chat_template_kwargs and max_model_len default to the `vllm:` block's).
    See transformers_engine.py."""
    from ..models import ModelError
    from .transformers_engine import TransformersEngine
    from .vllm_launch import vllm_settings

    try:
        path = spec.weights_path()
    except ModelError as exc:
        raise EngineError(f"model {spec.name!r}: {exc}") from None
    own = dict(spec.settings.get("transformers") or {})
    vllm = vllm_settings(spec)
    settings: dict[str, Any] = {k: vllm[k] for k in ("max_model_len", "chat_template_kwargs") if vllm.get(k) is not None}
    settings.update({k: own[k] for k in ("device", "dtype", "batch_size", "max_model_len", "chat_template_kwargs", "threads")
                     if own.get(k) is not None})
    settings["merge_system"] = spec.settings.get("system_role") == "merge"
    settings.update(options)
    return TransformersEngine(path, name=spec.name, **settings)


ENGINES: dict[str, Callable[..., Engine]] = {"llamacpp": _llamacpp, "vllm": _vllm, "vllm-offline": _vllm_offline,
                                             "transformers": _transformers}


def load_engine(spec: ModelSpec, engine: Optional[str] = None, **options: Any) -> Engine:
    """The engine for a models.yaml entry; `engine` overrides the entry's (vllm, vllm-offline and transformers
    run the same Hugging Face folder)."""
    name = engine or spec.engine
    try:
        factory = ENGINES[name]
    except KeyError:
        raise EngineError(f"model {spec.name!r}: unknown engine {name!r}; available: {', '.join(ENGINES)}") from None
    if engine and engine != spec.engine and "llamacpp" in (engine, spec.engine):
        raise EngineError(f"model {spec.name!r} is a {spec.engine} model; it cannot run on {engine} "
                          f"(llama.cpp takes GGUF files, vLLM and transformers Hugging Face folders)")
    if name != "vllm":
        options.pop("server", None)
        if {"base_url", "base_urls"} & set(options):
            raise EngineError(f"model {spec.name!r} runs on {name}; a base URL is for vLLM servers (engine vllm)")
    return factory(spec, **options)
