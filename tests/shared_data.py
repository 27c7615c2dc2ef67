"""Where the shared human-labelled benchmarks are: ../shared next to the checkout, else /work/shared."""

from pathlib import Path

_NEXT_TO_REPO = Path(__file__).resolve().parent.parent.parent / "shared"
SHARED = _NEXT_TO_REPO if _NEXT_TO_REPO.is_dir() else Path("/work/shared")
BEGIN = SHARED / "benchmarks" / "begin" / "begin_dev_wow.tsv"
