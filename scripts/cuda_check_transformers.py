#!/usr/bin/env python
"""Check the transformers engine on a GPU (or any torch device) with no model weights at all.

It builds a tiny random Llama model and a small byte-level BPE tokenizer (trained in memory with the
`tokenizers` library, ChatML chat template), saves both to a temporary Hugging Face folder, loads that folder
through offline_eval's TransformersEngine on the device, and checks:
  - the model sits on the device;
  - unconstrained, the random model's output violates each constraint; constrained, every output satisfies it
    (a Choice, the bounded JSON our metrics ask for);
  - a Choice's option probabilities sum to 1 and the answer is their argmax;
  - a batch of several requests gives the same answers as the same requests one by one (float32);
  - a bfloat16/float16 run (on cuda) still satisfies every constraint.
It prints a short report and exits 1 if a check fails, 2 if something it needs is missing.

    python scripts/cuda_check_transformers.py               # --device cuda
    python scripts/cuda_check_transformers.py --device cpu  # the same checks here
Needs torch, transformers, tokenizers (a transformers dependency), outlines and this repository;
scripts/cuda_check_transformers.sh installs outlines from .cuda-wheels/ first where it is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["The sea is wide and deep.", "Rate the answer from 0 to 2.", "Is the claim supported? yes or no.",
          'JSON like {"claims":["one","two"],"lines":[]} with true and false.', "Paris is in France; 1889."]
PROMPTS = [(("system", "You are a judge."), ("user", f"Question {i}: is the sea {'deep' * (i + 1)}? Rate it."))
           for i in range(6)]


def build_folder(folder: Path, seed: int = 0) -> None:
    """A random tiny Llama and its tokenizer, saved as a Hugging Face folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token="<|im_start|>", unk_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper than the default init, so greedy answers do not hang on near-ties
        model.model.embed_tokens.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.failed += not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
        return ok


def free_text(engine, request, max_new_tokens: int) -> str:
    """The engine's model answering `request` greedily with no constraint."""
    import torch

    ids = torch.tensor([engine.prompt_ids(request)], device=engine.device)
    with torch.inference_mode():
        out = engine._model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                     do_sample=False, pad_token_id=engine._pad, eos_token_id=engine._eos)
    return engine._tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)


def check_engine(report: Report, folder: Path, device: str, dtype: str, full: bool) -> None:
    from offline_eval.constraints import Choice, ConstraintViolation, JsonSchema, array, obj, string
    from offline_eval.engines.base import JudgeRequest
    from offline_eval.engines.transformers_engine import TransformersEngine

    rating, yes_no = Choice(("0", "1", "2")), Choice(("yes", "no"))
    claims = JsonSchema.of(obj(claims=array(string(30, min_length=1), 3), ok={"type": "boolean"}))
    started = time.perf_counter()
    engine = TransformersEngine(folder, device=device, dtype=dtype, batch_size=8, name="tiny-random-llama")
    print(f"{dtype} on {device}: loaded in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        placed = engine._model.device.type
        report.check("model on the device", placed == device.split(":")[0], f"parameters on {placed}, "
                     f"dtype {next(engine._model.parameters()).dtype}")
        constraints = [rating, yes_no, claims]
        if full:
            for c in constraints:
                text = free_text(engine, JudgeRequest(PROMPTS[0], c), c.max_tokens())
                try:
                    c.parse(text)
                    bites = False
                except ConstraintViolation:
                    bites = True
                report.check(f"unconstrained output violates {c.key[:40]}", bites, repr(text[:60]))
        requests = [JudgeRequest(p, c) for c in constraints for p in PROMPTS]
        started = time.perf_counter()
        try:
            batched = engine.generate(requests)
        except ConstraintViolation as exc:
            report.check("constrained outputs satisfy their constraints", False, str(exc))
            return
        seconds = time.perf_counter() - started
        good = [o.value is not None and o.finish_reason == "stop" for o in batched]
        report.check("constrained outputs satisfy their constraints", all(good),
                     f"{sum(good)}/{len(good)} in {seconds:.1f} s, batches of up to 8; e.g. "
                     + ", ".join(repr(batched[i].text[:40]) for i in (0, len(PROMPTS), 2 * len(PROMPTS))))
        sums = [sum(o.probabilities.values()) for o in batched if isinstance(o.value, str)]
        report.check("choice probabilities sum to 1", len(sums) == 2 * len(PROMPTS)
                     and all(abs(s - 1) < 1e-6 for s in sums), f"{len(sums)} distributions")
        argmax = all(max(o.probabilities, key=o.probabilities.get) == o.value
                     for o in batched if isinstance(o.value, str))
        report.check("the answer is the most probable option", argmax)
        report.check("token counts", all(o.prompt_tokens > 0 and 0 < o.completion_tokens <= r.max_tokens
                                         for o, r in zip(batched, requests)))
        if full:
            alone = [engine.generate([r])[0] for r in requests]
            same = [a.text == b.text for a, b in zip(batched, alone)]
            report.check("batched outputs equal one-by-one outputs", all(same), f"{sum(same)}/{len(same)}")
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default cuda; cpu to try it anywhere)")
    args = parser.parse_args(argv)
    try:
        import outlines  # noqa: F401
        import torch
        import transformers
    except ImportError as exc:
        print(f"missing: {exc} (scripts/cuda_check_transformers.sh installs outlines from .cuda-wheels/)")
        return 2
    from importlib.metadata import version

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, outlines {version('outlines')}, "
          f"outlines_core {version('outlines_core')}, python {sys.version.split()[0]}")
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("CUDA is not available to torch")
            return 1
        print(f"device: {torch.cuda.get_device_name(args.device)}")
    report = Report()
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as tmp:
        folder = Path(tmp)
        build_folder(folder)
        check_engine(report, folder, args.device, "float32", full=True)
        if args.device.startswith("cuda"):
            half = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
            check_engine(report, folder, args.device, half, full=False)
    print("PASS" if not report.failed else f"FAIL: {report.failed} check(s)")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
