"""`offline-eval compare --from DIR`: analyse an earlier comparison again, without running any judge.

A comparison's output folder holds everything a new analysis needs: compare.json (the labelled rows it used,
each judge's cost, timings and rerun scores) and per judge its results file (every score with its details and
judge calls). So another --threshold, --margin, --rank-by or --bootstrap costs seconds, not the judges' hours.
The labels file must be the one the comparison used: its rows are picked by the row numbers compare.json lists
(so --limit and --seed of the first run need not be repeated; a compare.json older than that list needs them),
and each must have a result in every judge's file, else it is a clear error.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from .compare import JudgeRun, MetricRun, results_file_name
from ..dataset import DataError
from .labels import LabelledSet
from ..metrics import MetricResult

RESULT_FIELDS = ("value", "reason", "details", "judge_calls", "scores")


def load_comparison(out_dir: Path, labelled: LabelledSet, subset: Optional[LabelledSet] = None,
                    ) -> tuple[LabelledSet, list[JudgeRun], dict[str, Any]]:
    """The labelled rows an earlier comparison in `out_dir` used, its judges' runs, and its settings.
    `subset`: the rows to assume when compare.json does not list them (made before it did): the same
    --limit and --seed as that comparison's."""
    data = _read_json(out_dir / "compare.json")
    numbers = data["labels"].get("row_numbers")
    if numbers is None:
        if subset is None or len(subset) != data["labels"]["rows"]:
            raise DataError(f"{out_dir / 'compare.json'} does not list its rows (made by an older offline-eval): "
                            f"give the --limit and --seed it was made with ({data['labels']['rows']} rows, seed "
                            f"{data['settings']['seed']})")
        numbers = [r.number for r in subset.rows]
    by_number = {r.number: i for i, r in enumerate(labelled.rows)}
    unknown = [n for n in numbers if n not in by_number]
    if unknown:
        raise DataError(f"{labelled.source} has no row {unknown[0]}, which the comparison in {out_dir} used: "
                        f"pass the labels file it was made with ({data['labels']['source']})")
    picked = [by_number[n] for n in numbers]
    used = replace(labelled, rows=[labelled.rows[i] for i in picked],
                   labels={m: [ys[i] for i in picked] for m, ys in labelled.labels.items()})
    runs = [_judge_run(out_dir, judge, data["metrics"], used) for judge in data["judges"]]
    return used, runs, data["settings"]


def _judge_run(out_dir: Path, judge: dict[str, Any], metrics: dict[str, Any], labelled: LabelledSet) -> JudgeRun:
    path = out_dir / results_file_name(judge["name"])
    records = {rec["row"]: rec for rec in _read_jsonl(path)}
    runs = {}
    for metric, analysis in metrics.items():
        rows, _ = labelled.labelled(metric)
        missing = [r.number for r in rows if metric not in records.get(r.number, {}).get("metrics", {})]
        if missing:
            raise DataError(f"{path} has no {metric} result for row {missing[0]}: it does not belong to this "
                            "comparison")
        mine = analysis["judges"][judge["name"]]
        results = [MetricResult(**{k: records[r.number]["metrics"][metric].get(k, {}) for k in RESULT_FIELDS})
                   for r in rows]
        runs[metric] = MetricRun(results, mine["seconds_per_sample"] * len(rows),
                                 [records[r.number] for r in rows], mine.get("rerun_scores", []))
    identity = {"engine": judge["engine"], "model": judge["model"]}
    return JudgeRun(judge["name"], identity, judge["size_bytes"], judge["load_seconds"], judge["memory"], runs)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} not found: --from takes the output folder of an earlier `offline-eval compare`")
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} could not be read: {exc}") from None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise DataError(f"{path} not found: the comparison's results file for this judge is missing")
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} could not be read: {exc}") from None
