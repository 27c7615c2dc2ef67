"""Security rules as tests: safe YAML only, no pickle, remote code only where a model entry asks for it, and
network code only in the vLLM client modules. (The behavioural proof of "no network" is test_air_gap.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from offline_eval.models import Registry

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(REPO / "offline_eval").rglob("*.py"), *(REPO / "scripts").rglob("*.py")])


def lines_matching(pattern: str, files=SOURCES) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(pattern, line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return found


def test_the_sources_are_found():
    assert len(SOURCES) > 20 and any(p.name == "models.py" for p in SOURCES)


def test_yaml_is_only_loaded_safely():
    assert lines_matching(r"yaml\.(load|unsafe_load|full_load|load_all)\(|yaml\.(Unsafe|Full)?Loader\b") == []
    assert lines_matching(r"yaml\.safe_load\(")  # and it is used


def test_no_pickle_and_no_unsafe_torch_load():
    assert lines_matching(r"\bimport (c?pickle|dill|shelve|marshal|joblib)\b|pickle\.loads?\(") == []
    unsafe = [line for line in lines_matching(r"torch\.load\(") if "weights_only=True" not in line]
    assert unsafe == []


def test_trust_remote_code_is_never_switched_on_in_code():
    """Every mention is either False or the model entry's own setting (the server flag: test_vllm_launch.py)."""
    mentions = lines_matching(r"trust_remote_code")
    assert mentions
    for line in mentions:
        assert re.search(r"trust_remote_code\s*=\s*False|settings\.get\(\"trust_remote_code\"\) is True", line), line


def test_the_vllm_offline_engine_gets_remote_code_only_from_its_entry(monkeypatch, tmp_path):
    from offline_eval.engines import registry as engines

    monkeypatch.setenv("OFFLINE_EVAL_MODELS_DIR", str(tmp_path))
    (tmp_path / "Phi-3.5-mini-instruct").mkdir()
    seen = {}
    monkeypatch.setattr("offline_eval.engines.vllm_offline.VllmOfflineEngine",
                        lambda path, **kwargs: seen.update(kwargs))
    spec = Registry.load().get("phi-3.5-mini-instruct")
    engines.load_engine(spec, engine="vllm-offline")
    assert seen["trust_remote_code"] is False
    spec.settings["trust_remote_code"] = "yes"  # only a YAML true counts
    engines.load_engine(spec, engine="vllm-offline")
    assert seen["trust_remote_code"] is False
    spec.settings["trust_remote_code"] = True
    engines.load_engine(spec, engine="vllm-offline")
    assert seen["trust_remote_code"] is True


@pytest.mark.parametrize("name", ["judge", "embeddings"])
def test_no_shipped_model_entry_runs_remote_code(name):
    registry = Registry.load()
    assert [n for n in registry.names(name) if registry.get(n, name).settings.get("trust_remote_code")] == []


def test_network_code_lives_only_in_the_judge_server_client_modules_and_the_viewer():
    package = sorted((REPO / "offline_eval").rglob("*.py"))
    network = (r"^\s*(import|from) (httpx|requests|urllib|socket|socketserver|http\.client|http\.server|aiohttp|"
               r"websockets|huggingface_hub|openai)\b")
    users = {line.split(":")[0] for line in lines_matching(network, package)}
    # http.py: the direct (never proxied) clients the other two use; viewer/server.py: `offline-eval view`,
    # a server on loopback unless --host says otherwise (tests/test_view.py checks it refuses other Host names)
    assert users <= {"offline_eval/engines/vllm_server.py", "offline_eval/engines/vllm_launch.py",
                     "offline_eval/engines/http.py", "offline_eval/viewer/server.py"}, users
