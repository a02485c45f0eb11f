"""The memory plan on a NeuronCore as the runtime reports it (tests/support/fake_neuron.py), with the real
FLUX.2-klein-4B and Qwen3-0.6B folders minus their weights (tests/support/real_size.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import fake_neuron
from support.model_folders import real_flux_layout

from neuron_backend import memory
from neuron_backend.devices import resolve_placements
from neuron_backend.errors import EngineUnavailableError
from neuron_backend.image import loading
from neuron_backend.image.engine import ImageEngine, ImageRequest
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize
from tools.parallel import plugin as tensor_parallel

GIB = memory.GIB
FULL_SIZES = [ImageSize(1024, 1024), ImageSize(1344, 768), ImageSize(768, 1344)]


def full_settings(tmp_path, models, *argv, env=None):
    """The full preset (1024x1024 and its aspect ratios, one reference) on the real-size folders."""
    return parse_settings(["--models", "full", "--image-model", str(models.image), "--chat-model", str(models.chat),
                           "--cache-dir", str(tmp_path), *argv], env=env or {}, plugins=(tensor_parallel,))


def test_the_fake_core_reports_24_gib_less_the_runtime_reserve(monkeypatch):
    fake = fake_neuron.install(monkeypatch)
    total = torch.neuron.get_device_properties(1).total_memory
    assert total == fake_neuron.REPORTED_TOTAL == (24 << 30) - 2 * (96 << 20)  # micro-code of 2 physical cores
    assert fake.device_count() == 2 and total < 24 << 30


def test_the_real_size_folders_hold_the_real_parameter_counts(real_size_models):
    image = memory.parameter_counts(real_size_models.image)
    assert image == {"transformer": 3_875_544_576, "text_encoder": 4_022_468_096, "vae": 84_046_372}  # 7.98 B
    assert memory.parameter_counts(real_size_models.chat, "chat") == {"model": 596_049_920}  # Qwen3-0.6B, tied
    # the figure the first-run review gave: bf16 weights and a float32 decode at 1024x1024, no reference
    upcast = memory.estimate_image(real_size_models.image, torch.bfloat16, FULL_SIZES, on_cpu=False)
    assert 23.9 * GIB < upcast.total < 24.0 * GIB and "decoding 1024x1024" in upcast.text()


def test_flux2_klein_4b_fits_one_neuron_core_only_if_attention_keeps_no_scores(tmp_path, monkeypatch,
                                                                              real_size_models):
    """One 1024x1024 reference makes the joint sequence 512 + 4096 + 4096 = 8,704 tokens: materialised, the
    scores of its 24 heads are ~3.4 GiB, more than the ~1.3 GiB that bf16 weights + a bf16 decode + the reference
    tokens (~20.5 GiB) leave of ~23.8 GiB less the headroom. The plan counts them, says so, and loads anyway with
    the decode in bfloat16 (as Flux2KleinPipeline does): an edit slot that runs out of memory fails alone."""
    fake_neuron.install(monkeypatch)
    settings = full_settings(tmp_path, real_size_models)
    placement = resolve_placements(settings)["image"]
    assert (placement.device, placement.dtype, max(settings.references)) == ("neuron:1", torch.bfloat16, 1)
    chosen = memory.estimate_image(real_size_models.image, torch.bfloat16, settings.sizes, False, 1, upcast=False)
    assert chosen.attention == 24 * 8704**2 * 2 and 3.3 * GIB < chosen.attention < 3.5 * GIB
    assert "the largest edit slot's attention scores 3.4 GiB" in chosen.text()
    assert chosen.total + memory.DEVICE_HEADROOM > fake_neuron.REPORTED_TOTAL  # with the scores: no fit
    unscored = chosen.total - chosen.attention
    assert 20.0 * GIB < unscored < 21.0 * GIB and unscored + memory.DEVICE_HEADROOM <= fake_neuron.REPORTED_TOTAL
    plan = loading.plan_memory(real_size_models.image, placement, settings)
    assert plan.dtype == torch.bfloat16 and not plan.upcast and plan.needs == unscored
    assert "if attention materialises the largest edit slot's scores (3.4 GiB" in plan.note
    assert "Loading anyway" in plan.note and "decoding 1024x1024 in bfloat16 3.8 GiB" in plan.note
    assert "23.8 GiB free on neuron" in plan.note and "2.0 GiB of it kept for the runtime" in plan.note
    text_only = full_settings(tmp_path, real_size_models, "--references", "0")  # no edit slot: no scores counted
    assert "Loading anyway" not in loading.plan_memory(real_size_models.image, placement, text_only).note


def test_a_refusal_names_only_fixes_that_apply(tmp_path, monkeypatch, real_size_models):
    """Already bfloat16: never --dtype bfloat16; sharding the transformer is named only when it fits."""
    fake = fake_neuron.install(monkeypatch)
    fake.total_memory = 20 * GIB  # a core that holds less (another process, a smaller part)
    settings = full_settings(tmp_path, real_size_models)
    placement = resolve_placements(settings)["image"]
    with pytest.raises(EngineUnavailableError) as err:
        loading.plan_memory(real_size_models.image, placement, settings)
    message = str(err.value)
    assert "--dtype bfloat16" not in message and "--no-image" in message and "fewer --references" in message
    assert "torchrun --nproc_per_node=2 app.py --tp 2 --tp-engine image" in message
    assert "decoding 1024x1024 in bfloat16" in message  # the smallest way at this dtype, not the float32 decode
    big = full_settings(tmp_path, real_size_models, "--sizes", "2048x2048")
    with pytest.raises(EngineUnavailableError) as err:  # sharding does not save enough: not offered
        loading.plan_memory(real_size_models.image, resolve_placements(big)["image"], big)
    assert "--tp 2" not in str(err.value) and "--dtype bfloat16" not in str(err.value)
    fp32 = full_settings(tmp_path, real_size_models, "--dtype", "float32", "--sizes", "1024x1024", "--references",
                         "0")
    fake.total_memory = fake_neuron.REPORTED_TOTAL
    with pytest.raises(EngineUnavailableError) as err:  # --dtype float32 given: bfloat16 would fit, so it is named
        loading.plan_memory(real_size_models.image, resolve_placements(fp32)["image"], fp32)
    assert "--dtype bfloat16 (which needs ~" in str(err.value)


def test_a_tensor_parallel_follower_reads_its_own_core(tmp_path, monkeypatch, real_size_models):
    """Under torchrun rank 1 holds neuron:1, which its runtime calls 0: the total is asked by that index (the
    PyTorch index reads 0 bytes there), the allocated bytes by PyTorch's."""
    fake = fake_neuron.install(monkeypatch, torchrun=(1, 2))
    settings = full_settings(tmp_path, real_size_models, "--tp", "2", "--tp-engine", "image",
                             env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    placements = resolve_placements(settings, sharding=tensor_parallel.plug(settings).sharding)
    image = placements["image"]
    assert (image.device, image.tp) == ("neuron:1", 2)
    assert torch.neuron.get_device_properties(1).total_memory == 0  # what the query by PyTorch's index reads
    fake.place([torch.ones(1024)], 1)
    from neuron_backend.compile_cache import device_counters

    counted = device_counters(placements)["memory"]["neuron:1"]  # the panel's and the doctor's line
    assert counted == {"allocated_bytes": torch.neuron.memory_allocated(1), "total_bytes": fake_neuron.REPORTED_TOTAL}
    plan = loading.plan_memory(real_size_models.image, image, settings)
    assert "23.8 GiB free on neuron" in plan.note and plan.dtype == torch.bfloat16
    assert image.runtime_core == 0 and placements["chat"].runtime_core == 0  # both engines on this rank's core
    free = memory.free_bytes("neuron", 1, image.runtime_core)
    assert free == fake_neuron.REPORTED_TOTAL - torch.neuron.memory_allocated(1) and free > 23 * GIB


def test_a_total_of_zero_is_unknown_not_zero_free(monkeypatch):
    fake = fake_neuron.install(monkeypatch)
    fake.total_memory = 0  # TorchNeuron's answer when the runtime's query fails
    assert memory.free_bytes("neuron", 0) is None


@pytest.fixture(scope="module")
def flux_folder(demo_models, tmp_path_factory):
    return real_flux_layout(demo_models.image, tmp_path_factory.mktemp("flux") / "klein")


def test_the_engine_decodes_in_bfloat16_when_the_float32_decode_does_not_fit(tmp_path, monkeypatch, flux_folder):
    settings = parse_settings(["--models", "full", "--image-model", str(flux_folder), "--device", "cpu", "--dtype",
                               "bfloat16", "--sizes", "64x64", "--references", "0", "--cache-dir", str(tmp_path)],
                              env={})
    upcast = memory.estimate_image(flux_folder, torch.bfloat16, settings.sizes, True).total
    monkeypatch.setattr(loading, "free_bytes", lambda kind, core, *_: upcast - 1)  # the float32 decode: no room
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "test/klein")
    engine.load(flux_folder)
    engine.shapes.gated = False
    assert engine._pipe.vae.dtype == torch.bfloat16 and engine._pipe.vae.config.force_upcast is True
    assert "decoding in bfloat16 instead of float32" in engine.describe()["memory"]
    assert engine.generate(ImageRequest("a lighthouse", "64x64", steps=2, seed=1)).image.size == (64, 64)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.slow
def test_a_bfloat16_decode_stays_close_to_the_float32_one(demo_models):
    """The demo VAE (random weights, 4 levels like the real one) decodes the same latents in both dtypes."""
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2.from_pretrained(demo_models.image, subfolder="vae").eval()
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, vae.config.latent_channels, 32, 32, generator=generator)

    def decode(dtype):
        with torch.no_grad():
            image = vae.to(dtype).decode(latents.to(dtype)).sample.float()
        return ((image.clamp(-1, 1) + 1) * 127.5).round().numpy()

    fp32, bf16 = decode(torch.float32), decode(torch.bfloat16)
    assert psnr(fp32, bf16) > 40  # 8-bit images: measured ~46 dB here (docs/trainium.md, Memory)


def test_a_demo_models_parameter_count_is_not_zero():
    """The estimate's text names a tiny model's parameters in billions without rounding them to "0.00"."""
    assert memory._billions(600_000_000) == "0.60" and memory._billions(8_000_000_000) == "8.00"
    assert memory._billions(1_300_000) == "0.0013" and memory._billions(45_000) == "0.000045"
