"""QA cells through any OpenAI-compatible server: this app's ``/v1`` or another (vLLM Neuron, a CPU build).

    python -m tools.qa run SET.jsonl --variants "cold: temperature=0.2" \\
        --openai http://127.0.0.1:7860/v1 --out run.jsonl

The same prompt set, variants and seeds then run against two servers side by side (``compare`` reads
both runs). The server's limits come from ``GET /v1/models``: this app lists its buckets, context,
sizes and step limits there; a server that lists none gets the preset's defaults, and a request it
cannot take fails its cell with the server's own message. Chat cells are streamed (so the time to
the first token is what a client waits), with Qwen3's thinking as vLLM takes it
(``chat_template_kwargs.enable_thinking``) and its reasoning read from ``reasoning_content``; image
cells ask for ``b64_json`` with ``seed``, ``steps`` and ``guidance`` as extra fields. An image cell of a
row with reference images goes through ``images.edit`` (``POST /v1/images/edits``): the row's files,
read again and checked against the sha256 the set was read with, with ``fit`` as one more extra field.
The counts of references a server takes come from its image model's ``edits`` in ``/v1/models``; a
server that lists none is sent any count, and a server that does not edit answers the cell with its
own message. Speed figures are measured here, at the client, so they compare across servers.
"""

from __future__ import annotations

import base64
import io
import time

from PIL import Image

from neuron_backend.errors import InvalidRequestError
from neuron_backend.image.png_info import png_metadata
from neuron_backend.settings import Settings
from neuron_backend.shapes import MAX_REFERENCES, parse_size

from .references import current_bytes, file_name
from .runs import DONE, Cell, QARun

FINISH = {"stop": "eos", "length": "length"}  # OpenAI's finish_reason -> the bench's


def connect(base_url: str, api_key: str | None):
    """An ``openai`` client for ``base_url`` (``http://host:port/v1``); checked with one ``/models`` call."""
    import openai  # only this runner needs the SDK

    client = openai.OpenAI(base_url=base_url, api_key=api_key or "none", max_retries=2, timeout=600)
    try:
        client.models.list()
    except openai.OpenAIError as exc:
        raise InvalidRequestError(f"Could not list the models at {base_url} ({type(exc).__name__}: {exc}); pass "
                                  "the server's base URL ending in /v1 (and --api-key if it needs one).") from None
    return client


def served_models(client) -> dict[str, dict]:
    """{"chat": entry, "image": entry}: this app marks each entry's engine; another server's models are chat."""
    found: dict[str, dict] = {}
    for model in client.models.list().data:
        entry = {"id": model.id, **(model.model_extra or {})}
        found.setdefault(entry.get("engine") or "chat", entry)
    return found


def server_settings(models: dict[str, dict]) -> Settings:
    """The limits ``plan_run`` checks a set against, from the models' declared shapes where listed."""
    base, chat, image = Settings(), models.get("chat", {}), models.get("image", {})
    changes = {"chat": "chat" in models, "image": "image" in models}
    if isinstance(chat.get("max_new_tokens"), int):
        changes["max_new_tokens"] = chat["max_new_tokens"]
    edits = image.get("edits")
    if isinstance(edits, list) and edits and all(isinstance(n, int) and 0 < n <= MAX_REFERENCES for n in edits):
        changes["references"] = (0, *sorted(set(edits)))
    else:  # no counts declared (or none served): the server's own answer refuses a row it cannot take
        changes["references"] = tuple(range(MAX_REFERENCES + 1))
    if image.get("sizes"):
        changes["sizes"] = tuple(parse_size(s) for s in image["sizes"])
    for key in ("default_steps", "max_steps"):
        if isinstance(image.get(key), int):
            changes[key] = image[key]
    return base.replace(**changes)


class OpenAICells:
    """Runs one cell at a time through the SDK; ``chat`` and ``image`` fill the cell as ``cli.run_cells`` wants."""

    def __init__(self, client, models: dict[str, dict]):
        self.client, self.models = client, models

    def _model(self, kind: str) -> str:
        if kind not in self.models:
            raise InvalidRequestError(f"The server lists no {kind} model at /v1/models.")
        return self.models[kind]["id"]

    def chat(self, prompt: str, cell: Cell) -> None:
        s = cell.settings
        messages = ([{"role": "system", "content": s["system_prompt"]}] if s.get("system_prompt") else [])
        messages.append({"role": "user", "content": prompt})
        greedy = bool(s.get("greedy"))
        started, first, answer, reasoning, usage, finish = time.perf_counter(), None, [], [], None, None
        stream = self.client.chat.completions.create(
            model=self._model("chat"), messages=messages, stream=True, stream_options={"include_usage": True},
            temperature=0 if greedy else s["temperature"], top_p=s["top_p"], max_tokens=s["max_new_tokens"],
            seed=None if greedy else s["seed"],
            extra_body={"top_k": s["top_k"], "chat_template_kwargs": {"enable_thinking": bool(s["thinking"])}})
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text = choice.delta.content or ""
                thought = (choice.delta.model_extra or {}).get("reasoning_content") or ""
                if (text or thought) and first is None:
                    first = time.perf_counter() - started
                answer.append(text)
                reasoning.append(thought)
                finish = choice.finish_reason or finish
        total = time.perf_counter() - started
        new = usage.completion_tokens if usage is not None else None
        decode = total - (first or total)
        cell.text, cell.reasoning = "".join(answer), "".join(reasoning) or None
        cell.stats = {"prompt_tokens": usage.prompt_tokens if usage is not None else None, "new_tokens": new,
                      "time_to_first_token_s": first, "total_s": total, "finish_reason": FINISH.get(finish, finish),
                      "tokens_per_s": (new - 1) / decode if new and new > 1 and decode > 0 else 0.0,
                      "seed": None if greedy else s["seed"], "stopped": False}
        cell.status = DONE

    def image(self, run: QARun, prompt: str, cell: Cell) -> None:
        """``images.generate``, or ``images.edit`` with the row's reference files when the cell records any."""
        s = cell.settings
        references = run.rows[cell.prompt_index].references if s.get("references") else []
        common = {"model": self._model("image"), "prompt": prompt, "size": s["size"], "n": 1,
                  "response_format": "b64_json"}
        extra = {"seed": s["seed"], "steps": s["steps"], "guidance": s["guidance"]}
        # Each file as the set was read (else the cell fails saying it changed), named without its folder.
        files = [(file_name(ref.name), current_bytes(ref)) for ref in references]
        started = time.perf_counter()
        if files:
            answer = self.client.images.edit(image=files, **common,
                                             extra_body={**extra, "fit": ",".join(ref.fit for ref in references)})
        else:
            answer = self.client.images.generate(**common, extra_body=extra)
        seconds = time.perf_counter() - started
        item = answer.data[0]
        png = {"prompt": prompt, "kind": "image", **s}
        recorded = ((item.model_extra or {}).get("parameters") or {}).get("references")
        if files and recorded:
            png["references"] = recorded  # the server's record: sha256, sizes and fit of each (as /edit_image)
        with Image.open(io.BytesIO(base64.b64decode(item.b64_json))) as image:
            buffer = io.BytesIO()
            # As the tab stores it: the cell's own parameters only, so the same pixels give the same bytes.
            image.save(buffer, format="PNG", pnginfo=png_metadata(png))
        cell.image_png = base64.b64encode(buffer.getvalue()).decode("ascii")
        cell.stats = {"seed": s["seed"], "seconds": seconds, "stopped": False}
        cell.status = DONE
