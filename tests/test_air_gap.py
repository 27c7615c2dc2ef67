"""Air gap: a whole `offline-eval run` (SmolLM2 judge, MiniLM embeddings) in a process where every
connection that is not loopback or a Unix socket is refused and recorded. The run must succeed without a
single attempt, with the hub-offline switches set by the CLI itself (they are removed from its environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"

# Loaded by every Python started with this folder on PYTHONPATH (site imports `sitecustomize`).
BLOCKER = r'''
import ipaddress, json, os, socket

_LOG = os.environ["AIR_GAP_LOG"]


def _record(kind, target):
    with open(_LOG, "a") as f:
        f.write(json.dumps({"kind": kind, "target": repr(target), "pid": os.getpid()}) + "\n")


def _local(host):
    if host in (None, "", "localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _check(kind, family, address):
    if family == getattr(socket, "AF_UNIX", None) or isinstance(address, (str, bytes)):
        return
    host = address[0] if isinstance(address, tuple) else address
    if not _local(host):
        _record(kind, address)
        raise OSError(101, f"air gap: {kind} to {address!r} blocked")


_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
_create_connection, _getaddrinfo = socket.create_connection, socket.getaddrinfo


def connect(self, address):
    _check("connect", self.family, address)
    return _connect(self, address)


def connect_ex(self, address):
    _check("connect_ex", self.family, address)
    return _connect_ex(self, address)


def create_connection(address, *args, **kwargs):
    _check("create_connection", None, address)
    return _create_connection(address, *args, **kwargs)


def getaddrinfo(host, *args, **kwargs):
    if not _local(host.decode() if isinstance(host, bytes) else host):
        _record("getaddrinfo", host)
        raise socket.gaierror(socket.EAI_NONAME, f"air gap: lookup of {host!r} blocked")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.create_connection, socket.getaddrinfo = create_connection, getaddrinfo
_record("loaded", None)
'''


def sealed_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")}
    # this checkout's offline_eval, whichever checkout the environment has installed
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(site), str(ROOT), env.get("PYTHONPATH")])),
               AIR_GAP_LOG=str(tmp_path / "network.log"), OFFLINE_EVAL_THREADS="1",
               OFFLINE_EVAL_CACHE_DIR=str(tmp_path / "cache"))
    return env


def log(tmp_path: Path) -> list[dict]:
    path = tmp_path / "network.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_blocker_blocks_and_records(tmp_path):
    probe = ("import socket\n"
             "for target in (('example.com', 443), ('93.184.215.14', 80)):\n"
             "    try:\n"
             "        socket.create_connection(target, timeout=2)\n"
             "    except OSError as exc:\n"
             "        print('refused:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", probe], env=sealed_env(tmp_path), capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.count("refused:") == 2, proc.stderr
    assert [e["kind"] for e in log(tmp_path)] == ["loaded", "create_connection", "create_connection"]


def test_a_full_run_makes_no_network_attempt(tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text("".join((EXAMPLES / "quickstart.jsonl").read_text(encoding="utf-8").splitlines(True)[:2]),
                    encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "offline_eval.cli", "run", "--model", "smollm2-135m-instruct", "--embeddings",
         "all-minilm-l6-v2", "--metrics", "context_relevance,answer_relevancy", str(data)],
        cwd=tmp_path, env=sealed_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    events = log(tmp_path)
    assert events and events[0]["kind"] == "loaded"  # the blocker was active in the run
    assert [e for e in events if e["kind"] != "loaded"] == [], proc.stderr
    records = [json.loads(line) for line in (tmp_path / "two.results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["metrics"]["answer_relevancy"]["value"] is not None for r in records)


def test_the_multilingual_embedders_load_from_their_packages_without_a_network_attempt(tmp_path):
    probe = ("from offline_eval import embedding_factory\n"
             "for e in (embedding_factory().for_language('zh'), embedding_factory('multilingual-e5-small')):\n"
             "    v = e.embed(['北京有哪些著名的旅游景点？', '北京值得游览的名胜古迹有哪些？', '怎样降低投资风险？'])\n"
             "    print(e.name, float(v[1] @ v[0] - v[2] @ v[0]))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=sealed_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    gaps = dict(line.split() for line in proc.stdout.splitlines())
    assert set(gaps) == {"use-multilingual-v3", "multilingual-e5-small"}  # the default for Chinese is USE
    assert all(float(gap) > 0.08 for gap in gaps.values()), gaps
    events = log(tmp_path)
    assert events and events[0]["kind"] == "loaded"
    assert [e for e in events if e["kind"] != "loaded"] == [], proc.stderr
