"""Compare two runs of a set ("run it again and compare"): what changed, cell by cell.

Cells are matched by prompt text, variant name and engine. A cell "changed" when its output, its
status, its settings or its automatic verdict differ, or when both runs carry a reviewer's mark and
the marks differ (a fresh run has no marks yet, which is not a change). ``changed_only`` keeps just
those, each with a text diff (chat) or a side-by-side picture of both images. An edit's references are
named (path and sha256 prefix) in what changed and in an image pair's caption.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass

from PIL import Image

from neuron_backend.messages import in_language, tr

from .expect import word
from .images import decode_png
from .references import describe as describe_references
from .runs import PENDING, RUNNING, Cell, QARun

UNFINISHED = {PENDING, RUNNING}
GAP_PX = 8  # between the old and the new image of a side-by-side picture


@dataclass
class CellChange:
    """How one prompt x variant x engine cell differs between an old and a new run."""

    prompt: str
    variant: str
    kind: str
    change: str  # "same" | "changed" | "not run" (either side unfinished) | "only in old" | "only in new"
    what: list[str]  # e.g. ["output", "settings: temperature", "status: done -> failed", "verdict: pass -> fail"]
    old_index: int | None
    new_index: int | None
    old_mark: str | None
    new_mark: str | None
    deltas: dict  # numeric stats, new minus old: tokens_per_s, new_tokens, seconds


def compare_runs(old: QARun, new: QARun) -> list[CellChange]:
    """Match cells by prompt text, variant name and engine; say what changed in each (new run order)."""
    old_cells, new_cells = _keyed(old), _keyed(new)
    changes = []
    for key, j in new_cells.items():
        i = old_cells.get(key)
        if i is None:
            changes.append(CellChange(key[0], key[1], key[2], "only in new", [], None, j, None, new.cells[j].mark, {}))
            continue
        a, b = old.cells[i], new.cells[j]
        what = _differences(a, b)
        change = "not run" if UNFINISHED & {a.status, b.status} else "changed" if what else "same"
        changes.append(CellChange(key[0], key[1], key[2], change, what, i, j, a.mark, b.mark, _deltas(a, b)))
    for key, i in old_cells.items():
        if key not in new_cells:
            changes.append(CellChange(key[0], key[1], key[2], "only in old", [], i, None, old.cells[i].mark, None, {}))
    return changes


def _text(value, lang: str) -> str:
    """A word or Message in ``lang``; other values (data) as they are."""
    return str(in_language(value, lang)) if value is not None else ""


def _what(c: CellChange, lang: str) -> str:
    return "; ".join(_text(w, lang) for w in c.what)


def compare_table(changes: list[CellChange], only_changed: bool = False,
                  lang: str = "en") -> tuple[list[str], list[list[str]]]:
    """Headers and rows for showing ``compare_runs`` output (only the changed cells when asked), words in ``lang``."""
    headers = [_text(tr(k), lang) for k in ("prompt", "variant", "kind",
                                             "change", "what", "old mark",
                                             "new mark")] + ["Δ"]
    rows = [[c.prompt, c.variant, _text(word("kind", c.kind), lang),
             _text(word("change", c.change.replace(" ", "_")), lang), _what(c, lang),
             _text(word("", c.old_mark), lang) if c.old_mark else "",
             _text(word("", c.new_mark), lang) if c.new_mark else "",
             ", ".join(f"{k} {v:+.3g}" for k, v in c.deltas.items())]
            for c in changes if not only_changed or c.change == "changed"]
    return headers, rows


@dataclass
class ChangedCell:
    """A changed cell for the "only what changed" view: a text diff or a side-by-side image."""

    change: CellChange
    diff: str  # chat: a unified diff of the answers (reasoning too); image: ""
    image: Image.Image | None  # image: old left, new right; chat: None
    caption: str


def changed_only(old: QARun, new: QARun, changes: list[CellChange] | None = None,
                 lang: str = "en") -> list[ChangedCell]:
    """The cells whose output, verdict or mark differ, each with its diff or its two images side by side."""
    out = []
    for c in changes if changes is not None else compare_runs(old, new):
        if c.change != "changed":
            continue
        a, b = old.cells[c.old_index], new.cells[c.new_index]
        caption = tr("#{prompt} · {variant} · {kind}: {what}", prompt=b.prompt_index + 1, variant=c.variant,
                      kind=_text(word("kind", c.kind), lang), what=_what(c, lang)).text(lang)
        if c.kind == "chat":
            out.append(ChangedCell(c, text_diff(a, b), None, caption))
        else:
            refs = describe_references(b.settings.get("references"))
            edited = tr(" · edited from {references}", references=refs).text(lang) if refs else ""
            out.append(ChangedCell(c, "", side_by_side(decode_png(a.image_png), decode_png(b.image_png)),
                                   caption + edited + tr(" (old left, new right)").text(lang)))
    return out


def text_diff(a: Cell, b: Cell) -> str:
    """A unified diff of two chat cells' answers (and reasoning), line by line; "" when the text is equal."""
    def lines(cell: Cell) -> list[str]:
        head = [f"[reasoning] {line}" for line in (cell.reasoning or "").splitlines()]
        return head + (cell.text or "").splitlines() or [""]

    if (a.text, a.reasoning) == (b.text, b.reasoning):
        return ""
    return "\n".join(difflib.unified_diff(lines(a), lines(b), "old", "new", lineterm="", n=2))


def side_by_side(old: Image.Image | None, new: Image.Image | None) -> Image.Image:
    """Both images in one picture, old left and new right, on white (a missing one leaves a grey box)."""
    images = [im.convert("RGB") if im is not None else None for im in (old, new)]
    sizes = [im.size if im is not None else (64, 64) for im in images]
    width, height = sizes[0][0] + GAP_PX + sizes[1][0], max(h for _, h in sizes)
    canvas = Image.new("RGB", (width, height), "white")
    x = 0
    for im, (w, h) in zip(images, sizes, strict=True):
        canvas.paste(im if im is not None else Image.new("RGB", (w, h), (200, 200, 200)), (x, 0))
        x += w + GAP_PX
    return canvas


def _keyed(run: QARun) -> dict[tuple[str, str, str, int], int]:
    """(prompt, variant, kind, n-th occurrence of that prompt) -> cell index."""
    seen: dict[tuple, int] = {}
    out = {}
    for index, cell in enumerate(run.cells):
        base = (run.rows[cell.prompt_index].prompt, cell.variant, cell.kind)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[(*base, n)] = index
    return out


def _differences(a: Cell, b: Cell) -> list[str]:
    """Status, output, verdict, mark (when both are marked) and settings differences."""
    what = []  # Messages: English as text, translated where the page shows them
    if a.status != b.status:
        what.append(tr("status: {old} -> {new}", old=word("status", a.status), new=word("status", b.status)))
    if (a.text, a.reasoning) != (b.text, b.reasoning) or _pixels(a) != _pixels(b):
        what.append(tr("output"))
    if a.auto != b.auto:
        what.append(tr("verdict: {old} -> {new}", old=word("", a.auto or "none"), new=word("", b.auto or "none")))
    if a.mark and b.mark and a.mark != b.mark:
        what.append(tr("mark: {old} -> {new}", old=word("", a.mark), new=word("", b.mark)))
    old_refs, new_refs = a.settings.get("references"), b.settings.get("references")
    if old_refs != new_refs:  # each reference by name and sha256: which image the edit started from
        what.append(tr("references: {old} -> {new}", old=describe_references(old_refs) or "-",
                       new=describe_references(new_refs) or "-"))
    keys = sorted((set(a.settings) | set(b.settings)) - {"references"})
    return what + [tr("settings: {field}", field=k) for k in keys if a.settings.get(k) != b.settings.get(k)]


def _pixels(cell: Cell) -> str | None:
    """A hash of the decoded pixels: PNGs written by another Pillow version may differ in bytes only."""
    image = decode_png(cell.image_png)
    if image is None:
        return None
    return hashlib.sha256(image.convert("RGB").tobytes() + repr(image.size).encode()).hexdigest()


def _deltas(a: Cell, b: Cell) -> dict:
    pairs = {"seconds": (a.seconds, b.seconds)}
    if a.kind == "chat":
        pairs.update({k: ((a.stats or {}).get(k), (b.stats or {}).get(k)) for k in ("tokens_per_s", "new_tokens")})
    return {k: round(vb - va, 3) for k, (va, vb) in pairs.items() if _number(va) and _number(vb)}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
