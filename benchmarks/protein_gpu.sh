#!/bin/bash
# The issue-4 protein runs on one GPU, as measured on one NVIDIA H100 (16 CPU cores): 6.5 min.
# Phase A: MLM pretraining of a 25.5 M-parameter encoder (d_model 512, 8 layers, bf16 autocast)
#   beside the scratch SignalP / AMP runs and the composition / window + LR baselines (CPU,
#   written to $R/baselines.json: task runs here use baseline=false).
# Phase B: fine-tune and probe from the MLM, and FLIP scratch, all at once on the GPU.
# Scratch and fine-tune each try two peak learning rates; the run with the better validation
# metric is the one reported (linked as <task>_<mode>, read by benchmarks/protein_results.py).
#   QKV_DATA_DIR=/path/to/shared/data R=runs/gpu bash benchmarks/protein_gpu.sh
#   python benchmarks/protein_results.py runs/gpu
# MLM_STEPS / MLM_MINUTES: pretraining steps (the cosine decay ends there) and a wall-clock backstop.
# SCRATCH=0 skips the scratch runs and the baselines (they do not depend on the MLM), e.g. to
# re-run only pretraining + fine-tune + probe with a longer pretraining.
set -u
export QKV_DATA_DIR=${QKV_DATA_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data}
Q=${Q:-qkv}
R=${R:-runs/gpu}
mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

ARCH="d_model=512 n_heads=8 d_ff=2048 n_layers=8 max_len=256"   # the MLM's network, for scratch
C="--quiet precision=bf16 threads=1 baseline=false"
SP="--task signalp max_tokens=4096 max_epochs=15 eval_every=300 max_minutes=6"
AMP="--task amp-scanner max_tokens=2048 max_epochs=30 eval_every=100 max_minutes=6"
SS="--task secondary-structure max_tokens=16384 max_epochs=5 eval_every=155 max_minutes=3.5"
M=$R/protein_mlm
MLM_STEPS=${MLM_STEPS:-1400}
MLM_MINUTES=${MLM_MINUTES:-4.5}
SCRATCH=${SCRATCH:-1}

run() {  # run NAME ARGS...: one training run, logged, timed
    local name=$1; shift
    local t=$(date +%s)
    "$@" --out "$R/$name" > "$R/$name.log" 2>&1
    stamp "$name done (rc $?, $(( $(date +%s) - t )) s)"
}

# Phase A
stamp "phase A"
[ "$SCRATCH" = 1 ] && python3 - > "$R/baselines.json" 2> "$R/baselines.log" <<'PY' &
import json
from qkv.data.protein_tasks import load_task
from qkv.evaluate.baselines import baseline_metrics
out = {}
for key, task, level in [("signalp", "signalp", "sequence"), ("amp", "amp-scanner", "sequence"),
                         ("flip", "secondary-structure", "residue")]:
    out[key] = baseline_metrics(load_task(task, level), "test")
print(json.dumps(out, indent=1, default=float))
PY
run protein_mlm $Q train protein-mlm $ARCH --quiet precision=bf16 threads=4 max_tokens=32768 \
    lr=8e-4 min_lr_ratio=0.05 warmup_steps=150 max_steps=$MLM_STEPS max_minutes=$MLM_MINUTES eval_every=350 &
MLM_PID=$!
if [ "$SCRATCH" = 1 ]; then
run signalp_scratch_lr1e-3 $Q train protein-cls $SP $ARCH $C lr=1e-3 &
run signalp_scratch_lr3e-4 $Q train protein-cls $SP $ARCH $C lr=3e-4 &
run amp_scratch_lr1e-3 $Q train protein-cls $AMP $ARCH $C lr=1e-3 &
run amp_scratch_lr3e-4 $Q train protein-cls $AMP $ARCH $C lr=3e-4 &
fi
wait $MLM_PID

# Phase B
stamp "phase B"
run flip_finetune $Q train protein-residue $SS --init $M $C &
run flip_probe $Q train protein-residue $SS --init $M --freeze $C &
[ "$SCRATCH" = 1 ] && run flip_scratch $Q train protein-residue $SS $ARCH $C &
run signalp_finetune_lr3e-4 $Q train protein-cls $SP --init $M $C lr=3e-4 &
run signalp_finetune_lr1e-4 $Q train protein-cls $SP --init $M $C lr=1e-4 &
run signalp_probe $Q train protein-cls $SP --init $M --freeze $C &
run amp_finetune_lr3e-4 $Q train protein-cls $AMP --init $M $C lr=3e-4 &
run amp_finetune_lr1e-4 $Q train protein-cls $AMP --init $M $C lr=1e-4 &
run amp_probe $Q train protein-cls $AMP --init $M --freeze $C &
wait
stamp "all done"

# Pick each lr-tried mode's run by its validation metric (never by test), as <task>_<mode>
python3 - "$R" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
for task, key in (("signalp", "mcc"), ("amp", "accuracy")):
    for mode in ("scratch", "finetune"):
        runs = [(json.loads((d / "summary.json").read_text())["validation"][key], d.name)
                for d in root.glob(f"{task}_{mode}_lr*") if (d / "summary.json").is_file()]
        if runs:
            score, name = max(runs)
            link = root / f"{task}_{mode}"
            if link.is_symlink():
                link.unlink()
            link.symlink_to(name)
            print(f"{task}_{mode}: {name} (validation {key} {score:.4f}; tried "
                  + ", ".join(f"{n} {s:.4f}" for s, n in sorted(runs)) + ")")
PY
