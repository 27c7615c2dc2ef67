"""scripts/install.sh builds llama.cpp for the CPU it runs on (scripts/llama_cmake_args.sh): an instruction
set the CPU lacks is never turned on (an AVX-512 build dies with SIGILL on CPUs without it), AMX never is."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "llama_cmake_args.sh"
HASWELL = "fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 bmi2"
SAPPHIRE_RAPIDS = HASWELL + " avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi amx_tile amx_int8 amx_bf16"


def cmake_args(tmp_path: Path, flags: str, arch: str = "x86_64") -> dict[str, str]:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    out = subprocess.run(["bash", str(SCRIPT), str(cpuinfo), arch], capture_output=True, text=True, check=True)
    return dict(arg.removeprefix("-D").split("=") for arg in out.stdout.split())


def test_a_cpu_without_avx512_gets_no_avx512(tmp_path):
    args = cmake_args(tmp_path, HASWELL)
    assert args["GGML_NATIVE"] == "OFF"
    assert args["GGML_AVX2"] == args["GGML_FMA"] == args["GGML_F16C"] == "ON"
    assert all(v == "OFF" for k, v in args.items() if "AVX512" in k or "AMX" in k)


def test_avx512_where_the_cpu_has_it_and_amx_never(tmp_path):
    args = cmake_args(tmp_path, SAPPHIRE_RAPIDS)
    assert args["GGML_AVX512"] == args["GGML_AVX512_VNNI"] == args["GGML_AVX512_BF16"] == "ON"
    assert args["GGML_AMX_TILE"] == args["GGML_AMX_INT8"] == args["GGML_AMX_BF16"] == "OFF"


def test_other_machines_target_their_own_cpu(tmp_path):
    assert cmake_args(tmp_path, "fp asimd", arch="aarch64") == {"GGML_NATIVE": "ON"}


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo on this system")
def test_this_machine_gets_only_what_it_has():
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=True).stdout
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "").split()
    assert ("-DGGML_AVX512=ON" in out) == ("avx512f" in flags)
