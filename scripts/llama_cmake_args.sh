#!/usr/bin/env bash
# Prints the CMAKE_ARGS that build llama.cpp's CPU backend for the machine this runs on.
#  - x86-64 Linux: GGML_NATIVE=OFF with each instruction set turned on only where /proc/cpuinfo lists it, so
#    the library never uses an instruction the CPU lacks (an AVX-512 build dies with SIGILL on most AMD
#    CPUs before Zen 4 and many Intel client CPUs). AMX stays off whatever the CPU has: on some virtualised
#    Xeons its matmul path segfaults on the first decode.
#  - Anything else (arm64, macOS): GGML_NATIVE=ON, which targets the build machine's own CPU.
# Usage: llama_cmake_args.sh [CPUINFO_FILE] [ARCH]   (defaults: /proc/cpuinfo, uname -m; the tests pass others)
set -euo pipefail
cpuinfo="${1:-/proc/cpuinfo}"
arch="${2:-$(uname -m)}"
case "$arch" in
    x86_64|amd64) ;;
    *) echo "-DGGML_NATIVE=ON"; exit 0 ;;
esac
if [ ! -r "$cpuinfo" ]; then
    echo "-DGGML_NATIVE=ON"   # no flag list to read (e.g. macOS on Intel): let the compiler target this CPU
    exit 0
fi
flags=" $(grep -m1 -E '^flags' "$cpuinfo" | cut -d: -f2) "
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
on() { case "$flags" in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
args+=" -DGGML_AVX=$(on avx) -DGGML_AVX2=$(on avx2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c)"
args+=" -DGGML_SSE42=$(on sse4_2) -DGGML_BMI2=$(on bmi2)"
args+=" -DGGML_AVX512=$(on avx512f) -DGGML_AVX512_VNNI=$(on avx512_vnni)"
args+=" -DGGML_AVX512_BF16=$(on avx512_bf16) -DGGML_AVX512_VBMI=$(on avx512vbmi)"
args+=" -DGGML_AVX_VNNI=$(on avx_vnni)"
echo "$args"
