"""Expectations of a prompt-set row and the automatic verdict of a cell against them.

A row may carry checks next to its prompt (JSONL keys or CSV columns)::

    contains      text (or, in JSONL, a list of texts) the answer must contain
    not_contains  text (or list) the answer must not contain
    starts_with   text the answer must start with (leading whitespace ignored)
    regex         a pattern the answer must match somewhere (``regex`` module syntax, bounded)
    max_tokens    the most new tokens the reply may have
    image_size    the exact size of the image, e.g. 256x256

Text checks and ``max_tokens`` apply to chat cells, ``image_size`` to image cells; a cell with no
check of its kind gets no automatic verdict. The reviewer's own mark always wins over the verdict.

Regexes come from files, so they are bounded: at most ``MAX_PATTERN_CHARS`` characters, and each
search runs with a ``REGEX_TIMEOUT_S`` timeout (the ``regex`` module stops a catastrophic pattern
such as ``(a+)+$`` instead of hanging the server); a timeout is a failed check that says so.
"""

from __future__ import annotations

import numbers

import regex

from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import Message, tr
from neuron_backend.shapes import parse_size

from .images import png_size

MAX_PATTERN_CHARS = 300
MAX_EXPECT_TEXT_CHARS = 2000  # each contains / not_contains / starts_with text
MAX_EXPECT_ITEMS = 20  # texts in one contains / not_contains list
REGEX_TIMEOUT_S = 0.2
# check -> kind of cell it applies to
CHECKS: dict[str, str] = {
    "contains": "chat", "not_contains": "chat", "starts_with": "chat", "regex": "chat", "max_tokens": "chat",
    "image_size": "image",
}
PASS, FAIL = "pass", "fail"
# The words word() translates, by family: value -> English template (read in the QA bench's context)
WORDS = {"status": {w: w for w in ("pending", "running", "done", "failed", "stopped")},
         "kind": {w: w for w in ("chat", "image", "both")},
         "change": {"same": "same", "changed": "changed", "not_run": "not run", "only_in_old": "only in old",
                    "only_in_new": "only in new"},
         "": {"pass": "pass", "fail": "fail"}}


def parse_check(key: str, value: object, where: str) -> object:
    """Check one expectation's value (from a file) and return it in its stored form."""
    if key in ("contains", "not_contains"):
        items = value if isinstance(value, list) else [value]
        if not items or len(items) > MAX_EXPECT_ITEMS:
            raise InvalidRequestError(tr("{where}: {field} needs 1 to {most} texts.",
                                         where=where, field=key, most=MAX_EXPECT_ITEMS))
        texts = [_text(key, item, where) for item in items]
        return texts if isinstance(value, list) else texts[0]
    if key == "starts_with":
        return _text(key, value, where)
    if key == "regex":
        pattern = _text(key, value, where, MAX_PATTERN_CHARS)
        try:
            regex.compile(pattern)
        except (regex.error, RecursionError) as exc:
            raise InvalidRequestError(tr("{where}: regex {pattern!r} is not a valid pattern ({detail}).",
                                         where=where, pattern=pattern,
                                          detail=str(exc))) from None
        return pattern
    if key == "max_tokens":
        number = value
        if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
            number = int(value.strip())
        if isinstance(number, bool) or not isinstance(number, numbers.Integral) or not 1 <= number <= 10**9:
            raise InvalidRequestError(tr("{where}: max_tokens must be a whole number of at least 1, got {got!r}.",
                                         where=where, got=value))
        return int(number)
    if key == "image_size":
        try:
            return parse_size(value).label
        except InvalidRequestError as exc:
            where = tr("{where}: {field}", where=where, field="image_size")
            raise InvalidRequestError(tr("{where}: {detail}", where=where, detail=exc)) from None
    raise InvalidRequestError(tr("{where}: unknown expectation {field!r}; allowed: {allowed}.",
                                 where=where, field=key, allowed=", ".join(CHECKS)))


def _text(key: str, value: object, where: str, limit: int = MAX_EXPECT_TEXT_CHARS) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(tr("{where}: {field} must be non-empty text, got {got!r}.",
                                     where=where, field=key, got=value))
    if len(value) > limit:
        raise InvalidRequestError(tr("{where}: {field} is {chars} characters; at most {most} are allowed.",
                                     where=where, field=key, chars=len(value), most=limit))
    return value


def applicable(expect: dict, kind: str) -> dict:
    """The checks of ``expect`` that apply to a cell of ``kind``."""
    return {k: v for k, v in (expect or {}).items() if CHECKS.get(k) == kind}


def judge(expect: dict, cell, lang: str = "en") -> tuple[str | None, str]:
    """(verdict, reason) of a finished cell: "pass"/"fail", or None when nothing applies or it did not finish.

    The reason is in ``lang`` (the page's language; runs store the English one, which exports carry).
    """
    checks = applicable(expect, cell.kind)
    if not checks:
        return None, ""
    if cell.status == "failed":
        return FAIL, _in(lang, "the cell failed: {error}", error=cell.error)
    if cell.status != "done":
        return None, _in(lang, "not judged: the cell is {status}", status=word("status", cell.status))
    problems = [p.text(lang) for key, value in checks.items() if (p := _check(key, value, cell))]
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, _in(lang, "all of {checks} hold", checks=", ".join(checks))


def word(family: str, value: str) -> str:
    """A status ("done"), kind ("chat") or verdict ("pass") as a Message the page can translate; else as it is."""
    template = WORDS.get(family, {}).get(value) if isinstance(value, str) else None
    return value if template is None else tr(template, ctx="qa")


def _in(lang: str, key: str, **params) -> str:
    return tr(key, **params).text(lang)


def _check(key: str, value: object, cell) -> Message | None:
    """None when the check holds, else why not."""
    text = cell.text or ""
    if key == "contains":
        missing = [t for t in _as_list(value) if t not in text]
        return tr("does not contain {texts}", texts=", ".join(map(repr, missing))) if missing else None
    if key == "not_contains":
        found = [t for t in _as_list(value) if t in text]
        return tr("contains {texts}", texts=", ".join(map(repr, found))) if found else None
    if key == "starts_with":
        return None if text.lstrip().startswith(value) else tr("does not start with {text!r}", text=value)
    if key == "regex":
        try:
            hit = regex.search(value, text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            return tr("regex {pattern!r} took over {seconds} s (too complex): simplify it",
                      pattern=value, seconds=REGEX_TIMEOUT_S)
        except (regex.error, RecursionError) as exc:
            return tr("regex {pattern!r} is not usable ({detail})", pattern=value, detail=str(exc))
        return None if hit else tr("no match for regex {pattern!r}", pattern=value)
    if key == "max_tokens":
        tokens = (cell.stats or {}).get("new_tokens")
        if not isinstance(tokens, int):
            return tr("the number of new tokens is unknown")
        return None if tokens <= value else tr("{tokens} new tokens > max_tokens {most}", tokens=tokens, most=value)
    if key == "image_size":
        size = _image_size(cell)
        if size is None:
            return tr("no image to measure")
        return None if size == value else tr("image is {size}, expected {expected}", size=size, expected=value)
    return tr("unknown expectation {field!r}", field=key)


def _as_list(value: object) -> list[str]:
    return value if isinstance(value, list) else [value]


def _image_size(cell) -> str | None:
    if not cell.image_png:
        return None
    try:
        width, height = png_size(cell.image_png)
    except InvalidRequestError:
        return None
    return f"{width}x{height}"


def verdict(cell) -> str | None:
    """The cell's final verdict: the reviewer's mark when set, else the automatic one."""
    return cell.mark or cell.auto


def describe(expect: dict) -> str:
    """The expectations as one short line, e.g. ``contains 'hi'; max_tokens 8``."""
    return "; ".join(f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}" for k, v in (expect or {}).items())
