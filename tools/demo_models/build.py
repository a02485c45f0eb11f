"""Tiny offline stand-ins for Qwen/Qwen3-0.6B and FLUX.2-klein-4B, built with random weights.

They load through the same ``from_pretrained`` calls as the real checkpoints, with no network. torch,
transformers and diffusers are imported inside the builders only, so the checks stay cheap for the UI. The
plug-in (``plugin.py``) imports this module only when a demo model is asked for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Bump whenever a recipe below changes: folders carrying another version are rebuilt.
RECIPE_VERSION = "neuron-demo-models v1"
MARKER_NAME = ".complete"
DEMO_DIR_NAME = "demo-models"
CHAT_DIR_NAME = "qwen3-tiny"
IMAGE_DIR_NAME = "flux2-klein-tiny"
SEED = 0

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Random weights pick tokens at random. With only byte tokens the output is one long "word", and
# TextIteratorStreamer holds text back until it sees a space. So the tokenizer gets BPE merges that
# spell these words with a leading space (like most tokens of the real vocabulary), and generation
# is restricted to them (no punctuation: greedy decoding of random weights repeats one token, and
# ",,,," would never stream): random output then streams word by word and is easy to eyeball.
DEMO_WORDS = (
    "the a and of to in is it on with for that this as at by from we you they "
    "hello world tiny model demo random weights token stream chip core graph cache shape static "
    "light cloud river stone garden bright quiet fast small open green blue paper music window"
).split()

# A cut-down Qwen3 template (no tool calls) that renders the same text as the real one for
# system/user/assistant turns: `enable_thinking=False` appends an empty think block to the
# generation prompt, and assistant turns before the last user message lose their think block.
# Like the real template, non-string message content renders as "" (callers must flatten lists).
CHAT_TEMPLATE = """\
{%- set ns = namespace(found=false, last_query_index=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
  {%- if not ns.found and message.role == 'user' -%}
    {%- set ns.found = true -%}
    {%- set ns.last_query_index = (messages|length - 1) - loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'assistant' -%}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is string -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}
      {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}
      {{- content.lstrip('\\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\\n' + content -}}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\\n\\n</think>\\n\\n' -}}
  {%- endif -%}
{%- endif -%}
"""


@dataclass(frozen=True)
class DemoModels:
    """Folders of the two demo models, each loadable like the real checkpoint."""

    chat: Path
    image: Path


def _byte_symbols() -> list[str]:
    """GPT-2/Qwen byte-to-unicode table, in Qwen's id order (printable bytes first)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    symbols = {b: chr(b) for b in printable}
    symbols.update({b: chr(256 + n) for n, b in enumerate(others)})
    return [symbols[b] for b in [*printable, *others]]


def _word_merges() -> list[tuple[str, str]]:
    """Left-to-right BPE merges that build "Ġword" for every demo word (Ġ is the space byte)."""
    merges: list[tuple[str, str]] = []
    seen: set[str] = set()
    for word in DEMO_WORDS:
        spelled = "Ġ" + word
        for end in range(2, len(spelled) + 1):
            if spelled[:end] not in seen:
                seen.add(spelled[:end])
                merges.append((spelled[: end - 1], spelled[end - 1]))
    return merges


def build_tiny_tokenizer() -> PreTrainedTokenizerBase:
    """Byte-level BPE tokenizer with Qwen3's special tokens, pre-tokenizer and chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import Qwen2TokenizerFast  # an alias of Qwen2Tokenizer in transformers 5
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    merges = _word_merges()
    vocab = {symbol: i for i, symbol in enumerate(_byte_symbols())}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # Same normalizer/pre-tokenizer/decoder as Qwen2Tokenizer builds when it loads tokenizer.json.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (ENDOFTEXT, IM_START, IM_END)])
    # As in real Qwen3, the think tags are added but NOT special: they survive skip_special_tokens.
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_OPEN, THINK_CLOSE)])
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        unk_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=131072,  # Qwen3-0.6B's tokenizer_config value
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _allowed_output_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids the demo chat model may emit: whole demo words and <|im_end|>."""
    tokens = ["Ġ" + word for word in DEMO_WORDS] + [IM_END]
    return sorted(set(tokenizer.convert_tokens_to_ids(tokens)))


def _vocab_size_for(tokenizer: PreTrainedTokenizerBase) -> int:
    """Embedding rows: the tokenizer length rounded up to 256, like real checkpoints pad theirs."""
    return -(-len(tokenizer) // 256) * 256


@contextlib.contextmanager
def _seeded_float32() -> Iterator[None]:
    """Seeded RNG and float32 default dtype for a deterministic build; the caller's state is restored."""
    import torch

    previous_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_default_dtype(previous_dtype)


def _write_marker(folder: Path) -> None:
    """Write the completion marker; callers do this last, after every other file is saved."""
    (folder / MARKER_NAME).write_text(RECIPE_VERSION + "\n", encoding="utf-8")


def build_tiny_chat_model(folder: Path) -> Path:
    """Build a random-weight Qwen3 causal LM plus tokenizer into `folder`; return `folder`."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    vocab_size = _vocab_size_for(tokenizer)
    # Qwen3-0.6B's shape in miniature: GQA (4 query heads share 2 KV heads), explicit head_dim,
    # tied embeddings, Qwen3's rope theta and context length.
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
    )
    with _seeded_float32():
        model = Qwen3ForCausalLM(config).eval()
    allowed = set(_allowed_output_ids(tokenizer))
    # Qwen3-0.6B's generation_config.json, plus the vocabulary restriction (see DEMO_WORDS).
    # <think>/</think> are suppressed too: random tags would open think blocks that never close.
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext,
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
        do_sample=True,
        temperature=0.6,
        top_k=20,
        top_p=0.95,
        suppress_tokens=[i for i in range(vocab_size) if i not in allowed],
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if not (folder / "config.json").is_file():  # e.g. save_pretrained on a non-zero rank writes nothing
        raise RuntimeError(f"saving the demo chat model into {folder} wrote no config.json")
    _write_marker(folder)
    return folder


def build_tiny_image_pipeline(folder: Path) -> Path:
    """Build a random-weight Flux2KleinPipeline into `folder`; return `folder`."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    encoder_hidden = 32
    out_layers = 3  # the pipeline stacks hidden states of layers (9, 18, 27) by default
    latent_channels = 4
    # FLUX.2's scheduler settings: the pipeline always passes `mu` (a resolution-dependent shift),
    # and set_timesteps silently ignores it unless use_dynamic_shifting=True.
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
        time_shift_type="exponential",
    )
    with _seeded_float32():
        # 28 layers so the default text_encoder_out_layers=(9, 18, 27) exist, as in Qwen3-4B.
        text_encoder = Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=_vocab_size_for(tokenizer),
                hidden_size=encoder_hidden,
                intermediate_size=64,
                num_hidden_layers=28,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                max_position_embeddings=40960,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                tie_word_embeddings=True,
                bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
                eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
                pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
            )
        )
        # 4 levels => vae_scale_factor 8, so sizes must be multiples of 16 as with the real VAE.
        vae = AutoencoderKLFlux2(
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=latent_channels,
            norm_num_groups=8,
        )
        # Two blocks of each kind so compile_repeated_blocks really reuses a compiled block.
        transformer = Flux2Transformer2DModel(
            patch_size=1,
            in_channels=4 * latent_channels,  # latents are 2x2-patchified before the transformer
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=out_layers * encoder_hidden,
            axes_dims_rope=(4, 4, 4, 4),  # sum must equal attention_head_dim
            guidance_embeds=False,  # FLUX.2-klein is step-distilled: no guidance embedding
        )
    pipe = Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        transformer=transformer.eval(),
        is_distilled=True,
    )
    pipe.save_pretrained(folder)
    from neuron_backend.image.preview import fit_latent_rgb, write_table

    # The live preview's latents -> RGB table, fitted against this VAE (image/preview.py explains how).
    with _seeded_float32():
        write_table(folder, fit_latent_rgb(vae))
    _write_marker(folder)
    return folder


def is_demo_model(path: str | Path) -> bool:
    """True when `path` is a folder built by this module (random weights, not a real checkpoint)."""
    return (Path(path) / MARKER_NAME).is_file()


def _is_complete(folder: Path, engine: str) -> bool:
    """True when `folder` was fully built by the current recipe and its files are still whole: a truncated
    or garbled file fails ``weights.verify_folder`` (headers and configs only: milliseconds), so the
    folder is rebuilt instead of failing to load on every start."""
    from neuron_backend.weights import verify_folder

    try:
        marked = (folder / MARKER_NAME).read_text(encoding="utf-8").strip() == RECIPE_VERSION
    except OSError:
        return False
    return marked and not verify_folder(folder, engine)


@contextlib.contextmanager
def _build_lock(parent: Path) -> Iterator[None]:
    """Serialise builders across processes (POSIX flock; no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic rename below still keeps readers safe
        fcntl = None
    if fcntl is None:
        yield
        return
    with open(parent / ".build.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(final: Path, build: Callable[[Path], Path], engine: str) -> None:
    """Run `build` into a temp sibling of `final`, then swap it in with one rename."""
    parent = final.parent
    with _build_lock(parent):
        if _is_complete(final, engine):  # another process finished while we waited for the lock
            return
        # Under the lock, any leftover temp/stale folder belongs to a builder that died.
        for leftover in parent.glob(f".{final.name}.*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared by other users
        try:
            build(tmp)
            if final.exists():
                # An incomplete or outdated folder: move it aside first so `final` is never half-built.
                stale = parent / f".{final.name}.stale-{os.getpid()}"
                os.rename(final, stale)
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def ensure_demo_models(root: Path, engines: tuple[str, ...] = ("chat", "image")) -> DemoModels:
    """Build the demo models of ``engines`` under `root/demo-models/` unless already complete and whole;
    return both folders (one not asked for may not exist). Each is built on its own (a failed image build
    leaves chat working), in a temporary sibling renamed into place: safe from several processes at once."""
    base = Path(root) / DEMO_DIR_NAME
    models = DemoModels(chat=base / CHAT_DIR_NAME, image=base / IMAGE_DIR_NAME)
    for engine, folder, build in (("chat", models.chat, build_tiny_chat_model),
                                  ("image", models.image, build_tiny_image_pipeline)):
        if engine in engines and not _is_complete(folder, engine):
            try:
                base.mkdir(parents=True, exist_ok=True)
                _build_atomically(folder, build, engine)
            except OSError as exc:
                raise OSError(f"could not build the demo {engine} model in {folder} ({exc}); free some space or "
                              f"fix its permissions (deleting {folder} makes the next start rebuild it)") from exc
    return models
