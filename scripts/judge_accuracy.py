"""How well do the judge prompts agree with human labels?

Two suites:

  begin   (default) Runs metrics on the BEGIN benchmark (Dziri et al.; human "is the response attributable
          to the knowledge?" labels). Each row becomes a sample: knowledge -> retrieved_contexts=[knowledge],
          message -> user_input, response -> response. "Fully attributable" is the positive class. For each
          metric it reports ROC-AUC of the score, accuracy and balanced accuracy at --threshold (score >=
          threshold predicts "fully attributable"; also shown for score > threshold), the score / rating
          distribution, the number of samples without a score (None, left out of the statistics) and the
          wall time.

  sets    The cross-set table: faithfulness and response_groundedness on a balanced, seeded subset of every
          human-labelled development set in ../shared/benchmarks (BEGIN dev, English dialogue; CiteCheck dev,
          Chinese RAG citations; WiCE dev, English claims against whole web articles), under both scorings
          (probability, argmax): ROC-AUC, Cohen's kappa and balanced accuracy at 0.5 with 95% bootstrap CIs,
          expected calibration error, mean score per class. The sets named by --tuned-on (default: begin,
          which the prompts and the choice of default scoring were tuned on) are marked: their figures are not
          accuracy. Each set runs under each --long-inputs policy (default focus, then truncate: long contexts
          judged on their most relevant passages, or whole), with the paired ROC-AUC difference between them;
          a set whose rows the focus leaves alone runs once. Then a cut fit on the tuned-on sets (a shift-only recalibration, offline_eval/comparison/calibration.py)
          is measured on the others: kappa at that cut next to kappa at 0.5. Judge calls go through the judge
          cache, so a rerun replays in seconds.

  sanity  A few hand-written cases per metric (English and Chinese) in groups of good / partial / bad;
          checks that each group's scores come out in that order.

Examples (from the repository root, with PYTHONPATH=. and OFFLINE_EVAL_THREADS=2):

  python scripts/judge_accuracy.py --limit 120 --seed 0                  # a fixed 120-row sample
  python scripts/judge_accuracy.py --limit 120 --seed 0 --offset 120     # the next 120 rows: a disjoint subset
  python scripts/judge_accuracy.py --metrics response_groundedness --output rows.csv
  python scripts/judge_accuracy.py --suite sanity
  python scripts/judge_accuracy.py --suite sets --sets begin,citecheck,wice --per-set begin=40,citecheck=80,wice=40 \
      --long-inputs focus  # the README table

Rows are taken in a random order fixed by --seed, so (--seed, --offset, --limit) names a reproducible subset
and two subsets with the same seed and non-overlapping offsets never share a row.

To compare several judges on BEGIN (or on your own labels) with confidence intervals, cost and an HTML
report, use `offline-eval compare` (README, "Comparing judges"); it shares this script's loader, subset
order and statistics (offline_eval/comparison/labels.py, offline_eval/comparison/agreement.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from offline_eval import llm_factory  # noqa: E402
from offline_eval.comparison.agreement import accuracy, balanced_accuracy, roc_auc  # noqa: E402
from offline_eval.comparison.labels import LabelledSet, load_labelled  # noqa: E402
from offline_eval.metrics import MetricResult, metric_by_name  # noqa: E402

DEFAULT_TSV = REPO.parent / "shared" / "benchmarks" / "begin" / "begin_dev_wow.tsv"


# ---- the BEGIN suite (the loader and the statistics are offline_eval.comparison.labels and offline_eval.comparison.agreement) ---

def load_begin(path: Path, seed: int, offset: int, limit: Optional[int]) -> LabelledSet:
    return load_labelled(path).subset(limit, seed, offset)


def rating_counts(results: Sequence[MetricResult]) -> str:
    """Per-judge rating counts for dual-judge metrics, else a histogram of the score."""
    ratings = [r.details.get("ratings") for r in results]
    if all(ratings):
        lines = []
        for j in range(len(ratings[0])):
            counts = Counter(str(r[j]) for r in ratings)
            lines.append(f"judge{j + 1} ratings " + "  ".join(f"{k}:{v}" for k, v in sorted(counts.items())))
        return "\n    ".join(lines)
    counts = Counter("None" if r.value is None else f"{round(r.value * 4) / 4:.2f}" for r in results)
    return "score (to 0.25) " + "  ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def report_begin(name: str, results: Sequence[MetricResult], labels: np.ndarray, seconds: float,
                 threshold: float) -> dict:
    values = np.array([np.nan if r.value is None else r.value for r in results], dtype=float)
    valid = ~np.isnan(values)
    auc = roc_auc(values[valid], labels[valid])
    pred, truth = values[valid] >= threshold, labels[valid]
    acc, bal = accuracy(pred, truth), balanced_accuracy(pred, truth)
    # Dual-judge scores are often exactly 0.5 (two "partial" ratings), so also show the strict threshold.
    strict = values[valid] > threshold
    acc_strict, bal_strict = accuracy(strict, truth), balanced_accuracy(strict, truth)
    pos_mean = np.nanmean(values[labels]) if (valid & labels).any() else np.nan
    neg_mean = np.nanmean(values[~labels]) if (valid & ~labels).any() else np.nan
    print(f"\n{name}  ({len(results)} rows, {int(labels.sum())} fully attributable)")
    print(f"    ROC-AUC {auc:.3f}   accuracy {acc:.3f}   balanced accuracy {bal:.3f}   (score >= {threshold})")
    print(f"                  accuracy {acc_strict:.3f}   balanced accuracy {bal_strict:.3f}   (score > {threshold})")
    print(f"    mean score: fully attributable {pos_mean:.3f}, not fully attributable {neg_mean:.3f}")
    print(f"    {rating_counts(results)}")
    print(f"    None (no score): {int((~valid).sum())}   wall time {seconds:.0f} s "
          f"({seconds / max(len(results), 1):.1f} s/row)")
    return {"metric": name, "rows": len(results), "auc": auc, "accuracy": acc, "balanced_accuracy": bal,
            "balanced_accuracy_strict": bal_strict, "none": int((~valid).sum()), "seconds": seconds}


def run_begin(args: argparse.Namespace, judge) -> None:
    labelled = load_begin(Path(args.tsv), args.seed, args.offset, args.limit)
    labels = np.array(labelled.labels["faithfulness"]) == 1.0  # the same labels for both BEGIN metrics
    samples = [row.data for row in labelled.rows]
    print(f"BEGIN: {len(labelled)} rows from {args.tsv} (seed {args.seed}, offset {args.offset})")
    table = pd.DataFrame([{"row": r.number, **r.extra, "knowledge": r.data["retrieved_contexts"][0],
                           "message": r.data["user_input"], "response": r.data["response"]} for r in labelled.rows])
    table["fully_attributable"] = labels
    for name in args.metrics:
        metric = metric_by_name(name)
        metric.llm = judge
        started = time.perf_counter()
        results = metric.batch_score(samples, show_progress=args.progress)
        seconds = time.perf_counter() - started
        report_begin(metric.name, results, labels, seconds, args.threshold)
        table[metric.name] = [r.value for r in results]
        table[metric.name + "_reason"] = [r.reason for r in results]
    if args.output:
        table.to_csv(args.output, index=False)
        print(f"\nper-row scores written to {args.output}")


# ---- the cross-set suite: every development set, both scorings, what was tuned on marked ------------------

DEV_SETS = {"begin": ("begin", "begin_dev_wow.tsv"), "citecheck": ("citecheck", "citecheck_dev_zh.jsonl"),
            "wice": ("wice", "wice_dev_en.jsonl")}


def balanced_rows(labelled: LabelledSet, per_set: int, seed: int) -> LabelledSet:
    """`per_set` rows, half positive and half negative, each half in a random order fixed by `seed`."""
    labels = np.array(labelled.labels["faithfulness"], dtype=float)
    rng = np.random.RandomState(seed)
    picked = []
    for cls in (1.0, 0.0):
        idx = np.flatnonzero(labels == cls)
        picked += list(rng.permutation(idx)[:per_set // 2])
    picked.sort()
    return LabelledSet([labelled.rows[i] for i in picked],
                       {m: [ys[i] for i in picked] for m, ys in labelled.labels.items()},
                       labelled.source, labelled.format)


def rows_for(per_set: str, name: str) -> int:
    """--per-set: one number for every set, or name=N pairs (sets not named get 40)."""
    if "=" not in per_set:
        return int(per_set)
    return dict((k.strip(), int(v)) for k, v in (p.split("=") for p in per_set.split(","))).get(name, 40)


def run_sets(args: argparse.Namespace, judge) -> None:
    from offline_eval import evaluate
    from offline_eval.comparison.agreement import agreement, calibration
    from offline_eval.comparison.tables import with_ci
    from offline_eval.run.plan import SCORINGS

    tuned = set(args.tuned_on.split(",")) if args.tuned_on else set()
    policies = [p.strip() for p in args.long_inputs.split(",") if p.strip()]
    lines = ["| set | rows | long inputs | metric | scoring | ROC-AUC | kappa @ 0.5 | balanced acc. @ 0.5 | ECE | "
             "mean pos / neg |", "|---|---|---|---|---|---|---|---|---|---|"]
    dump = {}
    for name in args.sets.split(","):
        folder, file = DEV_SETS[name]
        labelled = balanced_rows(load_labelled(Path(args.benchmarks) / folder / file), rows_for(args.per_set, name),
                                 args.seed)
        labels = np.array(labelled.labels["faithfulness"], dtype=float)
        pos = labels == 1.0
        shown = f"{name} (tuned on)" if name in tuned else name
        for k, policy in enumerate(policies):
            started = time.perf_counter()
            result = evaluate([r.data for r in labelled.rows], metrics=args.metrics, llm=judge, cache=True,
                              show_progress=args.progress, long_inputs=policy)
            seconds = time.perf_counter() - started
            print(f"{name}, long_inputs={policy}: {len(labels)} rows ({int(pos.sum())} positive), {result.focused} "
                  f"focused, {seconds:.0f} s", flush=True)
            key = name if k == 0 else f"{name}:{policy}"
            dump[key] = {"set": name, "long_inputs": policy, "focused": result.focused,
                         "rows": [r.number for r in labelled.rows], "labels": labels.tolist(), "metrics": {}}
            for metric in args.metrics:
                results = [res[metric] for res in result.results.values()]
                dump[key]["metrics"][metric] = {s: [r.scores.get(s) for r in results] for s in SCORINGS}
                # each row's constrained choices with the judge's distribution: what a recalibration is fit on
                dump[key]["metrics"][metric]["choices"] = [
                    [{"stage": c["stage"], "value": c["value"], "probabilities": c["probabilities"]}
                     for c in r.judge_calls if c.get("probabilities")] for r in results]
                for scoring in SCORINGS:
                    scores = [r.scores.get(scoring) for r in results]
                    a = agreement(scores, labels, pos, 0.5, args.seed, args.bootstrap)
                    ece = calibration(scores, pos)["ece"]
                    means = a["mean_score"]
                    lines.append(f"| {shown} | {a['scored']} | {policy} ({result.focused} focused) | {metric} | "
                                 f"{scoring} | {with_ci(a['auc'])} | {with_ci(a['kappa'])} | "
                                 f"{with_ci(a['balanced_accuracy'])} | {ece:.3f} | "
                                 f"{means['positive']:.2f} / {means['negative']:.2f} |")
            print("\n".join(lines), flush=True)
            if k == 0 and policy.startswith("focus") and not result.focused:
                break  # no row was focused: the other policies would judge the very same prompts
    differences = policy_differences(dump, policies, args)
    transferred = transferred_cuts({k: v for k, v in dump.items() if ":" not in k}, tuned, args)
    print("\n".join(differences + transferred))
    lines += differences + transferred
    if args.output:
        Path(args.output).write_text(json.dumps({"table": lines, "sets": dump}, indent=1))
        print(f"scores written to {args.output}")


def policy_differences(dump: dict, policies: Sequence[str], args: argparse.Namespace) -> list[str]:
    """Per set, metric and scoring: the first --long-inputs policy's ROC-AUC minus each other's, on the same
    rows, with a paired bootstrap interval (rows resampled together): whether focusing long contexts helps."""
    from offline_eval.comparison.agreement import estimate, roc_auc
    from offline_eval.comparison.tables import with_ci
    from offline_eval.run.plan import SCORINGS

    others = [(k, v) for k, v in dump.items() if ":" in k]
    if not others:
        return []
    lines = ["", f"ROC-AUC of long_inputs={policies[0]} minus the other policy's, same rows, paired bootstrap:", "",
             "| set | vs | metric | scoring | difference |", "|---|---|---|---|---|"]
    for key, other in others:
        first = dump[other["set"]]
        for metric in args.metrics:
            for scoring in SCORINGS:
                a, b = first["metrics"][metric][scoring], other["metrics"][metric][scoring]
                keep = [i for i in range(len(a)) if a[i] is not None and b[i] is not None]
                arrays = [np.array([a[i] for i in keep]), np.array([b[i] for i in keep]),
                          np.array([first["labels"][i] == 1.0 for i in keep])]
                diff = estimate(lambda x, y, p: roc_auc(x, p) - roc_auc(y, p), arrays, args.bootstrap, args.seed)
                lines.append(f"| {other['set']} | {other['long_inputs']} | {metric} | {scoring} | {with_ci(diff)} |")
    return lines


def transferred_cuts(dump: dict, tuned: set, args: argparse.Namespace) -> list[str]:
    """A cut fit on the tuned-on sets, measured on the others: the raw score where a shift-only recalibration
    (offline_eval/comparison/calibration.py) fit on the tuned-on rows puts 0.5, and each held-out set's kappa there, next
    to its kappa at 0.5. It tells whether a recalibration learnt on one set carries to data it never saw."""
    from offline_eval.comparison.agreement import agreement
    from offline_eval.comparison.calibration import fit
    from offline_eval.comparison.tables import with_ci
    from offline_eval.run.plan import SCORINGS

    fit_on = [name for name in dump if name in tuned]
    if not fit_on:
        return []
    lines = ["", f"Cut fit on {'+'.join(fit_on)} (shift-only recalibration), measured on the other sets:", "",
             "| set | metric | scoring | cut | kappa @ cut | kappa @ 0.5 |", "|---|---|---|---|---|---|"]
    for metric in args.metrics:
        for scoring in SCORINGS:
            pairs = [(s, y) for name in fit_on for s, y in zip(dump[name]["metrics"][metric][scoring],
                                                              dump[name]["labels"]) if s is not None]
            cut = fit([s for s, _ in pairs], [y == 1.0 for _, y in pairs]).threshold()
            for name, got in dump.items():
                if name in tuned:
                    continue
                labels = np.array(got["labels"], dtype=float)
                scores = got["metrics"][metric][scoring]
                at_cut = agreement(scores, labels, labels == 1.0, cut, args.seed, args.bootstrap)["kappa"]
                at_half = agreement(scores, labels, labels == 1.0, 0.5, args.seed, args.bootstrap)["kappa"]
                lines.append(f"| {name} | {metric} | {scoring} | {cut:.3f} | {with_ci(at_cut)} | {with_ci(at_half)} |")
    return lines


# ---- the sanity suite -----------------------------------------------------------------------------------
# Each group is one question with three cases, expected to score good > partial > bad.

CONTEXT_RELEVANCE = [
    ("en", "What is the boiling point of water at sea level in degrees Celsius?", [
        ("good", ["At sea level, pure water boils at 100 degrees Celsius (212 degrees Fahrenheit)."]),
        ("partial", ["Water boils when its vapour pressure equals the surrounding air pressure, "
                     "so its boiling point depends on altitude."]),
        ("bad", ["The Eiffel Tower was completed in 1889 and is 330 metres tall."]),
    ]),
    ("en", "Who wrote the novel 'Pride and Prejudice' and in which year was it published?", [
        ("good", ["'Pride and Prejudice' is a novel by Jane Austen, first published in 1813."]),
        ("partial", ["Jane Austen was an English novelist known for her novels about the landed gentry."]),
        ("bad", ["Photosynthesis converts light energy into chemical energy stored in glucose."]),
    ]),
    ("zh", "长城的总长度大约是多少公里？", [
        ("good", ["根据国家文物局公布的数据，明长城总长度约为8851.8公里，历代长城总长度约为21196公里。"]),
        ("partial", ["长城是中国古代的军事防御工程，始建于春秋战国时期，后经多个朝代修筑。"]),
        ("bad", ["熊猫主要以竹子为食，分布在四川、陕西和甘肃的山区。"]),
    ]),
    ("zh", "Python 中如何获取列表的长度？", [
        ("good", ["在 Python 中，可以使用内置函数 len() 获取列表的长度，例如 len([1, 2, 3]) 返回 3。"]),
        ("partial", ["Python 的列表是一种可变序列，可以存放任意类型的元素，并支持索引和切片。"]),
        ("bad", ["西湖位于浙江省杭州市，是中国著名的风景名胜区。"]),
    ]),
]

ANSWER_ACCURACY = [
    ("en", "What is the capital of Australia?", "The capital of Australia is Canberra.", [
        ("good", "Canberra is Australia's capital city."),
        ("partial", "Australia's capital is in the Australian Capital Territory, but I am not sure which city."),
        ("bad", "The capital of Australia is Sydney."),
    ]),
    ("en", "When did the first human land on the Moon, and who was it?",
     "Neil Armstrong was the first human to land on the Moon, on 20 July 1969.", [
        ("good", "On July 20, 1969, Neil Armstrong became the first person to land on the Moon."),
        ("partial", "Neil Armstrong was the first person on the Moon."),
        ("bad", "Yuri Gagarin landed on the Moon in 1961."),
    ]),
    ("zh", "水的化学式是什么？", "水的化学式是 H2O，由两个氢原子和一个氧原子组成。", [
        ("good", "水的化学式为 H2O，即两个氢原子和一个氧原子。"),
        ("partial", "水由氢元素和氧元素组成。"),
        ("bad", "水的化学式是 CO2。"),
    ]),
    ("zh", "《红楼梦》的作者是谁？它是哪个朝代的作品？", "《红楼梦》的作者是曹雪芹，是清代的长篇小说。", [
        ("good", "《红楼梦》是清代曹雪芹创作的长篇小说。"),
        ("partial", "《红楼梦》的作者是曹雪芹。"),
        ("bad", "《红楼梦》是明代罗贯中写的。"),
    ]),
]


def sanity_cases(metric: str) -> list[tuple[int, str, str, dict]]:
    """(group, language, expected level, sample) for a metric's sanity cases."""
    cases = []
    if metric == "context_relevance":
        for g, (lang, question, variants) in enumerate(CONTEXT_RELEVANCE):
            for level, contexts in variants:
                cases.append((g, lang, level, {"user_input": question, "retrieved_contexts": contexts}))
    elif metric == "answer_accuracy":
        for g, (lang, question, reference, variants) in enumerate(ANSWER_ACCURACY):
            for level, response in variants:
                cases.append((g, lang, level, {"user_input": question, "response": response,
                                               "reference": reference}))
    else:
        raise SystemExit(f"the sanity suite has cases for context_relevance and answer_accuracy, not {metric}")
    return cases


def run_sanity(args: argparse.Namespace, judge) -> None:
    metrics = args.metrics if args.metrics_given else ["context_relevance", "answer_accuracy"]
    order = {"good": 2, "partial": 1, "bad": 0}
    for name in metrics:
        metric = metric_by_name(name)
        metric.llm = judge
        cases = sanity_cases(metric.name)
        started = time.perf_counter()
        results = metric.batch_score([c[3] for c in cases])
        seconds = time.perf_counter() - started
        print(f"\n{metric.name}  ({len(cases)} cases, {seconds:.0f} s)")
        ordered_pairs = total_pairs = strict_groups = 0
        groups = sorted({c[0] for c in cases})
        for g in groups:
            rows = [(c, r) for c, r in zip(cases, results) if c[0] == g]
            cells = "  ".join(f"{c[2]} {_fmt(r.value)} {r.details.get('ratings')}" for c, r in rows)
            scores = {c[2]: r.value for c, r in rows}
            pairs = [(a, b) for a in scores for b in scores if order[a] > order[b]]
            ok = [scores[a] is not None and scores[b] is not None and scores[a] > scores[b] for a, b in pairs]
            ordered_pairs += sum(ok)
            total_pairs += len(ok)
            strict_groups += all(ok)
            print(f"    [{rows[0][0][1]}] group {g + 1}: {cells}   {'ordered' if all(ok) else 'NOT ordered'}")
        values = Counter(_fmt(r.value) for r in results)
        print(f"    groups fully ordered {strict_groups}/{len(groups)}, pairs ordered {ordered_pairs}/{total_pairs}, "
              f"distinct scores {dict(sorted(values.items()))}")


def _fmt(value: Optional[float]) -> str:
    return "None" if value is None else f"{value:.2f}"


# ---- command line ---------------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tsv", nargs="?", default=str(DEFAULT_TSV), help="BEGIN TSV file (default: %(default)s)")
    parser.add_argument("--suite", choices=("begin", "sets", "sanity"), default="begin")
    parser.add_argument("--sets", default="begin,citecheck,wice", help="sets suite: development sets to score")
    parser.add_argument("--per-set", default="40",
                        help="sets suite: balanced rows per set: N, or name=N,... (e.g. citecheck=40,wice=24)")
    parser.add_argument("--tuned-on", default="begin",
                        help="sets suite: the sets prompts and scoring were tuned on (marked in the table; "
                             "their figures are not accuracy)")
    parser.add_argument("--long-inputs", default="focus,truncate",
                        help="sets suite: the long_inputs policies to run, comma-separated; the first is the one "
                             "the table leads with and the cut is fit on; a set none of whose rows the focus "
                             "changes runs once (default: %(default)s)")
    parser.add_argument("--benchmarks", default=str(REPO.parent / "shared" / "benchmarks"),
                        help="the folder of the development sets (default: %(default)s)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    parser.add_argument("--metrics", default=None,
                        help="comma-separated metric names (begin default: faithfulness,response_groundedness; "
                             "sanity default: context_relevance,answer_accuracy)")
    parser.add_argument("--model", default=None, help="judge name from models.yaml (default: the default judge)")
    parser.add_argument("--limit", type=int, default=None, help="score only N rows")
    parser.add_argument("--offset", type=int, default=0, help="skip the first K rows of the shuffled order")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row order (default 0)")
    parser.add_argument("--threshold", type=float, default=0.5, help="score >= threshold predicts positive")
    parser.add_argument("--output", help="write per-row scores and reasons to this CSV (begin suite)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    args = parser.parse_args(argv)
    args.metrics_given = args.metrics is not None
    args.metrics = [m.strip() for m in (args.metrics or "faithfulness,response_groundedness").split(",") if m.strip()]

    judge = llm_factory(args.model)
    print(f"judge: {judge.identity.get('model')}")
    if args.suite == "sanity":
        run_sanity(args, judge)
    elif args.suite == "sets":
        run_sets(args, judge)
    else:
        run_begin(args, judge)


if __name__ == "__main__":
    main()
