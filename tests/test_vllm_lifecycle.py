"""A vLLM server never outlives the run that started it, and servers are reached as configured: with their
API key on every request (health checks included), never through a proxy from the environment, and with
cache keys that change with every setting that changes the prompt. Real vLLM CPU server, SmolLM2.

Each server start costs ~35-60 s on 2 cores: the two `run` tests start one each, the rest share one server
behind `--api-key`.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
import yaml

from offline_eval.constraints import Choice
from offline_eval.engines.base import EngineError, JudgeOutput, JudgeRequest, Sampling
from offline_eval.engines.vllm_launch import ManagedServer, free_port, is_up
from offline_eval.models import Registry
from run_support import stored_calls
from vllm_support import BANANA, HF_ENTRY, SAMPLES, need, smollm_hf_dir

need("vllm")
need("httpx")

REPO = Path(__file__).resolve().parent.parent
KEY = "test-key-1234"
YES_NO = Choice(("yes", "no"))


# ---- the server dies with the run ------------------------------------------------------------------------
def server_processes(port: int) -> list[int]:
    """The pids of the vLLM server listening on `port` and of every process in its session (its workers)."""
    leaders = [p for p in _pids() if "vllm.entrypoints.openai.api_server" in _cmdline(p) and
               f"\0--port\0{port}\0" in _cmdline(p)]
    return [p for p in _pids() if any(_session(p) == leader for leader in leaders) and _state(p) != "Z"]


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _read(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    return _read(pid, "cmdline")


def _stat_field(pid: int, i: int) -> str:
    stat = _read(pid, "stat")
    return stat.rsplit(")", 1)[1].split()[i] if stat else ""


def _state(pid: int) -> str:
    return _stat_field(pid, 0)


def _session(pid: int) -> int:
    return int(_stat_field(pid, 3) or -1)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    smollm_hf_dir()
    data = yaml.safe_load((REPO / "models.yaml").read_text(encoding="utf-8"))
    data["judges"][HF_ENTRY]["base_url"] = f"http://127.0.0.1:{free_port()}/v1"  # nothing there
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.setenv("OFFLINE_EVAL_MODELS_FILE", str(tmp_path / "models.yaml"))
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES * 3), encoding="utf-8")
    return tmp_path


def run_until_judging(workdir: Path) -> tuple[subprocess.Popen, int, list[str]]:
    """`offline-eval run --server start`, once its server is up and the first judge calls are cached:
    (the run, the server's port, its stderr lines so far and to come)."""
    proc = subprocess.Popen([sys.executable, "-m", "offline_eval.cli", "run", "--model", HF_ENTRY, "--server",
                             "start", "--metrics", "faithfulness", "--cache", "cache.sqlite", "-o", "out.jsonl",
                             "data.jsonl"], cwd=workdir, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    deadline = time.monotonic() + float(os.environ.get("OFFLINE_EVAL_VLLM_START_TIMEOUT", 300))
    while stored_calls(workdir / "cache.sqlite") < 1:
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.1)
    url = next(line for line in lines if "starting a vLLM server" in line).split(" at ")[1].split(" ")[0]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert server_processes(port), "".join(lines)
    return proc, port, lines


def gone_within(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while server_processes(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not server_processes(port)


def test_sigterm_stops_the_run_and_its_server_and_keeps_the_cache(workdir):
    proc, port, lines = run_until_judging(workdir)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    time.sleep(0.5)  # the stderr reader's last lines
    assert proc.returncode == 143, "".join(lines)
    assert not server_processes(port)  # stopped before the run exited, workers included
    assert stored_calls(workdir / "cache.sqlite") >= 1 and "terminated (SIGTERM)" in "".join(lines)
    assert "Traceback" not in "".join(lines)


def test_a_sigkilled_run_leaves_no_server_behind(workdir):
    proc, port, lines = run_until_judging(workdir)
    proc.kill()  # no handler, no atexit: only the kernel can tell the server
    proc.wait(timeout=30)
    assert gone_within(port, 60), f"server processes left: {server_processes(port)}"
    assert not is_up(f"http://127.0.0.1:{port}/v1")


# ---- one server behind --api-key ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed():
    """A real vLLM server started with --api-key, and a models.yaml entry for it (key in $TEST_VLLM_KEY)."""
    smollm_hf_dir()
    spec = copy.deepcopy(Registry.load().get(HF_ENTRY))
    spec.settings["vllm"]["extra_args"] = ["--api-key", KEY]
    server = ManagedServer(spec, start_timeout=float(os.environ.get("OFFLINE_EVAL_VLLM_START_TIMEOUT", 300)))
    try:
        server.start()
    except Exception as exc:
        pytest.fail(f"the vLLM server did not start: {exc}")
    spec.settings.update(base_url=server.url, api_key_env="TEST_VLLM_KEY")
    os.environ["TEST_VLLM_KEY"] = KEY
    yield spec, server
    server.stop()
    os.environ.pop("TEST_VLLM_KEY", None)


def banana(**sampling) -> JudgeRequest:
    return JudgeRequest(BANANA, YES_NO, Sampling(**sampling))


def test_auto_uses_a_server_behind_an_api_key_instead_of_starting_another(keyed):
    from offline_eval.engines.registry import load_engine

    spec, server = keyed
    engine = load_engine(spec, server="auto")
    try:
        assert engine.managed is None and engine.base_url == server.url  # no second server
        assert engine.generate([banana()])[0].value in ("yes", "no")
    finally:
        engine.close()


def test_the_fleet_keeps_a_healthy_endpoint_behind_an_api_key(keyed):
    from offline_eval.engines.vllm_fleet import VllmFleetEngine

    spec, server = keyed
    fleet = VllmFleetEngine([server.url], HF_ENTRY, api_key=KEY, max_retries=0)
    # a request the server rejects (HTTP 400): the endpoint's health check says it is fine, so the error is the
    # request's own, and the endpoint stays in the fleet
    with pytest.raises(EngineError, match="rejected a request"):
        fleet.generate([banana(temperature=-1.0)])
    assert fleet.down == {}
    assert fleet.generate([banana()])[0].value in ("yes", "no")


class ConnectionRecorder:
    """A loopback listener that records every connection (a proxy that anything sent through would reach)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.seen += 1
            conn.close()


def test_a_judge_server_is_never_reached_through_a_proxy_from_the_environment(keyed, monkeypatch):
    from offline_eval.engines.registry import load_engine

    spec, server = keyed
    recorder = ConnectionRecorder()
    proxy = f"http://127.0.0.1:{recorder.port}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy", "OFFLINE_EVAL_USE_PROXY"):
        monkeypatch.delenv(name, raising=False)
    engine = load_engine(spec, server="auto")  # health check, /v1/models, then requests and token counts
    try:
        assert engine.managed is None
        assert engine.generate([banana()])[0].value in ("yes", "no")
        assert engine.count_tokens(["hello world"])[0] > 0
    finally:
        engine.close()
    assert recorder.seen == 0

    monkeypatch.setenv("OFFLINE_EVAL_USE_PROXY", "1")  # the opt-in: now the proxy is used
    assert not is_up(server.url, api_key=KEY) and recorder.seen >= 1


def test_every_setting_that_changes_the_prompt_changes_the_cache_key(keyed, tmp_path):
    from offline_eval.cache import JudgeCache
    from offline_eval.engines.registry import load_engine

    spec, _ = keyed
    request = banana()

    def engine_with(**settings):
        variant = copy.deepcopy(spec)
        variant.settings["vllm"].update(settings.pop("vllm", {}))
        variant.settings.update(settings)
        return load_engine(variant, server="connect")

    base = engine_with()
    cache = JudgeCache(tmp_path / "cache.sqlite")
    cache.put_many(base.identity, [request], [JudgeOutput(text="yes", value="yes")])
    assert cache.get_many(engine_with().identity, [request])  # the same settings hit
    variants = {"chat_template_kwargs": engine_with(vllm={"chat_template_kwargs": {"enable_thinking": False}}),
                "system_role": engine_with(system_role="merge")}
    for what, engine in variants.items():
        assert what in engine.identity
        assert cache.get_many(engine.identity, [request]) == {}, f"{what} did not change the key"
        engine.close()
    base.close()
    cache.close()


# ---- a server that ignores constraints is refused before any judge time ---------------------------------------
class IgnoringProxy:
    """The real server behind a loopback proxy that drops `structured_outputs` from every request body, as a
    server that does not know the field does (vLLM < 0.12, other OpenAI-style servers); it can also claim
    another vLLM version at /version, or answer chat completions with `reply` instead of the server's."""

    def __init__(self, upstream: str, version: Optional[str] = None, reply: Optional[bytes] = None):
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        root = upstream.removesuffix("/v1")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _relay(self, body: Optional[bytes]):
                if self.path == "/version" and version:
                    status, payload = 200, json.dumps({"version": version}).encode()
                elif self.path.endswith("/chat/completions") and reply is not None:
                    status, payload = 200, reply
                else:
                    headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                    req = urllib.request.Request(root + self.path, data=body, headers=headers, method=self.command)
                    try:
                        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120) as r:
                            status, payload = r.status, r.read()
                    except urllib.error.HTTPError as exc:
                        status, payload = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                self._relay(None)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if reply is None:
                    body.pop("structured_outputs", None)
                self._relay(json.dumps(body).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_server_that_ignores_constraints_is_an_engine_error_before_any_judge_call(keyed, tmp_path):
    from offline_eval.engines.registry import load_engine

    spec, server = keyed
    engine = load_engine(spec, server="connect")  # the real server applies them: accepted
    engine.close()
    proxy = IgnoringProxy(server.url)
    try:
        with pytest.raises(EngineError, match="ignores output constraints: asked for one of"):
            load_engine(spec, server="connect", base_url=proxy.url)
        # the CLI: exit 3, and no judge call was made
        models = yaml.safe_load((REPO / "models.yaml").read_text(encoding="utf-8"))
        models["judges"][HF_ENTRY].update(base_url=proxy.url, api_key_env="TEST_VLLM_KEY")
        (tmp_path / "models.yaml").write_text(yaml.safe_dump(models), encoding="utf-8")
        (tmp_path / "data.jsonl").write_text(json.dumps(SAMPLES[0]) + "\n", encoding="utf-8")
        run = subprocess.run([sys.executable, "-m", "offline_eval.cli", "run", "--model", HF_ENTRY, "--server", "connect", "--metrics",
                              "faithfulness", "--cache", "cache.sqlite", "data.jsonl"], cwd=tmp_path, text=True,
                             capture_output=True, timeout=300,
                             env={**os.environ, "OFFLINE_EVAL_MODELS_FILE": str(tmp_path / "models.yaml")})
        assert run.returncode == 3, run.stderr
        assert "ignores output constraints" in run.stderr and "Traceback" not in run.stderr
        assert stored_calls(tmp_path / "cache.sqlite") == 0
    finally:
        proxy.close()

    old = IgnoringProxy(server.url, version="0.10.2")
    try:
        with pytest.raises(EngineError, match=r"runs vLLM 0\.10\.2; offline-eval needs vLLM >= 0\.12"):
            load_engine(spec, server="connect", base_url=old.url)
    finally:
        old.close()


@pytest.mark.parametrize("reply", [b'{"choices": []}', b'<html>502 Bad Gateway</html>', b'{"object": "error"}'])
def test_a_malformed_server_reply_is_an_engine_error_not_a_crash(keyed, reply):
    from offline_eval.engines.registry import load_engine

    spec, server = keyed
    proxy = IgnoringProxy(server.url, reply=reply)
    try:
        engine = load_engine(spec, server="connect", base_url=proxy.url)
        with pytest.raises(EngineError, match=f"the vLLM server at {proxy.url} sent a malformed reply"):
            engine.generate([banana()])
    finally:
        proxy.close()
