"""The live page of a translation or caption run in headless Chromium (qkv.explain.live), against
qkv's own greedy decoding: a translator's first N test2016 sentences typed into the page against
`qkv translate --beam 1`; a captioner's N scenes composed in the page's grid (seeded random
layouts of the page's garments) against `qkv caption --beam 1` on the same pixels. Prints how many
are identical, the seconds until the page is ready, and any request outside the site or console
error.

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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image
from playwright.sync_api import Page, sync_playwright

from qkv.explain.live import write_live_page
from qkv.files import read_json
from qkv.runs.info import RunInfo


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def translations(page: Page, run: str, n: int, _: Path) -> Iterator[bool]:
    from qkv.data.translation import load_multi30k
    from qkv.inference.translator import Translator

    sentences = load_multi30k("test2016", "de", "en")[0][:n]
    expected = Translator.from_run(run, beam_size=1).translate(sentences)
    for sentence, want in zip(sentences, expected, strict=True):
        page.evaluate("document.body.dataset.done = '0'")
        page.fill("#prompt", sentence)
        page.click("#generate")
        page.wait_for_selector('body[data-done="1"]', timeout=120_000)
        yield page.locator("#output").inner_text() == want


def captions(page: Page, run: str, n: int, site: Path) -> Iterator[bool]:
    from qkv.inference.caption import Captioner

    captioner = Captioner.from_run(run, beam_size=1)
    sheet = np.asarray(Image.open(site / "model" / "garments.png"))
    meta = read_json(site / "model" / "garments.json")
    cell, rng = meta["cell"], np.random.default_rng(0)
    for _ in range(n):
        page.click("#empty")
        scene = np.zeros((2 * cell, 2 * cell, 1), np.uint8)
        cells = [i for i in range(4) if rng.random() < 0.6] or [int(rng.integers(4))]
        for at in cells:
            label, k = int(rng.integers(len(meta["nouns"]))), int(rng.integers(meta["per_class"]))
            page.click(f'#grid button[data-cell="{at}"]')
            page.click(f'#palette canvas[data-label="{label}"][data-index="{k}"]')
            row, col = divmod(at, 2)
            garment = sheet[label * cell : (label + 1) * cell, k * cell : (k + 1) * cell]
            scene[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell, 0] = garment
        page.wait_for_selector('body[data-done="1"]', timeout=120_000)
        yield page.locator("#output").inner_text() == captioner.caption(scene[None])[0]


def main(run: str, n: int, weights: str) -> None:
    chromium = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    recipe = RunInfo.read(Path(run)).recipe
    compare = {"translation": translations, "caption": captions}[recipe]
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
            same = sum(compare(page, run, n, site))
            browser.close()
        server.shutdown()
        megabytes = sum(f.stat().st_size for f in (site / "model").iterdir()) / 1e6
    outside = [u for u in requests if not u.startswith(base)]
    print(
        f"{megabytes:.1f} MB of model, ready in {ready:.1f} s; {same}/{n} identical to qkv's greedy "
        f"{recipe}; requests outside: {outside}"
    )
    print(f"console errors: {errors}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--n", type=int, default=20, help="sentences typed or scenes composed")
    parser.add_argument(
        "--weights", default="float32", help="float32, or float16 (stored; float32 arithmetic)"
    )
    args = parser.parse_args()
    main(args.run, args.n, args.weights)
