"""Blind A/B review of two variants of a run: pairs with the names hidden and the sides shuffled.

``start(run, "cold", "hot")`` pairs, for every prompt (and engine), the cell of each variant and
puts them left and right in a random order; the reviewer picks "left", "right" or "tie" pair by
pair (``pick``); the names are revealed when every pair is picked or the reviewer ends it
(``reveal``). The review is plain data in ``run.ab``, so it goes into the JSONL, HTML and CSV
exports::

    {"variants": ["cold", "hot"], "seed": 123, "revealed": false,
     "pairs": [{"prompt_index": 0, "kind": "chat", "left": "hot", "right": "cold", "pick": "left"}, ...]}

Until it is revealed the UI must show nothing that names a side (settings, seeds, captions).
"""

from __future__ import annotations

import random
import secrets

from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import tr

from .runs import Cell, QARun

CHOICES = ("left", "right", "tie")


def start(run: QARun, first: str, second: str, seed: int | None = None) -> dict:
    """A new blind review of variants ``first`` and ``second`` of ``run`` (replaces any earlier one)."""
    names = [v.name for v in run.variants]
    for name in (first, second):
        if name not in names:
            raise InvalidRequestError(tr("Variant {name!r} is not in this run; choose two of: {names}.",
                                         name=name, names=", ".join(names)))
    if first == second:
        raise InvalidRequestError(tr("Choose two different variants to compare blind."))
    seed = secrets.randbits(32) if seed is None else seed
    rng = random.Random(seed)
    kinds = sorted({c.kind for c in run.cells}, key=("chat", "image").index)
    pairs = []
    for p in range(len(run.rows)):
        for kind in kinds:
            sides = [first, second]
            rng.shuffle(sides)
            pairs.append({"prompt_index": p, "kind": kind, "left": sides[0], "right": sides[1], "pick": None})
    run.ab = {"variants": [first, second], "seed": seed, "revealed": False, "pairs": pairs}
    return run.ab


def _review(run: QARun) -> dict:
    if not run.ab:
        raise InvalidRequestError(tr("Start a blind A/B review first: choose two variants."))
    return run.ab


def pick(run: QARun, pair: int, choice: str) -> dict:
    """Record the reviewer's pick for pair ``pair``: "left", "right" or "tie"."""
    review = _review(run)
    if choice not in CHOICES:
        raise InvalidRequestError(tr("Unknown pick {choice!r}; choose left, right or tie.", choice=choice))
    if isinstance(pair, bool) or not isinstance(pair, int) or not 0 <= pair < len(review["pairs"]):
        raise InvalidRequestError(tr("Pair {pair!r} does not exist; this review has {count} pairs.",
                                     pair=pair, count=len(review["pairs"])))
    review["pairs"][pair]["pick"] = choice
    if next_pair(run) is None:
        review["revealed"] = True  # every pair picked: the names may be shown
    return review


def next_pair(run: QARun) -> int | None:
    """The first pair not picked yet, or None when all are."""
    return next((i for i, p in enumerate(_review(run)["pairs"]) if p["pick"] is None), None)


def reveal(run: QARun) -> dict:
    """End the review early and show the names (unpicked pairs stay unpicked)."""
    review = _review(run)
    review["revealed"] = True
    return review


def pair_cells(run: QARun, pair: int) -> tuple[Cell, Cell]:
    """The (left, right) cells of a pair."""
    p = _review(run)["pairs"][pair]
    return _cell(run, p, p["left"]), _cell(run, p, p["right"])


def _cell(run: QARun, p: dict, variant: str) -> Cell:
    return next(c for c in run.cells if (c.prompt_index, c.kind, c.variant) == (p["prompt_index"], p["kind"], variant))


def winner(p: dict) -> str | None:
    """The variant name a pair's pick chose, "tie", or None when not picked."""
    return p[p["pick"]] if p["pick"] in ("left", "right") else p["pick"]


def tally(run: QARun) -> dict:
    """{"wins": {first: n, second: n}, "ties": n, "unpicked": n}."""
    review = _review(run)
    winners = [winner(p) for p in review["pairs"]]
    return {"wins": {name: winners.count(name) for name in review["variants"]}, "ties": winners.count("tie"),
            "unpicked": winners.count(None)}


def tally_line(run: QARun, lang: str = "en") -> str:
    """The tally as one line, e.g. ``cold 3 · hot 1 · tie 1 · unpicked 0`` (words in ``lang``)."""
    t = tally(run)
    return " · ".join([*(f"{name} {n}" for name, n in t["wins"].items()),
                       tr("tie {count}", count=t["ties"]).text(lang),
                       tr("unpicked {count}", count=t["unpicked"]).text(lang)])


def per_row(run: QARun) -> list[dict]:
    """Each pair with its prompt, sides, pick and the winning variant (for exports and the revealed view)."""
    return [{"prompt": run.rows[p["prompt_index"]].prompt, **p, "winner": winner(p)} for p in _review(run)["pairs"]]


def cell_pick(run: QARun, cell: Cell) -> str:
    """For a cell of the review: "better", "worse", "tie", "unpicked"; "" when it is not in the review."""
    if not run.ab or cell.variant not in run.ab["variants"]:
        return ""
    for p in run.ab["pairs"]:
        if (p["prompt_index"], p["kind"]) == (cell.prompt_index, cell.kind):
            won = winner(p)
            if won in (None, "tie"):
                return won or "unpicked"
            return "better" if won == cell.variant else "worse"
    return ""


def checked(run: QARun, review: object) -> dict:
    """An imported review, checked against the run (InvalidRequestError says what is wrong)."""
    bad = InvalidRequestError(tr("QA run: ab must be a blind review of two of the run's variants, as exported."))
    if not isinstance(review, dict) or set(review) != {"variants", "seed", "revealed", "pairs"}:
        raise bad
    names = {v.name for v in run.variants}
    variants, pairs = review["variants"], review["pairs"]
    if (not isinstance(variants, list) or len(variants) != 2 or len(set(map(str, variants))) != 2
            or not set(variants) <= names or not isinstance(review["revealed"], bool)
            or not isinstance(review["seed"], int) or not isinstance(pairs, list) or len(pairs) > len(run.cells)):
        raise bad
    kinds = {c.kind for c in run.cells}
    for p in pairs:
        if (not isinstance(p, dict) or set(p) != {"prompt_index", "kind", "left", "right", "pick"}
                or not isinstance(p["prompt_index"], int) or not 0 <= p["prompt_index"] < len(run.rows)
                or p["kind"] not in kinds or not all(isinstance(p[k], str) for k in ("left", "right"))
                or sorted([p["left"], p["right"]]) != sorted(variants)
                or p["pick"] not in (None, *CHOICES)):
            raise bad
    return review
