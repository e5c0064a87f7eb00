#!/bin/bash
# Draws the pictures of docs/walkthrough.md from three trained runs (see its last section) and
# copies them into docs/img/. Usage: docs/make_pictures.sh [RUNS_DIR]   (default: runs)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-runs}
Q=${Q:-.venv/bin/qkv}
T=$(mktemp -d)
$Q explain "$R/explain_mt" --input "Ein Mann fährt mit dem Fahrrad durch den Park." --out "$T/mt" > /dev/null
$Q explain "$R/explain_lm" --input $'ROMEO:\nBut soft, what light' --out "$T/lm" > /dev/null
$Q explain "$R/explain_amp" --input GIGKFLHSAKKFGKAFVGEIMNS --out "$T/amp" > /dev/null
mkdir -p docs/img
cp "$T/mt/steps.png" docs/img/steps_translation.png
cp "$T/mt/attention_encoder.png" docs/img/attention_encoder_translation.png
cp "$T/mt/positional_encoding.png" docs/img/positional_encoding_translation.png
cp "$T/mt/alignment.png" docs/img/alignment_translation.png
cp "$T/lm/attention_decoder.png" docs/img/attention_decoder_lm.png
cp "$T/lm/next_tokens.png" docs/img/next_tokens_lm.png
cp "$T/amp/classes.png" docs/img/classes_protein.png
cp "$T/amp/attention_encoder.png" docs/img/attention_encoder_protein.png
rm -rf "$T"
echo "pictures in docs/img (the page screenshot: python docs/screenshot_page.py, see docs/walkthrough.md)"
