"""A non-distilled checkpoint's Image tab as a visitor first sees it: the model's own 50 steps and the Guidance
slider from the first paint (read from its model_index.json before the pipeline loads), and a number the visitor
types stays through the warm-up's end. The header names that checkpoint and no chat model.

Its own app process: ``--models full --no-chat`` on the tiny pipeline with ``is_distilled: false``, as
FLUX.2-klein-base-4B runs. Screenshot: test-artifacts/screenshots/base-checkpoint-first-view.png.
"""

from __future__ import annotations

import pytest
from support.browser import _shot, _wait_ready, open_page, running_app
from support.model_folders import non_distilled_copy

pytestmark = [pytest.mark.browser, pytest.mark.slow]

IN_VIEW_JS = """(selector) => {
  const r = document.querySelector(selector).getBoundingClientRect();
  return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight;
}"""


@pytest.fixture(scope="module")
def base_url(chromium, demo_models, tmp_path_factory):
    base = non_distilled_copy(demo_models.image, tmp_path_factory.mktemp("base-checkpoint") / "klein-base")
    with running_app("browser-base-app.log", "--models", "full", "--no-chat", "--image-model", str(base)) as url:
        yield url


def test_a_base_checkpoint_opens_with_its_steps_and_guidance_and_keeps_a_typed_number(browser, base_url):
    context, page = open_page(browser, base_url, "en-US")
    try:
        summary = page.locator("#page-header .summary")
        assert summary.inner_text().startswith("Draw with klein-base, run natively on Trainium")  # no chat here
        assert summary.is_visible() and "Qwen3" not in page.locator("#page-header").inner_text()
        page.locator("#image-tab-button").click()
        steps = page.locator("#image-steps input[type=number]")
        steps.wait_for()
        assert steps.input_value() == "50"
        guidance = page.locator("#image-guidance")
        assert guidance.is_visible() and page.evaluate(IN_VIEW_JS, "#image-steps")
        _shot(page, "base-checkpoint-first-view", full_page=False)
        steps.fill("3")
        steps.press("Tab")
        _wait_ready(page)  # every page-load and status update has come and gone
        page.wait_for_function("() => document.querySelector('#image-steps input[type=number]').value === '3'")
        assert steps.input_value() == "3" and guidance.is_visible()
    finally:
        context.close()
