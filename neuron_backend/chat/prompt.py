"""Chat prompts: the template rendered, tokenized, old turns dropped to fit the largest bucket, bucket chosen.

The template is rendered once as a skeleton with a placeholder per message and the contents go back in as
data, so typed control tokens are plain characters. How: docs/api.md, "Chat history and the export format".
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import PromptTooLongError
from ..messages import tr
from .text import THINK_OPEN, ChatRequest

_SLOT = "\ue000{}\ue001"  # private-use characters: a message content placeholder in the skeleton
_SLOT_RE = re.compile("\ue000(\\d+)\ue001")


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # unpadded token ids
    bucket: int
    dropped_turns: int
    max_new_tokens: int
    starts_in_reasoning: bool  # the template already opened <think> in the prompt
    window_floor: int = 0  # warm-up: decode over at least this cache window (compiles its graph)
    thinking: bool = False  # think tags in the reply mean something (ThinkSplitter)


def plain_text_tokenizer(tokenizer):
    """The tokenizer's own pipeline (normalizer, pre-tokenizer, BPE) with no added tokens: every
    string is tokenized as characters, special-token strings included."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["added_tokens"], spec["post_processor"] = [], None
    spec["truncation"] = spec["padding"] = None
    return Tokenizer.from_str(json.dumps(spec))


class PromptBuilder:
    """Builds a request's prompt with the model's own chat template. Stateless: safe from any thread.

    ``renders`` and ``encoded_chars`` count template renders and characters tokenized (for tests
    and benchmarks; updated without a lock, so only approximate under concurrency).
    """

    def __init__(self, tokenizer, buckets: Sequence[int], context_length: int):
        self.tokenizer, self.buckets, self.context_length = tokenizer, tuple(buckets), context_length
        self._plain = plain_text_tokenizer(tokenizer)
        self._marker_ids = dict(tokenizer.get_added_vocab())  # control tokens, by their text
        names = sorted(self._marker_ids, key=len, reverse=True)  # longest first, like the tokenizer
        self._marker_re = re.compile("|".join(map(re.escape, names))) if names else None
        self.renders = self.encoded_chars = 0

    # ----- rendering and tokenizing ------------------------------------------------------------------
    def render(self, system: str | None, turns: list[list[dict]], message: str, thinking: bool) -> str:
        """The template's text for a conversation (contents as they are)."""
        return self._template(self._messages(system, turns, message), thinking)

    def encode(self, text: str) -> list[int]:
        """Token ids of text the template wrote (every marker in it is a control token)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _messages(self, system, turns, message) -> list[dict]:
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [m for turn in turns for m in turn] + [{"role": "user", "content": message}]

    def _template(self, messages: list[dict], thinking: bool) -> str:
        self.renders += 1
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=thinking)

    def _units(self, messages: list[dict], thinking: bool) -> tuple[list[int | str], list[int]]:
        """The prompt as units (control token ids, and the plain text between them), and for each
        message the index of the unit where its part of the prompt starts (-1 if not found)."""
        slotted = [{**m, "content": _SLOT.format(i)} for i, m in enumerate(messages)]
        skeleton = self._template(slotted, thinking)
        units: list[int | str] = []
        starts = [-1] * len(messages)
        text: list[str] = []
        last_marker = 0  # index in units of the latest control token (where a message's part begins)
        pieces = _SLOT_RE.split(skeleton)  # template text, slot number, template text, ...
        for n, piece in enumerate(pieces):
            if n % 2:  # a message's content: plain text, whatever it holds
                index = int(piece)
                if starts[index] == -1:
                    starts[index] = last_marker
                text.append(messages[index]["content"])
                continue
            position = 0
            for match in self._marker_re.finditer(piece) if self._marker_re else ():
                text.append(piece[position:match.start()])
                if joined := "".join(text):
                    units.append(joined)
                text, position = [], match.end()
                last_marker = len(units)
                units.append(self._marker_ids[match.group()])
            text.append(piece[position:])
        if joined := "".join(text):
            units.append(joined)
        return units, starts

    def _encode(self, units: list[int | str], cache: dict[str, list[int]]) -> list[int]:
        """Ids of units; each distinct text is tokenized once per cache."""
        new = list(dict.fromkeys(u for u in units if isinstance(u, str) and u not in cache))
        if new:
            self.encoded_chars += sum(map(len, new))
            for text, encoding in zip(new, self._plain.encode_batch(new, add_special_tokens=False), strict=True):
                cache[text] = encoding.ids
        ids: list[int] = []
        for unit in units:
            if isinstance(unit, str):
                ids.extend(cache[unit])
            else:
                ids.append(unit)
        return ids

    # ----- fitting ----------------------------------------------------------------------------------
    def fit(self, request: ChatRequest) -> tuple[list[int], int]:
        """Token ids with the fewest oldest turns dropped to fit the largest bucket, and how many were."""
        turns: list[list[dict]] = []
        for m in request.history:  # a turn: a user message and the replies after it
            if m["role"] == "user" or not turns:
                turns.append([])
            turns[-1].append(m)
        system, message, thinking = request.system_prompt, request.message, request.thinking
        cache: dict[str, list[int]] = {}

        def ids_without(dropped: int) -> list[int]:
            return self._encode(self._units(self._messages(system, turns[dropped:], message), thinking)[0], cache)

        largest = self.buckets[-1]
        messages = self._messages(system, turns, message)
        units, starts = self._units(messages, thinking)
        ids = self._encode(units, cache)
        if len(ids) <= largest or not turns:
            return ids, 0
        # Where each turn's part begins (in units), from the one render: turn k is kept by keeping
        # units[turn_start[k]:]; the part before turn 0 (system prompt) is always kept.
        first = 1 if system else 0
        turn_start, index = [], first
        for turn in turns:
            turn_start.append(starts[index])
            index += len(turn)
        lengths = [1 if isinstance(u, int) else len(cache[u]) for u in units]
        if all(s >= 0 for s in turn_start) and turn_start == sorted(turn_start):
            head = sum(lengths[: turn_start[0]])
            suffix = sum(lengths[turn_start[0]:])
            dropped = 0
            while dropped < len(turns) and head + suffix > largest:
                end = turn_start[dropped + 1] if dropped + 1 < len(turns) else starts[-1]
                suffix -= sum(lengths[turn_start[dropped]:end])
                dropped += 1
            candidate = ids_without(dropped)  # one more render confirms what the sums predict
            kept_from = turn_start[dropped] if dropped < len(turns) else starts[-1]
            if self._encode(units[: turn_start[0]] + units[kept_from:], cache) == candidate:
                return candidate, dropped
        return self._search(ids_without, len(turns), largest)

    @staticmethod
    def _search(ids_without, turns: int, largest: int) -> tuple[list[int], int]:
        """Binary search (dropping more turns never makes the prompt longer): the general fallback."""
        low, high = 0, turns
        best = ids_without(high)
        if len(best) > largest:
            return best, high
        while high - low > 1:
            middle = (low + high) // 2
            candidate = ids_without(middle)
            if len(candidate) <= largest:
                high, best = middle, candidate
            else:
                low = middle
        return best, high

    def too_long_message(self, tokens: int, request: ChatRequest) -> str:
        if request.system_prompt:
            return tr("The message and the system prompt take {tokens} tokens with the chat template; the longest "
                      "prompt this server accepts is {limit} tokens. Shorten the message or the system prompt.",
                      tokens=tokens, limit=self.buckets[-1])
        return tr("The message takes {tokens} tokens with the chat template; the longest prompt this server accepts "
                  "is {limit} tokens. Shorten the message.", tokens=tokens, limit=self.buckets[-1])

    def prepare(self, request: ChatRequest) -> Prompt:
        """The prompt of a validated request, or PromptTooLongError naming the limit."""
        ids, dropped = self.fit(request)
        if len(ids) > self.buckets[-1]:
            raise PromptTooLongError(self.too_long_message(len(ids), request))
        bucket = next(b for b in self.buckets if len(ids) <= b)
        # One static cache of context_length tokens holds the padded prompt and every new token.
        max_new = min(request.max_new_tokens, self.context_length - bucket)
        opened = self.tokenizer.decode(ids[-4:]).rstrip().endswith(THINK_OPEN)
        return Prompt(ids, bucket, dropped, max_new, opened, thinking=request.thinking)
