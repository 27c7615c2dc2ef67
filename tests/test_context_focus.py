"""Long contexts focused on the passages relevant to the sample (offline_eval/context_focus.py).

The selection is plain text processing, tested on its own; the run-level tests use a scripted judge only to
see which prompts the scheduler sends (the focused contexts, one shared prefix per sample). A real judge on a
focused row runs in tests/test_long_inputs.py.
"""

from __future__ import annotations

from offline_eval import evaluate
from offline_eval.context_focus import (DEFAULT_BUDGET, GAP, estimated_tokens, focus_contexts, split_passages,
                                        split_sentences)
from offline_eval.long_inputs import parse_policy
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
