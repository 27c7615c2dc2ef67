"""Hugging Face tokenizer helpers shared by the engines that run a Hugging Face folder in process
(vllm-offline, transformers)."""

from __future__ import annotations

from typing import Any, Optional


def special_tokens(tokenizer: Any) -> list[str]:
    """A Hugging Face tokenizer's special and added tokens: it matches all of them in text, so user text must
    never spell one (JudgeRequest.chat neutralises them)."""
    tokens = set(getattr(tokenizer, "all_special_tokens", None) or [])
    tokens.update(t.content for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values())
    return sorted(tokens)


def chat_ids(tokenizer: Any, messages: list[dict[str, str]],
             chat_template_kwargs: Optional[dict[str, Any]] = None) -> list[int]:
    """The prompt's token ids: `messages` through the tokenizer's chat template, generation prompt added."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                        **(chat_template_kwargs or {}))
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
