"""Where the shared human-labelled benchmarks are: $OFFLINE_EVAL_SHARED, else ../shared next to the checkout.
Tests that need them skip when they are not there."""

import os
from pathlib import Path

SHARED = Path(os.environ.get("OFFLINE_EVAL_SHARED") or Path(__file__).resolve().parent.parent.parent / "shared")
BEGIN = SHARED / "benchmarks" / "begin" / "begin_dev_wow.tsv"
