"""Token counts for traces that log text rather than token counts.

With a local model folder and the ``tokenizers`` (or ``transformers``) package, counts
are exact. Otherwise they are *estimated*, and the workload says so
(``Workload.estimated_tokens``), by this rule:

* Chinese/Japanese/Korean characters: 1.4 characters per token. Large-vocabulary
  tokenizers trained on Chinese (Qwen, Baichuan2, ChatGLM) encode simplified Chinese at
  about 4.1-4.5 UTF-8 bytes per token on cc100-zh-Hans (tokenizer-arena compression
  table, huggingface.co/spaces/eson/tokenizer-arena README); a Chinese character is 3
  UTF-8 bytes, so 1.37-1.5 characters per token.
* Everything else: 4 characters per token, OpenAI's rule of thumb for English text
  ("one token is roughly 4 characters", OpenAI help center, "What are tokens and how to
  count them?").
* Chat messages add the ChatML framing Qwen-family chat templates render
  (``<|im_start|>role\\n ... <|im_end|>\\n``: 5 tokens per message, plus 3 for the
  ``<|im_start|>assistant\\n`` generation prompt; Qwen2.5 ``tokenizer_config.json``
  chat_template).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError

CJK_CHARS_PER_TOKEN = 1.4
OTHER_CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD = 5
MESSAGE_HEAD = 3  # <|im_start|>, role, newline: the part of the framing before the text
REPLY_PRIMER = 3

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f]")


def estimate_tokens(text: str) -> int:
    """Estimated token count of ``text`` (see the module docstring for the rule)."""
    if not text:
        return 0
    cjk = len(_CJK.findall(text))
    other = len(text) - cjk
    return max(1, math.ceil(cjk / CJK_CHARS_PER_TOKEN + other / OTHER_CHARS_PER_TOKEN))


class TokenCounter:
    """Counts tokens of text with the model's tokenizer when it can, else estimates."""

    def __init__(self, tokenizer: str | None = None) -> None:
        self._encode = None
        self.note: str | None = None
        if tokenizer is None:
            return
        folder = Path(tokenizer)
        if not folder.exists():
            raise InputError("tokenizer folder not found", path=folder,
                             hint="give the local model folder that holds tokenizer.json")
        try:
            from tokenizers import Tokenizer  # type: ignore[import-not-found]

            file = folder / "tokenizer.json" if folder.is_dir() else folder
            tok = Tokenizer.from_file(str(file))
            self._encode = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
            return
        except ImportError:
            pass
        except Exception as err:  # a broken tokenizer file: fall back to transformers, then estimate
            self.note = f"could not load {folder}/tokenizer.json ({type(err).__name__}); token counts estimated"
        try:
            from transformers import AutoTokenizer  # type: ignore[import-not-found]

            hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self._encode = lambda text: len(hf.encode(text, add_special_tokens=False))
            self.note = None
        except ImportError:
            self.note = self.note or "neither tokenizers nor transformers is installed; token counts estimated"
        except Exception as err:
            self.note = f"could not load the tokenizer in {folder} ({type(err).__name__}); token counts estimated"

    @property
    def estimated(self) -> bool:
        return self._encode is None

    def count(self, text: str) -> int:
        if self._encode is None:
            return estimate_tokens(text)
        return int(self._encode(text))

    def messages(self, messages: list[Any]) -> tuple[list[tuple[str, str]], list[int]] | None:
        """``(role, text)`` pairs of a chat prompt and each one's tokens with its ChatML
        framing (the prompt is their sum plus ``REPLY_PRIMER``); None if malformed."""
        pairs, counts = [], []
        for m in messages:
            if not isinstance(m, dict):
                return None
            text = content_text(m.get("content"))
            role = m.get("role", "user")
            if text is None or not isinstance(role, str):
                return None
            pairs.append((role, text))
            counts.append(MESSAGE_OVERHEAD + self.count(text))
        return pairs, counts


def content_text(content: Any) -> str | None:
    """Text of an OpenAI message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return None
