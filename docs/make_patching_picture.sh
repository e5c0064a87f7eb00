#!/bin/bash
# Draws docs/img/patching_lm.png, the activation-patching table of docs/guides/explain.md
# ("Intervene"): notebook 12's character LM (the lm recipe, 500 steps, the notebook's settings)
# at a speaker's colon of the validation text, each name in capitals (clean) against the same
# line with the name in lower case (corrupted). Usage: docs/make_patching_picture.sh [LM_RUN]
# (default: train that run into a temporary folder, about a minute and a half on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
RUN=${1:-}
if [ -z "$RUN" ]; then
  RUN="$T/lm"
  .venv/bin/qkv train lm --quiet --out "$RUN" train.max_steps=500 train.eval_every=500 eval_batches=20 > /dev/null
fi
"$PY" - "$RUN" <<'EOF'
import re
import sys

import torch

import qkv
from qkv.data.lm import corpus_splits
from qkv.explain import activation_patching
from qkv.explain.plots import plot_patching, save

lm, chars = qkv.load(sys.argv[1])
lm.eval()
_, val_text = corpus_splits("tinyshakespeare", None, 0.1)
NEWLINE, SPACE = chars.encode("\n")[0], chars.encode(" ")[0]
CONTEXT = 16  # characters up to and including the colon, as in notebook 12
# the first half's speaker names of nine letters (PETRUCHIO, KATHARINA, ...), as in notebook 12
same = [
    m.span(1)
    for m in re.finditer(r"\n\n([A-Z][A-Z ]+):\n", val_text)
    if m.start(1) >= CONTEXT and m.start() < len(val_text) // 2 and m.end(1) - m.start(1) == 9
]


def lines(lower: bool) -> torch.Tensor:
    rows = []
    for start, end in same:
        name = val_text[start:end]
        name = name[0] + name[1:].lower() if lower else name
        rows.append(chars.encode(val_text[end + 1 - CONTEXT : start] + name + ":"))
    return torch.tensor(rows)


def newline_vs_space(out) -> torch.Tensor:
    logp = out.logits[:, -1].log_softmax(-1)
    return (logp[:, NEWLINE] - logp[:, SPACE]).mean()


table = activation_patching(lm, lines(False), lines(True), newline_vs_space, point="resid_pre")
first_line = val_text[same[0][1] + 1 - CONTEXT : same[0][1] + 1]
labels = [{"\n": "⏎", " ": "␣"}.get(c, c) for c in first_line]
fig = plot_patching(table, labels=labels, metric="log p(⏎) - log p(␣) after the colon")
print(save(fig, "docs/img/patching_lm.png"))
EOF
