"""Long contexts focused on the passages relevant to the sample (offline_eval/run/context_focus.py).

The selection is plain text processing, tested on its own; the run-level tests use a scripted judge only to
see which prompts the scheduler sends (the focused contexts, one shared prefix per sample). A real judge on a
focused row runs in tests/test_long_inputs.py.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter

from offline_eval import evaluate
from offline_eval.run.context_focus import (_STOPWORDS, BM25_B, BM25_K1, DEFAULT_BUDGET, GAP, PASSAGE_BYTES, _terms,
                                        bm25_scores, estimated_tokens, focus_contexts, split_passages,
                                        split_sentences)
from offline_eval.run.long_inputs import parse_policy
from scripted import ScriptedJudge, user_text

FILLER = [f"Filler sentence {i} is about the weather in a town with a long name and many quiet parks."
          for i in range(200)]


def article(*facts: str, at: tuple[int, ...] = (150, 30)) -> str:
    """A long article of filler sentences with `facts` placed at the positions `at` (late ones first)."""
    sentences = list(FILLER)
    for fact, where in zip(facts, at):
        sentences.insert(where, fact)
    return " ".join(sentences)


def test_contexts_within_the_budget_are_left_alone():
    assert focus_contexts(["A short context.", "Another one."], ["q", "r"]) is None
    assert parse_policy("focus") == ("focus", DEFAULT_BUDGET) and parse_policy("focus:300") == ("focus", 300)
    assert parse_policy("truncate") == ("truncate", 0) and parse_policy("error") == ("error", 0)


def test_each_sentence_of_the_response_keeps_its_evidence_even_late_in_a_long_context():
    late = "The Danube bridge at Novi Sad was rebuilt in 2018 by the city."
    early = "Marta Kovacs painted the harbour mural in 1997."
    context = article(late, early)
    response = ("The bridge in Novi Sad over the Danube was rebuilt in 2018 by the city council of Novi Sad. "
                "Kovacs painted the mural in 1997.")  # the first sentence shares far more words
    focus = focus_contexts([context], [response, None, "Tell me about the town."], budget=200)
    (text,) = focus.contexts
    assert late in text and early in text
    assert text.index(early) < text.index(late)  # kept in the document's order
    assert GAP in text and estimated_tokens(text) <= 200 + 10  # the budget, plus the gap marks
    assert "kept" in focus.note and "long_inputs=focus:200" in focus.note


def test_every_context_keeps_a_passage_and_short_ones_stay_whole():
    contexts = [article("Ulm lies on the Danube.", at=(100,)), "A short note about Ulm.", article(at=())]
    focus = focus_contexts(contexts, ["Ulm lies on the Danube.", None, "Where is Ulm?"], budget=300)
    first, second, third = focus.contexts
    assert "Ulm lies on the Danube." in first and second == "A short note about Ulm."
    assert third and third in contexts[2] or all(p in contexts[2] for p in third.replace(GAP, "|").split("|")
                                                 if p.strip())  # its best passage, cut out of it
    assert len(focus.contexts) == 3  # Context Precision still ranks three contexts


def test_chinese_is_matched_by_character_bigrams():
    filler = "".join(f"第{i}段讲的是这个城市的天气和公园，内容与问题无关。" for i in range(300))
    fact = "长江大桥于二〇一八年由市政府重建。"
    context = filler[:3000] + fact + filler[3000:]
    focus = focus_contexts([context], ["长江大桥在二〇一八年重建。", None, "长江大桥是什么时候重建的？"], budget=200)
    assert fact in focus.contexts[0] and estimated_tokens(focus.contexts[0]) <= 210


def test_the_focus_is_deterministic_and_passages_cover_the_text():
    context = article("Fact one is here.", "Fact two is there.")
    again = [focus_contexts([context], ["Fact one?", "Fact two."], 150).contexts for _ in range(2)]
    assert again[0] == again[1]
    for text in (context, "第一句。第二句！\n\n第三句", "word " * 2000 + "字" * 2000 + " end"):
        assert "".join(split_passages(text)) == "".join(split_sentences(text)) == text
        assert all(len(p.encode()) <= 400 for p in split_passages(text))



# The splitting, terms and scoring are written for speed (they are the hot loop of a cached run); these plain
# versions say what they compute, and the fast ones must agree with them exactly.
def plain_sentences(text: str) -> list[str]:
    return [m.group() for m in re.finditer(r"[^\n]*?(?:[.!?;]\s+|[。！？；]\s*|\n+|$)", text) if m.group()]


def plain_packed(units: list[str]) -> list[str]:
    runs, current = [], ""
    for unit in units:
        if current and len((current + unit).encode()) > PASSAGE_BYTES:
            runs, current = runs + [current], ""
        current += unit
    return runs + ([current] if current else [])


def plain_passages(text: str) -> list[str]:
    def pieces(sentence: str) -> list[str]:
        if len(sentence.encode()) <= PASSAGE_BYTES:
            return [sentence]
        return plain_packed([c for w in re.findall(r"\S+\s*|\s+", sentence)
                             for c in (list(w) if len(w.encode()) > PASSAGE_BYTES else [w])])
    return plain_packed([p for s in plain_sentences(text) for p in pieces(s)])


CJK = "\u3005-\u3007\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"


def plain_terms(text: str) -> Counter:
    found = []
    for cjk, word in re.findall(rf"([{CJK}]+)|([^\W_{CJK}]+)", text.lower()):
        if cjk:
            found += [cjk[i:i + 2] for i in range(max(1, len(cjk) - 1))]
        elif word not in _STOPWORDS:
            found.append(word[:-1] if len(word) > 3 and word[-1] == "s" and word[-2] != "s" else word)
    return Counter(found)


def plain_bm25(docs: list[Counter], query: Counter) -> list[float]:
    lengths = [sum(d.values()) for d in docs]
    mean = sum(lengths) / len(docs)
    df = Counter(t for d in docs for t in d)
    idf = {t: math.log(1 + (len(docs) - k + 0.5) / (k + 0.5)) for t, k in df.items()}
    return [sum(idf[t] * d[t] * (BM25_K1 + 1) / (d[t] + BM25_K1 * (1 - BM25_B + BM25_B * n / mean))
                for t in query if t in d) for d, n in zip(docs, lengths)]


def mixed_texts(n: int) -> list[str]:
    """Texts with every kind of sentence end, decimals, long sentences and words, Chinese, accents, newlines."""
    rng = random.Random(7)
    bits = ["The bridge was rebuilt.", "Pi is 3.14 here", "Why? ", "Yes! ", "a;b; c", "长江大桥于二〇一八年重建。",
            "第二句！", "Ulm\n", "\n\n", "Café Müller's ", "x" * 450, "word " * 120, "字" * 300, "tail.", " ",
            "Dr. Smith; ", "(see [1]) ", "end…", "Glass bridges cross rivers.", "ひらがなと한국어."]
    return [" ".join(rng.choice(bits) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def test_splitting_terms_and_scoring_equal_their_plain_definitions():
    texts = mixed_texts(300)
    for text in texts:
        assert split_sentences(text) == plain_sentences(text)
        assert split_passages(text) == plain_passages(text)
        assert _terms(text) == plain_terms(text)
    docs = [_terms(p) for text in texts[:20] for p in split_passages(text)]
    queries = [_terms(s) for s in split_sentences("The bridge was rebuilt in 2018. 长江大桥重建。 Café Müller?")]
    assert bm25_scores(docs, queries) == [plain_bm25(docs, q) for q in queries]



def answer(request):
    if request.tag == "claims":
        return {"claims": ["The bridge was rebuilt in 2018."]}
    options = request.constraint.options
    return "yes" if "yes" in options else options[-1]


def test_every_metric_of_a_sample_sees_the_same_focused_contexts():
    row = {"user_input": "When was the bridge rebuilt?", "response": "The bridge was rebuilt in 2018.",
           "retrieved_contexts": [article("The bridge was rebuilt in 2018 after the flood.", at=(120,))]}
    judge = ScriptedJudge(answer)
    metrics = ["context_relevance", "faithfulness", "response_groundedness"]
    result = evaluate([row], metrics=metrics, llm=judge, show_progress=False)
    shown = {user_text(r).split("\n\n")[0] for r in judge.requests if r.shows_contexts}
    assert len(shown) == 1  # one focused text, one shared prompt prefix for every context-showing call
    (contexts,) = shown
    assert "rebuilt in 2018 after the flood" in contexts and estimated_tokens(contexts) < DEFAULT_BUDGET + 20
    assert result.focused == 1 and result.warnings == []  # no window cut; the focus is a note, not a warning
    details = result.records()[0]["metrics"]
    assert all("context_focus" in details[m]["details"] for m in metrics)

    whole = ScriptedJudge(answer)  # --long-inputs truncate: whole contexts (they fit: no window here)
    result = evaluate([row], metrics=metrics, llm=whole, show_progress=False, long_inputs="truncate")
    assert result.focused == 0 and all(FILLER[199] in user_text(r) for r in whole.requests if r.shows_contexts)
