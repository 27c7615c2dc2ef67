"""How each constraint goes to vLLM's structured outputs, for the server and the in-process engine alike.

- Choice -> {"choice": options}, with every backend.
- JsonSchema, json_mode "grammar" (the default; backend xgrammar) -> {"grammar": our GBNF}: no whitespace,
  no escapes, so `constraint.max_tokens()` bounds the output (vllm_server.py says why xgrammar's own json mode
  is not bounded).
- JsonSchema, json_mode "json" (backend outlines, which takes no grammars) -> {"json": schema}. outlines turns
  the schema into a regex (outlines_core.json_schema) that allows at most one space where JSON allows
  whitespace and only the two-byte escapes, and keeps minLength/maxLength/maxItems: bounded, but not by our
  byte count, so max_tokens is doubled.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..constraints import Choice, Constraint

JSON_MODES = ("grammar", "json")


def json_mode_for(backend: Optional[str], json_mode: Optional[str] = None) -> str:
    """The form JSON constraints take on a vLLM with this structured-outputs backend (an explicit models.yaml
    `json_mode` wins)."""
    return json_mode or ("json" if backend == "outlines" else "grammar")


def backend_env(backend: Optional[str], env: Mapping[str, str]) -> dict[str, str]:
    """Environment a vLLM with this backend needs. outlines: vLLM gives up on a regex that takes more than
    VLLM_REGEX_COMPILATION_TIMEOUT_S (default 5 s; a guard against hostile user regexes) to compile, and our
    claim list (8 strings of up to 150 characters) takes ~11 s with SmolLM2's 49k vocabulary on 2 busy cores,
    more with Qwen's 152k; our schemas are fixed and bounded, so allow 10 minutes (a user's setting wins)."""
    if backend == "outlines" and "VLLM_REGEX_COMPILATION_TIMEOUT_S" not in env:
        return {"VLLM_REGEX_COMPILATION_TIMEOUT_S": "600"}
    return {}


def structured_outputs(constraint: Constraint, json_mode: str) -> dict[str, Any]:
    if isinstance(constraint, Choice):
        return {"choice": list(constraint.options)}
    return {"grammar": constraint.gbnf()} if json_mode == "grammar" else {"json": constraint.schema}


def output_budget(constraint: Constraint, max_tokens: int, fixed: bool, json_mode: str) -> int:
    """max_tokens for a request: the constraint's worst case, doubled for a schema sent as "json" (unless the
    request fixed its own, `fixed`)."""
    return 2 * max_tokens if json_mode == "json" and not isinstance(constraint, Choice) and not fixed else max_tokens
