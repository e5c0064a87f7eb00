#!/bin/bash
# Issue 47's accelerator call, run from the repository root on a GPU machine with no network:
#   1. the MFU of a GPT-2-small training step, alone on the GPU (benchmarks/mfu.py);
#   2. what each step of the demo learns: the candidates of `multi30k_sweep.py sweep race`, all
#      at once on the one GPU, each with the optimizer steps it makes in the demo's 10 minutes
#      on 2 CPU cores (validation BLEU only; the GPU's minutes mean nothing here).
# Carried: .whl/ (wheels the image lacks) and .gpudata/ (multi30k/ is all this reads).
#   OUT=/path DEADLINE=440 bash benchmarks/race_gpu.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-runs/race-gpu}
DEADLINE=${DEADLINE:-440}
mkdir -p "$OUT" /tmp/qkv-data
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
ln -sfn "$PWD/.gpudata/multi30k" /tmp/qkv-data/multi30k
export QKV_DATA_DIR=${QKV_DATA_DIR:-/tmp/qkv-data} PYTHONUNBUFFERED=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1
nvidia-smi -L
[ "${MFU:-1}" = 1 ] && timeout -s INT 90 python3 benchmarks/mfu.py --device cuda --workloads gpt2-small > "$OUT/mfu.log" 2>&1
[ "${MFU:-1}" = 1 ] && { grep -E "^\| |^matmul peak" "$OUT/mfu.log" || tail -5 "$OUT/mfu.log"; }
start=$(date +%s)
# shellcheck disable=SC2086  # NAMES: the candidates of this round, split at spaces (all: empty)
timeout -s INT "$DEADLINE" python3 benchmarks/multi30k_sweep.py sweep race ${NAMES:-} --device cuda --jobs 10 \
    --out /tmp/race > "$OUT/sweep.log" 2>&1
echo "sweep exit $? after $(( $(date +%s) - start )) s"
cat /tmp/race/race.md 2> /dev/null
# every candidate's validation rows, finished or not
for m in /tmp/race/race/*/metrics.jsonl; do
    echo "== $m"; grep val_bleu "$m"; grep -h '"step"' "$m" | tail -1
done > "$OUT/curves.txt" 2>&1
cat "$OUT/curves.txt"
tail -20 "$OUT/sweep.log"
