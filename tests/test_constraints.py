"""Output constraints: grammar text, worst-case output size, parsing, and the schema subset.

No engine runs here; these are the guarantees every engine relies on (the grammar an engine enforces, the
max_tokens that keeps an output from being cut off, and the parse check after decoding).
"""

import json
from typing import Any

import pytest

from offline_eval.constraints import Choice, ConstraintViolation, JsonSchema, array, copyable, enum, obj, string
from offline_eval.metrics.answer_relevancy import questions_schema
from offline_eval.metrics.claims import CLAIMS, extract_claims
from offline_eval.metrics.rubrics import SCORE

WIDE = "😀"  # 4 UTF-8 bytes: the widest character a string may hold

NESTED = JsonSchema.of(obj(
    title=string(10),
    flag={"type": "boolean"},
    kind=enum("short", "a longer value", 7),
    rows=array(obj(name=string(5, min_length=1), tags=array(string(3), 4)), 3, min_items=1),
    empty=array(string(2), 0),
))

SCHEMAS = {
    "claims": CLAIMS,
    "questions(1)": questions_schema(1),
    "questions(3)": questions_schema(3),
    "rubric": SCORE,
    "nested": NESTED,
}


def maximal(schema: dict[str, Any]) -> Any:
    """The instance of `schema` with the longest UTF-8 encoding."""
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(compact(v).encode()))
    kind = schema["type"]
    if kind == "boolean":
        return False
    if kind == "string":
        return WIDE * schema["maxLength"]
    if kind == "array":
        return [maximal(schema["items"]) for _ in range(schema["maxItems"])]
    return {name: maximal(sub) for name, sub in schema["properties"].items()}


def compact(value: Any) -> str:
    """JSON as the grammar makes engines write it: no whitespace, no ASCII escaping."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---- Choice -------------------------------------------------------------------------------------------

def test_choice_gbnf_lists_the_options_as_alternatives():
    assert Choice(("yes", "no")).gbnf() == 'root ::= "yes" | "no"\n'
    assert Choice(("0", "1", "2")).gbnf() == 'root ::= "0" | "1" | "2"\n'


@pytest.mark.parametrize("options", [("yes", "no"), ("0", "2", "4"), ("是", "否"), ("😀", "a")])
def test_choice_max_tokens_covers_the_longest_option(options):
    assert Choice(options).max_tokens() > max(len(o.encode()) for o in options)


def test_choice_parse_accepts_an_option_and_ignores_surrounding_whitespace():
    assert Choice(("yes", "no")).parse(" no\n") == "no"


@pytest.mark.parametrize("text", ["maybe", "", "Yes", "yes no", "1"])
def test_choice_parse_rejects_anything_else(text):
    with pytest.raises(ConstraintViolation):
        Choice(("yes", "no")).parse(text)


@pytest.mark.parametrize("options", [(), ("yes", "yes")])
def test_choice_needs_distinct_options(options):
    with pytest.raises(ValueError):
        Choice(options)


# ---- JsonSchema: grammar and bounds -------------------------------------------------------------------

def test_json_gbnf_has_a_root_and_one_rule_per_nested_part():
    grammar = JsonSchema.of(obj(claims=array(string(150, min_length=1), 8))).gbnf()
    lines = grammar.splitlines()
    assert grammar.endswith("\n")
    assert lines[0].startswith('root ::= "{" ')
    assert lines[0].endswith(' "}"')
    assert '"\\"claims\\":"' in lines[0]  # the key is a literal: keys are fixed, in declared order
    rules = dict(line.split(" ::= ", 1) for line in lines[1:])
    assert set(rules) == {"v-claims", "v-claims-item"}
    assert "{1,150}" in rules["v-claims-item"]  # string length bounds
    assert "{0,7}" in rules["v-claims"]  # up to 8 items: one, then at most seven more


def test_json_gbnf_writes_object_keys_in_declared_order():
    root = JsonSchema.of(obj(feedback=string(5), score=enum(1, 2))).gbnf().splitlines()[0]
    assert root.index('\\"feedback\\"') < root.index('\\"score\\"')
    assert '",\\"score\\":"' in root  # no whitespace between members


@pytest.mark.parametrize("name", SCHEMAS)
def test_max_tokens_exceeds_the_largest_allowed_output(name):
    constraint = SCHEMAS[name]
    worst = maximal(constraint.schema)
    constraint.parse(compact(worst))  # the worst case is itself a valid output
    assert len(compact(worst).encode()) < constraint.max_tokens()


# ---- JsonSchema: parsing ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"claims":[]}',
    '{"claims":["北京是中国的首都。"]}',
    '{ "claims" : [ "a", "b" ] }',  # whitespace is fine when parsing
])
def test_json_parse_accepts_valid_output(text):
    assert CLAIMS.parse(text) == json.loads(text)


@pytest.mark.parametrize("constraint, text", [
    (CLAIMS, '{"claims": ["a"'),  # bad JSON (cut off)
    (CLAIMS, "claims: a"),  # not JSON at all
    (CLAIMS, compact({"claims": ["c"] * 9})),  # too many items (max 8)
    (CLAIMS, compact({"claims": ["x" * 151]})),  # string too long (max 150)
    (CLAIMS, compact({"claims": [""]})),  # string too short (min 1)
    (CLAIMS, compact({"claims": [1]})),  # wrong item type
    (CLAIMS, compact({"claims": "a"})),  # not a list
    (CLAIMS, compact({})),  # missing key
    (CLAIMS, compact({"claims": [], "extra": 1})),  # extra key
    (SCORE, compact({"feedback": "ok", "score": 6})),  # not in the enum
    (SCORE, compact({"feedback": "ok", "score": "5"})),  # enum of numbers, given a string
    (questions_schema(2), compact({"questions": [{"question": "q?", "noncommittal": True}] * 2})),  # bool is not 1
    (questions_schema(2), compact({"questions": [{"question": "q?", "noncommittal": 0}]})),  # too few items
    (NESTED, compact({**maximal(NESTED.schema), "flag": "false"})),  # boolean given as a string
])
def test_json_parse_rejects_invalid_output(constraint, text):
    with pytest.raises(ConstraintViolation):
        constraint.parse(text)


# ---- the accepted schema subset -----------------------------------------------------------------------

@pytest.mark.parametrize("schema, problem", [
    ({"type": "array", "items": string(5)}, "maxItems"),
    (obj(claims={"type": "array", "items": string(5)}), "maxItems"),
    ({"type": "string"}, "maxLength"),
    (obj(name={"type": "string", "minLength": 1}), "maxLength"),
    (array({"type": "string"}, 3), "maxLength"),
    ({**obj(a=string(1), b=string(1)), "required": ["a"]}, "required"),
    ({"type": "number"}, "unsupported"),
    (enum(), "empty enum"),
])
def test_unbounded_or_unsupported_schemas_are_refused(schema, problem):
    with pytest.raises(ValueError, match=problem):
        JsonSchema.of(schema)


def test_texts_a_judge_copies_into_json_strings_are_shown_without_quotes_or_backslashes():
    """A claim cannot hold a double quote (no escapes in the string grammar), so the text it is copied from
    shows none: a quoted title stays quoted, in single quotes, and the claim can copy it whole."""
    assert copyable('the word "ski" came from Norway; C:\\skis') == "the word 'ski' came from Norway; C:/skis"
    assert copyable("北京是“首都”。") == "北京是“首都”。"  # allowed characters are left alone
    prompt = extract_claims('Its third album, "Emotive", came out in 2004.', "en").chat()
    shown = prompt[-1]["content"]
    assert "'Emotive'" in shown and '"' not in shown
