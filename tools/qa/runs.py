"""QA bench: run a prompt set under a few named settings variants, mark the cells, compare runs.

The UI calls, in order::

    run = plan_run(settings, prompts_text=..., prompts_file=..., variants=..., kind="chat"|"image"|"both")
    for p in run_cells(backend, run, stop):    # or run_set(backend, run, progress, stop)
        ...                                     # p.done / p.total / p.eta_s; results_table(run)
    rerun_cell(backend, run, index); set_mark(run, index, "pass", "looks right")
    qa_report.export_jsonl(run) / export_html(run) / import_jsonl(text) / compare_runs(old, new)

Every cell's settings and seed are fixed when the run is planned (defaults filled in), so a cell
re-run alone, or the same set run again later, makes the same request and gets the same result.

Sharing the engines: a run is a sequence of separate engine jobs, one cell each. The engines run
one job at a time (``shapes.SerialJobs``) and a request from another tab waits for the engine's
lock, so it runs between two cells rather than after the whole set. ``threading.Lock`` is not
fair (the releasing thread may re-take it first), so the runner pauses briefly between cells to
let a waiting request take the engine. The Gradio event that runs a set must therefore not share
the engines' ``concurrency_id``: interleaving happens here, not in Gradio's queue.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from neuron_backend.chat.text import SAMPLING_DEFAULTS, ChatRequest
from neuron_backend.errors import InvalidRequestError, ShowcaseError
from neuron_backend.image.engine import ImageRequest
from neuron_backend.image.png_info import png_metadata
from neuron_backend.messages import Message, tr
from neuron_backend.settings import Settings

from .expect import judge, word
from .inputs import (
    MAX_PROMPTS,
    MAX_VARIANTS,
    SETTINGS,
    PromptRow,
    Variant,
    allowed_columns,
    check_text,
    parse_prompt_set,
    parse_variants,
)
from .references import request_references

__all__ = [
    "MAX_PROMPTS", "MAX_VARIANTS", "Cell", "PromptRow", "QARun", "RunProgress", "Variant", "allowed_columns",
    "build_run", "derive_seed",
    "new_run_like", "parse_prompt_set", "parse_variants", "plan_run", "rerun_cell", "run_cells",
    "run_set", "set_mark",
]

log = logging.getLogger("showcase.qa")

KINDS = {"chat": ("chat",), "image": ("image",), "both": ("chat", "image")}
PENDING, RUNNING, DONE, FAILED, STOPPED = "pending", "running", "done", "failed", "stopped"
STATUSES = (PENDING, RUNNING, DONE, FAILED, STOPPED)
RUNNABLE = (PENDING, STOPPED)  # what run_cells picks up: a stopped set resumes where it stopped
MARKS = ("pass", "fail")
MAX_COMMENT_CHARS = 2000
INTERLEAVE_PAUSE_S = 0.05  # between cells: lets a waiting interactive request take the engine


@dataclass
class Cell:
    """One prompt under one variant on one engine: its exact request settings, result and review mark."""

    prompt_index: int
    variant: str
    kind: str  # "chat" | "image"
    settings: dict  # the request's fields except the prompt, every default filled in (seed included)
    status: str = PENDING  # pending | running | done | failed | stopped
    text: str | None = None  # chat: the answer (partial when stopped)
    reasoning: str | None = None  # chat: the thinking block
    image_png: str | None = None  # image: base64 PNG with the cell's parameters embedded
    image_path: str | None = None  # image: where the engine saved it (may be pruned later)
    stats: dict | None = None  # chat: ChatStats fields; image: seed, seconds, compiled_graphs, ...
    error: str | None = None
    seconds: float | None = None  # wall time of the cell, waiting for the engine included
    mark: str | None = None  # "pass" | "fail" | None
    comment: str = ""
    auto: str | None = None  # automatic verdict against the row's expectations: "pass" | "fail" | None
    auto_reason: str = ""  # why (which check failed), or "" when nothing applies


@dataclass
class QARun:
    """A planned or finished run: the prompt set, the variants and one cell per prompt x variant x kind."""

    id: str
    created: str
    kind: str  # "chat" | "image" | "both"
    run_seed: int
    rows: list[PromptRow]
    variants: list[Variant]
    cells: list[Cell]
    meta: dict = field(default_factory=dict)  # models, device and versions of the last run (plain data)
    ab: dict | None = None  # the blind A/B review of two variants, if one was started (see ab.py)


@dataclass(frozen=True)
class RunProgress:
    """Reported after each cell: cells finished in this call, how many it runs, seconds left (None: unknown)."""

    done: int
    total: int
    eta_s: float | None
    cell_index: int | None  # the cell just finished


# ----- planning -----------------------------------------------------------------------------------
def plan_run(settings: Settings, prompts_text: str | None = None, prompts_file: str | Path | None = None,
             variants: str | list | dict | None = None, kind: str = "chat", run_seed: int = 0,
             max_prompts: int = MAX_PROMPTS, uploads: Mapping[str, Path] | None = None) -> QARun:
    """Parse the prompt set and variants and fix every cell's settings and seed; nothing runs yet.

    ``uploads``: the reference images uploaded with the set, by file name (see ``parse_prompt_set``).
    """
    rows = parse_prompt_set(prompts_text, prompts_file, settings=settings, max_prompts=max_prompts,
                            uploads=uploads)
    return build_run(settings, rows, parse_variants(variants, settings=settings), kind, run_seed)


def build_run(settings: Settings, rows: list[PromptRow], variants: list[Variant], kind: str = "chat",
              run_seed: int = 0) -> QARun:
    """The cells of ``rows`` x ``variants`` x engines of ``kind``, in running order (a prompt's cells together).

    Settings, lowest first: server defaults, the row's own settings, the variant's (the variant is
    what is being compared, so it wins). A cell with no seed gets one derived from ``run_seed`` and
    the prompt's position: the same for every variant of a prompt, so variants differ only by their
    settings. Greedy chat cells keep the seed in their settings; the engine ignores it.
    """
    if kind not in KINDS:
        raise InvalidRequestError(tr("Unknown kind {kind!r}; choose chat, image or both.", kind=kind))
    for engine in KINDS[kind]:
        if not getattr(settings, engine):
            raise InvalidRequestError(tr("The {engine} engine is disabled on this server (--no-{flag}); choose "
                                         "{other}.", engine=word("kind", engine), flag=engine,
                                          other=word("kind", "image" if engine == "chat" else "chat")))
    for variant in variants:
        stray = [k for k in variant.settings if SETTINGS[k][0] not in (*KINDS[kind], "both")]
        if stray:
            raise InvalidRequestError(tr("Variant {name!r}: {keys} only apply to {applies} cells, but this run is "
                                         "{kind} only; choose 'both' or "
                                         "remove them.", name=variant.name, keys=", ".join(stray),
                                          applies=word("kind", SETTINGS[stray[0]][0]), kind=word("kind", kind)))
    cells = [Cell(p, variant.name, engine, _cell_settings(settings, engine, row, variant, run_seed, p))
             for p, row in enumerate(rows) for variant in variants for engine in KINDS[kind]]
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return QARun(uuid.uuid4().hex[:12], created, kind, run_seed, rows, variants, cells)


def _cell_settings(settings: Settings, engine: str, row: PromptRow, variant: Variant, run_seed: int,
                   prompt_index: int) -> dict:
    chosen = {k: v for k, v in {**row.settings, **variant.settings}.items() if SETTINGS[k][0] in (engine, "both")}
    if "seed" not in chosen:
        chosen["seed"] = derive_seed(run_seed, prompt_index)
    if engine == "image":
        base = {"size": settings.sizes[0].label, "steps": settings.default_steps, "guidance": None}
        edit = {"references": [ref.entry() for ref in row.references]} if row.references else {}
        return {**base, **chosen, **edit}
    base = {"system_prompt": None, "thinking": False, "greedy": False, "max_new_tokens": settings.max_new_tokens}
    out = {**base, **chosen}
    return {**SAMPLING_DEFAULTS["thinking" if out["thinking"] else "chat"], **out}


def derive_seed(run_seed: int, prompt_index: int) -> int:
    """A stable 32-bit seed for a prompt of a run (the same on every machine and Python version)."""
    digest = hashlib.sha256(f"qa:{run_seed}:{prompt_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def new_run_like(run: QARun) -> QARun:
    """A fresh, unrun copy of ``run`` (same prompts, variants and exact cell settings): run it to compare."""
    cells = [Cell(c.prompt_index, c.variant, c.kind, copy.deepcopy(c.settings)) for c in run.cells]
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return QARun(uuid.uuid4().hex[:12], created, run.kind, run.run_seed, copy.deepcopy(run.rows),
                 copy.deepcopy(run.variants), cells)


# ----- running ------------------------------------------------------------------------------------
def run_cells(backend, run: QARun, stop: threading.Event | None = None,
              pause_s: float = INTERLEAVE_PAUSE_S) -> Iterator[RunProgress]:
    """Run the pending (and stopped) cells one at a time, yielding progress after each; updates ``run``.

    Raises EngineUnavailableError before anything runs if an engine the run needs is not ready.
    A failing cell records its error and the run goes on. Setting ``stop`` ends the run after the
    running cell is interrupted (within one token or one denoising step): it is marked stopped, the
    cells not reached stay pending, finished ones are kept. Closing the generator between cells
    (e.g. Gradio cancelling the event) leaves the rest pending as well.
    """
    stop = stop or threading.Event()
    todo = [i for i, cell in enumerate(run.cells) if cell.status in RUNNABLE]
    for engine in sorted({run.cells[i].kind for i in todo}):
        backend.engine(engine)
    run.meta = _environment(backend)
    spent: dict[str, list[float]] = {"chat": [], "image": []}
    yield RunProgress(0, len(todo), None, None)
    for n, index in enumerate(todo):
        if n and pause_s > 0:
            time.sleep(pause_s)
        if stop.is_set():
            return
        cell = run.cells[index]
        _execute(backend, run, cell, stop)
        spent[cell.kind].append(cell.seconds)
        yield RunProgress(n + 1, len(todo), _eta(spent, [run.cells[i].kind for i in todo[n + 1:]]), index)
        if stop.is_set():
            return


def run_set(backend, run: QARun, progress: Callable[[int, int, float | None], None] | None = None,
            stop: threading.Event | None = None) -> QARun:
    """Run the set to the end or until ``stop``; ``progress(done, total, eta_s)`` after each cell."""
    for step in run_cells(backend, run, stop):
        if progress is not None:
            progress(step.done, step.total, step.eta_s)
    return run


def rerun_cell(backend, run: QARun, index: int, stop: threading.Event | None = None) -> Cell:
    """Run one cell again with its recorded settings; it replaces the old one (mark and comment kept)."""
    old = run.cells[_check_index(run, index)]
    backend.engine(old.kind)
    cell = Cell(old.prompt_index, old.variant, old.kind, copy.deepcopy(old.settings), mark=old.mark,
                comment=old.comment)
    _execute(backend, run, cell, stop or threading.Event())
    run.cells[index] = cell
    return cell


def _execute(backend, run: QARun, cell: Cell, stop: threading.Event) -> None:
    """Run one cell; every failure ends up in ``cell.error``, never raised."""
    prompt = run.rows[cell.prompt_index].prompt
    cell.status, cell.error, cell.stats = RUNNING, None, None
    cell.text = cell.reasoning = cell.image_png = cell.image_path = None  # a stopped attempt's partial output
    started = time.perf_counter()
    try:
        if cell.kind == "chat":
            _run_chat(backend, prompt, cell, stop)
        else:
            _run_image(backend, run.rows[cell.prompt_index], cell, stop)
    except ShowcaseError as exc:  # a Message stays one: the grid shows it in the page's language
        message = exc.args[0] if len(exc.args) == 1 else None
        cell.status, cell.error = FAILED, message if isinstance(message, Message) else str(exc)
    except Exception as exc:  # noqa: BLE001 - one broken cell must not end the set; logged with its traceback
        log.exception("QA cell %s/%s/%s failed", cell.prompt_index, cell.variant, cell.kind)
        cell.status, cell.error = FAILED, f"{type(exc).__name__}: {exc}"
    cell.seconds = round(time.perf_counter() - started, 3)
    cell.auto, cell.auto_reason = judge(run.rows[cell.prompt_index].expect, cell)


def _run_chat(backend, prompt: str, cell: Cell, stop: threading.Event) -> None:
    stream = backend.stream_chat(ChatRequest(message=prompt, **cell.settings))
    update = None
    try:
        for update in stream:  # noqa: B007 - the last update is used after the loop
            if stop.is_set():
                break  # closing the stream stops the generation within one token
    finally:
        stream.close()
    if update is not None:
        cell.text, cell.reasoning = update.answer, update.reasoning or None
    if update is not None and update.done:
        cell.stats = asdict(update.stats)
        cell.status = STOPPED if update.stats.stopped else DONE  # stopped: another tab's Stop hit this cell
    else:
        cell.status = STOPPED


def _run_image(backend, row: PromptRow, cell: Cell, stop: threading.Event) -> None:
    prompt, s = row.prompt, cell.settings

    def on_step(step: int, total: int, elapsed: float) -> None:
        if stop.is_set():
            # Called inside this cell's own engine job, so this cancels this cell and nobody else's.
            backend.cancel("image")

    references = request_references(row.references) if s.get("references") else ()
    request = ImageRequest(prompt, s["size"], s["steps"], s["seed"], s["guidance"], references=references)
    result = backend.generate_image(request, on_step)
    params = {"prompt": prompt, "kind": "image", **s}
    if references:  # the engine's record of each reference: sha256, sizes and fit mode (deterministic)
        params["references"] = result.params.get("references", s["references"])
    buffer = io.BytesIO()
    # Our own PNG, with only the cell's (deterministic) parameters: same pixels give the same bytes.
    result.image.save(buffer, format="PNG", pnginfo=png_metadata(params))
    cell.image_png = base64.b64encode(buffer.getvalue()).decode("ascii")
    cell.image_path = str(result.path) if result.path else None
    cell.stats = _plain({"seed": result.seed, "seconds": result.seconds, "compiled_graphs": result.compiled_graphs,
                         "stopped": result.stopped, "prompt_truncated": result.prompt_truncated,
                         "steps_done": result.params.get("steps_done"), "guidance": result.params.get("guidance")})
    cell.status = STOPPED if result.stopped else DONE


def _eta(spent: dict[str, list[float]], remaining: list[str]) -> float | None:
    every = [s for values in spent.values() for s in values]
    if not every:
        return None
    mean = {k: sum(v) / len(v) if v else sum(every) / len(every) for k, v in spent.items()}
    return round(sum(mean[k] for k in remaining), 1)


def _environment(backend) -> dict:
    return _plain({"models": {name: backend.model_id(name) for name in backend.placements},
                   "device": backend.description.get("accelerator"),
                   "placements": {name: p.label() for name, p in backend.placements.items()},
                   "versions": backend.description.get("versions", {})})


def _plain(value: dict) -> dict:
    """JSON-native copy, so a run equals its own JSONL round trip."""
    return json.loads(json.dumps(value, default=str))


# ----- reviewing ----------------------------------------------------------------------------------
def set_mark(run: QARun, index: int, mark: str | None, comment: str | None = None) -> Cell:
    """Mark a cell pass, fail or unmarked (None or ""); ``comment`` None keeps the current comment."""
    cell = run.cells[_check_index(run, index)]
    mark = (mark or "").strip().lower() or None
    if mark not in (None, *MARKS):
        raise InvalidRequestError(tr("Unknown mark {mark!r}; use pass, fail or nothing.", mark=mark))
    if comment is not None:
        if not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS:
            raise InvalidRequestError(tr("A comment must be text of at most {most} characters.",
                                         most=MAX_COMMENT_CHARS))
        cell.comment = check_text(comment.strip(), tr("The comment"))
    cell.mark = mark
    return cell


def _check_index(run: QARun, index: object) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(run.cells):
        raise InvalidRequestError(tr("Cell {index!r} does not exist; this run has cells 0 to {last}.",
                                     index=index, last=len(run.cells) - 1))
    return index
