"""The QA bench without a browser: run a prompt set against a running app through its public API.

    python -m tools.qa run SET.jsonl --variants "cold: temperature=0.2" \\
        --variants "hot: temperature=1.2" --url http://127.0.0.1:7860 --out run.jsonl

Plans the cells exactly as the QA tab does (same file formats, variants, limits and seeds; the
server's sizes and limits come from its ``/status``), runs each one through ``/chat`` or
``/generate_image`` with gradio_client (an image cell of a row with reference images through
``/edit_image``, the files read beside the set: ``references.py``; or, with ``--openai URL``, through
any OpenAI-compatible server: ``openai_cells.py``, such a cell through ``/v1/images/edits``), judges it
against the row's expectations and writes the run as the tab's JSONL export (``--csv`` / ``--html``
add those exports). Exit status: 0 when every expectation holds and every cell ran; 1 when an
expectation failed or a cell failed to run; 2 when the set, the variants or the connection are
wrong (nothing ran).
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import time
from functools import partial
from pathlib import Path

from PIL import Image

from neuron_backend.errors import InvalidRequestError, ShowcaseError
from neuron_backend.image.png_info import png_metadata
from neuron_backend.settings import Settings
from neuron_backend.shapes import parse_size

from .expect import judge
from .references import current_bytes
from .runs import DONE, FAILED, STOPPED, Cell, QARun, plan_run

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.qa", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a prompt set against a running app and judge its expectations")
    run.add_argument("set", help="the prompt set: .jsonl, .csv or .txt (as the QA tab reads it)")
    run.add_argument("--variants", action="append", default=[], metavar="SPEC",
                     help="a variant ('name: key=value, ...'), JSON, or @FILE; repeat for more")
    run.add_argument("--kind", choices=("chat", "image", "both"), default="chat", help="engines to run (chat)")
    run.add_argument("--run-seed", type=int, default=0, help="fixes every cell's seed (0)")
    run.add_argument("--url", default="http://127.0.0.1:7860", help="the running app (http://127.0.0.1:7860)")
    run.add_argument("--auth", metavar="USER:PASSWORD", help="login of an app started with --auth")
    run.add_argument("--openai", metavar="BASE_URL",
                     help="run through an OpenAI-compatible server instead (http://127.0.0.1:7860/v1, vLLM, ...)")
    run.add_argument("--api-key", help="the OpenAI-compatible server's key (with --openai)")
    run.add_argument("--out", required=True, help="where to write the run (JSONL, as the tab exports it)")
    run.add_argument("--csv", help="also write the CSV export here")
    run.add_argument("--html", help="also write the HTML report here")
    run.add_argument("--quiet", action="store_true", help="print only the summary")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.openai:
            from . import openai_cells

            client = openai_cells.connect(args.openai, args.api_key)
            models = openai_cells.served_models(client)
            settings, cells = openai_cells.server_settings(models), openai_cells.OpenAICells(client, models)
        else:
            client = _connect(args.url, args.auth)
            settings = server_settings(client.predict(api_name="/status"))
        run = plan_run(settings, prompts_file=args.set, variants=_variants(args.variants), kind=args.kind,
                       run_seed=args.run_seed)
        if args.openai:
            chat, image = cells.chat, partial(cells.image, run)
        else:
            chat, image = partial(_chat, client), partial(_image, client, run)
    except (ShowcaseError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    run_cells(run, chat, image, None if args.quiet else print)
    return finish(run, args)


def _connect(url: str, auth: str | None):
    from gradio_client import Client  # only the CLI needs it; the app's backend never imports it

    login = tuple(auth.split(":", 1)) if auth else None
    if login is not None and len(login) != 2:
        raise InvalidRequestError("--auth must be USER:PASSWORD.")
    try:
        return Client(url, auth=login, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any connection problem is reported the same way
        raise InvalidRequestError(f"Could not reach the app at {url} ({type(exc).__name__}: {exc}); start it "
                                  "with python app.py, or pass --url.") from None


def _variants(specs: list[str]) -> str | None:
    texts = []
    for spec in specs:
        texts.append(Path(spec[1:]).read_text(encoding="utf-8") if spec.startswith("@") else spec)
    if len(texts) == 1:
        return texts[0]
    return "\n".join(texts) or None


def server_settings(status: dict) -> Settings:
    """The server's sizes and limits (from /status) as the Settings that plan_run checks a set against."""
    limits = status.get("limits") if isinstance(status, dict) else None
    engines = status.get("engines", {}) if isinstance(status, dict) else {}
    enabled = {name for name, e in engines.items() if isinstance(e, dict) and e.get("state") != "disabled"}
    base = Settings()
    if isinstance(limits, dict):
        sizes = tuple(parse_size(s) for s in limits["sizes"])
        return base.replace(sizes=sizes, default_steps=limits["default_steps"], max_steps=limits["max_steps"],
                            max_new_tokens=limits["max_new_tokens"], max_prompt_chars=limits["max_prompt_chars"],
                            chat="chat" in limits["engines"], image="image" in limits["engines"],
                            references=tuple(limits.get("references") or (0,)))
    # An app without "limits" in /status: the sizes are its image warm-up shapes, the rest preset defaults.
    sizes = tuple(parse_size(t["shape"]) for t in status.get("tasks", [])  # edit slots ("64x64+1ref") left out
                  if t.get("engine") == "image" and t.get("kind") == "compile" and t.get("shape")
                  and "+" not in t["shape"])
    return base.replace(sizes=sizes or base.sizes, chat="chat" in enabled or not engines,
                        image="image" in enabled or not engines, references=(0,))


def run_cells(run: QARun, chat, image, say=print) -> QARun:
    """Run every pending cell with ``chat(prompt, cell)`` or ``image(prompt, cell)``, one at a time; judge each."""
    for index, cell in enumerate(run.cells):
        prompt = run.rows[cell.prompt_index].prompt
        started = time.perf_counter()
        try:
            (chat if cell.kind == "chat" else image)(prompt, cell)
        except Exception as exc:  # noqa: BLE001 - gradio_client and the SDK raise their own errors: a failed cell
            cell.status, cell.error = FAILED, _message(exc)
        cell.seconds = round(time.perf_counter() - started, 3)
        cell.auto, cell.auto_reason = judge(run.rows[cell.prompt_index].expect, cell)
        if say is not None:
            say(f"cell {index + 1}/{len(run.cells)} · #{cell.prompt_index + 1} · {cell.variant} · {cell.kind}: "
                f"{cell.status}{' · ' + cell.auto + ' (' + cell.auto_reason + ')' if cell.auto else ''}"
                f"{' · ' + cell.error if cell.error else ''}")
    return run


def _message(exc: Exception) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


def _chat(client, prompt: str, cell: Cell) -> None:
    s = cell.settings
    job = client.submit(message=prompt, system_prompt=s["system_prompt"] or "", thinking=s["thinking"],
                        temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"],
                        max_new_tokens=s["max_new_tokens"], greedy=s["greedy"], seed=s["seed"], api_name="/chat")
    final = job.result()
    if not isinstance(final, dict) or not final.get("done"):
        raise InvalidRequestError(f"/chat ended without a final reply ({str(final)[:200]}).")
    cell.text, cell.reasoning = final.get("answer"), final.get("reasoning") or None
    cell.stats = final.get("stats")
    cell.status = STOPPED if (cell.stats or {}).get("stopped") else DONE


def _image(client, run: QARun, prompt: str, cell: Cell) -> None:
    s = cell.settings
    common = {"prompt": prompt, "size": s["size"], "steps": s["steps"], "seed": s["seed"], "guidance": s["guidance"]}
    references = run.rows[cell.prompt_index].references if s.get("references") else []
    if references:
        from gradio_client import handle_file

        for ref in references:
            current_bytes(ref)  # the file as the set was read, or the cell fails saying it changed
        path, params = client.predict(references=[handle_file(ref.path) for ref in references],
                                      fit=",".join(ref.fit for ref in references), **common, api_name="/edit_image")
    else:
        path, params = client.predict(**common, api_name="/generate_image")
    path = path.get("path") if isinstance(path, dict) else path
    png = {"prompt": prompt, "kind": "image", **s}
    if references and isinstance(params, dict) and params.get("references"):
        png["references"] = params["references"]  # the server's record: sha256, sizes and fit of each
    with Image.open(path) as image:
        buffer = io.BytesIO()
        # As the tab stores it: the cell's own parameters only, so the same pixels give the same bytes.
        image.save(buffer, format="PNG", pnginfo=png_metadata(png))
    cell.image_png = base64.b64encode(buffer.getvalue()).decode("ascii")
    params = params if isinstance(params, dict) else {}
    cell.stats = {k: params.get(k) for k in ("seed", "seconds", "compiled_graphs", "stopped", "prompt_truncated",
                                             "steps_done", "guidance")}
    cell.status = STOPPED if params.get("stopped") else DONE


def finish(run: QARun, args) -> int:
    """Write the exports, print the summary per variant, return the exit status."""
    from .export_csv import export_csv
    from .grid import summary_line
    from .html_report import export_html
    from .report import export_jsonl

    Path(args.out).write_text(export_jsonl(run), encoding="utf-8")
    if args.csv:
        Path(args.csv).write_text(export_csv(run), encoding="utf-8", newline="")
    if args.html:
        Path(args.html).write_text(export_html(run), encoding="utf-8")
    failed = [i + 1 for i, c in enumerate(run.cells) if c.auto == "fail"]
    errors = [i + 1 for i, c in enumerate(run.cells) if c.status == FAILED]
    print(summary_line(run))
    print(f"{len(run.cells)} cells · {len(failed)} failed an expectation{_list(failed)} · "
          f"{len(errors)} failed to run{_list(errors)} · written to {args.out}")
    return EXIT_FAILED if failed or errors else EXIT_OK


def _list(numbers: list[int]) -> str:
    return f" (cells {', '.join(map(str, numbers[:20]))}{'…' if len(numbers) > 20 else ''})" if numbers else ""
