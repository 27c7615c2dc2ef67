"""Output constraints, declared once and translated per engine.

A judge stage asks for either one of a few fixed strings (`Choice`) or JSON of an exact, bounded shape
(`JsonSchema`). Every engine enforces the constraint while decoding; `parse` then checks the text, so an
engine that silently ignored a constraint is caught as an error instead of turning into a wrong score.

Only a small, bounded subset of JSON Schema is accepted: objects with fixed properties (all required,
emitted in declared order), arrays with `maxItems`, strings with `maxLength`, enums and booleans. Bounding
every list and string is what guarantees that generation terminates: `max_tokens` is set from the worst
case the schema allows (every token carries at least one byte), so an output can never be cut off.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

# A string character: anything but a quote, a backslash or a control character. Excluding escapes keeps
# the worst case at 4 UTF-8 bytes per character and keeps JSON strings single-line.
_STRING_CHAR = r'[^"\\\x7F\x00-\x1F]'
# What a judge is shown of a text it must copy into such strings (claims, questions): a double quote would
# end the string where the text goes on (the judge then has to write on after a closed string, and small
# judges wrote claims like ']}```{'), so quotes are shown as single quotes and backslashes as slashes. The
# meaning survives, and a claim is still checked against the untouched contexts.
_UNCOPYABLE = str.maketrans({'"': "'", "\\": "/"})


def copyable(text: str) -> str:
    """`text` as it can be copied into a constrained JSON string: double quotes as single quotes,
    backslashes as slashes."""
    return text.translate(_UNCOPYABLE)


class ConstraintViolation(ValueError):
    """An engine returned text outside its constraint: a bug in (or misuse of) that engine."""


@dataclass(frozen=True)
class Choice:
    """Exactly one of `options` (e.g. ratings "0", "1", "2")."""

    options: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.options or len(set(self.options)) != len(self.options):
            raise ValueError("Choice needs distinct options")
        # Prefix-free options ("1"/"2", never "1"/"10") make the first generated token decide the option, so
        # the judge's distribution at that one position is its distribution over the options (distribution()).
        if any(a != b and b.startswith(a) for a in self.options for b in self.options):
            raise ValueError(f"Choice options must not be prefixes of each other: {list(self.options)}")

    @property
    def key(self) -> str:
        # "choice2": outputs carry the options' probabilities since then, so older cached answers miss once.
        return "choice2:" + json.dumps(list(self.options), ensure_ascii=False)

    def gbnf(self) -> str:
        return "root ::= " + " | ".join(_gbnf_literal(o) for o in self.options) + "\n"

    def max_tokens(self) -> int:
        return max(len(o.encode()) for o in self.options) + 1

    def parse(self, text: str) -> str:
        value = text.strip()
        if value not in self.options:
            raise ConstraintViolation(f"expected one of {list(self.options)}, got {text[:80]!r}")
        return value

    def option_of(self, token_text: str) -> Optional[str]:
        """The option that a first generated token spelling `token_text` begins, if any: exactly the first
        tokens the constraint allows (a token may spell the whole option or a part, e.g. "y" of "yes")."""
        if token_text:
            for option in self.options:
                if option.startswith(token_text):
                    return option
        return None

    def first_tokens(self, tokenize: Callable[[str], list[int]]) -> dict[int, str]:
        """The tokens this Choice allows first, {token id: text}: every option prefix ("y", "ye", "yes") that
        `tokenize` (plain text, no special tokens) turns into one token. An engine reads their logits at the
        answer position for distribution()."""
        first: dict[int, str] = {}
        for option in self.options:
            for end in range(1, len(option) + 1):
                ids = tokenize(option[:end])
                if len(ids) == 1:
                    first[ids[0]] = option[:end]
        return first

    def distribution(self, first_tokens: Iterable[tuple[str, float]]) -> Optional[dict[str, float]]:
        """{option: probability} from (token text, log-probability) pairs of the first generated position,
        renormalised over the options: each token's mass goes to the option it begins; tokens no option
        begins are dropped. None when no listed token begins an option. Options none of whose tokens is
        listed get 0 (an engine lists at least every token with more mass than those it leaves out)."""
        mass = dict.fromkeys(self.options, 0.0)
        logprobs = [(o, lp) for o, lp in ((self.option_of(t), lp) for t, lp in first_tokens) if o is not None]
        if not logprobs:
            return None
        top = max(lp for _, lp in logprobs)
        for option, lp in logprobs:
            mass[option] += math.exp(lp - top)  # relative to the largest: no underflow to an all-zero sum
        total = sum(mass.values())
        return {o: m / total for o, m in mass.items()}


@dataclass(frozen=True)
class JsonSchema:
    """JSON of the bounded shape `schema` describes (see the module docstring for the subset)."""

    schema_json: str
    name: str = "output"

    @classmethod
    def of(cls, schema: dict[str, Any], name: str = "output") -> "JsonSchema":
        _check_schema(schema, "$")
        return cls(json.dumps(schema, ensure_ascii=False), name)  # keeps property order

    @property
    def schema(self) -> dict[str, Any]:
        return json.loads(self.schema_json)

    @property
    def key(self) -> str:
        return "json:" + self.schema_json

    def gbnf(self) -> str:
        rules: list[str] = []
        root = _gbnf_value(self.schema, "v", rules)
        return "\n".join([f"root ::= {root}", *rules]) + "\n"

    def max_tokens(self) -> int:
        return _max_bytes(self.schema) + 1

    def parse(self, text: str) -> Any:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConstraintViolation(f"not valid JSON ({exc.msg}): {text[:120]!r}") from None
        _validate(value, self.schema, "$")
        return value


Constraint = Union[Choice, JsonSchema]


# ---- helpers to build schemas -------------------------------------------------------------------------

def string(max_length: int, min_length: int = 0) -> dict[str, Any]:
    return {"type": "string", "minLength": min_length, "maxLength": max_length}


def array(items: dict[str, Any], max_items: int, min_items: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_items}


def obj(**properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def enum(*values: Any) -> dict[str, Any]:
    return {"enum": list(values)}


# ---- schema checks, grammar and bounds ----------------------------------------------------------------

def _check_schema(s: dict[str, Any], path: str) -> None:
    if "enum" in s:
        if not s["enum"]:
            raise ValueError(f"{path}: empty enum")
        return
    kind = s.get("type")
    if kind == "object":
        if set(s.get("required", [])) != set(s["properties"]):
            raise ValueError(f"{path}: every property must be required")
        for name, sub in s["properties"].items():
            _check_schema(sub, f"{path}.{name}")
    elif kind == "array":
        if "maxItems" not in s:
            raise ValueError(f"{path}: arrays need maxItems")
        _check_schema(s["items"], f"{path}[]")
    elif kind == "string":
        if "maxLength" not in s:
            raise ValueError(f"{path}: strings need maxLength")
    elif kind != "boolean":
        raise ValueError(f"{path}: unsupported schema {s!r}")


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _gbnf_value(s: dict[str, Any], name: str, rules: list[str]) -> str:
    """Return a GBNF expression for `s`, adding named rules for nested parts to `rules`."""
    if "enum" in s:
        return "(" + " | ".join(_gbnf_literal(json.dumps(v, ensure_ascii=False)) for v in s["enum"]) + ")"
    kind = s["type"]
    if kind == "boolean":
        return '("true" | "false")'
    if kind == "string":
        lo, hi = s.get("minLength", 0), s["maxLength"]
        return f'"\\"" {_STRING_CHAR}{{{lo},{hi}}} "\\""'
    if kind == "array":
        item = f"{name}-item"
        rules.append(f"{item} ::= {_gbnf_value(s['items'], item, rules)}")
        lo, hi = s.get("minItems", 0), s["maxItems"]
        if hi == 0:
            return '"[" "]"'
        more = f'("," {item}){{{max(lo - 1, 0)},{hi - 1}}}'
        body = f"{item} {more}"
        return f'"[" {body} "]"' if lo >= 1 else f'"[" ({body})? "]"'
    # object: fixed properties, in order, no whitespace
    parts = []
    for i, (prop, sub) in enumerate(s["properties"].items()):
        rule = f"{name}-{prop.replace('_', '-')}"
        rules.append(f"{rule} ::= {_gbnf_value(sub, rule, rules)}")
        sep = "," if i else ""
        parts.append(_gbnf_literal(f'{sep}"{prop}":') + f" {rule}")
    return '"{" ' + " ".join(parts) + ' "}"'


def _max_bytes(s: dict[str, Any]) -> int:
    if "enum" in s:
        return max(len(json.dumps(v, ensure_ascii=False).encode()) for v in s["enum"])
    kind = s["type"]
    if kind == "boolean":
        return 5
    if kind == "string":
        return 2 + 4 * s["maxLength"]
    if kind == "array":
        n = s["maxItems"]
        return 2 + n * _max_bytes(s["items"]) + max(n - 1, 0)
    props = s["properties"]
    return 2 + sum(len(p.encode()) + 4 + _max_bytes(sub) for p, sub in props.items())


def _validate(v: Any, s: dict[str, Any], path: str) -> None:
    def fail(msg: str) -> None:
        raise ConstraintViolation(f"{path}: {msg}")

    if "enum" in s:
        if v not in s["enum"] or isinstance(v, bool) != any(isinstance(e, bool) for e in s["enum"]):
            fail(f"{v!r} not in {s['enum']}")
        return
    kind = s["type"]
    if kind == "boolean":
        if not isinstance(v, bool):
            fail("expected a boolean")
    elif kind == "string":
        if not isinstance(v, str):
            fail("expected a string")
        elif not s.get("minLength", 0) <= len(v) <= s["maxLength"]:
            fail(f"string length {len(v)} outside [{s.get('minLength', 0)}, {s['maxLength']}]")
    elif kind == "array":
        if not isinstance(v, list):
            fail("expected a list")
        elif not s.get("minItems", 0) <= len(v) <= s["maxItems"]:
            fail(f"{len(v)} items outside [{s.get('minItems', 0)}, {s['maxItems']}]")
        for i, item in enumerate(v):
            _validate(item, s["items"], f"{path}[{i}]")
    else:
        if not isinstance(v, dict) or set(v) != set(s["properties"]):
            fail(f"expected an object with keys {list(s['properties'])}")
        for prop, sub in s["properties"].items():
            _validate(v[prop], sub, f"{path}.{prop}")
