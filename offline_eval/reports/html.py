"""Self-contained HTML reports with hand-written inline SVG charts (no JavaScript, no plotting library).

- `compare_report(analysis)`: a judge comparison (`offline-eval compare`): ranking, per-metric agreement
  tables, bars with confidence intervals, ROC curves, score distributions per label, cost and consistency.
- `results_report(records)`: an ordinary run's results file (`offline-eval report`): per-metric score
  distributions and the worst samples with their claims, verdicts and reasons.
"""

from __future__ import annotations

import math
import re
from html import escape
from typing import Any, Optional, Sequence

from ..comparison.tables import STAT_NAMES, Table, all_tables, num

_NUMERIC = re.compile(r"^([-+]?[\d.]|n/a$|-$)")  # numbers (with units or intervals) align right
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
LABEL_COLOURS = {"positive": "#2ca02c", "negative": "#d62728"}

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 0.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.text { text-align: left; }
caption { caption-side: top; font-weight: bold; text-align: left; padding: 0.3em 0; }
p.note { font-size: 0.85em; color: #555; margin: 0 0 1.2em; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
svg.chart { background: #fafafa; border: 1px solid #e4e4e4; }
svg text { font-size: 11px; fill: #333; }
.recommended { font-size: 1.1em; }
pre.reason { white-space: pre-wrap; margin: 0; font-size: 0.95em; }
ul.claims { margin: 0.2em 0; padding-left: 1.2em; }
li.supported { color: #1a7f37; } li.unsupported { color: #c62828; } li.none { color: #777; }
td { white-space: nowrap; }
td.text { max-width: 28em; white-space: normal; }
table.samples th { text-align: left; }
"""


# ---- SVG charts -----------------------------------------------------------------------------------------

def _svg(width: int, height: int, kind: str, title: str, body: list[str]) -> str:
    return (f'<svg class="chart {kind}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
            f'<text x="8" y="16" style="font-weight:bold">{escape(title)}</text>' + "".join(body) + "</svg>")


def _text_width(texts: Any) -> int:
    """Roughly how wide the longest text is in the charts' 11px font (so labels are never cut off)."""
    return int(6.5 * max((len(t) for t in texts), default=0))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def bars_svg(title: str, items: Sequence[tuple[str, Optional[float], Optional[float], Optional[float]]]) -> str:
    """Horizontal bars (label, value, ci low, ci high) with their interval as a whisker. The axis runs from
    0 (or below, for negative values such as kappa) to 1."""
    label_w, plot_w, row_h, top = _text_width(item[0] for item in items) + 14, 300, 26, 28
    values = [v for item in items for v in item[1:] if _finite(v)]
    lo, hi = min([0.0, *values]), max([1.0, *values])
    lo = -1.0 if lo < 0 else lo

    def x(v: float) -> float:
        return label_w + (v - lo) / (hi - lo) * plot_w

    height = top + row_h * len(items) + 22
    body = []
    for tick in sorted({lo, 0.0, 0.5, hi}):
        body.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{top}" y2="{height - 20}" stroke="#ddd"/>'
                    f'<text x="{x(tick):.1f}" y="{height - 6}" text-anchor="middle">{tick:g}</text>')
    for i, (label, value, low, high) in enumerate(items):
        y = top + i * row_h
        colour = PALETTE[i % len(PALETTE)]
        body.append(f'<text x="{label_w - 6}" y="{y + row_h / 2 + 4}" text-anchor="end">{escape(label)}</text>')
        if _finite(value):
            start, end = sorted((x(max(lo, 0.0)), x(value)))
            body.append(f'<rect class="bar" x="{start:.1f}" y="{y + 5}" width="{end - start:.1f}" '
                        f'height="{row_h - 10}" fill="{colour}" opacity="0.8"/>')
            body.append(f'<text x="{x(hi) + 4:.1f}" y="{y + row_h / 2 + 4}">{value:.3f}</text>')
        if _finite(low) and _finite(high):
            mid = y + row_h / 2
            body.append(f'<path class="ci" d="M{x(low):.1f},{mid - 5}v10M{x(low):.1f},{mid}H{x(high):.1f}'
                        f'M{x(high):.1f},{mid - 5}v10" stroke="#222" stroke-width="1.5" fill="none"/>')
    return _svg(label_w + plot_w + 50, height, "bars", title, body)


def roc_svg(title: str, curves: dict[str, tuple[Sequence[Sequence[float]], Optional[float]]]) -> str:
    """ROC curves {name: (points (fpr, tpr), auc)} on one square plot, with the chance diagonal."""
    left, top, side = 36, 26, 260

    def xy(fpr: float, tpr: float) -> str:
        return f"{left + fpr * side:.1f},{top + (1 - tpr) * side:.1f}"

    body = [f'<rect x="{left}" y="{top}" width="{side}" height="{side}" fill="none" stroke="#bbb"/>',
            f'<line x1="{left}" y1="{top + side}" x2="{left + side}" y2="{top}" stroke="#bbb" stroke-dasharray="4 3"/>',
            f'<text x="{left + side / 2}" y="{top + side + 26}" text-anchor="middle">false positive rate</text>',
            f'<text x="10" y="{top + side / 2}" transform="rotate(-90 10 {top + side / 2})" '
            f'text-anchor="middle">true positive rate</text>',
            f'<text x="{left}" y="{top + side + 13}" text-anchor="middle">0</text>',
            f'<text x="{left + side}" y="{top + side + 13}" text-anchor="middle">1</text>']
    for i, (name, (points, auc)) in enumerate(curves.items()):
        colour = PALETTE[i % len(PALETTE)]
        if points:
            path = " ".join(xy(f, t) for f, t in points)
            body.append(f'<polyline class="roc-curve" points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = top + 14 + 16 * i
        body.append(f'<rect x="{left + side + 12}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
                    f'<text x="{left + side + 26}" y="{ly}">{escape(name)} (AUC {num(auc)})</text>')
    legend = _text_width(f"{name} (AUC 0.000)" for name in curves)
    return _svg(left + side + 34 + legend, top + side + 36, "roc", title, body)


def histogram_svg(title: str, series: dict[str, Sequence[float]], colours: dict[str, str],
                  lo: float = 0.0, hi: float = 1.0, bins: int = 10) -> str:
    """Grouped histogram: per bin, one bar per series, as the share of that series' values (so series of
    different sizes compare)."""
    left, top, plot_w, plot_h = 36, 26, 320, 130
    width = (hi - lo) or 1.0
    shares = {}
    for name, values in series.items():
        counts = [0] * bins
        for v in values:
            counts[max(0, min(int((v - lo) / width * bins), bins - 1))] += 1
        shares[name] = [c / max(len(values), 1) for c in counts]
    peak = max([s for v in shares.values() for s in v] + [0.01])
    slot = plot_w / bins
    bar_w = slot * 0.8 / max(len(series), 1)
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#999"/>',
            f'<text x="{left}" y="{top + plot_h + 13}" text-anchor="middle">{lo:g}</text>',
            f'<text x="{left + plot_w / 2}" y="{top + plot_h + 13}" text-anchor="middle">{(lo + hi) / 2:g}</text>',
            f'<text x="{left + plot_w}" y="{top + plot_h + 13}" text-anchor="middle">{hi:g}</text>',
            f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{peak:.0%}</text>']
    for k, (name, values) in enumerate(shares.items()):
        for b, share in enumerate(values):
            h = share / peak * plot_h
            bx = left + b * slot + slot * 0.1 + k * bar_w
            body.append(f'<rect class="bin" x="{bx:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" '
                        f'height="{h:.1f}" fill="{colours.get(name, PALETTE[k % len(PALETTE)])}" opacity="0.85"/>')
        body.append(f'<rect x="{left + plot_w + 12}" y="{top + 16 * k}" width="10" height="10" '
                    f'fill="{colours.get(name, PALETTE[k % len(PALETTE)])}"/><text x="{left + plot_w + 26}" '
                    f'y="{top + 9 + 16 * k}">{escape(name)} (n={len(series[name])})</text>')
    return _svg(left + plot_w + 150, top + plot_h + 22, "hist", title, body)


# ---- HTML pieces ----------------------------------------------------------------------------------------

def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def table_html(table: Table, css_class: str = "") -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" if _NUMERIC.match(c) else f'<td class="text">{escape(c)}</td>'
                                    for c in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    return (f'<table class="{css_class}"><caption>{escape(table.title)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table>{note}")


# ---- the comparison report ------------------------------------------------------------------------------

def compare_report(analysis: dict[str, Any]) -> str:
    labels, settings = analysis["labels"], analysis["settings"]
    tables = {t.title: t for t in all_tables(analysis)}
    parts = ["<h1>Judge comparison</h1>",
             f"<p>Labels: <code>{escape(labels['source'])}</code> ({escape(labels['format'])}, {labels['rows']} rows); "
             f"threshold {escape(str(settings['threshold']))}, seed {settings['seed']}, "
             f"{settings['resamples']} bootstrap resamples, reruns {settings['reruns']}.</p>",
             f'<p class="recommended">Recommended judge: <strong>{escape(str(analysis["overall"]["recommended"]))}'
             f"</strong> — the smallest within {settings['margin']} of the best mean "
             f"{escape(STAT_NAMES[settings['rank_by']])}.</p>",
             table_html(tables["ranking"], "ranking")]
    for metric in analysis["metrics"]:
        parts.append(_metric_section(analysis, metric, tables[f"{metric}: agreement with the labels"]))
    if "scorings side by side" in tables:
        parts.append("<h2>Scorings side by side</h2>" + table_html(tables["scorings side by side"], "scorings"))
    parts.append("<h2>Cost</h2>" + table_html(tables["cost per judge"], "cost"))
    if "consistency" in tables:
        parts.append("<h2>Consistency</h2>" + table_html(tables["consistency"], "consistency"))
    return page("Judge comparison", "\n".join(parts))


def _metric_section(analysis: dict[str, Any], metric: str, table: Table) -> str:
    m = analysis["metrics"][metric]
    stat = analysis["settings"]["rank_by"]
    judges = list(m["judges"])
    charts = [bars_svg(f"{STAT_NAMES[stat]} (95% CI)", _bar_items(m, judges, stat))]
    if stat != "balanced_accuracy":
        charts.append(bars_svg("balanced accuracy (95% CI)", _bar_items(m, judges, "balanced_accuracy")))
    charts.append(roc_svg("ROC curves", {j: (m["judges"][j]["roc"], m["judges"][j]["auc"]["value"])
                                         for j in judges}))
    positive = _positive_flags(m["labels"])
    for j in judges:
        scores = m["judges"][j]["scores"]
        series = {"positive": [s for s, p in zip(scores, positive) if p and s is not None],
                  "negative": [s for s, p in zip(scores, positive) if not p and s is not None]}
        lo, hi = _range([s for s in scores if s is not None])
        charts.append(histogram_svg(f"{j}: scores by human label", series, LABEL_COLOURS, lo, hi))
    return (f'<section id="metric-{escape(metric)}"><h2>{escape(metric)}</h2>{table_html(table, "agreement")}'
            f'<div class="charts">{"".join(charts)}</div></section>')


def _bar_items(m: dict[str, Any], judges: Sequence[str], stat: str) -> list[tuple]:
    return [(j, m["judges"][j][stat]["value"], *m["judges"][j][stat]["ci"]) for j in judges]


def _positive_flags(labels: dict[str, Any]) -> list[bool]:
    from ..comparison.labels import positive

    return positive(labels["values"]).tolist() if labels["values"] else []


def _range(values: Sequence[float]) -> tuple[float, float]:
    """0..1 for the usual scores; the data's range for others (the rubric score is 1-5)."""
    if not values or (min(values) >= 0 and max(values) <= 1):
        return 0.0, 1.0
    return float(min(values)), float(max(values))


# ---- an ordinary run's results --------------------------------------------------------------------------

def results_report(records: Sequence[dict[str, Any]], source: str = "", worst: int = 10) -> str:
    """Per metric: the score distribution and the `worst` lowest-scored samples with their reasons."""
    scored = [r for r in records if "metrics" in r]
    metrics = list(dict.fromkeys(m for r in scored for m in r["metrics"]))
    summary = Table("summary", ["metric", "mean", "scored", "no value"], [])
    sections = []
    for metric in metrics:
        entries = [(r, r["metrics"][metric]) for r in scored if metric in r["metrics"]]
        values = [e["value"] for _, e in entries if e.get("value") is not None]
        mean = sum(values) / len(values) if values else None
        summary.rows.append([metric, num(mean, 4), str(len(values)), str(len(entries) - len(values))])
        lo, hi = _range(values)
        chart = histogram_svg(f"{metric}: score distribution", {"samples": values}, {"samples": PALETTE[0]}, lo, hi)
        lowest = sorted((e for e in entries if e[1].get("value") is not None), key=lambda e: e[1]["value"])[:worst]
        no_value = [e for e in entries if e[1].get("value") is None][:worst]
        sections.append(f'<section id="metric-{escape(metric)}"><h2>{escape(metric)}</h2>'
                        f'<div class="charts">{chart}</div>'
                        f"<h3>Lowest scores</h3>{_samples_table(lowest)}"
                        + (f"<h3>No value</h3>{_samples_table(no_value)}" if no_value else "") + "</section>")
    skipped = len(records) - len(scored)
    head = (f"<h1>Evaluation results</h1><p><code>{escape(source)}</code>: {len(records)} rows, {len(scored)} "
            f"scored, {skipped} skipped.</p>")
    return page(f"Evaluation results {source}", head + table_html(summary, "summary") + "\n".join(sections))


def _samples_table(entries: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    if not entries:
        return "<p>none</p>"
    fields = [f for f in ("user_input", "retrieved_contexts", "response", "reference")
              if any(rec.get(f) for rec, _ in entries)]
    rows = []
    for rec, entry in entries:
        cells = "".join(f'<td class="text">{escape(_clip(rec.get(f)))}</td>' for f in fields)
        rows.append(f"<tr><td>{escape(str(rec.get('row', '')))}</td><td>{num(entry.get('value'))}</td>{cells}"
                    f'<td class="text">{_reason_html(entry)}</td></tr>')
    head = "".join(f"<th>{c}</th>" for c in ("row", "score", *fields, "reason"))
    return f'<table class="samples"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _reason_html(entry: dict[str, Any]) -> str:
    """The reason; for claim metrics its first line and then each claim marked by its verdict."""
    reason = entry.get("reason") or ""
    details = entry.get("details") or {}
    claims, verdicts = details.get("claims"), details.get("verdicts")
    if not claims or verdicts is None or len(verdicts) != len(claims):
        return f'<pre class="reason">{escape(reason)}</pre>'
    marks = {True: ("supported", "supported"), False: ("unsupported", "not supported"), None: ("none", "no verdict")}
    items = "".join(f'<li class="{marks[v][0]}">[{marks[v][1]}] {escape(c)}</li>' for c, v in zip(claims, verdicts))
    return f'<pre class="reason">{escape(reason.splitlines()[0])}</pre><ul class="claims">{items}</ul>'


def _clip(value: Any, limit: int = 400) -> str:
    if value is None:
        return ""
    text = "\n---\n".join(value) if isinstance(value, list) else str(value)
    return text if len(text) <= limit else text[:limit] + " …"
