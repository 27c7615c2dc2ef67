"""Compare judge models against human labels (`offline-eval compare`).

Each judge is loaded once, scores the labelled rows of every metric (one `evaluate` per metric, so each
metric's latency and tokens are its own), optionally reruns them, and is closed before the next judge loads.
Then `analyse` measures, per metric and judge: agreement with the labels (agreement.py), the invalid-output
rate, latency and tokens per sample, the judge's memory, the consistency of dual-judge templates and of
reruns; it ranks the judges and names the smallest one within a margin of the best.

Memory: before a judge loads, the process's peak-RSS mark is reset (`/proc/self/clear_refs`, Linux), so the
reported peak is the process's highest resident memory while that judge loaded and ran — it includes
Python, the embeddings model and earlier results (the `baseline` RSS just before loading shows that share).
Where the reset is impossible the peak is the process lifetime's (`ru_maxrss`) and is labelled so. For a
vLLM *server* judge only this client process is measured: the server's memory is not included.
"""

from __future__ import annotations

import json
import math
import re
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .agreement import agreement, calibration, cohen_kappa, mean_difference, share_identical
from ..dataset import ValidationError
from ..engines.base import Engine
from ..run.evaluation import evaluate, validate
from .labels import LabelledSet, is_binary, positive
from ..metrics import MetricResult, metric_by_name
from ..run.plan import SCORINGS
from ..metrics.answer_accuracy import RATING as _AA_RATING
from ..metrics.context_relevance import RATING as _CR_RATING
from ..metrics.response_groundedness import RATING as _RG_RATING

RANK_BY = ("auc", "balanced_accuracy", "kappa", "accuracy", "spearman", "kendall")
# The dual-judge metrics and the top of their rating scale (their ratings are in details["ratings"]).
TEMPLATE_SCALE = {name: max(int(o) for o in rating.options) for name, rating in
                  (("answer_accuracy", _AA_RATING), ("context_relevance", _CR_RATING),
                   ("response_groundedness", _RG_RATING))}
ROLE_SWAP_METRIC = "answer_accuracy"  # its template 2 swaps response and reference


@dataclass
class CompareSettings:
    metrics: Optional[Sequence[str]] = None  # default: every metric the labels cover
    threshold: float | str = 0.5  # a number, or "auto" (chosen on a calibration split)
    seed: int = 0
    margin: float = 0.02
    reruns: int = 0
    resamples: int = 1000
    rank_by: str = "auc"
    show_progress: bool = False


@dataclass
class MetricRun:
    results: list[MetricResult]
    seconds: float
    records: list[dict[str, Any]]  # EvaluationResult.records(), for the per-judge results file
    reruns: list[list[Optional[float]]] = field(default_factory=list)


@dataclass
class JudgeRun:
    name: str
    identity: dict[str, Any]
    size_bytes: Optional[int]
    load_seconds: float
    memory: dict[str, Any]
    metrics: dict[str, MetricRun]


# ---- running the judges ---------------------------------------------------------------------------------

def load_judge(name: str) -> Engine:
    """A fresh engine for a models.yaml judge (or .gguf path), not shared with `llm_factory`'s cache, so
    closing it frees exactly this judge."""
    from ..engines.registry import load_engine
    from ..models import Registry

    return load_engine(Registry.load().get(name, "judge"))


def choose_metrics(labelled: LabelledSet, names: Optional[Sequence[str]]) -> list[str]:
    if not names:
        return labelled.metrics
    chosen = [metric_by_name(n).name for n in names]
    missing = [m for m in chosen if m not in labelled.labels]
    if missing:
        raise ValueError(f"{labelled.source} has no labels for {', '.join(missing)}; "
                         f"it labels {', '.join(labelled.metrics)}")
    return chosen


def check_inputs(labelled: LabelledSet, metrics: Sequence[str]) -> None:
    """Every labelled row has the inputs its metric needs — checked before any judge loads."""
    errors = [e for m in metrics for e in validate(labelled.labelled(m)[0], [metric_by_name(m)])]
    if errors:
        raise ValidationError(errors)
    empty = [m for m in metrics if not labelled.labelled(m)[0]]
    if empty:
        raise ValueError(f"no labelled rows for {', '.join(empty)}")


def run_judges(labelled: LabelledSet, models: Sequence[str], settings: CompareSettings,
               loader: Callable[[str], Engine] = load_judge, embeddings: Any = None,
               on_judge: Callable[[str], None] = lambda name: None) -> list[JudgeRun]:
    """Run each judge in turn on the labelled rows of every chosen metric."""
    metrics = choose_metrics(labelled, settings.metrics)
    check_inputs(labelled, metrics)
    if any(metric_by_name(m).needs_embeddings for m in metrics):
        from ..judges import resolve_embeddings

        embeddings = resolve_embeddings(embeddings)  # loaded once, before the first judge's memory baseline
    runs = []
    for name in models:
        on_judge(name)
        runs.append(run_judge(name, labelled, metrics, settings, loader, embeddings))
    return runs


def run_judge(name: str, labelled: LabelledSet, metrics: Sequence[str], settings: CompareSettings,
              loader: Callable[[str], Engine], embeddings: Any) -> JudgeRun:
    baseline = current_rss()
    scope = "judge" if reset_peak_rss() else "process lifetime"
    tic = time.perf_counter()
    engine = loader(name)
    load_seconds = time.perf_counter() - tic
    try:
        runs = {m: _run_metric(engine, labelled, m, settings, embeddings) for m in metrics}
        identity = dict(engine.identity)
    finally:
        engine.close()
    memory = {"baseline_rss": baseline, "peak_rss": peak_rss(scope), "scope": scope}
    if identity.get("engine") == "vllm":
        memory["note"] = "this client process only; the vLLM server's memory is not included"
    return JudgeRun(name, identity, weights_size(name, identity), load_seconds, memory, runs)


def _run_metric(engine: Engine, labelled: LabelledSet, metric: str, settings: CompareSettings,
                embeddings: Any) -> MetricRun:
    rows, _ = labelled.labelled(metric)  # inputs only: the labels stay in `labelled`

    def once():
        return evaluate(rows, metrics=[metric_by_name(metric)], llm=engine, embeddings=embeddings,
                        show_progress=settings.show_progress)

    tic = time.perf_counter()
    result = once()
    seconds = time.perf_counter() - tic
    results = [result.results[row.number][metric] for row in rows]
    reruns = [once().values(metric) for _ in range(settings.reruns)]
    return MetricRun(results, seconds, result.records(), reruns)


def weights_size(name: str, identity: dict[str, Any]) -> Optional[int]:
    """Bytes of the judge's weights on disk (file, or folder in total): the engine's weights path, else
    the registry's; None when they are not local (a remote vLLM server)."""
    if identity.get("weights_size") is not None:
        return int(identity["weights_size"])
    path = identity.get("weights")
    if not path:
        from ..models import ModelError, Registry, locate_weights

        try:
            spec = Registry.load().get(name, "judge")
            path = locate_weights(spec.settings.get("weights", {}), spec.registry.models_dir)
        except (ModelError, OSError):
            return None
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return None


# ---- memory ---------------------------------------------------------------------------------------------

def _status_bytes(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss() -> Optional[int]:
    return _status_bytes("VmRSS")


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux >= 4.0); False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss(scope: str) -> Optional[int]:
    peak = _status_bytes("VmHWM") if scope == "judge" else None
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- analysis -------------------------------------------------------------------------------------------

def analyse(labelled: LabelledSet, runs: Sequence[JudgeRun], settings: CompareSettings) -> dict[str, Any]:
    """Everything the reports show, JSON-ready (NaN where a statistic is undefined)."""
    if settings.rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {', '.join(RANK_BY)}, not {settings.rank_by!r}")
    metrics = list(runs[0].metrics) if runs else []
    sizes = {run.name: run.size_bytes for run in runs}
    out: dict[str, Any] = {
        "labels": {"source": labelled.source, "format": labelled.format, "rows": len(labelled),
                   "row_numbers": [r.number for r in labelled.rows]},
        "settings": {"threshold": settings.threshold, "seed": settings.seed, "margin": settings.margin,
                     "reruns": settings.reruns, "resamples": settings.resamples, "rank_by": settings.rank_by},
        "judges": [_judge_summary(run, labelled, metrics) for run in runs],
        "metrics": {},
    }
    for metric in metrics:
        _, labels = labelled.labelled(metric)
        pos = positive(labels)
        per_judge = {run.name: _judge_metric(run.metrics[metric], metric, labels, pos, settings) for run in runs}
        primary = {name: a[settings.rank_by]["value"] for name, a in per_judge.items()}
        out["metrics"][metric] = {
            "labels": {"n": len(labels), "positive": int(pos.sum()), "graded": not is_binary(labels),
                       "values": labels.tolist()},
            "judges": per_judge,
            "ranking": rank(primary),
            "recommended": smallest_within_margin(primary, sizes, settings.margin),
        }
    overall = {run.name: _nanmean([out["metrics"][m]["judges"][run.name][settings.rank_by]["value"]
                                   for m in metrics]) for run in runs}
    out["overall"] = {"primary": overall, "ranking": rank(overall),
                      "recommended": smallest_within_margin(overall, sizes, settings.margin)}
    return out


def _judge_summary(run: JudgeRun, labelled: LabelledSet, metrics: Sequence[str]) -> dict[str, Any]:
    calls = [c for m in metrics for r in run.metrics[m].results for c in r.judge_calls]
    n = max(len(labelled), 1)
    return {"name": run.name, "engine": run.identity.get("engine"), "model": run.identity.get("model"),
            "size_bytes": run.size_bytes, "load_seconds": run.load_seconds, "memory": run.memory,
            "seconds_per_sample": sum(run.metrics[m].seconds for m in metrics) / n,
            "tokens_per_sample": _tokens(calls) / n}


def _judge_metric(run: MetricRun, metric: str, labels: np.ndarray, pos: np.ndarray,
                  settings: CompareSettings) -> dict[str, Any]:
    scores = [r.value for r in run.results]
    out = agreement(scores, labels, pos, settings.threshold, settings.seed, settings.resamples)
    calls = [c for r in run.results for c in r.judge_calls]
    n = max(len(scores), 1)
    out.update(
        calls=len(calls),
        invalid_calls=sum(c.get("value") is None for c in calls) / len(calls) if calls else math.nan,
        no_score_rate=out["no_score"] / n,
        seconds_per_sample=run.seconds / n,
        tokens_per_sample=_tokens(calls) / n,
        consistency=consistency(metric, run, settings),
        scores=scores,
        scorings=by_scoring(run.results, labels, pos, settings),
    )
    if run.reruns:
        out["rerun_scores"] = run.reruns  # so `compare --from` can re-analyse without rerunning the judge
    return out


def by_scoring(results: Sequence[MetricResult], labels: np.ndarray, pos: np.ndarray,
               settings: CompareSettings) -> dict[str, Any]:
    """Agreement and calibration of each scoring (probability, argmax) side by side, from the same judge
    calls: every result keeps both scores."""
    out = {}
    for scoring in SCORINGS:
        scores = [r.scores.get(scoring, r.value) for r in results]
        a = agreement(scores, labels, pos, settings.threshold, settings.seed, settings.resamples)
        out[scoring] = {k: a[k] for k in ("scored", "threshold", "auc", "kappa", "balanced_accuracy", "mean_score")}
        out[scoring]["calibration"] = calibration(scores, pos)
    return out


def _tokens(calls: Sequence[dict[str, Any]]) -> int:
    return sum(c.get("prompt_tokens", 0) + c.get("completion_tokens", 0) for c in calls)


def consistency(metric: str, run: MetricRun, settings: CompareSettings) -> dict[str, Any]:
    """Dual-judge metrics: how often the two templates give the same rating, their Cohen's kappa and (Answer
    Accuracy) the role-swap bias, the mean of template 1's score minus template 2's on the [0, 1] scale.
    With reruns: the share of rerun scores identical to the first run's (1.0 expected at temperature 0)."""
    out: dict[str, Any] = {}
    if metric in TEMPLATE_SCALE:
        pairs = [r.details.get("ratings") or [None, None] for r in run.results]
        both = [(a, b) for a, b in pairs if a is not None and b is not None]
        out["template_pairs"] = len(both)
        out["template_agreement"] = sum(a == b for a, b in both) / len(both) if both else math.nan
        out["template_kappa"] = cohen_kappa([a for a, _ in both], [b for _, b in both])
        if metric == ROLE_SWAP_METRIC:
            scale = TEMPLATE_SCALE[metric]
            out["role_swap_bias"] = mean_difference([int(a) / scale for a, _ in both],
                                                    [int(b) / scale for _, b in both],
                                                    settings.resamples, settings.seed)
    if run.reruns:
        out["rerun_identical"] = share_identical([r.value for r in run.results], run.reruns)
    return out


def rank(values: dict[str, float]) -> list[str]:
    """Names from best to worst; undefined (NaN) values last."""
    return sorted(values, key=lambda n: (math.isnan(values[n]), -values[n] if not math.isnan(values[n]) else 0))


def smallest_within_margin(values: dict[str, float], sizes: dict[str, Optional[int]],
                           margin: float) -> Optional[str]:
    """The judge with the smallest weights among those within `margin` of the best value (unknown sizes
    count as largest; equal sizes go to the better value)."""
    valid = {n: v for n, v in values.items() if not math.isnan(v)}
    if not valid:
        return None
    best = max(valid.values())
    close = [n for n, v in valid.items() if v >= best - margin - 1e-12]
    return min(close, key=lambda n: (sizes.get(n) is None, sizes.get(n) or 0, -valid[n]))


def _nanmean(values: Sequence[float]) -> float:
    valid = [v for v in values if not math.isnan(v)]
    return sum(valid) / len(valid) if valid else math.nan


# ---- output files ---------------------------------------------------------------------------------------

def merged_records(run: JudgeRun) -> list[dict[str, Any]]:
    """One results record per row, with every metric the judge scored it on (the `run` results format)."""
    by_row: dict[int, dict[str, Any]] = {}
    for metric_run in run.metrics.values():
        for rec in metric_run.records:
            merged = by_row.setdefault(rec["row"], {k: v for k, v in rec.items() if k != "metrics"})
            merged.setdefault("metrics", {}).update(rec.get("metrics", {}))
    return [by_row[k] for k in sorted(by_row)]


def json_ready(value: Any) -> Any:
    """NaN -> None (JSON has no NaN), tuples -> lists, numpy values -> Python values."""
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def results_file_name(judge: str) -> str:
    return f"results-{re.sub(r'[^A-Za-z0-9._-]+', '_', Path(judge).name)}.jsonl"


def write_outputs(analysis: dict[str, Any], runs: Sequence[JudgeRun], out_dir: Path) -> dict[str, Path]:
    """compare.json (everything, re-renderable), compare.md, compare.html, and per judge its results file
    (the `offline-eval run` format, so `offline-eval report` renders it)."""
    from .tables import markdown_report
    from ..reports.html import compare_report

    out_dir.mkdir(parents=True, exist_ok=True)
    ready = json_ready(analysis)
    paths = {"json": out_dir / "compare.json", "markdown": out_dir / "compare.md", "html": out_dir / "compare.html"}
    paths["json"].write_text(json.dumps(ready, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_report(ready), encoding="utf-8")
    paths["html"].write_text(compare_report(ready), encoding="utf-8")
    for run in runs:
        path = out_dir / results_file_name(run.name)
        with open(path, "w", encoding="utf-8") as f:
            for rec in merged_records(run):
                f.write(json.dumps(json_ready(rec), ensure_ascii=False) + "\n")
        paths[f"results {run.name}"] = path
    return paths
