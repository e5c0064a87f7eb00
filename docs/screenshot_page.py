"""Screenshot of the explainer page for a run: python docs/screenshot_page.py RUN_DIR "input" OUT.png [TOKEN]

Starts the page on a free loopback port, types the input, waits for the attention of every
head, opens the step-through, and saves a full-page screenshot. For a ViT run the input is an
image file (uploaded) or ``test:K`` (test image ``K`` of the run's task). Needs the playwright
package and a Chromium (``QKV_CHROMIUM`` or ``chromium`` on PATH; Debian: apt-get install
chromium). With TOKEN (an index into the followed stack's tokens, negative from the end), the
picture is the "Follow a token through the block" card with that token chosen.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

from playwright.sync_api import sync_playwright

from qkv import load_explainer
from qkv.explain.server import create_app, serve_in_thread


def main(run_dir: str, text: str, out: str, token: str | None = None) -> None:
    chromium = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no Chromium found: set QKV_CHROMIUM or install chromium")
    explainer = load_explainer(run_dir)
    server, thread, base = serve_in_thread(create_app(explainer))
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(base + "/")
            if explainer.input_kind != "image":
                page.fill("#input", text)
                page.click("#run")
            elif re.fullmatch(r"test:\d+", text) and not os.path.exists(text):
                page.fill("#test-index", text.split(":")[1])
                page.dispatch_event("#test-index", "change")
                page.click("#run")
            else:
                page.set_input_files("#file", text)  # choosing a file runs the model
            page.wait_for_selector('body[data-ready="1"]', timeout=120_000)
            page.wait_for_selector('body[data-steps-ready="1"]', timeout=120_000)
            if token is None:
                page.screenshot(path=out, full_page=True)
            else:
                page.wait_for_selector('body[data-block-ready="1"]', timeout=120_000)
                buttons = page.locator("#block-tokens button")
                buttons.nth(int(token) % buttons.count()).click()
                page.locator("#block-card").screenshot(path=out)
            heads = page.locator("#overview .head").count()
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    print(f"{out}: {explainer.family} page, {heads} heads rendered")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__.splitlines()[0])
    main(*sys.argv[1:])
