#!/usr/bin/env python
"""Download models.yaml's hub models on a CONNECTED host, to carry them to an air-gapped one.

    python scripts/stage_models.py --out models                      # every entry with a hub_id
    python scripts/stage_models.py --out models qwen2.5-7b-instruct bge-m3 --tar models.tar
    python scripts/stage_models.py --out models --judges-only --dry-run

Each model goes to <out>/<weights.path>/ (the layout OFFLINE_EVAL_MODELS_DIR=<out> expects), pinned to the
commit its `revision` (default main) resolves to. Only what vLLM and sentence-transformers load is fetched:
configs, tokenizers, *.safetensors (*.bin only where a folder has no safetensors), licences. Never *.py
(offline-eval does not run remote code), GGUF, ONNX/OpenVINO exports or original/ checkpoints.

Written at <out>: SHA256SUMS (`sha256sum -c SHA256SUMS` format, every staged file; each hash is also checked
against the hub's LFS sha256 where the hub gives one) and staged.json (model, kind, hub_id, revision,
commit, files, bytes). Re-running skips models already complete; an interrupted download resumes.
On the air-gapped host: `offline-eval models verify` checks the files against SHA256SUMS.

Needs: pyyaml and huggingface_hub (`pip install huggingface_hub pyyaml`), not offline-eval itself.
Gated models (Llama, Gemma): accept the licence on the hub, then set HF_TOKEN.
Exit codes: 0 all staged, 1 a download failed, 2 usage (unknown model, no hub_id).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import posixpath
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"  # before huggingface_hub is imported

import yaml

REPO_MODELS_FILE = Path(__file__).resolve().parent.parent / "models.yaml"
SUMS_FILE = "SHA256SUMS"
MANIFEST_FILE = "staged.json"

KEEP = ("*.json", "*.safetensors", "*.bin", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*",
        "LICENSE*", "NOTICE*", "README.md", "USE_POLICY.md")
SKIP_DIRS = {"original", "onnx", "openvino", "coreml", "flax_model", "tf_model", ".git"}


class StageError(Exception):
    pass


class UsageError(StageError):
    pass


@dataclass
class Entry:
    name: str
    kind: str  # "judge" or "embeddings"
    hub_id: str
    revision: str
    path: str  # weights.path: the folder under <out>


@dataclass
class RemoteFile:
    size: Optional[int]
    sha256: Optional[str]  # the hub's LFS sha256 (large files only)


def load_registry(models_file: Path) -> dict:
    try:
        return yaml.safe_load(models_file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {models_file}: {exc}") from None


def select_entries(data: dict, names: list[str], kinds: tuple[str, ...]) -> list[Entry]:
    """The named entries (case-insensitive), or every entry with a hub_id, of the given kinds."""
    entries = [(kind, name, settings or {}) for kind in kinds
               for name, settings in (data.get("judges" if kind == "judge" else "embeddings") or {}).items()]
    if not names:
        return [_entry(kind, name, s) for kind, name, s in entries if s.get("hub_id")]
    chosen = []
    for wanted in names:
        found = [(kind, name, s) for kind, name, s in entries if name.lower() == wanted.lower()]
        if not found:
            raise UsageError(f"unknown model {wanted!r}; known: {', '.join(n for _, n, _ in entries)}")
        chosen += [_entry(*e) for e in found]
    return chosen


def _entry(kind: str, name: str, settings: dict) -> Entry:
    if not settings.get("hub_id"):
        raise UsageError(f"{name} has no hub_id in models.yaml: its weights are not downloaded from a hub")
    path = (settings.get("weights") or {}).get("path")
    if not path or posixpath.isabs(path) or ".." in Path(path).parts:
        raise UsageError(f"{name}: weights.path must be a folder relative to models_dir, not {path!r}")
    return Entry(name, kind, settings["hub_id"], str(settings.get("revision") or "main"), path)


def select_files(files: list[str]) -> list[str]:
    """The repo files worth carrying: see KEEP and SKIP_DIRS. A *.bin is kept only if its folder has no
    *.safetensors, and consolidated*.safetensors (Mistral's single-file duplicate) only if it is alone."""
    kept = [f for f in files
            if not SKIP_DIRS.intersection(f.split("/")[:-1])
            and any(fnmatch.fnmatch(posixpath.basename(f), p) for p in KEEP)]
    safetensors_dirs = {posixpath.dirname(f) for f in kept if f.endswith(".safetensors")
                        and not posixpath.basename(f).startswith("consolidated")}

    def duplicate(f: str) -> bool:
        folder, base = posixpath.dirname(f), posixpath.basename(f)
        if f.endswith(".bin"):
            return folder in safetensors_dirs
        return base.startswith("consolidated") and f.endswith(".safetensors") and folder in safetensors_dirs

    return sorted(f for f in kept if not duplicate(f))


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise StageError("huggingface_hub is not installed: `pip install huggingface_hub`") from None
    return huggingface_hub


def list_repo(entry: Entry, token: Optional[str]) -> tuple[str, dict[str, RemoteFile]]:
    """(commit, {file: RemoteFile}) of the entry's revision on the hub."""
    info = _hub().HfApi().model_info(entry.hub_id, revision=entry.revision, files_metadata=True, token=token)
    files = {}
    for s in info.siblings or []:
        lfs = s.lfs or {}
        sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        files[s.rfilename] = RemoteFile(s.size, sha)
    return info.sha, files


def read_sums(out: Path) -> dict[str, str]:
    try:
        lines = (out / SUMS_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    return {name.lstrip("*"): digest for digest, _, name in (line.partition("  ") for line in lines) if name}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_sums(out: Path, sums: dict[str, str]) -> None:
    write_atomic(out / SUMS_FILE, "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items())))


def read_manifest(out: Path) -> dict:
    try:
        return json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"models": {}}


def is_complete(out: Path, entry: Entry, record: Optional[dict], sums: dict[str, str]) -> bool:
    """Staged before from the same source, and every file it listed is still there at its size."""
    if not record or (record.get("hub_id"), record.get("revision"), record.get("path")) != (
            entry.hub_id, entry.revision, entry.path):
        return False
    files = [out / name for name in sums if name.startswith(entry.path + "/")]
    return (len(files) == record.get("files") and all(f.is_file() for f in files)
            and sum(f.stat().st_size for f in files) == record.get("bytes"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def stage(entry: Entry, out: Path, token: Optional[str]) -> tuple[dict, dict[str, str]]:
    """Download one model; returns its manifest record and its SHA256SUMS lines {path under out: hex}."""
    commit, remote = list_repo(entry, token)
    files = select_files(list(remote))
    if not any(f.endswith((".safetensors", ".bin")) for f in files):
        raise StageError(f"{entry.hub_id}@{entry.revision} has no *.safetensors or *.bin weights")
    target = out / entry.path
    size = sum(remote[f].size or 0 for f in files)
    log(f"{entry.name}: {entry.hub_id}@{commit[:12]} -> {target} ({len(files)} files, {size / 1e9:.2f} GB)")
    # Pinned to the commit listed above, so the listing and the download cannot disagree.
    _hub().snapshot_download(entry.hub_id, revision=commit, local_dir=str(target), allow_patterns=files,
                             token=token)
    log(f"{entry.name}: checking sizes and sha256 of {len(files)} files")
    sums = {}
    for name in files:
        path = target / name
        if not path.is_file() or (remote[name].size is not None and path.stat().st_size != remote[name].size):
            raise StageError(f"{entry.name}: {name} is missing or incomplete after the download; run again")
        digest = sha256_file(path)
        if remote[name].sha256 and digest != remote[name].sha256:
            raise StageError(f"{entry.name}: {name} has sha256 {digest}, the hub says {remote[name].sha256}")
        sums[f"{entry.path}/{name}"] = digest
    record = {"kind": entry.kind, "hub_id": entry.hub_id, "revision": entry.revision, "commit": commit,
              "path": entry.path, "files": len(files), "bytes": sum((target / f).stat().st_size for f in files)}
    return record, sums


def dry_run(entries: list[Entry], out: Path, token: Optional[str]) -> int:
    manifest, sums, failed = read_manifest(out), read_sums(out), 0
    for entry in entries:
        if is_complete(out, entry, manifest["models"].get(entry.name), sums):
            print(f"{entry.name}: already staged in {out / entry.path}")
            continue
        try:
            commit, remote = list_repo(entry, token)
        except Exception as exc:  # noqa: BLE001 - any hub error is reported per model
            failed += 1
            log(f"error: {entry.name}: {_explain(entry, exc)}")
            continue
        files = select_files(list(remote))
        size = sum(remote[f].size or 0 for f in files)
        print(f"{entry.name}: {entry.hub_id}@{commit[:12]} -> {out / entry.path}: "
              f"{len(files)} of {len(remote)} files, {size / 1e9:.2f} GB")
        for f in files:
            print(f"    {f}  ({(remote[f].size or 0) / 1e6:.1f} MB)")
    return 1 if failed else 0


def make_tar(out: Path, tar_path: Path) -> None:
    """Pack <out> as <out.name>/... with SHA256SUMS and staged.json; no download metadata (.cache)."""
    mode = "w:gz" if tar_path.name.endswith((".tar.gz", ".tgz")) else "w"
    skip = tar_path.resolve()

    def keep(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        parts = Path(info.name).parts
        if ".cache" in parts or (out.parent / info.name).resolve() == skip or info.name.endswith(".tmp"):
            return None
        return info

    log(f"packing {out} into {tar_path} ...")
    with tarfile.open(tar_path, mode) as tar:
        tar.add(out, arcname=out.name, filter=keep)


def _explain(entry: Entry, exc: Exception) -> str:
    hint = ""
    if type(exc).__name__ in ("GatedRepoError", "RepositoryNotFoundError") or "401" in str(exc) or "403" in str(exc):
        hint = (f" (gated or private: accept the licence at https://huggingface.co/{entry.hub_id} and set "
                f"HF_TOKEN)")
    return f"{type(exc).__name__}: {exc}{hint}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="models.yaml names (default: every entry with a hub_id)")
    parser.add_argument("--out", type=Path, required=True, help="staging folder (becomes OFFLINE_EVAL_MODELS_DIR)")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--judges-only", action="store_true", help="only judges: entries under judges:")
    kind.add_argument("--embeddings-only", action="store_true", help="only embedding models")
    parser.add_argument("--tar", type=Path, help="also pack <out> into this tarball (.tar, or .tar.gz)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be downloaded, download nothing")
    parser.add_argument("--models-file", type=Path,
                        default=Path(os.environ.get("OFFLINE_EVAL_MODELS_FILE") or REPO_MODELS_FILE),
                        help="the registry to read (default: $OFFLINE_EVAL_MODELS_FILE, else the repo's models.yaml)")
    args = parser.parse_args(argv)

    kinds = ("judge",) if args.judges_only else ("embeddings",) if args.embeddings_only else ("judge", "embeddings")
    try:
        entries = select_entries(load_registry(args.models_file), args.names, kinds)
        if not entries:
            raise UsageError("no models.yaml entry with a hub_id selected")
        _hub()
    except StageError as exc:
        log(f"error: {exc}")
        return 2 if isinstance(exc, UsageError) else 1
    token = os.environ.get("HF_TOKEN") or None
    out = args.out.expanduser()
    if args.dry_run:
        return dry_run(entries, out, token)

    out.mkdir(parents=True, exist_ok=True)
    manifest, sums, failed = read_manifest(out), read_sums(out), []
    for entry in entries:
        if is_complete(out, entry, manifest["models"].get(entry.name), sums):
            log(f"{entry.name}: already staged, skipped")
            continue
        try:
            record, model_sums = stage(entry, out, token)
        except Exception as exc:  # noqa: BLE001 - report, and go on with the other models
            failed.append(entry.name)
            log(f"error: {entry.name}: {exc if isinstance(exc, StageError) else _explain(entry, exc)}")
            continue
        # Replace this model's lines; written after each model so an interruption keeps the finished ones.
        sums = {k: v for k, v in sums.items() if not k.startswith(entry.path + "/")} | model_sums
        manifest["models"][entry.name] = record
        write_sums(out, sums)
        write_atomic(out / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if failed:
        log(f"failed: {', '.join(failed)}; run again to retry (finished models are kept)")
        return 1
    if args.tar:
        make_tar(out, args.tar)
    log(f"staged {len(entries)} model(s) in {out}; on the air-gapped host: "
        f"OFFLINE_EVAL_MODELS_DIR=<copy of {out.name}> offline-eval models verify")
    return 0


if __name__ == "__main__":
    sys.exit(main())
