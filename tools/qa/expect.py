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
from neuron_backend.messages import MESSAGES, Message, msg
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


def parse_check(key: str, value: object, where: str) -> object:
    """Check one expectation's value (from a file) and return it in its stored form."""
    if key in ("contains", "not_contains"):
        items = value if isinstance(value, list) else [value]
        if not items or len(items) > MAX_EXPECT_ITEMS:
            raise InvalidRequestError(msg("err_qa_expect_items", where=where, field=key, most=MAX_EXPECT_ITEMS))
        texts = [_text(key, item, where) for item in items]
        return texts if isinstance(value, list) else texts[0]
    if key == "starts_with":
        return _text(key, value, where)
    if key == "regex":
        pattern = _text(key, value, where, MAX_PATTERN_CHARS)
        try:
            regex.compile(pattern)
        except (regex.error, RecursionError) as exc:
            raise InvalidRequestError(msg("err_qa_expect_bad_regex", where=where, pattern=pattern,
                                          detail=str(exc))) from None
        return pattern
    if key == "max_tokens":
        number = value
        if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
            number = int(value.strip())
        if isinstance(number, bool) or not isinstance(number, numbers.Integral) or not 1 <= number <= 10**9:
            raise InvalidRequestError(msg("err_qa_expect_max_tokens", where=where, got=value))
        return int(number)
    if key == "image_size":
        try:
            return parse_size(value).label
        except InvalidRequestError as exc:
            where = msg("err_qa_where_key", where=where, field="image_size")
            raise InvalidRequestError(msg("err_qa_where_detail", where=where, detail=exc)) from None
    raise InvalidRequestError(msg("err_qa_expect_unknown", where=where, field=key, allowed=", ".join(CHECKS)))


def _text(key: str, value: object, where: str, limit: int = MAX_EXPECT_TEXT_CHARS) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(msg("err_qa_expect_not_text", where=where, field=key, got=value))
    if len(value) > limit:
        raise InvalidRequestError(msg("err_qa_expect_too_long", where=where, field=key, chars=len(value), most=limit))
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
        return FAIL, _in(lang, "qa_view_judge_cell_failed", error=cell.error)
    if cell.status != "done":
        return None, _in(lang, "qa_view_judge_not_judged", status=word("status", cell.status))
    problems = [p.text(lang) for key, value in checks.items() if (p := _check(key, value, cell))]
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, _in(lang, "qa_view_judge_all_hold", checks=", ".join(checks))


def word(family: str, value: str) -> str:
    """A status ("done"), kind ("chat") or verdict ("pass") as a Message the page can translate; else as it is."""
    key = f"qa_view_{family}_{value}" if family else f"qa_view_{value}"
    return msg(key) if isinstance(value, str) and key in MESSAGES else value


def _in(lang: str, key: str, **params) -> str:
    return msg(key, **params).text(lang)


def _check(key: str, value: object, cell) -> Message | None:
    """None when the check holds, else why not."""
    text = cell.text or ""
    if key == "contains":
        missing = [t for t in _as_list(value) if t not in text]
        return msg("qa_view_judge_missing", texts=", ".join(map(repr, missing))) if missing else None
    if key == "not_contains":
        found = [t for t in _as_list(value) if t in text]
        return msg("qa_view_judge_found", texts=", ".join(map(repr, found))) if found else None
    if key == "starts_with":
        return None if text.lstrip().startswith(value) else msg("qa_view_judge_start", text=value)
    if key == "regex":
        try:
            hit = regex.search(value, text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            return msg("qa_view_judge_regex_slow", pattern=value, seconds=REGEX_TIMEOUT_S)
        except (regex.error, RecursionError) as exc:
            return msg("qa_view_judge_regex_bad", pattern=value, detail=str(exc))
        return None if hit else msg("qa_view_judge_no_match", pattern=value)
    if key == "max_tokens":
        tokens = (cell.stats or {}).get("new_tokens")
        if not isinstance(tokens, int):
            return msg("qa_view_judge_tokens_unknown")
        return None if tokens <= value else msg("qa_view_judge_too_many_tokens", tokens=tokens, most=value)
    if key == "image_size":
        size = _image_size(cell)
        if size is None:
            return msg("qa_view_judge_no_image")
        return None if size == value else msg("qa_view_judge_wrong_size", size=size, expected=value)
    return msg("qa_view_judge_unknown", field=key)


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
