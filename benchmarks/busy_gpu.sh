#!/bin/bash
# Issue 56's accelerator call, from the repository root on a GPU machine of 16 CPUs with no
# network (.whl/ and .gpudata/ carried, as for benchmarks/gpu_checklist.sh, which says what they
# hold). All at once, on CPU sets that do not overlap:
#   CPUs 4-15: the 10-minute race, 3 seeds of each recipe, six 2-CPU runs at once
#              (benchmarks/race_seeds.py; started in a session of its own, so that it outlives
#              this call: collect it with `python3 benchmarks/race_seeds.py report --out /tmp/race`);
#   CPUs 0-3:  two qkv training runs sharing the GPU against one alone, before and after
#              (benchmarks/busy_machine.py --device cuda), then the standing GPU checklist.
#   OUT=/path CHECKLIST_DEADLINE=400 bash benchmarks/busy_gpu.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-runs/busy-gpu}
mkdir -p "$OUT" /tmp/qkv-data
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site QKV_DATA_DIR=/tmp/qkv-data MPLBACKEND=Agg PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
ln -sfn "$PWD"/.gpudata/{multi30k,uniprot_mmseqs2,README.md,SHA256SUMS} "$QKV_DATA_DIR"/
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    .gpudata/sets.tar.xz "$QKV_DATA_DIR"
lscpu > "$OUT/lscpu.txt"
grep -E "^Model name|^CPU\(s\)|^Thread|^Flags" "$OUT/lscpu.txt" | cut -c1-200
setsid nohup python3 benchmarks/race_seeds.py run --out /tmp/race --parallel 6 --skip-cpus 4 train.device=cpu \
    > /tmp/race.log 2>&1 < /dev/null &
taskset -c 0-3 python3 benchmarks/busy_machine.py --device cuda --workloads train --policies before default \
    --scenarios alone two --seconds 10 --setup 20 2>&1 | tee "$OUT/busy_gpu.md"
# the checklist's nine files in one (at most 8 files come back from the machine)
taskset -c 0-3 env OUT=/tmp/checklist DEADLINE="${CHECKLIST_DEADLINE:-400}" MFU_TIMEOUT=90 TEST_WORKERS=4 \
    TEST_ARGS="--ignore=tests/test_emoji.py" bash benchmarks/gpu_checklist.sh > /dev/null 2>&1
tar -czf "$OUT/checklist.tar.gz" -C /tmp checklist
tail -12 /tmp/checklist/checklist.log
