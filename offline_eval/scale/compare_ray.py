"""`offline-eval compare --ray`: each judge scored by its own replicas on a Ray cluster (ray_run.py).

Judges run one after another. Each judge's replicas are placed on the cluster, score that judge's labelled
rows and are released before the next judge's load, so every judge has the cluster's resources to itself and
no two judges share a GPU. Metrics labelled on the same rows (BEGIN: faithfulness and groundedness) are
scored by one Ray run, so replicas load once per judge. The labels stay on the driver; replicas see the
metric inputs only.

What differs from a local compare: latency is the judge's wall time on the cluster per row (all replicas
together), `load_seconds` is the Ray run's time outside scoring (placing and loading the replicas), and the
memory reported is the largest resident size of one replica with its child processes (vLLM's engine core)
after a block. Block parts (and so resume) live under <output dir>/<judge>.ray/.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..comparison.compare import CompareSettings, JudgeRun, MetricRun, check_inputs, choose_metrics, weights_size
from ..comparison.labels import LabelledSet
from ..metrics import metric_by_name


@dataclass
class RayPlacement:
    address: Optional[str] = None  # None: an already connected Ray, else $RAY_ADDRESS, else a local instance
    replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: Optional[float] = None  # default: the model's tensor_parallel_size on a GPU cluster, else 0
    block_rows: int = 64
    engine_options: Optional[dict[str, Any]] = None


def run_judges_on_ray(labelled: LabelledSet, models: Sequence[str], settings: CompareSettings, placement: RayPlacement,
                      work_dir: Path, embeddings: Optional[str] = None,
                      on_judge: Callable[[str], None] = lambda name: None) -> list[JudgeRun]:
    """Each judge in turn, on the whole cluster."""
    if settings.reruns:
        raise ValueError("--reruns is not supported with --ray: a rerun on Ray resumes from the first run's "
                         "blocks; measure rerun stability with a local compare")
    metrics = choose_metrics(labelled, settings.metrics)
    check_inputs(labelled, metrics)
    return [_run_judge(name, labelled, metrics, placement, work_dir, embeddings, on_judge) for name in models]


def _run_judge(name: str, labelled: LabelledSet, metrics: Sequence[str], placement: RayPlacement, work_dir: Path,
               embeddings: Optional[str], on_judge: Callable[[str], None]) -> JudgeRun:
    from .ray_run import evaluate_on_ray

    on_judge(name)
    runs: dict[str, MetricRun] = {}
    identity: dict[str, Any] = {}
    load_seconds, peak = 0.0, 0
    for group in _same_rows(labelled, metrics):
        rows, _ = labelled.labelled(group[0])
        tic = time.perf_counter()
        result = evaluate_on_ray(
            rows, [metric_by_name(m) for m in group], name, placement.replicas, output=work_dir /
            f"{_slug(name)}.ray" / f"{'+'.join(group)}.jsonl", num_cpus=placement.num_cpus, num_gpus=placement.num_gpus,
            embeddings=embeddings, engine_options=placement.engine_options, block_rows=placement.block_rows,
            address=placement.address)
        wall = time.perf_counter() - tic
        new = [b for b in result.blocks if not b.get("reused")]
        # from the first new block's start to the last one's end (0 when every block came from an earlier run)
        scoring = max(b["finished"] for b in new) - min(b["finished"] - b["seconds"] for b in new) if new else 0.0
        load_seconds += max(wall - scoring, 0.0)
        peak = max([peak, *(b.get("rss") or 0 for b in new)])
        identity = dict(result.judge)
        records = result.records()
        for metric in group:
            # each metric is charged its share of the scoring time, by its own engine time in the blocks
            share = _share(new, metric, group)
            runs[metric] = MetricRun([result.results[row.number][metric] for row in rows], scoring * share,
                                     records)
    memory = {"peak_rss": peak or None, "scope": "replica",
              "note": f"one Ray replica with its child processes, the largest of {placement.replicas}"}
    return JudgeRun(name, identity, weights_size(name, identity), load_seconds, memory, runs)


def _same_rows(labelled: LabelledSet, metrics: Sequence[str]) -> list[list[str]]:
    """The metrics grouped by the rows they are labelled on, in the given order."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for metric in metrics:
        rows, _ = labelled.labelled(metric)
        groups.setdefault(tuple(r.number for r in rows), []).append(metric)
    return list(groups.values())


def _share(blocks: Sequence[dict[str, Any]], metric: str, group: Sequence[str]) -> float:
    seconds = {m: sum(b["stats"].get("per_metric", {}).get(m, {}).get("seconds", 0.0) for b in blocks)
               for m in group}
    total = sum(seconds.values())
    return seconds[metric] / total if total > 0 else 1 / len(group)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
