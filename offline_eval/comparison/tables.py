"""The tables of a judge comparison, built once from `compare.analyse`'s output and rendered three ways:
a rich table for the terminal, markdown, and HTML (reports/html.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

STAT_NAMES = {"auc": "ROC-AUC", "balanced_accuracy": "balanced accuracy", "accuracy": "accuracy",
              "kappa": "Cohen's kappa", "spearman": "Spearman", "kendall": "Kendall tau-b"}


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


# ---- formatting -----------------------------------------------------------------------------------------

def num(value: Optional[float], digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def with_ci(est: dict[str, Any]) -> str:
    lo, hi = est["ci"]
    return num(est["value"]) + ("" if _missing(lo) else f" [{num(lo, 2)}, {num(hi, 2)}]")


def percent(value: Optional[float]) -> str:
    return "n/a" if _missing(value) else f"{100 * value:.1f}%"


def size(nbytes: Optional[int]) -> str:
    if nbytes is None:
        return "unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ---- the tables -----------------------------------------------------------------------------------------

def agreement_table(analysis: dict[str, Any], metric: str) -> Table:
    m = analysis["metrics"][metric]
    graded = m["labels"]["graded"]
    columns = ["judge", "scored", "no score", "invalid calls", "threshold", "accuracy", "balanced acc.",
               "kappa", "ROC-AUC"] + (["Spearman", "Kendall"] if graded else [])
    rows = []
    for name in m["ranking"]:
        a = m["judges"][name]
        row = [name, f"{a['scored']}/{a['n']}", percent(a["no_score_rate"]), percent(a["invalid_calls"]),
               num(a["threshold"], 2), with_ci(a["accuracy"]), with_ci(a["balanced_accuracy"]),
               with_ci(a["kappa"]), with_ci(a["auc"])]
        if graded:
            row += [with_ci(a["spearman"]), with_ci(a["kendall"])]
        rows.append(row)
    labels = m["labels"]
    first = m["judges"][m["ranking"][0]] if m["ranking"] else {}
    rule = first.get("threshold_rule", "fixed")
    where = "" if rule == "fixed" else ", reported on the held-out half"
    scale = " (graded labels: positive = above the middle of the scale)" if graded else ""
    note = (f"{labels['n']} labelled rows, {labels['positive']} positive{scale}; prediction: score >= threshold "
            f"({rule}{where}); [95% bootstrap CI]; judges ranked by "
            f"{STAT_NAMES[analysis['settings']['rank_by']]}; recommended: {m['recommended']}")
    return Table(f"{metric}: agreement with the labels", columns, rows, note)


def scoring_table(analysis: dict[str, Any]) -> Optional[Table]:
    """Each scoring of each judge and metric side by side: agreement, and calibration (ECE)."""
    rows = []
    for metric, m in analysis["metrics"].items():
        for name in m["ranking"]:
            for scoring, a in (m["judges"][name].get("scorings") or {}).items():
                means = a["mean_score"]
                rows.append([metric, name, scoring, with_ci(a["auc"]), with_ci(a["kappa"]),
                             with_ci(a["balanced_accuracy"]), num(a["calibration"]["ece"]),
                             f"{num(means['positive'], 2)} / {num(means['negative'], 2)}"])
    if not rows:
        return None
    note = ("probability: from the judge's probability of each allowed answer (P(top rating) of the templates "
            "combined, mean P(yes)); "
            "argmax: from the answers alone (Ragas). kappa and balanced accuracy at the threshold of the agreement "
            "tables; ECE: expected calibration error over 10 score bins (0 = a score of 0.7 means 70% positive)")
    return Table("scorings side by side", ["metric", "judge", "scoring", "ROC-AUC", "kappa", "balanced acc.",
                                           "ECE", "mean score pos / neg"], rows, note)


def cost_table(analysis: dict[str, Any]) -> Table:
    columns = ["judge", "engine", "weights", "load s", "s / sample", "tokens / sample", "peak RSS",
               "RSS before load"]
    rows = []
    for j in analysis["judges"]:
        mem = j["memory"]
        scope = mem.get("scope")
        peak = size(mem.get("peak_rss")) + {"process lifetime": " (lifetime)", "replica": " (per replica)"}.get(scope, "")
        peak += " (client only)" if mem.get("note") and scope != "replica" else ""
        rows.append([j["name"], str(j["engine"]), size(j["size_bytes"]), num(j["load_seconds"], 1),
                     num(j["seconds_per_sample"], 2), num(j["tokens_per_sample"], 0), peak,
                     size(mem.get("baseline_rss"))])
    note = ("s / sample and tokens / sample (prompt + completion) over all compared metrics; peak RSS: the "
            "process's highest resident memory while that judge loaded and ran (it includes the RSS before "
            "load); a vLLM server's own memory is not included; with --ray, per replica: the largest resident "
            "memory of one replica and its child processes after a block, and load s is the time outside scoring")
    return Table("cost per judge", columns, rows, note)


def consistency_table(analysis: dict[str, Any]) -> Optional[Table]:
    rows = []
    for metric, m in analysis["metrics"].items():
        for name, a in m["judges"].items():
            c = a["consistency"]
            if not c:
                continue
            bias = c.get("role_swap_bias")
            rows.append([metric, name,
                         percent(c.get("template_agreement")) if "template_agreement" in c else "-",
                         num(c.get("template_kappa")) if "template_kappa" in c else "-",
                         with_ci(bias) if bias else "-",
                         percent(c.get("rerun_identical")) if "rerun_identical" in c else "-"])
    if not rows:
        return None
    note = ("templates agree: both templates of a dual-judge metric gave the same rating (kappa corrects for "
            "chance); role-swap bias (answer_accuracy): mean score of template 1 minus template 2 (which swaps "
            "response and reference) on the 0-1 scale; reruns identical: share of rerun scores equal to the "
            "first run's — 100% is expected at temperature 0 (greedy decoding, the default)")
    return Table("consistency", ["metric", "judge", "templates agree", "template kappa", "role-swap bias",
                                 "reruns identical"], rows, note)


def ranking_table(analysis: dict[str, Any]) -> Table:
    stat = analysis["settings"]["rank_by"]
    overall = analysis["overall"]
    sizes = {j["name"]: j["size_bytes"] for j in analysis["judges"]}
    metrics = list(analysis["metrics"])
    rows = []
    for place, name in enumerate(overall["ranking"], 1):
        per_metric = [num(analysis["metrics"][m]["judges"][name][stat]["value"]) for m in metrics]
        mark = "recommended" if name == overall["recommended"] else ""
        rows.append([str(place), name, size(sizes.get(name)), num(overall["primary"][name]), *per_metric, mark])
    note = (f"ranked by the mean {STAT_NAMES[stat]} over the metrics; recommended: the smallest judge (weights "
            f"on disk) within {analysis['settings']['margin']} of the best")
    return Table("ranking", ["#", "judge", "weights", f"mean {STAT_NAMES[stat]}", *metrics, ""], rows, note)


def all_tables(analysis: dict[str, Any]) -> list[Table]:
    tables = [ranking_table(analysis)]
    tables += [agreement_table(analysis, m) for m in analysis["metrics"]]
    scorings = scoring_table(analysis)
    tables += [scorings] if scorings else []
    tables.append(cost_table(analysis))
    extra = consistency_table(analysis)
    return tables + ([extra] if extra else [])


# ---- renderers ------------------------------------------------------------------------------------------

def to_rich(table: Table):
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, caption=table.note or None, caption_justify="left")
    for i, col in enumerate(table.columns):
        out.add_column(col, justify="left" if i < 2 else "right")
    for row in table.rows:
        out.add_row(*row)
    return out


def to_markdown(table: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [f"### {table.title}", "", line(table.columns), line(["---"] * len(table.columns))]
    lines += [line(row) for row in table.rows]
    if table.note:
        lines += ["", table.note]
    return "\n".join(lines) + "\n"


def markdown_report(analysis: dict[str, Any]) -> str:
    labels = analysis["labels"]
    head = (f"# Judge comparison\n\nLabels: `{labels['source']}` ({labels['format']}, {labels['rows']} rows). "
            f"Recommended judge: **{analysis['overall']['recommended']}**.\n")
    return head + "\n" + "\n".join(to_markdown(t) for t in all_tables(analysis))
