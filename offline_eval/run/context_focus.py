"""Long retrieved contexts focused on what the sample says: the passages a judge needs, not the whole text.

A small judge loses track in long contexts: on WiCE dev (claims against whole web articles) the default judge
said "yes" to supported claims with a mean probability of 0.31, against 0.56 on short passages. And cutting a
long context from the end to fit the judge's window drops whatever evidence stood late in it. So when a
sample's contexts hold more than a budget of tokens (estimated as bytes / 4, which holds within about 20% for
English and Chinese and needs no tokenizer, so every engine and every judge of a `compare` sees the same
text), each context is cut into passages of a few sentences and only the passages most relevant to the
sample's texts are kept, in their order, with "…" where text was left out:

- the queries are each sentence of the response, then of the reference, then the question (in that order
  they take turns below: what the response states needs its evidence most);
- passages are ranked for each query by BM25 over the sample's passages (words for alphabetic scripts,
  character bigrams for Chinese, Japanese and Korean, so names, numbers and dates weigh most);
- every context keeps its best passage (so no context disappears: Context Precision ranks them all), then
  the queries take turns, each adding its next best passage, until the budget is spent; so each sentence of
  a long response gets its evidence, not only the sentence with the most words in common;
- what budget is left goes to the neighbours of the kept passages, nearest first.

The focus is made once per sample, for every metric alike, so a sample's context-showing calls still share one
prompt prefix (metrics/base.py `request`). Pure text processing: deterministic, no model, no network.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate
from typing import Optional, Sequence

DEFAULT_BUDGET = 1024  # tokens of contexts a sample keeps (estimated); chosen a priori, see the README
PASSAGE_BYTES = 400  # a passage: consecutive sentences up to about 100 tokens
GAP = "…"
BM25_K1, BM25_B = 1.2, 0.75

# A sentence: up to the end mark and the spaces after it, so sentences and passages are slices of the text
# and join back to it exactly (Chinese has no space to put back between sentences). Written greedily (a run
# of text with no end mark, or a mark that no space follows) rather than as a lazy `[^\n]*?`: the same
# matches, found 4x faster, and splitting is a hot loop of the run core.
_SENTENCE = re.compile(r"(?:[^\n.!?;。！？；]+|[.!?;](?!\s))*(?:[.!?;]\s+|[。！？；]\s*|\n+|$)")
_CJK = "\u3005-\u3007\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TERMS = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")
# _TERMS's words in lower-cased ASCII text (which has no CJK run) are what is left between everything else:
# translate and split find them faster than a regex does.
_ASCII_SPACES = str.maketrans({c: " " for c in map(chr, range(128)) if not c.isalnum()})
_STOPWORDS = frozenset("""a an and are as at be been but by can did do does for from had has have he her his
i if in into is it its me my no not of on or our she so than that the their them then there these they this
those to was we were what when where which who will with would you your yes also about after all any before
being both each how just more most other over such only own same some very""".split())


def estimated_tokens(text: str) -> int:
    return (len(text.encode()) + 3) // 4


@dataclass
class Focus:
    contexts: list[str]
    note: str  # what was kept, for the result's details


def focus_contexts(contexts: Sequence[str], queries: Sequence[Optional[str]],
                   budget: int = DEFAULT_BUDGET) -> Optional[Focus]:
    """`contexts` reduced to their passages most relevant to `queries` (response, reference, question: earlier
    ones take their turn first; None entries are skipped), about `budget` tokens in all; None when they fit
    the budget as they are."""
    total = sum(estimated_tokens(c) for c in contexts)
    if total <= budget:
        return None
    passages = [split_passages(c) for c in contexts]
    flat = [(ci, pi) for ci, ps in enumerate(passages) for pi in range(len(ps))]
    starts = [0]
    for ps in passages:
        starts.append(starts[-1] + len(ps))
    own = [range(starts[ci], starts[ci + 1]) for ci in range(len(contexts))]  # each context's indices in flat
    terms = [_terms(passages[ci][pi]) for ci, pi in flat]
    asks = [t for q in queries if q for s in split_sentences(q) if (t := _terms(s))]
    scores = bm25_scores(terms, asks)
    best = [max((s[i] for s in scores), default=0.0) for i in range(len(flat))]
    size = [estimated_tokens(passages[ci][pi]) for ci, pi in flat]

    kept: set[int] = set()
    used = 0
    for span in own:  # every context keeps its best passage (its first if none matches)
        if span:
            top = max(span, key=lambda i: (best[i], -i))
            kept.add(top)
            used += size[top]
    orders = [sorted((i for i in range(len(flat)) if s[i] > 0), key=lambda i: (-s[i], i)) for s in scores]
    for turn in range(len(flat)):
        if used >= budget or not any(turn < len(o) for o in orders):
            break
        for order in orders:
            if turn < len(order) and order[turn] not in kept and used + size[order[turn]] <= budget:
                kept.add(order[turn])
                used += size[order[turn]]

    # What the budget still holds goes to the kept passages' neighbours in the same context, nearest first (they
    # name who "he" or "it" is, and finish a thought a passage starts), farther out until it is spent.
    for distance in range(1, len(flat)):
        near = sorted({i + d for i in kept for d in (-distance, distance)
                       if 0 <= i + d < len(flat) and flat[i + d][0] == flat[i][0]} - kept)
        if not near or used >= budget:
            break
        for i in near:
            if used + size[i] <= budget:
                kept.add(i)
                used += size[i]

    focused = []
    for ci, ps in enumerate(passages):
        chosen = [i - starts[ci] for i in own[ci] if i in kept]
        focused.append(_joined(ps, chosen) if chosen else contexts[ci])
    note = (f"retrieved_contexts focused on the passages most relevant to the sample: kept {len(kept)} of "
            f"{len(flat)} passages, ~{used} of ~{total} tokens (long_inputs=focus:{budget})")
    return Focus(focused, note)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, each with the spaces that follow it: "".join(them) == text."""
    return [sentence for sentence in _SENTENCE.findall(text) if sentence]


def split_passages(text: str) -> list[str]:
    """`text` as consecutive runs of sentences of up to PASSAGE_BYTES each (a longer sentence is cut after a
    space, or anywhere in text without spaces): "".join(them) == text."""
    units = []
    for sentence in split_sentences(text):
        units.extend([sentence] if len(sentence.encode()) <= PASSAGE_BYTES else _pieces(sentence))
    return _packed(units, text.isascii())


def _pieces(sentence: str) -> list[str]:
    """A sentence longer than a passage, cut after spaces (a run without spaces: by character) into runs of up
    to a passage."""
    words = re.findall(r"\S+\s*|\s+", sentence)
    if max(map(len, words)) * 4 > PASSAGE_BYTES:  # a word may be longer than a passage (4 bytes a character)
        words = [c for w in words for c in (list(w) if len(w.encode()) > PASSAGE_BYTES else [w])]
    return _packed(words, sentence.isascii())


def _packed(units: list[str], ascii: bool) -> list[str]:
    """Consecutive `units` (`ascii`: all of them ASCII) joined into runs of up to PASSAGE_BYTES (a unit is never
    split): each run takes units while they fit, and at least one. Found by bisecting the units' cumulative
    byte ends, not unit by unit: a long sentence is cut into hundreds of words."""
    # UTF-8 bytes add up, and ASCII has one per character
    ends = list(accumulate(map(len, units) if ascii else (len(u.encode()) for u in units)))
    runs, i, before = [], 0, 0
    while i < len(units):
        j = max(i, bisect_right(ends, before + PASSAGE_BYTES, i) - 1)
        runs.append("".join(units[i:j + 1]))
        before, i = ends[j], j + 1
    return runs


def _joined(passages: Sequence[str], chosen: Sequence[int]) -> str:
    """The chosen passages as they stand in the text, with a gap mark for each stretch left out."""
    text = f"{GAP} " if chosen[0] > 0 else ""
    for k, pi in enumerate(chosen):
        if k and pi != chosen[k - 1] + 1:
            text = text.rstrip() + f" {GAP} "
        text += passages[pi]
    if chosen[-1] < len(passages) - 1:
        text = text.rstrip() + f" {GAP}"
    return text.strip()


def _terms(text: str) -> Counter:
    """Words (lower-cased, a plural 's' dropped, stopwords out) and, in CJK runs, character bigrams."""
    lowered = text.lower()
    if lowered.isascii():  # most text, and the hot loop of a focus (one call per passage): no regex
        return Counter([_stem(w) for w in lowered.translate(_ASCII_SPACES).split() if w not in _STOPWORDS])
    found: list[str] = []  # in text order, counted at once
    for cjk, word in _TERMS.findall(lowered):  # a CJK run, or a word of other letters and digits
        if cjk:
            found.extend(cjk[i:i + 2] for i in range(max(1, len(cjk) - 1)))
        elif word not in _STOPWORDS:
            found.append(_stem(word))
    return Counter(found)


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word[-1] == "s" and word[-2] != "s" else word


def bm25_scores(docs: Sequence[Counter], queries: Sequence[Counter]) -> list[list[float]]:
    """Each query's BM25 score of each doc. Only the queries' terms are weighed (a doc holds many more), each
    once for all the queries: a focus asks one query per sentence of the sample."""
    lengths = [sum(d.values()) for d in docs]
    mean_length = (sum(lengths) / len(docs)) if docs else 0.0
    n = len(docs)
    idf = {}
    for t in set().union(*queries):
        if k := sum(1 for d in docs if t in d):
            idf[t] = math.log(1 + (n - k + 0.5) / (k + 0.5))
    weights = []  # per doc: {term of a query: its weight in the doc}
    for doc, length in zip(docs, lengths):
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / (mean_length or 1))
        weights.append({t: idf[t] * tf * (BM25_K1 + 1) / (tf + norm) for t in idf if (tf := doc.get(t))})
    return [[sum(w[t] for t in query if t in w) for w in weights] for query in queries]
