"""Which files a model needs, which of them are missing, and whether the present ones are whole.

Two kinds of model folder:

- ``chat`` (a transformers causal LM such as Qwen/Qwen3-0.6B): ``config.json``, the tokenizer
  (``tokenizer_config.json`` plus ``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) and every
  weight shard that ``model.safetensors.index.json`` names (or the single ``model.safetensors``);
- ``image`` (a diffusers pipeline such as FLUX.2-klein-4B): ``model_index.json`` and, for every
  component it lists, the files ``Flux2KleinPipeline.from_pretrained`` reads: a model folder's
  ``config.json`` and weights (index + shards, or the single file), a scheduler's
  ``scheduler_config.json``, a tokenizer's files. This is the set ``DiffusionPipeline.download``
  fetches (model files of the component folders, every file of the non-model folders, no root
  checkpoint, README or images).

The rules run on any "does this path exist / read this JSON" pair, so the same code lists the
needs of a local folder, a cached snapshot, or a Hub listing (model_sources.py). Only safetensors
weights are supported (what both real repositories ship).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .messages import Message, tr

Exists = Callable[[str], bool]
ReadJson = Callable[[str], dict]

TOKENIZER_EXTRAS = ("special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
CHAT_EXTRAS = ("generation_config.json", *TOKENIZER_EXTRAS)  # fetched when the repo has them; never required
_WEIGHTS = {"diffusers": "diffusion_pytorch_model.safetensors", "transformers": "model.safetensors"}


@dataclass(frozen=True)
class Need:
    """One file a model needs; ``why`` says what it is for (shown when it is missing)."""

    path: str
    why: str


class BrokenModelFile(Exception):
    """A file is present but unusable; the message names the file and the cause."""


def broken(file: str, problem: str) -> BrokenModelFile:
    """"<file>: <problem>" (a message: the page shows it in its language; ``problem_of`` gives the cause alone)."""
    return BrokenModelFile(tr("{file}: {problem}", file=file, problem=problem))


def said(exc: BaseException) -> str:
    """An error's message: the Message it carries (translatable), else its text."""
    return exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], Message) else str(exc)


def problem_of(exc: BrokenModelFile) -> str:
    """What is wrong, without the file's name."""
    text = said(exc)
    if isinstance(text, Message) and text.template == "{file}: {problem}":
        return text.params["problem"]
    return str(exc).split(": ", 1)[-1]


def joined(parts, key: str = "{a}, {b}") -> str:
    """``parts`` joined by the separator message ``key`` (", " or "; "), each part kept translatable."""
    parts = list(parts)
    text = parts[0] if parts else ""
    for part in parts[1:]:
        text = tr(key, a=text, b=part)
    return text


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _tokenizer_needs(folder: str, exists: Exists, what: str) -> list[Need]:
    needs = [Need(_join(folder, "tokenizer_config.json"), tr("{what} settings", what=what))]
    if exists(_join(folder, "tokenizer.json")) or not exists(_join(folder, "vocab.json")):
        needs.append(Need(_join(folder, "tokenizer.json"), what))
    else:
        needs += [Need(_join(folder, "vocab.json"), what), Need(_join(folder, "merges.txt"), what)]
    return needs


def _weight_needs(folder: str, single: str, exists: Exists, read_json: ReadJson, what: str) -> list[Need]:
    """The index and every shard it names, or the single weights file."""
    index = _join(folder, single.replace(".safetensors", ".safetensors.index.json"))
    if not exists(index):
        return [Need(_join(folder, single), tr("{what} weights", what=what))]
    try:
        shards = sorted(set(read_json(index)["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as exc:
        raise broken(index, tr("not a safetensors index (no weight_map: {error})", error=repr(exc))) from None
    return [Need(index, tr("{what} weight index", what=what))] + [
        Need(_join(folder, s), tr("{what} weight shard", what=what)) for s in shards]


def chat_needs(exists: Exists, read_json: ReadJson) -> list[Need]:
    """Files a transformers causal LM folder must hold."""
    model = tr("model")
    return [Need("config.json", tr("{what} config", what=model)),
            *_tokenizer_needs("", exists, tr("tokenizer")),
            *_weight_needs("", _WEIGHTS["transformers"], exists, read_json, model)]


def component_kind(library: str, class_name: str) -> str:
    """'scheduler', 'tokenizer', 'processor' or 'model' for a model_index.json entry."""
    if class_name.endswith("Scheduler"):
        return "scheduler"
    if "Tokenizer" in class_name:
        return "tokenizer"
    if class_name.endswith(("Processor", "FeatureExtractor")):
        return "processor"
    return "model"


def pipeline_components(model_index: dict) -> dict[str, tuple[str, str]]:
    """Component name -> (library, class) for every component model_index.json enables."""
    out = {}
    for name, value in model_index.items():
        if name.startswith("_") or not isinstance(value, list | tuple) or len(value) != 2:
            continue
        library, class_name = value
        if library is None or class_name is None:
            continue
        out[name] = (str(library), str(class_name))
    return out


def image_needs(exists: Exists, read_json: ReadJson) -> list[Need]:
    """Files a diffusers pipeline folder must hold (what from_pretrained reads)."""
    needs = [Need("model_index.json", tr("pipeline index"))]
    if not exists("model_index.json"):
        return needs
    for name, (library, class_name) in pipeline_components(read_json("model_index.json")).items():
        what = f"{name} ({class_name})"
        kind = component_kind(library, class_name)
        if kind == "scheduler":
            needs.append(Need(f"{name}/scheduler_config.json", tr("{what} config", what=what)))
        elif kind == "tokenizer":
            needs += _tokenizer_needs(name, exists, what)
        elif kind == "processor":
            needs.append(Need(f"{name}/preprocessor_config.json", tr("{what} config", what=what)))
        else:
            single = _WEIGHTS.get(library, _WEIGHTS["transformers"])
            needs.append(Need(f"{name}/config.json", tr("{what} config", what=what)))
            needs += _weight_needs(name, single, exists, read_json, what)
    return needs


def needs_for(kind: str, exists: Exists, read_json: ReadJson) -> list[Need]:
    """The files a ``kind`` ("chat" or "image") model needs, given what exists where."""
    return chat_needs(exists, read_json) if kind == "chat" else image_needs(exists, read_json)


def folder_needs(folder: Path, kind: str) -> list[Need]:
    """The files a local model folder (or cached snapshot) needs; raises BrokenModelFile for a bad index."""
    folder = Path(folder)

    def read_json(rel: str) -> dict:
        return read_json_file(folder, rel)

    return needs_for(kind, lambda rel: (folder / rel).is_file(), read_json)


def missing_in_folder(folder: Path, kind: str) -> list[str]:
    """Needed files absent from ``folder`` (a folder absent entirely: all of its files); [] when complete.

    A cached snapshot's files are links into ``blobs/``: a link whose blob is gone counts as missing.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return [n.path for n in needs_for(kind, lambda rel: False, lambda rel: {})]
    return [n.path for n in folder_needs(folder, kind) if not (folder / n.path).is_file()]


def read_json_file(folder: Path, rel: str) -> dict:
    """Parse ``folder/rel``; BrokenModelFile names the file and the cause."""
    try:
        data = json.loads((Path(folder) / rel).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise broken(rel, tr("unreadable JSON ({error})", error=str(exc))) from None
    if not isinstance(data, dict):
        raise broken(rel, tr("expected a JSON object, found {type}", type=type(data).__name__))
    return data


# ----- verifying what is there -------------------------------------------------------------

def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file, checked against the file's length.

    Raises BrokenModelFile naming the file: too short for a header, a header that is not JSON, or
    fewer bytes than the tensors it declares (a truncated download).
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise broken(path.name, tr("truncated ({size} bytes, not even a safetensors header)", size=size))
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise broken(path.name, tr("truncated ({size} bytes; its header alone declares {length})",
                                       size=size, length=length + 8))
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise broken(path.name, tr("corrupt safetensors header ({error})", error=str(exc))) from None
    if not isinstance(header, dict):
        raise broken(path.name, tr("corrupt safetensors header (not a JSON object)"))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end > size:
        raise broken(path.name, tr("truncated ({size} bytes of {expected}; an interrupted download?)",
                                   size=f"{size:,}", expected=f"{8 + length + end:,}"))
    return header


def verify_folder(folder: Path, kind: str) -> list[str]:
    """Problems of a model folder, one line per file: missing files, unreadable configs, truncated weights.

    Every component folder is checked (not only the first broken one); [] means loadable as far
    as the files can tell without loading them.
    """
    folder = Path(folder)
    try:
        needs = folder_needs(folder, kind)
    except BrokenModelFile as exc:
        return [said(exc)]
    problems = []
    for need in needs:
        path = folder / need.path
        if not path.is_file():
            top = need.path.split("/")[0]
            gone = "/" in need.path and not (folder / top).is_dir()
            problems.append(tr("{path}: missing ({why}; the {top}/ folder is absent)",
                               path=need.path, why=need.why, top=top) if gone
                            else tr("{path}: missing ({why})", path=need.path, why=need.why))
            continue
        try:
            if path.suffix == ".json":
                read_json_file(folder, need.path)
            elif path.suffix == ".safetensors":
                safetensors_header(path)
        except BrokenModelFile as exc:
            problems.append(tr("{file}: {problem}", file=need.path, problem=problem_of(exc)))
    return problems


def weight_files(folder: Path, kind: str) -> dict[str, list[Path]]:
    """Safetensors files per component ("" for a chat model's own weights)."""
    out: dict[str, list[Path]] = {}
    for need in folder_needs(folder, kind):
        if need.path.endswith(".safetensors"):
            component = need.path.rsplit("/", 1)[0] if "/" in need.path else ""
            out.setdefault(component, []).append(Path(folder) / need.path)
    return out
