"""Getting a judge engine and an embedder: by models.yaml name, by default, or as given.

Loaded models are kept for the life of the process, so `metric.score(...)` called in a loop loads the
judge once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .engines.base import Engine
from .models import ModelError, Registry

_loaded: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def llm_factory(model: Optional[str] = None, **options: Any) -> Engine:
    """The judge named `model` in models.yaml (default: the registry's default judge), loaded once."""
    from .engines.registry import load_engine

    spec = Registry.load().get(model, "judge")
    key = ("judge", spec.name + repr(sorted(options.items())))
    with _lock:
        if key not in _loaded:
            _loaded[key] = load_engine(spec, **options)
        return _loaded[key]


def close_judges() -> None:
    """Close every judge this process loaded (stops vLLM servers started for them)."""
    with _lock:
        engines = [v for k, v in _loaded.items() if k[0] == "judge"]
        for k in [k for k in _loaded if k[0] == "judge"]:
            del _loaded[k]
    for engine in engines:
        engine.close()


def embedding_factory(model: Optional[str] = None) -> "Embeddings":
    spec = Registry.load().get(model, "embeddings")
    key = ("embeddings", spec.name)
    with _lock:
        if key not in _loaded:
            _loaded[key] = Embeddings(spec.weights_path(), name=spec.name)
        return _loaded[key]


def resolve_judge(judge: Any) -> Engine:
    if judge is None or isinstance(judge, str):
        return llm_factory(judge)
    if hasattr(judge, "generate") and hasattr(judge, "identity"):
        return judge
    raise TypeError(f"expected a judge engine or a model name, got {type(judge).__name__}")


def resolve_embeddings(embeddings: Any) -> Any:
    if embeddings is None or isinstance(embeddings, str):
        return embedding_factory(embeddings)
    if hasattr(embeddings, "embed"):
        return embeddings
    if hasattr(embeddings, "embed_documents"):  # LangChain-style embedders
        return _DocumentEmbedder(embeddings)
    raise TypeError(f"expected embeddings or a model name, got {type(embeddings).__name__}")


class Embeddings:
    """sentence-transformers from a local folder; never touches a hub."""

    def __init__(self, path: str | Path, name: Optional[str] = None, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ModelError("embeddings need sentence-transformers: pip install 'offline-eval[cpu]'") from None
        if not Path(path).is_dir():
            raise ModelError(f"embedding model folder not found: {path}")
        self.name = name or Path(path).name
        self.identity = {"embeddings": self.name, "path": str(path)}  # keys its vectors in the judge cache
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True,
                                         trust_remote_code=False)
        threads = int(os.environ.get("OFFLINE_EVAL_THREADS", 0))
        if threads and device == "cpu":  # torch, like llama.cpp, takes every core unless told (process-wide)
            import torch

            torch.set_num_threads(threads)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False)


class _DocumentEmbedder:
    def __init__(self, inner: Any):
        self.inner = inner

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.inner.embed_documents(texts), dtype=float)
