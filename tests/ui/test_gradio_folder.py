"""Two servers on one host (app.py twice): each files its uploads in a Gradio folder of its own.

Gradio files an upload under its bytes' sha256 and, when its server stops, deletes every file it filed.
With one shared folder the same picture sent to two servers had one path, and stopping one server (Ctrl-C)
deleted the file the other had just been sent.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from support.browser import PROCESSES, running_app


def _upload(url: str, picture: Path) -> Path:
    with picture.open("rb") as file:
        answer = httpx.post(url + "gradio_api/upload", files=[("files", (picture.name, file))], timeout=60)
    answer.raise_for_status()
    return Path(answer.json()[0])


def _ready(url: str, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while httpx.get(url + "readyz", timeout=10).status_code != 200:
        assert time.monotonic() < end, f"{url} not ready after {deadline_s} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_stopping_one_server_keeps_the_uploads_of_another_on_the_same_host(tmp_path):
    picture = tmp_path / "cat.png"
    Image.new("RGB", (80, 50), (200, 30, 30)).save(picture)
    base = Path(os.environ["GRADIO_TEMP_DIR"])
    flags = ("--no-chat", "--sizes", "64x64")
    with running_app("gradio-folder-a.log", *flags) as a:
        with running_app("gradio-folder-b.log", *flags) as b:
            _ready(a), _ready(b)
            kept, dropped = _upload(a, picture), _upload(b, picture)
            assert kept.parent.name == dropped.parent.name  # the same bytes: the same sha256 folder
            PROCESSES[b].send_signal(signal.SIGINT)  # Ctrl-C: Gradio closes the server and deletes its files
            assert PROCESSES[b].wait(timeout=60) is not None
        assert not dropped.exists()  # the stopped server deleted what it filed
        assert kept.read_bytes() == picture.read_bytes()  # and nothing of the server still running
        assert [kept.parents[1], dropped.parents[1]] == [base / f"port-{_port(a)}", base / f"port-{_port(b)}"]


def _port(url: str) -> str:
    return url.rstrip("/").rsplit(":", 1)[1]
