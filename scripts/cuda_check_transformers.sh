#!/usr/bin/env bash
# Run scripts/cuda_check_transformers.py on a GPU host that has torch and transformers (no model weights needed).
# If outlines is not importable there, it is installed from the wheels in .cuda-wheels/ (made on a connected
# machine, see below) into .cuda-site/, a folder used by this check only: nothing in the host's Python changes.
#
#   bash scripts/cuda_check_transformers.sh                 # --device cuda
#   bash scripts/cuda_check_transformers.sh --device cpu
#   bash scripts/cuda_check_transformers.sh --download-wheels   # on a connected machine: fills .cuda-wheels/
#
# .cuda-wheels/ (git-ignored, ~16 MB): outlines 1.3.3 and what it imports at run time that a torch +
# transformers install may lack (measured: genson, diskcache, jsonschema and its deps, pydantic), pure-Python
# wheels once and the compiled ones (outlines_core, pydantic_core, rpds-py) for CPython 3.10-3.12 on
# manylinux x86_64.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [ "${1:-}" = --download-wheels ]; then
    "$PYTHON" -m pip download -q --no-deps -d .cuda-wheels outlines==1.3.3 genson==1.4.0 diskcache==5.6.3 \
        jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 attrs pydantic==2.14.4 \
        typing-inspection==0.4.5 annotated-types typing_extensions==4.16.0
    for py in 310 311 312; do
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d .cuda-wheels --implementation cp \
            --python-version "$py" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            outlines_core==0.2.14 pydantic_core==2.50.5 rpds-py
    done
    du -sh .cuda-wheels
    exit 0
fi
if ! "$PYTHON" -c "import outlines, outlines_core" 2>/dev/null; then
    if [ ! -d .cuda-wheels ]; then
        echo "outlines is not installed and .cuda-wheels/ is missing (see the top of $0)" >&2
        exit 2
    fi
    if ! PYTHONPATH=".cuda-site${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "import outlines, outlines_core" 2>/dev/null; then
        rm -rf .cuda-site
        "$PYTHON" -m pip install -q --no-index --find-links .cuda-wheels --no-deps --target .cuda-site \
            outlines outlines_core genson diskcache jsonschema jsonschema-specifications referencing attrs rpds-py \
            pydantic pydantic_core typing-inspection annotated-types typing_extensions
    fi
    export PYTHONPATH=".cuda-site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PYTHON" scripts/cuda_check_transformers.py "$@"
