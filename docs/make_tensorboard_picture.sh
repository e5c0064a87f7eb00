#!/bin/bash
# Draws docs/img/tensorboard_runs.png, the TensorBoard picture of docs/guides/tracking.md: two
# short runs of the lm recipe (300 steps of a 2-layer character model, learning rates 1e-3 and
# 3e-3) logged with train.log_to=tensorboard, shown by `tensorboard --logdir RUNS` and
# photographed by headless Chromium (playwright), the learning rate and loss charts of the Time Series page.
# Usage: docs/make_tensorboard_picture.sh [RUNS]  (RUNS: a folder of such runs to show; default:
# train the two into a temporary folder, about two minutes each on 2 cores).
# Needs qkv[tensorboard], playwright and a Chromium (QKV_CHROMIUM or chromium on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BIN=$(dirname "$PY")
T=$(mktemp -d)
TB=
trap '[ -n "$TB" ] && kill "$TB"; rm -rf "$T"' EXIT
RUNS=${1:-}
if [ -z "$RUNS" ]; then
  RUNS="$T/runs"
  for lr in 1e-3 3e-3; do
    "$BIN/qkv" train lm --quiet --out "$RUNS/lr$lr" --max-steps 300 train.lr=$lr train.warmup_steps=30 \
      train.eval_every=25 eval_batches=8 model.n_layers=2 num_samples=1 sample_tokens=100 \
      train.log_to=tensorboard > /dev/null
  done
fi
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN/tensorboard" --logdir "$RUNS" --host 127.0.0.1 --port "$PORT" 2> "$T/tensorboard.log" &
TB=$!
"$PY" - "http://127.0.0.1:$PORT" docs/img/tensorboard_runs.png <<'EOF'
import os
import shutil
import sys
import time
import urllib.parse
import urllib.request

from playwright.sync_api import sync_playwright

base, out = sys.argv[1:]
for _ in range(120):  # TensorBoard takes a few seconds to start and read the event files
    try:
        urllib.request.urlopen(base + "/data/runs", timeout=2)
        break
    except OSError:
        time.sleep(0.5)
chromium = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 610})
    # the charts of the learning rate, the training loss and the validation loss
    page.goto(base + "/?tagFilter=" + urllib.parse.quote("^(lr|train_loss|val_loss)$") + "#timeseries")
    page.wait_for_selector("canvas, svg.line-chart, .line-chart", timeout=60_000)
    settings = page.locator("button:has-text('Settings')")
    if settings.count():  # its side pane is open at first: closed, the charts get the width
        settings.first.click()
    time.sleep(5)  # the charts draw their lines after the data arrives
    page.screenshot(path=out)
    browser.close()
print(out)
EOF
