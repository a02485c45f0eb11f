"""The Gradio app in-process on the tiny models, driven through its public API (gradio_client)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from support.app import warm_backend

import ui

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from support.app import start_app  # noqa: E402


@pytest.fixture(scope="module")
def served(warm_app):
    backend, url = warm_app
    return backend, Client(url, verbose=False)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """An app with --auth whose last image size has not warmed up yet."""
    demo, backend, url = start_app(tmp_path_factory.mktemp("guarded"), "--auth", "ada:lovelace", warm=False)
    yield backend, url
    demo.close()


def test_named_endpoints_only(served):
    _, client = served
    api = client.view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == {"/chat", "/generate_image", "/status"}  # what the API page lists
    assert not api["unnamed_endpoints"]
    # /paste_png stays callable by name (tests/ui/test_bad_input.py calls it), undocumented on the page
    named = {d["api_name"]: d.get("api_visibility") for d in client.config["dependencies"] if d.get("api_name")}
    assert named["paste_png"] == "undocumented"
    # The API page shows each docstring as written: no reStructuredText markup in it (``history`` read literally).
    for name, endpoint in api["named_endpoints"].items():
        assert "``" not in (endpoint.get("description") or ""), (name, endpoint.get("description"))
    assert "\"history\" takes" in api["named_endpoints"]["/chat"]["description"]


@pytest.mark.slow
def test_status_json(served):
    backend, client = served
    # The counter behind compiles_since_ready is the process's: in a test process the other modules' compiles
    # count too, so the field must not grow while this app serves a chat and an image.
    before = backend.runner.compiles_since_ready()
    client.predict(message="hi", max_new_tokens=4, seed=1, api_name="/chat")
    client.predict(prompt="a cat", size="64x64", steps=1, seed=1, api_name="/generate_image")
    status = client.predict(api_name="/status")
    for key in ("tasks", "progress", "eta_s", "ready", "compiles_since_ready", "banner", "device", "models",
                "engines", "cache_dir"):
        assert key in status
    assert status["ready"] and status["compiles_since_ready"] == before
    assert "demo models with random weights" in status["banner"] and "CPU" in status["banner"]
    assert {t["state"] for t in status["tasks"]} == {"ready"}


def test_chat_streams_with_history_and_controls(served):
    _, client = served
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>x</think>hello"}]
    job = client.submit(message="tell me more", history=history, system_prompt="Be brief.", thinking=False,
                        temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=24, greedy=False, seed=5,
                        api_name="/chat")
    updates = list(job)
    assert len(updates) > 1 and updates[-1]["done"]
    final = updates[-1]
    assert final["answer"].strip() and final["stats"]["new_tokens"] >= 1
    assert final["stats"]["compiled_graphs"] == 0 and final["stats"]["bucket"] in (32, 64, 128)
    assert final["answer"] in "".join(u["delta"] for u in updates)
    again = client.predict(message="tell me more", history=history, system_prompt="Be brief.", top_k=20,
                           max_new_tokens=24, seed=5, api_name="/chat")
    assert again["answer"] == final["answer"]  # same seed, same reply


@pytest.mark.slow
def test_chat_takes_the_chat_tabs_export_and_says_what_is_wrong(served):
    """/chat history: the Export JSON document's messages as they are (one normaliser for both sides);
    refusals say what is allowed; the final update names a cut at the token limit; deltas join to the answer."""
    from gradio_client.exceptions import AppError

    from tools.conversation_files.document import export_document

    shown = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
             {"role": "assistant", "content": "weighing", "metadata": {"title": "💭 Reasoning", "status": "done"}},
             {"role": "assistant", "content": "hello there"}]
    document = export_document(shown, model="m", system_prompt=None, settings={})
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    replies = [list(served[1].submit(message="more", history=h, greedy=True, max_new_tokens=3, api_name="/chat"))
               for h in (document["messages"], shown, plain)]
    finals = [r[-1] for r in replies]
    assert finals[0]["stats"]["prompt_tokens"] == finals[1]["stats"]["prompt_tokens"] \
        == finals[2]["stats"]["prompt_tokens"] and finals[0]["answer"] == finals[2]["answer"]
    for updates in replies:
        assert "".join(u["delta"] for u in updates) == updates[-1]["answer"]  # no stray leading space
    if finals[0]["stats"]["finish_reason"] == "length":
        assert finals[0]["notices"] and "limit of 3 new tokens" in finals[0]["notices"][0]
    for bad, allowed in ((5, "The history must be a list of"), ([{"role": "user", "content": "x"}] * 201,
                                                              "at most 200")):
        with pytest.raises(AppError, match=allowed):
            served[1].predict(message="x", history=bad, api_name="/chat")
    with pytest.raises(AppError, match="from 0.01 to 2"):
        served[1].predict(message="x", temperature=1e-300, api_name="/chat")


def test_chat_cancel_frees_the_engine(served):
    backend, client = served
    # greedy: runs all 200 tokens (a sampled demo reply may end at once, before the cancel)
    job = client.submit(message="go on", max_new_tokens=200, greedy=True, api_name="/chat")
    deadline = time.time() + 30
    while not job.outputs() and time.time() < deadline:  # wait until the reply is streaming
        time.sleep(0.02)
    assert job.outputs() and not job.outputs()[-1]["done"]
    job.cancel()
    deadline = time.time() + 5
    while backend.engine("chat").busy and time.time() < deadline:
        time.sleep(0.02)
    assert not backend.engine("chat").busy
    assert client.predict(message="next user", max_new_tokens=4, api_name="/chat")["done"]


def test_generate_image_returns_png_with_parameters(served):
    _, client = served
    path, params = client.predict(prompt="a lighthouse", size="96x64", steps=2, seed=11, guidance=None,
                                  api_name="/generate_image")
    with Image.open(path) as image:
        assert image.size == (96, 64) and image.format == "PNG"
        assert "Seed: 11" in image.text["parameters"] and "a lighthouse" in image.text["parameters"]
    assert params["seed"] == 11 and params["size"] == "96x64" and params["steps"] == 2


def test_unsupported_size_refused_with_allowed_list(served):
    _, client = served
    with pytest.raises(Exception, match=r"64x64.*96x64") as info:
        client.predict(prompt="x", size="512x512", steps=1, seed=1, guidance=None, api_name="/generate_image")
    assert "512x512" in str(info.value)


@pytest.mark.slow
def test_wrong_password_rejected(guarded):
    _, url = guarded
    with pytest.raises(Exception):  # noqa: B017 - gradio_client raises a plain ValueError/AppError here
        Client(url, auth=("ada", "wrong"), verbose=False)


@pytest.mark.slow
def test_not_ready_size_refused_with_eta(guarded):
    backend, url = guarded
    client = Client(url, auth=("ada", "lovelace"), verbose=False)
    with pytest.raises(Exception, match=r"96x64 is still warming up.*about 30 s"):
        client.predict(prompt="x", size="96x64", steps=1, seed=1, guidance=None, api_name="/generate_image")
    path, _ = client.predict(prompt="x", size="64x64", steps=1, seed=1, guidance=None, api_name="/generate_image")
    assert Image.open(path).size == (64, 64)
    status = client.predict(api_name="/status")
    assert not status["ready"] and status["done"] == status["total"] - 1



@pytest.mark.slow
def test_chat_batch_serves_concurrent_api_users_together(tmp_path):
    """--chat-batch 3: users who wait together ride in one generate() (the app gives chat 3 slots)."""
    demo, backend, url = start_app(tmp_path, "--chat-batch", "3", "--no-image", "--context-length", "1024",
                                   "--max-new-tokens", "900")
    engine = backend.engine("chat")
    calls, generate = [], engine.model.generate

    def counting_generate(*args, **kwargs):  # observe which generate() calls serve the users
        calls.append(kwargs["input_ids"].shape[0])
        return generate(*args, **kwargs)

    engine.model.generate = counting_generate
    try:
        clients = [Client(url, verbose=False) for _ in range(3)]
        # A long reply occupies the device; two users who arrive meanwhile wait for the next batch.
        first = clients[0].submit(message="long", greedy=True, max_new_tokens=900, api_name="/chat")
        deadline = time.time() + 30
        while not engine.busy and time.time() < deadline:
            time.sleep(0.01)
        later = [c.submit(message=f"user {i}", greedy=True, max_new_tokens=8, api_name="/chat")
                 for i, c in enumerate(clients[1:])]
        finals = [job.result(timeout=300) for job in (first, *later)]
        assert all(f["done"] and f["stats"]["batch_size"] == 3 for f in finals)
        assert calls == [3, 3], calls  # the long reply's batch, then one batch for both later users
    finally:
        engine.model.generate = generate
        demo.close()


def test_reasoning_is_folded_apart_and_not_fed_back():
    """The demo model never thinks (its vocabulary has no <think>), so the folding is checked here."""
    from neuron_backend.chat.text import ChatUpdate
    from ui import chat_tab

    thinking = chat_tab.reply_messages(ChatUpdate("weighing options", "", "options", False, None, 0))
    assert len(thinking) == 1 and thinking[0].metadata == {"title": "💭 Reasoning", "status": "pending"}
    done = chat_tab.reply_messages(ChatUpdate("weighing options", "The answer.", "answer.", True, None, 0))
    assert [m.content for m in done] == ["weighing options", "The answer."]
    assert done[0].metadata["status"] == "done" and not done[1].metadata
    history = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
               {"role": "assistant", "content": "weighing options", "metadata": {"title": "💭 Reasoning"}},
               {"role": "assistant", "content": "The answer."}]
    from neuron_backend.chat.text import HistoryLimits, normalize_history

    assert normalize_history(history, HistoryLimits()) == ({"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "The answer."})


# ----- the served app -----------------------------------------------------------------------------
@pytest.mark.slow
def test_images_come_back_from_a_cache_root_outside_cwd_and_tmp(home_root, demo_models):
    """Gradio serves files only from cwd, the temp dir and allowed_paths."""
    backend = warm_backend(home_root, demo_models, "--no-chat")
    assert backend.served_folders() == [home_root / "outputs", home_root / "exports"]
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    try:
        path, params = Client(url, verbose=False).predict("a lighthouse", api_name="/generate_image")
        assert Image.open(path).size == (64, 64) and params["size"] == "64x64"
        saved = backend.engine("image").outputs.saved_files()
        assert saved and saved[-1].parent == home_root / "outputs"
        allowed = {str(Path(p)) for p in demo.allowed_paths}
        assert allowed == {str(home_root / "outputs"), str(home_root / "exports")}  # nothing wider
    finally:
        demo.close()


@pytest.mark.slow
def test_api_pages_show_the_real_contract_and_accept_the_minimal_calls(tmp_path, demo_models):
    """Typed parameters with defaults; only the prompt / the message is required."""
    backend = warm_backend(tmp_path, demo_models)
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(url, verbose=False)
        api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        # the API page: the three public endpoints, the chat first; /paste_png stays callable, undocumented
        info = httpx.get(f"{url}gradio_api/info").json()["named_endpoints"]
        assert list(info) == ["/chat", "/status", "/generate_image"]
        assert all(endpoint["description"] for endpoint in info.values())
        image = {p["parameter_name"]: p for p in api["/generate_image"]["parameters"]}
        assert [n for n, p in image.items() if not p["parameter_has_default"]] == ["prompt"]
        assert image["size"]["parameter_default"] == "64x64"
        assert image["size"]["python_type"]["type"] == "Literal['64x64', '96x64']"
        assert image["steps"]["parameter_default"] == backend.image_default_steps() == 4  # FLUX.2-klein's
        assert image["steps"]["python_type"]["type"] == "int"
        assert image["seed"]["parameter_default"] is None and image["guidance"]["parameter_default"] is None
        chat = api["/chat"]["parameters"]
        assert [p["parameter_name"] for p in chat if not p["parameter_has_default"]] == ["message"]
        assert "answer: str" in api["/chat"]["returns"][0]["python_type"]["type"]
        status_type = api["/status"]["returns"][0]["python_type"]["type"]
        assert status_type != "Any" and "ready: bool" in status_type and "eta_s: None | float" in status_type

        path, params = client.predict("a cat", api_name="/generate_image")  # a prompt, nothing else
        assert Image.open(path).size == (64, 64)
        assert params["steps"] == backend.settings.default_steps and 0 <= params["seed"] < 2**32
        assert client.predict("hello", api_name="/chat")["done"]  # a message, nothing else
    finally:
        demo.close()


def _server_folders(backend) -> list[str]:
    """The server's folders that appear in its status: the cache root and each engine's model folder."""
    return [str(backend.settings.cache_dir), *(str(folder) for folder in backend.model_folders().values())]


def test_anonymous_visitors_see_no_server_folder_in_status_or_panel(served):
    """Without --auth: /status, the task table and the details name the folders, never their server paths."""
    from ui.status_panel import details_markdown, task_rows

    backend, client = served
    raw = json.dumps(backend.status(), default=str)
    folders = _server_folders(backend)
    assert all(folder in raw for folder in folders)  # the backend knows them: the UI leaves them out
    shown = json.dumps(client.predict(api_name="/status"))
    assert not any(folder in shown for folder in folders), shown
    assert "<cache-dir>" in shown
    from ui.presentation import visitor_status

    public = visitor_status(backend)
    page = json.dumps(task_rows(public), default=str) + details_markdown(public, show_paths=False)
    assert not any(folder in page for folder in folders), page


def test_with_auth_the_status_keeps_the_server_folders(guarded):
    backend, url = guarded
    status = Client(url, auth=("ada", "lovelace"), verbose=False).predict(api_name="/status")
    assert status["cache_dir"] == str(backend.settings.cache_dir)
