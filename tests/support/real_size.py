"""Real-size model folders with no weights: FLUX.2-klein-4B and Qwen3-0.6B as the memory estimate reads them.

Each folder has the real repository's configs and layout, and safetensors files whose headers declare
every tensor with its real name, shape and dtype; the data after the header is a hole (a sparse file of
the declared length), so the folder is "whole" to ``weights.verify_folder`` and costs no disk. The shapes
come from the model classes themselves, built on the meta device from the public configs (NOTES: FLUX.2-klein-4B
transformer 5 double + 20 single blocks, 24 heads x 128, joint_attention_dim 7680; text encoder of
Qwen3-4B's shape; VAE with latent_channels 32, block_out_channels 128/256/512/512, ``force_upcast: true``).
Nothing here loads: these folders are for the estimate and the doctor, not for ``from_pretrained``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_DTYPES = {"torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float16": "F16"}
_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def write_hollow_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """A safetensors file declaring ``tensors`` (name -> (dtype, shape)) over a hole; return its data bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        size = _BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + offset)  # the weights: a hole of their length
    return offset


def _stored(module, dtype: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What save_pretrained stores of a module: its state dict, tied weights once (the first name kept)."""
    tied = set(getattr(module, "_tied_weights_keys", None) or ()) if getattr(
        getattr(module, "config", None), "tie_word_embeddings", False) else set()
    return {name: (dtype, tuple(t.shape)) for name, t in module.state_dict().items() if name not in tied}


def _tokenizer(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    (folder / "tokenizer.json").write_text("{}")


def qwen3_0_6b(folder: Path) -> Path:
    """Qwen/Qwen3-0.6B: its config.json, one model.safetensors (bf16, tied embeddings stored once)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="bfloat16",
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    config.architectures = ["Qwen3ForCausalLM"]
    (folder / "config.json").write_text(config.to_json_string())
    write_hollow_safetensors(folder / "model.safetensors", _stored(model, "BF16"))
    _tokenizer(folder)
    return folder


def flux2_klein_4b(folder: Path) -> Path:
    """black-forest-labs/FLUX.2-klein-4B: model_index.json, transformer, text encoder in two shards, VAE."""
    import torch
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    with torch.device("meta"):
        transformer = Flux2Transformer2DModel(patch_size=1, in_channels=128, num_layers=5, num_single_layers=20,
                                              attention_head_dim=128, num_attention_heads=24,
                                              joint_attention_dim=7680, axes_dims_rope=(32, 32, 32, 32),
                                              rope_theta=2000, guidance_embeds=False)
        vae = AutoencoderKLFlux2(latent_channels=32, block_out_channels=(128, 256, 512, 512), patch_size=(2, 2))
        encoder_config = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                     head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
                                     torch_dtype="bfloat16",
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        encoder = Qwen3ForCausalLM(encoder_config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "Flux2KleinPipeline", "_diffusers_version": "0.42.1", "is_distilled": True,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"], "tokenizer": ["transformers", "Qwen2TokenizerFast"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"]}, indent=1))
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps({
        "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0,
        "use_dynamic_shifting": True}))
    _tokenizer(folder / "tokenizer")
    (folder / "transformer").mkdir()
    (folder / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "Flux2Transformer2DModel", **transformer.config}, indent=1, default=list))
    write_hollow_safetensors(folder / "transformer" / "diffusion_pytorch_model.safetensors",
                             _stored(transformer, "BF16"))
    (folder / "vae").mkdir()
    (folder / "vae" / "config.json").write_text(json.dumps(
        {"_class_name": "AutoencoderKLFlux2", **vae.config, "force_upcast": True}, indent=1, default=list))
    write_hollow_safetensors(folder / "vae" / "diffusion_pytorch_model.safetensors", _stored(vae, "F32"))
    encoder_config.architectures = ["Qwen3ForCausalLM"]
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder" / "config.json").write_text(encoder_config.to_json_string())
    tensors = _stored(encoder, "BF16")
    names = sorted(tensors)
    weight_map, total = {}, 0
    for number, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), start=1):
        shard = f"model-0000{number}-of-00002.safetensors"
        total += write_hollow_safetensors(folder / "text_encoder" / shard, {k: tensors[k] for k in part})
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "text_encoder" / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return folder
