#!/bin/bash
# Draws the ViT pictures for the docs from a trained `qkv train vit` run and copies them into
# docs/img/: for each test image K, the class token's attention over the image in the last
# layer (every head), the attention rollout and the class probabilities; then a screenshot of
# the page on the first of them.
# Usage: docs/make_vit_pictures.sh RUN_DIR [K ...]   (default test images: 0 1 2; IMG=DIR: elsewhere)
# Needs the run's data (Fashion-MNIST under $QKV_DATA_DIR) and, for the screenshot, playwright
# and a Chromium (see docs/screenshot_page.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then sed -n 2,7p "$0"; exit 2; fi
R=$1; shift
if [ $# -gt 0 ]; then INDICES=("$@"); else INDICES=(0 1 2); fi
IMG=${IMG:-docs/img}  # where the pictures go
Q=${Q:-.venv/bin/qkv}
PY=${PY:-.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
LAYERS=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["n_layers"])' "$R/config.json")
mkdir -p "$IMG"
for K in "${INDICES[@]}"; do
  $Q explain "$R" --input "test:$K" --out "$T/$K" > /dev/null
  cp "$T/$K/attention_layer$LAYERS.png" "$IMG/vit_attention_test$K.png"
  cp "$T/$K/rollout.png" "$IMG/vit_rollout_test$K.png"
  cp "$T/$K/classes.png" "$IMG/vit_classes_test$K.png"
done
"$PY" docs/screenshot_page.py "$R" "test:${INDICES[0]}" "$IMG/page_vit.png"
echo "pictures in $IMG: vit_{attention,rollout,classes}_test{$(IFS=,; echo "${INDICES[*]}")}.png, page_vit.png"
