"""In CI (CI=true) a skipped test fails, unless its skip reason is listed in EXPECTED_SKIPS with why CI may
skip it: a test that quietly stops running must never pass for one that ran. conftest.py installs the hooks;
elsewhere (a developer's machine without Chromium, say) skips stay skips."""

from __future__ import annotations

import os

import pytest

# the skip reason a test gives -> why CI may skip it
EXPECTED_SKIPS = {
    "the BEGIN dev file is not on this machine":
        "the human-labelled BEGIN benchmark is not in the repository; it lies in ../shared/benchmarks next to "
        "the checkout, which a CI checkout may not have",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_unexpected_skip(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        reason = skip_reason(report)
        if reason not in EXPECTED_SKIPS:
            report.outcome = "failed"
            report.longrepr = (f"skipped in CI: {reason}\n(in CI every skip fails unless tests/ci_skips.py "
                               "EXPECTED_SKIPS lists its reason with why CI may skip it)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_unexpected_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # a module that skips as a whole
    outcome = yield
    _fail_unexpected_skip(outcome.get_result())
