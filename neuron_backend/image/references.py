"""Reference images for editing: read, checked and fitted to the size the pipeline keeps unchanged.

``read_reference`` reads only a file's header and keeps the compressed bytes; ``fit_reference`` decodes it
and fits it by ``letterbox`` or ``crop``: same file, mode and size, same pixels. Why the fitting is ours:
docs/editing.md, "Fitting"; the memory bounds: docs/security.md.
"""

from __future__ import annotations

import hashlib
import io
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps

from ..errors import InvalidRequestError
from ..messages import shown_value, tr
from ..shapes import ImageSize

FIT_MODES = ("letterbox", "crop")
DEFAULT_FIT = "letterbox"
LETTERBOX_FILL = (0, 0, 0)  # the padding of a letterboxed reference (and under a transparent one)
MAX_REFERENCE_PIXELS = 64 * 2**20  # the ceiling of a reference file's pixels, whatever the sizes (8192x8192)
MIN_REFERENCE_PIXELS = 4 * 2**20  # the limit is never under this (2048x2048), however small the sizes
REFERENCE_AREA_FACTOR = 16  # a reference may have this many times the pixels of the largest declared size
RESIZE_REDUCING_GAP = 3.0  # box-reduce first when shrinking over 3x: LANCZOS's weights stay small (1xN images)
READ_FORMATS = ("PNG", "JPEG", "WEBP")
MAX_NAME_CHARS = 200  # a reference's file name as recorded in the PNG parameters


@dataclass(frozen=True)
class ReferenceImage:
    """A reference as a request carries it: the image as sent and how to fit it. ``sha256``: of the file's
    bytes, else of the RGB pixels; ``name``: the sender's file name (no folder), for the PNG parameters."""

    image: Image.Image
    fit: str = DEFAULT_FIT
    sha256: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ReferenceFile:
    """A reference file read but not decoded: its bytes, and its header's format and size.

    ``sha256``: of ``data``; ``size``: (width, height) as the header declares it (before EXIF orientation).
    """

    data: bytes
    fit: str
    sha256: str
    size: tuple[int, int]
    format: str
    name: str | None = None

    @property
    def pixels(self) -> int:
        return self.size[0] * self.size[1]


@dataclass(frozen=True)
class FittedReference:
    """A reference fitted for one output size: ``image`` is what the pipeline receives, unchanged."""

    image: Image.Image  # RGB, exactly ``fitted`` pixels
    fit: str
    sha256: str
    original: ImageSize | tuple[int, int]  # (width, height) of the image as sent
    fitted: ImageSize
    name: str | None = None

    def params(self) -> dict:
        """What the PNG parameters record of this reference (JSON-serialisable)."""
        entry = {"sha256": self.sha256, "original_size": f"{self.original[0]}x{self.original[1]}",
                 "fitted_size": self.fitted.label, "fit": self.fit}
        if self.name:
            entry["name"] = self.name
        return entry


def reference_pixel_limit(sizes) -> int:
    """The most pixels a reference file may declare where ``sizes`` are served: REFERENCE_AREA_FACTOR times
    the largest size's pixels, within MIN_REFERENCE_PIXELS..MAX_REFERENCE_PIXELS."""
    largest = max((width * height for width, height in sizes), default=0)
    return min(MAX_REFERENCE_PIXELS, max(MIN_REFERENCE_PIXELS, REFERENCE_AREA_FACTOR * largest))


def check_reference_pixels(reference: object, limit: int) -> None:
    """Refuse a reference file whose header declares more than ``limit`` pixels (nothing is decoded)."""
    if isinstance(reference, ReferenceFile) and reference.pixels > limit:
        raise _too_large(shown_value(reference.name) if reference.name else tr("image"), reference.size, limit)


def fit_mode(value: object) -> str:
    """``value`` as one of FIT_MODES; refused with the allowed modes named."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in FIT_MODES:
        raise InvalidRequestError(tr("Fit mode {value} is not known: use {allowed}.", value=shown_value(value),
                                     allowed=", ".join(FIT_MODES)))
    return text


def reference_fits(value: object, count: int) -> list[str]:
    """The fit mode of each of ``count`` references: one mode for all, or one per reference comma-separated
    (None or "": letterbox for all)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return [DEFAULT_FIT] * count
    parts = [fit_mode(part) for part in value.split(",")] if isinstance(value, str) else [fit_mode(value)]
    if len(parts) == 1:
        return parts * count
    if len(parts) != count:
        raise InvalidRequestError(tr("{given} fit modes for {count} references: give one for all, or one per "
                                     "reference.", given=len(parts), count=count))
    return parts


def check_reference_count(count: int, served: tuple[int, ...]) -> None:
    """Refuse ``count`` references unless it is one of the declared counts ``served`` (``settings.references``)."""
    if count not in served:
        raise InvalidRequestError(tr("{count} reference images are not served here (each count is compiled "
                                     "ahead of time). Allowed counts: {allowed}.", count=count,
                                     allowed=", ".join(str(n) for n in served)))


def read_reference(source: bytes | str | Path, fit: str = DEFAULT_FIT, name: str | None = None,
                   limit: int | None = None) -> ReferenceFile:
    """A reference from a file's bytes or path, read from its header only: PNG, JPEG or WebP, at most
    ``limit`` pixels (``reference_pixel_limit``; None: MAX_REFERENCE_PIXELS); refused with what is allowed.
    Nothing is decoded here."""
    limit = MAX_REFERENCE_PIXELS if limit is None else limit
    if isinstance(source, (str, Path)):
        name = name or Path(source).name
        try:
            source = Path(source).read_bytes()
        except OSError:
            raise InvalidRequestError(tr("Reference {name} could not be read: send an image file.",
                                         name=shown_value(name))) from None
    name = clean_name(name)
    label = shown_value(name) if name else tr("image")
    try:
        with Image.open(io.BytesIO(source)) as opened:  # the header only: no pixel is decoded until load()
            kind, size = opened.format, tuple(opened.size)
    except Image.DecompressionBombError:  # PIL's own limit, from the header too: far over ours
        raise _too_large(label, None, limit) from None
    except Exception:  # noqa: BLE001 - no header we can read: not an image we can read
        raise _unreadable(label) from None
    if kind not in READ_FORMATS:
        raise InvalidRequestError(tr("Reference {name} is a {kind} file; send {allowed}.", name=label,
                                     kind=kind or "?", allowed=", ".join(READ_FORMATS)))
    reference = ReferenceFile(source, fit_mode(fit), hashlib.sha256(source).hexdigest(), size, kind, name)
    check_reference_pixels(reference, limit)
    return reference


def clean_name(name: str | None) -> str | None:
    """A sender's file name as the PNG parameters keep it: no control or format characters (NUL, bidi
    overrides), no HTML's ``<>&"'``, at most MAX_NAME_CHARS; None when nothing is left."""
    if not isinstance(name, str):
        return None
    kept = "".join("_" if ch in "<>&\"'" else ch for ch in name
                   if unicodedata.category(ch) not in ("Cc", "Cf", "Cs"))
    return kept.strip()[:MAX_NAME_CHARS] or None


_DECODING = threading.Lock()  # one reference decoded at a time in the process: its pixels are the big part


def _decoded(reference: ReferenceFile) -> Image.Image:
    """The file's pixels, EXIF orientation applied; the caller holds ``_DECODING``."""
    label = shown_value(reference.name) if reference.name else tr("image")
    try:
        with Image.open(io.BytesIO(reference.data)) as opened:
            if tuple(opened.size) != reference.size or opened.format != reference.format:
                raise _unreadable(label)
            opened.load()
            image = ImageOps.exif_transpose(opened)  # a copy; the decoded file is closed with ``opened``
    except InvalidRequestError:
        raise
    except Exception:  # noqa: BLE001 - any decoding failure: not an image we can read
        raise _unreadable(label) from None
    return image


def _unreadable(label) -> InvalidRequestError:
    return InvalidRequestError(tr("Reference {name} is not an image that can be read; send {allowed}.",
                                  name=label, allowed=", ".join(READ_FORMATS)))


def _too_large(label, size: tuple[int, int] | None, limit: int) -> InvalidRequestError:
    megapixels = round(limit / 2**20, 1)
    if size is None:  # PIL refused the header itself: far over any limit of ours
        return InvalidRequestError(tr("Reference {name} has far too many pixels; this server takes references of at "
                                      "most {limit} pixels ({megapixels} megapixels). Send a smaller image.",
                                      name=label, limit=limit, megapixels=megapixels))
    return InvalidRequestError(tr("Reference {name} is {size} pixels; this server takes references of at most {limit} "
                                  "pixels ({megapixels} megapixels). Send a smaller image.", name=label,
                                  size=f"{size[0]}x{size[1]}", limit=limit, megapixels=megapixels))


def pixel_sha256(image: Image.Image) -> str:
    """sha256 of an image's RGB pixels with its size: the identity of a reference sent as pixels."""
    rgb = image.convert("RGB")
    return hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).hexdigest()


def fit_reference(reference: ReferenceImage | ReferenceFile | FittedReference, target: ImageSize,
                  limit: int | None = None) -> FittedReference:
    """``reference`` fitted to exactly ``target`` pixels by its fit mode (a fitted one at ``target`` is kept). A
    ``ReferenceFile`` is checked against ``limit``, decoded and fitted one at a time in the process (any thread)."""
    if isinstance(reference, FittedReference):
        if reference.fitted == target and reference.image.size == tuple(target) and reference.image.mode == "RGB":
            return reference
        raise InvalidRequestError(tr("A reference fitted to {fitted} cannot serve a request whose references are "
                                     "{target}.", fitted=reference.fitted.label, target=target.label))
    if isinstance(reference, ReferenceFile):
        check_reference_pixels(reference, MAX_REFERENCE_PIXELS if limit is None else limit)
        mode = fit_mode(reference.fit)
        with _DECODING:
            source = _decoded(reference)
            fitted = _fitted(source, mode, target)
        return FittedReference(fitted, mode, reference.sha256, tuple(source.size), ImageSize(*target),
                               reference.name)
    if not isinstance(reference, ReferenceImage) or not isinstance(reference.image, Image.Image):
        raise InvalidRequestError(tr("A reference must be an image, not {kind}.",
                                     kind=type(getattr(reference, "image", reference)).__name__))
    mode = fit_mode(reference.fit)
    source = reference.image
    return FittedReference(_fitted(source, mode, target), mode, reference.sha256 or pixel_sha256(source),
                           tuple(source.size), ImageSize(*target), reference.name)


def _fitted(source: Image.Image, mode: str, target: ImageSize) -> Image.Image:
    rgb = _flattened(source)
    return _letterbox(rgb, target) if mode == "letterbox" else _crop(rgb, target)


def _flattened(image: Image.Image) -> Image.Image:
    """RGB; a transparent image is laid over LETTERBOX_FILL (the pipeline would drop its alpha)."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        base = Image.new("RGBA", rgba.size, (*LETTERBOX_FILL, 255))
        return Image.alpha_composite(base, rgba).convert("RGB")
    return image.convert("RGB")


def _letterbox(image: Image.Image, target: ImageSize) -> Image.Image:
    """The whole image, scaled to fit inside ``target`` and centred on LETTERBOX_FILL."""
    scale = min(target.width / image.width, target.height / image.height)
    inner = (min(target.width, max(1, round(image.width * scale))),
             min(target.height, max(1, round(image.height * scale))))
    canvas = Image.new("RGB", tuple(target), LETTERBOX_FILL)
    scaled = image if image.size == inner else image.resize(inner, Image.Resampling.LANCZOS,
                                                             reducing_gap=RESIZE_REDUCING_GAP)
    canvas.paste(scaled, ((target.width - inner[0]) // 2, (target.height - inner[1]) // 2))
    return canvas


def _crop(image: Image.Image, target: ImageSize) -> Image.Image:
    """The image scaled to cover ``target`` and centre-cropped to it."""
    scale = max(target.width / image.width, target.height / image.height)
    cover = (max(target.width, round(image.width * scale)), max(target.height, round(image.height * scale)))
    scaled = image if image.size == cover else image.resize(cover, Image.Resampling.LANCZOS,
                                                             reducing_gap=RESIZE_REDUCING_GAP)
    left, top = (cover[0] - target.width) // 2, (cover[1] - target.height) // 2
    return scaled.crop((left, top, left + target.width, top + target.height))
