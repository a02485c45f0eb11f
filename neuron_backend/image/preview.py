"""Live preview of a denoising image: latents -> RGB by a fixed linear projection, on the host.

``LatentRGB`` is the fitted table (``fit_latent_rgb``, cached by ``cached_or_fitted``); ``unpack`` turns the
step callback's packed latents back into the VAE's grid. Why: docs/page.md, "How the live preview is drawn".
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

log = logging.getLogger("showcase.image")

TABLE_FILE = "latent_rgb.json"
FIT_SAMPLES = 4  # random latents per fit
FIT_GRID = 16  # latent tokens per side of each fitted sample (256x256 pixels with FLUX.2's VAE)


@dataclass(frozen=True)
class LatentRGB:
    """A fitted table: ``factors`` [C][3] and ``bias`` [3], for latents of C channels.

    ``scale``: image pixels per latent pixel along a side (the VAE's ``vae_scale_factor``); a table
    written without one is for FLUX.2's four-level VAE (8).
    """

    factors: tuple[tuple[float, float, float], ...]
    bias: tuple[float, float, float]
    note: str = ""
    scale: int = 8

    @property
    def channels(self) -> int:
        return len(self.factors)

    def to_json(self) -> dict:
        return {"factors": [list(row) for row in self.factors], "bias": list(self.bias), "note": self.note,
                "scale": self.scale}

    @classmethod
    def from_json(cls, data: dict) -> LatentRGB:
        factors = tuple(tuple(float(v) for v in row) for row in data["factors"])
        bias = tuple(float(v) for v in data["bias"])
        scale = data.get("scale", 8)
        if not factors or any(len(row) != 3 for row in factors) or len(bias) != 3:
            raise ValueError("a latent RGB table needs factors [C][3] and bias [3]")
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1 or scale & (scale - 1):
            raise ValueError(f"a latent RGB table's scale must be a power of 2, not {scale!r}")
        return cls(factors, bias, str(data.get("note", "")), scale)

    def render(self, packed: torch.Tensor, width: int, height: int) -> Image.Image:
        """The preview of the first image of host latents ``packed`` [B, seq, 4C] at 1/scale of (width, height)."""
        latents = unpack(packed[:1].float(), width, height, self.scale)[0]  # [C, H/s, W/s]
        table = torch.tensor(self.factors, dtype=torch.float32)  # [C, 3]
        rgb = torch.einsum("chw,ck->hwk", latents, table) + torch.tensor(self.bias)
        pixels = ((rgb.clamp(-1, 1) + 1) * 127.5).to(torch.uint8).numpy()
        return Image.fromarray(pixels, mode="RGB")


def unpack(packed: torch.Tensor, width: int, height: int, scale: int = 8) -> torch.Tensor:
    """Packed latents [B, (H/2s)*(W/2s), 4C] -> VAE-grid latents [B, C, H/s, W/s] (still normalised; s: scale)."""
    batch, seq, channels4 = packed.shape
    rows, cols = height // (2 * scale), width // (2 * scale)  # tokens: 2x2 latent pixels each
    if seq != rows * cols:
        raise ValueError(f"{seq} latent tokens do not match {width}x{height}")
    grid = packed.reshape(batch, rows, cols, channels4 // 4, 2, 2)  # [B, h, w, C, i, j]
    return grid.permute(0, 3, 1, 4, 2, 5).reshape(batch, channels4 // 4, rows * 2, cols * 2)


@torch.no_grad()
def fit_latent_rgb(vae, samples: int = FIT_SAMPLES, grid: int = FIT_GRID, seed: int = 0) -> LatentRGB:
    """Least-squares table from normalised latent channels to the VAE's decoded, scale x scale-pooled RGB.
    ``vae``: an ``AutoencoderKLFlux2`` on the CPU, of any number of levels (one latent pixel is
    ``2 ** (levels - 1)`` image pixels along a side); its batch norm undoes the normalisation as the pipeline does."""
    channels = vae.config.latent_channels
    scale = 2 ** (len(vae.config.block_out_channels) - 1)  # Flux2KleinPipeline's vae_scale_factor
    side = grid * 2 * scale  # pixels along a side of each sample
    generator = torch.Generator().manual_seed(seed)
    vae_dtype = next(vae.parameters()).dtype
    patched = torch.randn(samples, 4 * channels, grid, grid, generator=generator)  # [N, 4C, h, w]
    mean = vae.bn.running_mean.view(1, -1, 1, 1).float()
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1).float() + vae.config.batch_norm_eps)
    packed = patched.flatten(2).transpose(1, 2)  # [N, h*w, 4C], the pipeline's packed layout
    normal = unpack(packed, side, side, scale)  # [N, C, 2h, 2w]: the preview's input
    raw = unpack((patched * std + mean).flatten(2).transpose(1, 2), side, side, scale)
    decoded = vae.decode(raw.to(vae_dtype), return_dict=False)[0].float()  # [N, 3, 2h*s, 2w*s] in [-1, 1]
    if decoded.shape[-2:] != (side, side):
        raise ValueError(f"the VAE decoded a {2 * grid}x{2 * grid} latent grid to {decoded.shape[-1]}x"
                         f"{decoded.shape[-2]} pixels, not the {side}x{side} its {scale}x scale factor implies")
    pooled = torch.nn.functional.avg_pool2d(decoded, scale)  # [N, 3, 2h, 2w]
    x = normal.permute(0, 2, 3, 1).reshape(-1, channels)
    y = pooled.permute(0, 2, 3, 1).reshape(-1, 3)
    design = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    solution = torch.linalg.lstsq(design.double(), y.double()).solution.float()  # [C+1, 3]
    fitted = design @ solution
    r2 = 1 - ((y - fitted) ** 2).sum() / ((y - y.mean(0)) ** 2).sum().clamp_min(1e-12)
    note = (f"least squares over {samples} random latents of {side}x{side} px decoded by this VAE "
            f"({scale}x{scale}-pooled RGB); R^2 {float(r2):.3f}")
    rows = tuple(tuple(round(float(v), 6) for v in row) for row in solution[:channels])
    return LatentRGB(rows, tuple(round(float(v), 6) for v in solution[channels]), note, scale)


def write_table(folder: Path, table: LatentRGB) -> Path:
    path = Path(folder) / TABLE_FILE
    path.write_text(json.dumps(table.to_json(), indent=1) + "\n", encoding="utf-8")
    return path


def read_table(path: Path) -> LatentRGB | None:
    """The table at ``path``, or None when it is missing or unreadable (logged)."""
    try:
        return LatentRGB.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the preview table %s: %s", path, exc)
        return None


def cached_or_fitted(folder: Path, vae, cache_dir: Path) -> LatentRGB | None:
    """The model folder's table, else a cached fit for this VAE, else a new fit (cached); None if all fail."""
    table = read_table(Path(folder) / TABLE_FILE)
    if table is not None:
        return table
    key = hashlib.sha256(json.dumps(dict(vae.config), sort_keys=True, default=str).encode()
                         + str(Path(folder).resolve()).encode()).hexdigest()[:16]
    cached = Path(cache_dir) / "preview" / f"{key}.json"
    table = read_table(cached)
    if table is not None:
        return table
    start = time.perf_counter()
    try:
        # Fitted on a host copy: no device graph. nn.Module.to, not diffusers' (which warns about the cast).
        host_vae = torch.nn.Module.to(copy.deepcopy(vae), "cpu", torch.float32)
        table = fit_latent_rgb(host_vae)
        del host_vae
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_table(cached.parent, table).replace(cached)
    except Exception as exc:  # noqa: BLE001 - the preview is optional: the images still work without it
        log.warning("no live preview: fitting a latent RGB table failed: %s", exc)
        return None
    log.info("fitted the preview table in %.1f s (%s); cached in %s", time.perf_counter() - start, table.note, cached)
    return table


@dataclass
class PreviewFrame:
    """Host latents of one step and how to draw them; ``image()`` renders once, on first use (thread-safe)."""

    step: int
    total: int
    latents: torch.Tensor  # [1, seq, 4C] on the CPU
    table: LatentRGB
    width: int
    height: int
    index: int = 0  # which image of a several-image run
    _image: Image.Image | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def image(self) -> Image.Image:
        """The preview at 1/scale of the image's size (one pixel per latent pixel; 1/8 with FLUX.2's VAE)."""
        with self._lock:
            if self._image is None:
                self._image = self.table.render(self.latents, self.width, self.height)
            return self._image


PreviewFn = Callable[[PreviewFrame], None]
