"""Cell images: base64 PNGs, read with their size checked before any pixel is decoded.

An imported run is a file from anywhere: a 12000x12000 grey PNG compresses to a few KB and would
decode to gigabytes. So the size is read from the PNG header first (``png_size``), bounded in
bytes and pixels (and, given a server's Settings, limited to its precompiled sizes), and only then
does Pillow decode it.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct

from PIL import Image, UnidentifiedImageError

from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import tr

MAX_IMAGE_BYTES = 8_000_000  # one cell's PNG, decoded from base64 (a 1344x768 photo-like PNG is ~2 MB)
MAX_IMAGE_PIXELS = 2048 * 2048  # without a server's sizes to compare with
_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_bytes(data: str, where: str | None = None) -> bytes:
    """The PNG bytes of a base64 string, bounded in size; InvalidRequestError when it is not one."""
    where = tr("image", ctx="qa where") if where is None else where
    if not isinstance(data, str):
        raise InvalidRequestError(tr("{where}: image_png must be base64 text.", where=where))
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InvalidRequestError(tr("{where}: the image is larger than {mb} MB.",
                                     where=where, mb=MAX_IMAGE_BYTES // 1_000_000))
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(tr("{where}: image_png is not valid base64.", where=where)) from None
    if not raw.startswith(_SIGNATURE) or len(raw) < 33 or raw[12:16] != b"IHDR":
        raise InvalidRequestError(tr("{where}: image_png is not a PNG image.", where=where))
    return raw


def png_size(data: str, where: str | None = None) -> tuple[int, int]:
    """(width, height) from the PNG header, without decoding any pixel."""
    width, height = struct.unpack(">II", png_bytes(data, where)[16:24])
    return width, height


def check_png(data: str, where: str, sizes: tuple | None = None) -> None:
    """Refuse an image that is too big, not a PNG, broken, or (given ``sizes``) of a size not among them."""
    raw = png_bytes(data, where)
    width, height = struct.unpack(">II", raw[16:24])
    label = f"{width}x{height}"
    if sizes is not None and label not in {s.label for s in sizes}:
        allowed = ", ".join(s.label for s in sizes)
        raise InvalidRequestError(tr("{where}: the image is {size}; this server's sizes are {allowed}.",
                                     where=where, size=label, allowed=allowed))
    if not 0 < width * height <= MAX_IMAGE_PIXELS:
        raise InvalidRequestError(tr("{where}: the image is {size}; at most {most} pixels are allowed.",
                                     where=where, size=label, most=MAX_IMAGE_PIXELS))
    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.verify()  # chunk structure and checksums; pixels are decoded later, within the bound
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, struct.error) as exc:
        raise InvalidRequestError(tr("{where}: image_png is not a readable PNG ({detail}).",
                                     where=where, detail=str(exc))) from None


def decode_png(data: str | None) -> Image.Image | None:
    """The image of a base64 PNG (None for None), loaded only when its header size is within the bound."""
    if not data:
        return None
    width, height = png_size(data)
    if not 0 < width * height <= MAX_IMAGE_PIXELS:
        raise InvalidRequestError(tr("The image is {size}; at most {most} pixels are allowed.",
                                     size=f"{width}x{height}", most=MAX_IMAGE_PIXELS))
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    image.load()
    return image
