"""What ships with the repository: the license pyproject declares, no paths of the development machine, and a
README whose list of deliberate deviations from Ragas matches the code."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from offline_eval.metrics.answer_relevancy import MAX_QUESTION_CHARS
from offline_eval.metrics.claims import CLAIMS, MAX_CLAIM_CHARS, MAX_CLAIMS
from offline_eval.metrics.context_relevance import _JUDGE1, _JUDGE2
from offline_eval.metrics.rubrics import MAX_FEEDBACK_CHARS

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_license_is_the_apache_2_text_pyproject_declares():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert declared == "Apache-2.0"
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text


def shipped_files() -> list[Path]:
    """The repository's text files: hidden ones (.git, a .venv, caches) left out, but for the .ci folder."""
    found = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if d == ".ci" or not (d.startswith(".") or d == "__pycache__")]
        found += [Path(folder, f) for f in files
                  if not f.startswith(".") and Path(f).suffix in (".py", ".md", ".toml", ".yaml", ".txt", ".sh", "")]
    return found


def test_no_file_names_a_path_of_the_development_machine():
    machine = re.compile(r"(?<![\w.~])/work/")
    offenders = [str(p.relative_to(REPO)) for p in shipped_files()
                 if p.name != "test_repository.py" and machine.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert offenders == []


def test_the_deviations_from_ragas_match_the_code():
    deviations = README[README.index("Where offline-eval differs from Ragas on purpose"):README.index("## Long inputs")]
    assert f"At most {MAX_CLAIMS} claims of at most {MAX_CLAIM_CHARS} characters each" in deviations
    assert f"at most {MAX_QUESTION_CHARS} characters each; rubric feedback: at most {MAX_FEEDBACK_CHARS}" in deviations
    assert "Claims cannot contain a double quote or a backslash" in deviations
    assert '[^"\\\\' in CLAIMS.gbnf()  # a JSON string character: no quote, no backslash (no escapes)
    assert "Context Relevance's \"2\" is stricter" in deviations
    assert "contains the information needed to answer" in _JUDGE1["en"] and "it answers the Question" in _JUDGE2["en"]
    assert "any relevant information" not in _JUDGE1["en"] + _JUDGE2["en"]
