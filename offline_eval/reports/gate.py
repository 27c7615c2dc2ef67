"""The CI gate of `offline-eval run`: minimum means (--fail-under), regressions against a baseline
(--baseline, --max-drop), and for every metric it checks, a minimum coverage (--min-coverage): the share of
scored samples with a value, so that a mean over a few rows (the others failed or had no value) never passes.

A baseline is either a previous run's per-sample results (the JSONL `run` writes; it does not name its judge)
or the summary JSON that `run --summary-json FILE` writes:

    {"format": "offline-eval-summary", "version": 1, "data": "eval.jsonl", "created": "...",
     "judge": {"model": ..., "engine": ..., ...}, "samples": 20, "skipped": 0,
     "metrics": {"faithfulness": {"mean": 0.91, "scored": 19, "no_value": 1, "coverage": 0.95,
                                  "failed_calls": 2}, ...}}

Means are compared per metric present in both; `mean` is null when no sample had a value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence

from ..metrics import METRIC_ALIASES

SUMMARY_FORMAT = "offline-eval-summary"
DEFAULT_MAX_DROP = 0.02
DEFAULT_MIN_COVERAGE = 0.9  # a gated metric needs a value on at least 90% of the scored samples
_EPSILON = 1e-9  # means are float sums: a drop equal to the allowance must pass


class GateError(ValueError):
    """A bad gate flag or an unreadable baseline (exit code 2)."""


# ---- flags ------------------------------------------------------------------------------------------------

def parse_bars(spec: str, evaluated: Sequence[str]) -> dict[str, float]:
    """'faithfulness=0.9,answer_relevancy=0.8' -> {name: bar}; every name must be a metric of this run."""
    bars: dict[str, float] = {}
    for item in spec.split(","):
        name, sep, value = item.partition("=")
        name = METRIC_ALIASES.get(name.strip().lower(), name.strip().lower())
        try:
            bar = float(value)
        except ValueError:
            bar = math.nan
        if not sep or not name or not math.isfinite(bar):
            raise GateError(f"--fail-under: expected METRIC=NUMBER[,METRIC=NUMBER...], got {item.strip()!r}")
        if name not in evaluated:
            raise GateError(f"--fail-under: {name!r} is not a metric of this run (metrics: {', '.join(evaluated)})")
        if name in bars:
            raise GateError(f"--fail-under: {name} is given twice")
        bars[name] = bar
    return bars


# ---- baselines --------------------------------------------------------------------------------------------

@dataclass
class Baseline:
    path: Path
    means: dict[str, Optional[float]]  # None: no sample had a value
    judge: Optional[dict[str, Any]]  # None when not named (per-sample results files do not name it)


def load_baseline(path: Path) -> Baseline:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError(f"cannot read the baseline {path}: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "row" not in doc:  # a summary (a one-row results file has "row")
        return _from_summary(path, doc)
    return _from_results(path, text)


def _from_summary(path: Path, doc: dict[str, Any]) -> Baseline:
    metrics = doc.get("metrics")
    if not isinstance(metrics, dict) or not all(isinstance(m, dict) and _is_mean(m.get("mean"))
                                                for m in metrics.values()):
        raise GateError(f"the baseline {path} is not an offline-eval summary: it needs "
                        '"metrics": {name: {"mean": number or null, ...}}')
    judge = doc.get("judge")
    return Baseline(path, {name: m["mean"] for name, m in metrics.items()}, judge if isinstance(judge, dict) else None)


def _is_mean(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _from_results(path: Path, text: str) -> Baseline:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GateError(f"the baseline {path} is neither a summary JSON nor results JSONL "
                            f"(line {number}: {exc.msg})") from None
        if not isinstance(rec, dict) or not ("metrics" in rec or "skipped" in rec):
            raise GateError(f"the baseline {path} line {number} is not a per-sample result of `offline-eval run`")
        records.append(rec)
    if not records:
        raise GateError(f"the baseline {path} is empty")
    values: dict[str, list[Optional[float]]] = {}
    for rec in records:
        for name, res in (rec.get("metrics") or {}).items():
            values.setdefault(name, []).append(res.get("value") if isinstance(res, dict) else None)
    return Baseline(path, {name: _mean(v) for name, v in values.items()}, None)


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    valid = [v for v in values if v is not None]
    return sum(valid) / len(valid) if valid else None


# ---- the summary JSON --------------------------------------------------------------------------------------

def summary_document(result: Any, data: str) -> dict[str, Any]:
    """What `run --summary-json` writes (and `--baseline` reads) for an EvaluationResult or a RunSummary."""
    metrics = {name: {**s, "mean": None if math.isnan(s["mean"]) else s["mean"]}
               for name, s in result.summary().items()}
    return {"format": SUMMARY_FORMAT, "version": 1, "data": data,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "judge": result.judge,
            "samples": result.scored_rows, "skipped": result.skipped_rows,
            "metrics": metrics}


def write_summary(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


# ---- the checks -------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    lines: list[str] = field(default_factory=list)  # one per check, in order
    warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # short: "faithfulness below 0.9"

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def check(self, ok: bool, line: str, failure: str) -> None:
        self.lines.append(f"{'ok  ' if ok else 'FAIL'} {line}")
        if not ok:
            self.failures.append(failure)


def check(summary: dict[str, dict[str, Any]], judge: dict[str, Any], bars: dict[str, float],
          baseline: Optional[Baseline] = None, max_drop: float = DEFAULT_MAX_DROP,
          min_coverage: float = DEFAULT_MIN_COVERAGE) -> Verdict:
    """Judge a run's summary ({metric: {"mean", "scored", "no_value"}}, means NaN when nothing was scored)
    against the bars and the baseline; every metric either checks must also reach `min_coverage`."""
    verdict = Verdict()
    for name, bar in bars.items():
        mean, scored = _mean_of(summary[name]), summary[name]["scored"]
        if mean is None:
            verdict.check(False, f"{name}: no scored samples ({summary[name]['no_value']} without a value), so it "
                                 f"cannot reach {bar:g}", f"{name} has no scored samples")
        else:
            ok = mean >= bar
            verdict.check(ok, f"{name}: mean {mean:.4f} over {scored} samples {'>=' if ok else '<'} {bar:g}",
                          f"{name} below {bar:g}")
    if baseline is not None:
        _against(verdict, summary, judge, baseline, max_drop)
    gated = [*bars, *(n for n in summary if baseline is not None and baseline.means.get(n) is not None)]
    for name in dict.fromkeys(gated):
        scored, total = summary[name]["scored"], summary[name]["scored"] + summary[name]["no_value"]
        if scored:  # no value at all has failed above, with its own message
            ok = scored >= min_coverage * total - _EPSILON
            verdict.check(ok, f"{name}: coverage {scored}/{total} samples with a value ({scored / total:.0%}) "
                              f"{'>=' if ok else '<'} {min_coverage:.0%}",
                          f"{name} has a value on only {scored} of {total} samples")
    return verdict


def _against(verdict: Verdict, summary: dict[str, dict[str, Any]], judge: dict[str, Any], baseline: Baseline,
             max_drop: float) -> None:
    if baseline.judge is None:
        verdict.warnings.append(f"the baseline {baseline.path} does not name its judge (per-sample results do "
                                f"not): make sure it was {judge.get('model')}, as in this run")
    elif baseline.judge.get("model") != judge.get("model"):
        verdict.warnings.append(f"the baseline was judged by {baseline.judge.get('model')} "
                                f"({baseline.judge.get('engine')}), this run by {judge.get('model')} "
                                f"({judge.get('engine')}): scores of different judges are not comparable")
    shared = [name for name in summary if name in baseline.means]
    for name in shared:
        before, now = baseline.means[name], _mean_of(summary[name])
        if before is None:
            verdict.lines.append(f"     {name}: not compared, the baseline has no value")
        elif now is None:
            verdict.check(False, f"{name}: baseline {before:.4f}, no scored samples now",
                          f"{name} has no scored samples")
        else:
            drop = before - now
            ok = drop <= max_drop + _EPSILON
            verdict.check(ok, f"{name}: baseline {before:.4f} -> {now:.4f}, drop {drop:+.4f} "
                              f"({'within' if ok else 'over'} {max_drop:g})",
                          f"{name} dropped {drop:.4f}")
    missing = sorted(set(summary) ^ set(baseline.means))
    if missing:
        verdict.lines.append(f"     not compared (in only one of run and baseline): {', '.join(missing)}")
    if not shared:
        verdict.warnings.append(f"the baseline {baseline.path} has none of this run's metrics")


def _mean_of(stats: dict[str, Any]) -> Optional[float]:
    mean = stats.get("mean")
    return None if mean is None or math.isnan(mean) else float(mean)
