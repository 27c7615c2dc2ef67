#!/usr/bin/env python
"""How well each embedder separates related from unrelated text pairs: a proxy for Answer Relevancy.

Answer Relevancy scores an answer by the embedding cosine between the user question and questions generated
back from the answer. Its simplest honest proxy, with no judge in the loop, is the cosine between the user
question and the answer itself: a matched pair is a row's question and its own answer, a mismatched pair is
the question with the answer of another row (K other rows, with a different question). ROC-AUC says how often
a matched pair scores above a mismatched one (1.0 = always, 0.5 = chance). 95% CIs bootstrap the questions.

Data (../shared/benchmarks, see its README):
  zh  CiteCheck dev: user_input (question) vs response (a statement of the answer), 1000 rows
  en  BEGIN dev (Wizard of Wikipedia): message (the user's turn) vs response, 424 distinct messages
and, as a second proxy on the first 200 rows of each (--context-rows), the answer against its cited passage
(first 300 characters; long inputs are slow on CPU):
  zh  CiteCheck response vs retrieved_contexts[0];  en  BEGIN response vs knowledge

Usage: OFFLINE_EVAL_THREADS=1 python scripts/bench_embedders.py [--embedders a,b] [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from offline_eval.judges import embedding_factory  # noqa: E402

BENCHMARKS = ROOT.parent / "shared" / "benchmarks"
CONTEXT_CHARS = 300


def citecheck() -> list[dict[str, str]]:
    path = BENCHMARKS / "citecheck" / "citecheck_dev_zh.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"question": r["user_input"], "answer": r["response"],
             "context": r["retrieved_contexts"][0][:CONTEXT_CHARS]} for r in rows]


def begin() -> list[dict[str, str]]:
    path = BENCHMARKS / "begin" / "begin_dev_wow.tsv"
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    seen: dict[str, dict[str, str]] = {}
    for r in rows:  # one row per distinct message, so a mismatched pair never shares the question
        seen.setdefault(r["message"], {"question": r["message"], "answer": r["response"],
                                       "context": r["knowledge"][:CONTEXT_CHARS]})
    return list(seen.values())


DATASETS = {"zh": ("CiteCheck dev", citecheck), "en": ("BEGIN dev (WoW)", begin)}
PAIRS = {"question-answer": ("question", "answer"), "answer-context": ("answer", "context")}


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a matched score > a mismatched one), ties counted half (Mann-Whitney U)."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([pos, neg]))  # ties get their average rank
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def separation(left: np.ndarray, right: np.ndarray, k: int, boots: int, rng: np.random.Generator) -> dict:
    """Matched cosine per row i (left[i], right[i]) against K mismatched ones (left[i], right[i+s]) for K
    fixed shifts s; the AUC and its bootstrap CI over rows. The same seed draws the same shifts and bootstrap
    rows for every embedder, so the bootstrap samples of two embedders pair up (see paired_differences)."""
    n = len(left)
    shifts = rng.choice(np.arange(1, n), size=k, replace=False)
    matched = (left * right).sum(1)
    mismatched = np.stack([(left * np.roll(right, -s, axis=0)).sum(1) for s in shifts], axis=1)
    auc = roc_auc(matched, mismatched.ravel())
    samples = []
    for _ in range(boots):
        idx = rng.integers(0, n, n)
        samples.append(roc_auc(matched[idx], mismatched[idx].ravel()))
    low, high = np.percentile(samples, [2.5, 97.5])
    return {"auc": auc, "low": float(low), "high": float(high), "n": n, "samples": np.array(samples),
            "matched_mean": float(matched.mean()), "mismatched_mean": float(mismatched.mean())}


def paired_differences(results: list[dict]) -> None:
    """Each embedder's AUC minus the first one's on the same pairs, with a paired bootstrap 95% CI."""
    for r in results:
        base = next(b for b in results if (b["lang"], b["pair"]) == (r["lang"], r["pair"]))
        if r is not base:
            low, high = np.percentile(r["samples"] - base["samples"], [2.5, 97.5])
            r["vs_first"] = {"embedder": base["embedder"], "diff": r["auc"] - base["auc"],
                             "low": float(low), "high": float(high)}
            print(f"{r['embedder']:24} {r['lang']} {r['pair']:16} AUC - {base['embedder']}: "
                  f"{r['auc'] - base['auc']:+.3f} [{low:+.3f}, {high:+.3f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedders", default="all-minilm-l6-v2,multilingual-e5-small,use-multilingual-v3")
    parser.add_argument("--limit", type=int, default=0, help="first N rows per data set (0: all)")
    parser.add_argument("--context-rows", type=int, default=200, help="rows for the answer-context proxy")
    parser.add_argument("--mismatches", type=int, default=5, help="mismatched pairs per row")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    data = {lang: load()[: args.limit or None] for lang, (_, load) in DATASETS.items()}
    results = []
    for name in args.embedders.split(","):
        embedder = embedding_factory(name)
        for lang, rows in data.items():
            started = time.perf_counter()
            fields = {f: embedder.embed([r[f] for r in rows]) for f in ("question", "answer")}
            fields["context"] = embedder.embed([r["context"] for r in rows[: args.context_rows]]) \
                if args.context_rows else []
            seconds = time.perf_counter() - started
            for pair, (a, b) in PAIRS.items():
                n = min(len(fields[a]), len(fields[b]))
                if n < 2:  # --context-rows 0: no answer-context proxy
                    continue
                rng = np.random.default_rng(args.seed)
                r = separation(fields[a][:n], fields[b][:n], args.mismatches, args.bootstrap, rng)
                r.update(embedder=name, lang=lang, data=DATASETS[lang][0], pair=pair, embed_seconds=seconds)
                results.append(r)
                print(f"{name:24} {lang} {pair:16} AUC {r['auc']:.3f} [{r['low']:.3f}, {r['high']:.3f}]  "
                      f"cos matched {r['matched_mean']:.2f} / mismatched {r['mismatched_mean']:.2f}  "
                      f"n={r['n']}  embed {seconds:.0f}s", flush=True)
    paired_differences(results)
    if args.json:
        rows = [{k: v for k, v in r.items() if k != "samples"} for r in results]
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
