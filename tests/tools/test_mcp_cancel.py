"""An MCP client that cancels its image (``notifications/cancelled``) or goes away frees the image engine
within a step, the way the page's Stop and a ``gradio_client`` cancel do.

The tool runs its endpoint through a ``gradio_client`` loopback job (tools/mcp/server.py); the MCP server
cancels the tool handler, and the handler must then cancel that job, or every step runs (400 here, ~5 s
on the demo model).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import anyio
import pytest
from support.app import start_app

STEPS = 400  # ~5 s on the demo model: a job that runs whole is plain to see
ARGS = {"prompt": "slow", "size": "96x64", "steps": STEPS, "seed": 2}


@pytest.fixture(scope="module")
def long_images(tmp_path_factory):
    demo, backend, url = start_app(tmp_path_factory.mktemp("mcp-cancel"), "--mcp", "--no-chat",
                                   "--max-steps", str(STEPS))
    calls = []
    start_image = backend.start_image

    def counting(request, preview=False):  # each image call, to read how many steps it ran
        call = start_image(request, preview)
        calls.append(call)
        return call

    backend.start_image = counting
    yield backend, url, calls
    demo.close()


async def _busy(engine, calls, before: int, timeout: float = 60.0) -> None:
    started = time.monotonic()
    while not (len(calls) > before and engine.busy and calls[-1].progress):
        assert time.monotonic() - started < timeout, "the image never started"
        await asyncio.sleep(0.02)


def _free_after(engine, since: float, timeout: float = 15.0) -> float:
    while engine.busy and time.monotonic() - since < timeout:
        time.sleep(0.01)
    return time.monotonic() - since


def _cancel_mid_image(backend, url: str, calls, transport: str, how: str, progress: bool) -> float:
    """Start a long image over MCP (with ``progress``: asking for progress notifications), then cancel it
    (``how``: "notify" sends notifications/cancelled, "disconnect" closes the session and its transport);
    return when the cancel was sent."""
    from mcp import ClientSession, types
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    engine = backend.engine("image")

    async def run() -> float:
        client = streamable_http_client(url + "gradio_api/mcp/") if transport == "http" else sse_client(
            url + "gradio_api/mcp/sse")
        async with client as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                before = len(calls)
                async def on_progress(step, total, message):
                    pass

                call = asyncio.ensure_future(session.call_tool("generate_image", ARGS,
                                                               progress_callback=on_progress if progress else None))
                await _busy(engine, calls, before)
                sent = time.monotonic()
                if how == "notify":
                    request_id = session._request_id - 1  # the call_tool just sent
                    await session.send_notification(types.ClientNotification(types.CancelledNotification(
                        params=types.CancelledNotificationParams(requestId=request_id, reason="the user stopped"))))
                call.cancel()  # the client stops waiting; with "disconnect" the session closes right after
                with contextlib.suppress(BaseException):
                    await call
        return sent

    return asyncio.run(asyncio.wait_for(run(), timeout=120))


@pytest.mark.slow
@pytest.mark.parametrize(("transport", "how", "progress"), [
    ("sse", "notify", False), ("sse", "notify", True), ("http", "disconnect", False), ("http", "disconnect", True),
    ("sse", "disconnect", False)])
def test_an_mcp_cancel_or_disconnect_frees_the_engine_within_a_step(long_images, transport, how, progress):
    """Streamable HTTP is served stateless (each request its own session), so a notifications/cancelled
    there reaches no running call: its client stops a call by closing the request."""
    backend, url, calls = long_images
    engine = backend.engine("image")
    sent = _cancel_mid_image(backend, url, calls, transport, how, progress)
    # A whole run takes ~5 s (more on a busy host); stopped, the engine is free within a step or two, and the
    # cancel's round trip through Gradio's /cancel is well under a second.
    assert _free_after(engine, sent) < 3.0, f"{transport} {how}: the image ran on"
    step, total, _ = calls[-1].progress
    assert total == STEPS and step < STEPS // 2, f"{transport} {how}: {step} of {total} steps ran"


LATE_END_S = 2.0  # how late the MCP server's loop over a closed transport's messages ends (below)


@pytest.mark.slow
def test_a_progress_notification_to_a_client_that_went_away_cancels_its_image(long_images, monkeypatch, caplog):
    """A client that goes away closes its transport; the MCP server cancels the call's handler only when its
    loop over that transport's messages has ended, and a progress notification sent in between finds the
    stream closed (anyio's ClosedResourceError) instead: the image must be cancelled then too. On a busy host
    that loop can end seconds late; here it is made to end ``LATE_END_S`` late, so the next step's
    notification always lands in between."""
    from mcp.server.session import ServerSession

    incoming = ServerSession.incoming_messages

    class LateEnd:
        def __init__(self, stream):
            self.stream = stream

        async def __aiter__(self):
            async for message in self.stream:
                yield message
            await anyio.sleep(LATE_END_S)

    monkeypatch.setattr(ServerSession, "incoming_messages", property(lambda session: LateEnd(incoming.fget(session))))
    backend, url, calls = long_images
    engine = backend.engine("image")
    caplog.set_level("INFO", logger="tools.mcp.server")
    sent = _cancel_mid_image(backend, url, calls, "http", "disconnect", True)
    free_after = _free_after(engine, sent)
    step, total, _ = calls[-1].progress
    assert total == STEPS and step < STEPS // 2, f"{step} of {total} steps ran"
    assert free_after < LATE_END_S  # freed by the closed stream, not by the late cancel
    assert "generate_image: the client went away; its job was cancelled" in caplog.text
