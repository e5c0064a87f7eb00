#!/bin/bash
# Draws the captioning pictures for the docs from a trained `qkv train caption` run (scenes) and
# copies them into docs/img/: for each test image K, every generated word's cross-attention over
# the image (caption_attention.png: the last decoder layer, heads averaged); then a screenshot of
# the page on the first of them.
# Usage: docs/make_caption_pictures.sh RUN_DIR [K ...]   (default test images: 0 1; IMG=DIR: elsewhere)
# Needs Fashion-MNIST under $QKV_DATA_DIR and, for the screenshot, playwright and a Chromium
# (see docs/screenshot_page.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then sed -n 2,8p "$0"; exit 2; fi
R=$1; shift
if [ $# -gt 0 ]; then INDICES=("$@"); else INDICES=(0 1); fi
IMG=${IMG:-docs/img}  # where the pictures go
Q=${Q:-.venv/bin/qkv}
PY=${PY:-.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$IMG"
for K in "${INDICES[@]}"; do
  $Q explain "$R" --input "test:$K" --beam 1 --out "$T/$K" > /dev/null
  cp "$T/$K/caption_attention.png" "$IMG/caption_attention_test$K.png"
done
"$PY" docs/screenshot_page.py "$R" "test:${INDICES[0]}" "$IMG/page_caption.png" || echo "no screenshot (playwright/Chromium missing)"
echo "pictures in $IMG: caption_attention_test{$(IFS=,; echo "${INDICES[*]}")}.png, page_caption.png"
