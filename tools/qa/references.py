"""QA bench reference images: a prompt-set row's ``references`` and ``fit`` columns, checked and read per cell.

A row edits from files beside its prompt set: ``references`` is a list (JSON/JSONL) or ``;``-separated
text (CSV) of paths relative to the set's folder, ``fit`` one mode for all or one per reference
comma-separated (``neuron_backend/image/references.py``). Each path is checked when the set is read:
inside the set's folder, an existing PNG, JPEG or WebP file, a count the server declares. The row keeps
each file's sha256, and a cell reads the file again and refuses it if its bytes changed: a cell re-run
sends the same bytes, so it reproduces its image.

The QA tab takes the set and its images in one upload (``split_upload``): each upload sits in its own
temporary folder, so a row's references are looked up by file name among the uploaded images (``uploads``)
instead of in the set's folder.

The run's exports name each reference (its path as written and its sha256) but never carry the
folder it was read from: an imported run shows its references and cannot send them again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from neuron_backend.errors import InvalidRequestError
from neuron_backend.image.references import (
    ReferenceFile,
    check_reference_count,
    fit_mode,
    read_reference,
    reference_fits,
)
from neuron_backend.messages import shown_value, tr
from neuron_backend.settings import Settings
from neuron_backend.shapes import MAX_REFERENCES

COLUMNS = ("references", "fit")  # prompt-set columns of an edit
SHORT_SHA = 12  # hex digits of a reference's sha256 shown in reports (as the PNG infotext shows them)
MAX_NAME_CHARS = 300  # a reference's path as written in the set
SEPARATOR = ";"  # between the paths of a CSV cell
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")  # an upload's reference images; any other file is the set


@dataclass
class RowReference:
    """A reference file of a prompt-set row: its path as written (relative to the set), sha256 and fit mode.

    ``path``: where it was read from; left out of exports and comparisons (None in an imported run).
    """

    name: str
    sha256: str
    fit: str
    path: str | None = field(default=None, compare=False)

    def entry(self) -> dict:
        """How a cell's settings and the exports record it (no local path)."""
        return {"name": self.name, "sha256": self.sha256, "fit": self.fit}


def split_upload(paths: Sequence[str | Path]) -> tuple[Path | None, dict[str, Path]]:
    """One upload of a prompt set with its reference images: the set (the one non-image file), images by name."""
    paths = [Path(p) for p in paths]
    sets = [p for p in paths if p.suffix.lower() not in IMAGE_SUFFIXES]
    if len(sets) > 1:
        raise InvalidRequestError(tr("{count} prompt set files were uploaded ({names}); upload one set file (.jsonl, "
                                     ".csv or .txt), with its reference images.", count=len(sets),
                                     names=", ".join(p.name for p in sets)))
    images: dict[str, Path] = {}
    for path in (p for p in paths if p not in sets):
        if path.name in images:
            raise InvalidRequestError(tr("Two uploaded images are named {name}; references are matched by file "
                                         "name, so rename one and name it so in the prompt set.",
                                         name=shown_value(path.name)))
        images[path.name] = path
    if images and not sets:
        raise InvalidRequestError(tr("Images were uploaded without a prompt set file; upload the set file (.jsonl or "
                                     ".csv) together with its reference images."))
    return (sets[0] if sets else None), images


def row_references(where: str, value: object, fit: object, folder: Path | None, settings: Settings,
                   uploads: Mapping[str, Path] | None = None) -> list[RowReference]:
    """The ``references`` and ``fit`` columns of a row read from a file in ``folder``, each file checked.

    ``uploads``: the images uploaded with the set (file name -> path), where the files are looked up instead.
    """
    names = _names(where, value)
    if fit is not None and not names:
        raise InvalidRequestError(tr("{where}: fit applies to reference images; add a references column or remove "
                                     "fit.", where=where))
    if not names:
        return []
    try:
        check_reference_count(len(names), settings.references)
        fits = reference_fits(fit, len(names))
    except InvalidRequestError as exc:
        raise InvalidRequestError(tr("{where}: {detail}", where=where, detail=exc)) from None
    if uploads is not None:
        missing = [name for name in names if file_name(name) not in uploads]
        if missing:
            raise InvalidRequestError(tr("{where}: reference image(s) {names} were not uploaded; upload them together "
                                         "with the prompt set file (they are matched by file name).", where=where,
                                         names=", ".join(map(shown_value, missing))))
    return [_checked_file(where, name, mode, folder, uploads) for name, mode in zip(names, fits, strict=True)]


def file_name(name: str) -> str:
    """A reference's file name without its folder, as it is uploaded and as the engine records it."""
    return PurePosixPath(name.replace("\\", "/")).name


def _names(where: str, value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        names = [part.strip() for part in value.split(SEPARATOR) if part.strip()]
    elif isinstance(value, list) and all(isinstance(part, str) for part in value):
        names = [part.strip() for part in value]
    else:
        raise InvalidRequestError(tr("{where}: references must be a list of file paths (in a CSV: paths separated "
                                     "by ';'), got {got}.", where=where, got=shown_value(value)))
    if len(names) > MAX_REFERENCES:
        raise InvalidRequestError(tr("{where}: {count} reference images; at most {most} are allowed.", where=where,
                                     count=len(names), most=MAX_REFERENCES))
    return names


def _checked_file(where: str, name: str, fit: str, folder: Path | None,
                  uploads: Mapping[str, Path] | None = None) -> RowReference:
    """A reference path as written: relative, inside ``folder`` (links resolved) or uploaded, an image file."""
    shown = shown_value(name) if name else "''"
    pure = PurePosixPath(name.replace("\\", "/"))
    if not name or len(name) > MAX_NAME_CHARS or pure.is_absolute() or Path(name).is_absolute() or ".." in pure.parts:
        raise InvalidRequestError(tr("{where}: reference {name} is not allowed; give a path relative to the prompt "
                                     "set's folder, inside it (no absolute path, no '..').", where=where, name=shown))
    if uploads is not None:
        path = Path(uploads[pure.name])
    else:
        base = folder.resolve()
        path = (base / pure).resolve()
        if not path.is_relative_to(base):  # a link that leads out of the folder
            raise InvalidRequestError(tr("{where}: reference {name} leads outside the prompt set's folder; keep the "
                                         "reference files inside it.", where=where, name=shown))
        if not path.is_file():
            raise InvalidRequestError(tr("{where}: reference {name} does not exist; put the file in the prompt set's "
                                         "folder ({folder}).", where=where, name=shown, folder=folder.name or "."))
    data = path.read_bytes()
    try:
        read_reference(data, fit, pure.name)  # a PNG, JPEG or WebP within the pixel limit, or refused
    except InvalidRequestError as exc:
        raise InvalidRequestError(tr("{where}: {detail}", where=where, detail=exc)) from None
    return RowReference(pure.as_posix(), hashlib.sha256(data).hexdigest(), fit, str(path))


def request_references(references: list[RowReference]) -> tuple[ReferenceFile, ...]:
    """A cell's references for the engine, each file read again and refused if its bytes changed."""
    return tuple(read_reference(current_bytes(ref), ref.fit, file_name(ref.name)) for ref in references)


def current_bytes(ref: RowReference) -> bytes:
    """The file's bytes, if they are still the ones the set was read with; else what to do."""
    if ref.path is None:
        raise InvalidRequestError(tr("Reference {name} is not at hand: a run imported from a file names its "
                                     "references but cannot carry them. Run the prompt set file again with python "
                                     "-m tools.qa.", name=shown_value(ref.name)))
    try:
        data = Path(ref.path).read_bytes()
    except OSError:
        raise InvalidRequestError(tr("Reference {name} could not be read again; put it back beside the prompt set "
                                     "(in the QA tab: upload the set with its images again).",
                                     name=shown_value(ref.name))) from None
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise InvalidRequestError(tr("Reference {name} changed since the prompt set was read (sha256 {old}…); run "
                                     "the set again to use the new file.", name=shown_value(ref.name),
                                     old=ref.sha256[:SHORT_SHA]))
    return data


def describe(entries: list[dict] | None) -> str:
    """A cell's references as reports name them: ``refs/cat.png 1a2b3c4d5e6f letterbox; ...`` ("" for none)."""
    return "; ".join(f"{e.get('name')} {str(e.get('sha256'))[:SHORT_SHA]} {e.get('fit')}" for e in entries or ())


def imported(where: str, value: object) -> list[RowReference]:
    """A row's references from a run export (names, sha256 and fit modes, checked; no path)."""
    if not isinstance(value, list) or len(value) > MAX_REFERENCES:
        raise InvalidRequestError(tr("{where}: references must be a list of at most {most} entries.", where=where,
                                     most=MAX_REFERENCES))
    return [RowReference(**checked_entry(where, entry)) for entry in value]


def checked_entry(where: str, entry: object) -> dict:
    """One reference as an export records it: {"name", "sha256", "fit"}; refused with what is allowed."""
    if (not isinstance(entry, dict) or set(entry) != {"name", "sha256", "fit"}
            or not isinstance(entry["name"], str) or not 0 < len(entry["name"]) <= MAX_NAME_CHARS
            or not isinstance(entry["sha256"], str) or len(entry["sha256"]) != 64
            or any(c not in "0123456789abcdef" for c in entry["sha256"])):
        raise InvalidRequestError(tr("{where}: each reference must be an object with name (text), sha256 (64 hex "
                                     "digits) and fit.", where=where))
    return {"name": entry["name"], "sha256": entry["sha256"], "fit": fit_mode(entry["fit"])}
