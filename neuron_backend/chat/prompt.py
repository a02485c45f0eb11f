"""Chat prompts: the template rendered, tokenized, old turns dropped to fit the largest bucket, bucket chosen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import PromptTooLongError
from .text import THINK_OPEN, ChatRequest


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # unpadded token ids
    bucket: int
    dropped_turns: int
    max_new_tokens: int
    starts_in_reasoning: bool  # the template already opened <think> in the prompt
    window_floor: int = 0  # warm-up: decode over at least this cache window (compiles its graph)


class PromptBuilder:
    """Builds a request's prompt with the model's own chat template. Stateless: safe from any thread."""

    def __init__(self, tokenizer, buckets: Sequence[int], context_length: int):
        self.tokenizer, self.buckets, self.context_length = tokenizer, tuple(buckets), context_length

    def render(self, system: str | None, turns: list[list[dict]], message: str, thinking: bool) -> str:
        messages = [{"role": "system", "content": system}] if system else []
        messages += [m for turn in turns for m in turn] + [{"role": "user", "content": message}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=thinking)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]  # the template holds every marker

    def fit(self, request: ChatRequest) -> tuple[list[int], int]:
        """Token ids with the fewest oldest turns dropped to fit the largest bucket, and how many were."""
        turns: list[list[dict]] = []
        for m in request.history:  # a turn: a user message and the replies after it
            if m["role"] == "user" or not turns:
                turns.append([])
            turns[-1].append(m)

        def ids_without(dropped: int) -> list[int]:
            return self.encode(self.render(request.system_prompt, turns[dropped:], request.message,
                                           request.thinking))

        largest = self.buckets[-1]
        ids = ids_without(0)
        if len(ids) <= largest or not turns:
            return ids, 0
        low, high = 0, len(turns)  # binary search: dropping more turns never makes the prompt longer
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
        what, fix = ("The message and the system prompt take", "the message or the system prompt") \
            if request.system_prompt else ("The message takes", "the message")
        return (f"{what} {tokens} tokens with the chat template; the longest prompt this server accepts is "
                f"{self.buckets[-1]} tokens. Shorten {fix}.")

    def prepare(self, request: ChatRequest) -> Prompt:
        """The prompt of a validated request, or PromptTooLongError naming the limit."""
        ids, dropped = self.fit(request)
        if len(ids) > self.buckets[-1]:
            raise PromptTooLongError(self.too_long_message(len(ids), request))
        bucket = next(b for b in self.buckets if len(ids) <= b)
        # One static cache of context_length tokens holds the padded prompt and every new token.
        max_new = min(request.max_new_tokens, self.context_length - bucket)
        opened = self.tokenizer.decode(ids[-4:]).rstrip().endswith(THINK_OPEN)
        return Prompt(ids, bucket, dropped, max_new, opened)
