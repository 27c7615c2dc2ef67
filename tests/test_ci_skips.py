"""CI fails on a skip unless the skip is listed as expected (tests/ci_skips.py), in a real pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_skips import EXPECTED_SKIPS

TESTS = Path(__file__).parent
EXPECTED = next(iter(EXPECTED_SKIPS))

SAMPLE = f'''
import pytest

def test_ok():
    pass

def test_skips():
    pytest.skip("no such tool here")

@pytest.mark.skipif(True, reason="no such tool either")
def test_marked():
    pass

@pytest.mark.skipif(True, reason={EXPECTED!r})
def test_expected():
    pass

@pytest.mark.xfail(reason="a known bug")
def test_known_bug():
    assert False
'''


def run_pytest(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "ci_skips", "-q", "-rA", "-p", "no:cacheprovider",
                           "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_in_ci_an_unlisted_skip_fails_and_a_listed_one_stays_a_skip(tmp_path):
    proc = run_pytest(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout
    assert "FAILED test_sample.py::test_skips" in proc.stdout
    assert "ERROR test_sample.py::test_marked" in proc.stdout  # skipped at setup: an error there
    assert "skipped in CI: no such tool here" in proc.stdout
    assert "SKIPPED [1] test_sample.py" in proc.stdout and EXPECTED in proc.stdout  # the listed one
    assert "PASSED test_sample.py::test_ok" in proc.stdout and "XFAIL test_sample.py::test_known_bug" in proc.stdout


@pytest.mark.parametrize("ci", ["", "false"])
def test_outside_ci_skips_stay_skips(tmp_path, ci):
    proc = run_pytest(tmp_path, ci)
    assert proc.returncode == 0, proc.stdout
    assert "3 skipped" in proc.stdout


def test_every_expected_skip_says_why():
    assert all(len(why) > 20 for why in EXPECTED_SKIPS.values())
