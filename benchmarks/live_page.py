"""The live page of a translation run in headless Chromium (qkv.explain.live): the first N test2016
sentences typed into it against `qkv translate --beam 1`, the seconds until the page is ready,
and any request outside the site or console error.

    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/live_page.py RUN [--n N] [--weights float16]

Needs playwright and a Chromium (QKV_CHROMIUM or chromium on PATH), and `pip install 'qkv[onnx]'`.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from qkv.data.translation import load_multi30k
from qkv.explain.live import write_live_page
from qkv.inference.translator import Translator


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def main(run: str, n: int, weights: str) -> None:
    chromium = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    sentences = load_multi30k("test2016", "de", "en")[0][:n]
    expected = Translator.from_run(run, beam_size=1).translate(sentences)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        write_live_page(run, site, weights=weights)
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_port}/"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            errors: list[str] = []
            requests: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("request", lambda req: requests.append(req.url))
            t0 = time.perf_counter()
            page.goto(base)
            page.wait_for_selector('body[data-ready="1"]', timeout=120_000)
            ready = time.perf_counter() - t0
            same = 0
            for sentence, want in zip(sentences, expected, strict=True):
                page.evaluate("document.body.dataset.done = '0'")
                page.fill("#prompt", sentence)
                page.click("#generate")
                page.wait_for_selector('body[data-done="1"]', timeout=120_000)
                same += page.locator("#output").inner_text() == want
            browser.close()
        server.shutdown()
    outside = [u for u in requests if not u.startswith(base)]
    print(
        f"ready in {ready:.1f} s; {same}/{n} identical to qkv translate --beam 1; requests outside: {outside}"
    )
    print(f"console errors: {errors}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--n", type=int, default=20, help="test2016 sentences to type")
    parser.add_argument(
        "--weights", default="float32", help="float32, or float16 (stored; float32 arithmetic)"
    )
    args = parser.parse_args()
    main(args.run, args.n, args.weights)
