#!/bin/bash
# The issue-4 protein runs, as measured on 2 CPU cores: pretraining, then three single-thread
# chains side by side (fine-tune/probe, FLIP fine-tune/probe, scratch). Table: benchmarks/protein_results.py runs
set -u
export QKV_DATA_DIR=${QKV_DATA_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data}
Q=${Q:-.venv/bin/qkv}
M=runs/protein_mlm
mkdir -p runs
$Q train protein-mlm --out $M --quiet precision=fp32 max_steps=3300 max_minutes=85 eval_every=300 > runs/protein_mlm.log 2>&1
(
$Q train protein-cls --task signalp --init $M --out runs/signalp_finetune --quiet baseline=false threads=1 max_tokens=2048 max_epochs=8 max_minutes=13 eval_every=500 > runs/signalp_finetune.log 2>&1
$Q train protein-cls --task signalp --init $M --freeze --out runs/signalp_probe --quiet baseline=false threads=1 max_tokens=4096 max_epochs=10 max_minutes=4 eval_every=500 > runs/signalp_probe.log 2>&1
$Q train protein-cls --task amp-scanner --init $M --out runs/amp_finetune --quiet baseline=false threads=1 max_tokens=1024 max_epochs=20 max_minutes=6 eval_every=100 > runs/amp_finetune.log 2>&1
$Q train protein-cls --task amp-scanner --init $M --freeze --out runs/amp_probe --quiet baseline=false threads=1 max_tokens=1024 max_epochs=20 max_minutes=2 eval_every=100 > runs/amp_probe.log 2>&1
$Q train protein-cls --task amp-scanner --out runs/amp_scratch --quiet threads=1 max_tokens=1024 max_epochs=20 max_minutes=6 eval_every=100 > runs/amp_scratch.log 2>&1
) &
(
$Q train protein-residue --task secondary-structure --init $M --out runs/flip_finetune --quiet baseline=false threads=1 max_tokens=8192 max_epochs=2 max_minutes=18 eval_every=150 > runs/flip_finetune.log 2>&1
$Q train protein-residue --task secondary-structure --init $M --freeze --out runs/flip_probe --quiet baseline=false threads=1 max_tokens=8192 max_epochs=2 max_minutes=7 eval_every=150 > runs/flip_probe.log 2>&1
) &
(
$Q train protein-cls --task signalp --out runs/signalp_scratch --quiet threads=1 max_tokens=2048 max_epochs=8 max_minutes=13 eval_every=500 > runs/signalp_scratch.log 2>&1
$Q train protein-residue --task secondary-structure --out runs/flip_scratch --quiet threads=1 max_tokens=8192 max_epochs=2 max_minutes=18 eval_every=150 > runs/flip_scratch.log 2>&1
) &
wait
