"""``POST /v1/images/edits``'s request: OpenAI's multipart form read within the body limit, its image files
read and checked as ``/edit_image`` reads its references, into the ImageCall ``/v1/images/generations`` runs.

The form carries ``image`` (one file) or ``image[]`` (several: the ``openai`` SDK sends a list so), ``prompt``
and the generation fields of ``schema.IMAGE_FIELDS`` as text (``n``, ``seed`` and ``steps`` as whole
numbers), plus ``fit`` (``letterbox`` or ``crop``: one for all images, or one per image comma-separated, as
/edit_image takes it). Messages here are for API clients: English, like ui/api.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import PurePosixPath

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from neuron_backend.errors import InvalidRequestError
from neuron_backend.image.references import (
    READ_FORMATS,
    ReferenceFile,
    check_reference_count,
    read_reference,
    reference_fits,
    reference_pixel_limit,
)
from neuron_backend.runtime import Backend
from neuron_backend.shapes import MAX_REFERENCES

from .schema import IMAGE_FIELDS, ApiError, ImageCall, image_call

FILE_FIELDS = ("image", "image[]")
EDIT_FIELDS = (*FILE_FIELDS, *IMAGE_FIELDS, "fit")
WHOLE_FIELDS = ("n", "seed", "steps")  # form text read as whole numbers (schema checks their ranges)
MAX_FORM_FILES = MAX_REFERENCES + 4  # the parser's own cap; counts past the declared ones are refused by name
MAX_FORM_FIELDS = 32


def edit_counts(backend: Backend) -> tuple[int, ...]:
    """The numbers of images one edit may carry: the declared reference counts above 0 (empty: no editing)."""
    return tuple(n for n in backend.settings.references if n > 0)


async def edit_call(request: Request, backend: Backend) -> ImageCall:
    """Check a /v1/images/edits request and read its images (PNG, JPEG or WebP, each within the
    reference pixel limit); the engine fits them to the size's reference size."""
    counts = edit_counts(backend)
    if not counts:
        raise ApiError(400, "This server does not edit images: it declares no reference images (--references 0). "
                       "Start it with --references 0,1 (or more counts, e.g. 0,1,2) to serve /v1/images/edits, or "
                       "use /v1/images/generations.", "image", "editing_not_served")
    form = await read_form(request, backend.settings.max_request_bytes)
    try:
        files = [item for name in FILE_FIELDS for item in form.getlist(name)]
        fields = {name: value for name, value in form.multi_items() if name not in FILE_FIELDS}
        if "mask" in fields:
            raise ApiError(400, "mask is not supported: this server edits whole images (FLUX.2-klein takes no mask); "
                           "say in the prompt what to change.", "mask", "unsupported_parameter")
        for name, value in fields.items():
            if isinstance(value, UploadFile):
                raise ApiError(400, f"{name} cannot be a file: only image or image[] carry files (the images to "
                               "edit).", name, "invalid_value")
        fit = fields.pop("fit", None)
        call = image_call(_typed_fields(fields), backend, EDIT_FIELDS)
        references = await _references(files, fit, counts, reference_pixel_limit(backend.settings.sizes))
    finally:
        await form.close()
    return replace(call, request=replace(call.request, references=references))


async def read_form(request: Request, limit: int) -> FormData:
    """The request's multipart form, its body read no further than ``limit`` bytes (the size the server's
    body limit, ``--max-request-bytes``, lets through to a route)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise ApiError(400, "The request body must be multipart/form-data: the image files as image or image[], "
                       "the prompt and the other fields as form fields (as the openai SDK's images.edit sends).",
                       code="invalid_content_type")

    async def bounded() -> AsyncIterator[bytes]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(400, f"The request body is over {limit} bytes (--max-request-bytes); send smaller "
                               "images.", code="body_too_large")
            yield chunk

    parser = MultiPartParser(request.headers, bounded(), max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS)
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, f"The multipart body could not be read: {exc.message}", code="invalid_form") from None


def _typed_fields(fields: dict[str, str]) -> dict[str, object]:
    """Form text as the JSON body of /v1/images/generations would carry it (text that is no number is kept,
    for schema's check to name)."""
    typed: dict[str, object] = dict(fields)
    for name in WHOLE_FIELDS:
        if isinstance(typed.get(name), str) and typed[name].strip().lstrip("-").isdigit():
            typed[name] = int(typed[name])
    if isinstance(typed.get("guidance"), str):
        try:
            typed["guidance"] = float(typed["guidance"])
        except ValueError:
            raise ApiError(400, f"guidance must be a number, got {typed['guidance'][:40]!r}.", "guidance",
                           "invalid_value") from None
    return typed


async def _references(files: list, fit: object, counts: tuple[int, ...], limit: int) -> tuple[ReferenceFile, ...]:
    """The image files as references: their count, then each header's pixels against ``limit``; none is decoded
    here (the engine decodes them once the request holds it)."""
    allowed = ", ".join(str(n) for n in counts)
    if not files:
        raise ApiError(400, f"image is required: send the image(s) to edit as image (one file) or image[] "
                       f"(several); this server takes {allowed} per request.", "image", "missing_image")
    if not all(isinstance(f, UploadFile) for f in files):
        raise ApiError(400, f"image must be a file ({', '.join(READ_FORMATS)}), sent as multipart file parts.",
                       "image", "invalid_value")
    with _param("image"):
        check_reference_count(len(files), counts)
    with _param("fit"):
        fits = reference_fits(fit, len(files))
    references = []
    with _param("image"):
        for upload, mode in zip(files, fits, strict=True):
            name = PurePosixPath((upload.filename or "").replace("\\", "/")).name or None  # no client folder
            references.append(await asyncio.to_thread(read_reference, await upload.read(), mode, name, limit))
    return tuple(references)


@contextmanager
def _param(name: str):
    """A backend refusal (InvalidRequestError) inside as a 400 naming the form field ``name``."""
    try:
        yield
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), name, "invalid_value") from None
