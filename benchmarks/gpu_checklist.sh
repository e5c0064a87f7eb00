#!/bin/bash
# The standing GPU checklist (benchmarks/RESULTS.md, "The GPU checklist": its current figures; each
# run's dated section goes to benchmarks/HISTORY.md, by hand from $OUT/checklist.log) as
# one command for a GPU machine with no package registry and no network, run from the repository
# root. About 8.5 min on one H100 (16 CPU cores):
#   1. setup: carried wheels into /tmp/site, qkv from src/ (no `pip install -e .`: no build
#      backend can be fetched there), the carried data sets unpacked and checked against SHA256SUMS;
#   2. MFU of a training step, alone on the GPU (benchmarks/mfu.py);
#   3. at once, sharing the GPU (their wall times are upper bounds of each alone): the nanoGPT GPU
#      recipe, `make demo`'s command with a DEMO_MINUTES budget, the paper's translation recipe
#      (FULL_CONFIG, configs/paper_base.json: the file that was configs/multi30k_de_en.json on
#      2026-11-24) with a FULL_MINUTES budget (validation BLEU every 200 steps: minutes to BLEU 40),
#      the test suite, and the masked diffusion LM on the nanoGPT recipe's settings (`dlm`: the same
#      model, data, steps and schedule as `lm`, learned positions as there; issue 45).
# Every job is stopped (SIGINT, then SIGKILL) at DEADLINE seconds after the start, less MARGIN
# for the report; a time budget that no longer fits is shortened, and says so.
#
# What is carried (the machine copies only the working tree, and `carry` paths up to 64 MiB):
#   .whl/      wheels of what qkv and its tests import that the machine's image lacks (biopython,
#              fastapi, uvicorn, starlette, pydantic, ..., nbclient/ipykernel for the notebooks)
#   .gpudata/  README.md, SHA256SUMS, multi30k/, uniprot_mmseqs2/ as they are, and sets.tar.xz
#              (the other sets the tests read; fashion-mnist is left out: 29 MB)
# Run there (OUT: the folder whose files come back; at most 8 files, all written here):
#   OUT=/path bash benchmarks/gpu_checklist.sh
# $OUT gets checklist.log (this script's output and the final table), mfu.log, lm.log, dlm.log,
# demo.log, full.log, tests.log, summaries.json (each run's summary.json) and runs.tar.gz (each run's
# metrics.jsonl, settings and loss.png, the tests' JUnit XML, nvidia-smi every 10 s).
#
# Settings (environment):
#   DEADLINE=520 MARGIN=30        seconds: end of every job, and what is kept for the report
#   DEMO_MINUTES=5 FULL_MINUTES=5 training budgets of the two translation runs
#   FULL_CONFIG=configs/paper_base.json  settings of the second one
#   TEST_WORKERS=8 TESTS=tests    pytest -n (0: no pytest-xdist) and paths; TEST_ARGS: more
#                                 (both split at spaces: no quoted -k expression; name node ids in TESTS)
#   MFU_WORKLOADS="translation-base translation gpt2-small"  MFU_ARGS (e.g. "--steps 2")
#   MFU_TIMEOUT=150               seconds
#   JOBS="lm dlm demo full tests" which of the concurrent jobs run (MFU=0 skips the MFU)
#   R=/tmp/qkv-gpu                run directories (outside $OUT: only 8 files come back)
#   QKV_DATA_DIR                  if set, used as it is; else .gpudata/, unpacked into /tmp/qkv-data
#   SMOKE=1                       a CPU smoke test of this script on any machine: tiny budgets,
#                                 train.device=cpu, one test module (e.g. before spending GPU time)
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
OUT=${OUT:-runs/gpu-checklist}
R=${R:-/tmp/qkv-gpu}
DEADLINE=${DEADLINE:-520}
MARGIN=${MARGIN:-30}
DEMO_MINUTES=${DEMO_MINUTES:-5}
FULL_MINUTES=${FULL_MINUTES:-5}
FULL_CONFIG=${FULL_CONFIG:-configs/paper_base.json}
JOBS=${JOBS:-lm dlm demo full tests}
MFU=${MFU:-1}
MFU_TIMEOUT=${MFU_TIMEOUT:-150}
MFU_WORKLOADS=${MFU_WORKLOADS:-translation-base translation gpt2-small}
TESTS=${TESTS:-tests}
TEST_WORKERS=${TEST_WORKERS:-8}
TEST_ARGS=${TEST_ARGS:-}
if [ "${SMOKE:-0}" = 1 ]; then  # CPU: seconds of everything; shows that the script's pieces fit
    MFU_ARGS=${MFU_ARGS:---device cpu --precision fp32 --tokens 256 --steps 1 --repeats 1}
    MFU_WORKLOADS=translation
    TRAIN_EXTRA=${TRAIN_EXTRA:-train.device=cpu train.threads=1}
    MT_EXTRA=${MT_EXTRA:-test=false train.eval_every=20}
    LM_EXTRA=${LM_EXTRA:-train.compile=false train.max_steps=6 train.eval_every=3 eval_batches=2 \
model.n_layers=1 model.d_model=64 model.n_heads=2 model.d_ff=128 batch_size=4}
    DEMO_MINUTES=0.1 FULL_MINUTES=0.1
    TESTS=${SMOKE_TESTS:-tests/test_settings.py} TEST_WORKERS=${SMOKE_TEST_WORKERS:-0}
fi
MFU_ARGS=${MFU_ARGS:---device cuda}
TRAIN_EXTRA=${TRAIN_EXTRA:-}  # added to every `qkv train` (e.g. train.device=cpu)
MT_EXTRA=${MT_EXTRA:-}        # added to the two translation runs
LM_EXTRA=${LM_EXTRA:-}        # added to the language-model run

elapsed() { echo $(( $(date +%s) - T0 )); }
stamp() { echo "[$(elapsed) s] $*"; }
left() { echo $(( DEADLINE - MARGIN - $(elapsed) )); }  # seconds until the jobs' deadline

# fit_minutes WANT AFTER: WANT minutes, or fewer if training for WANT minutes plus AFTER seconds
# (start-up, final validation, test decoding) would run past the deadline.
fit_minutes() {
    python3 -c "import sys; want, after, left = map(float, sys.argv[1:]); \
print(f'{max(0.1, min(want, (left - after) / 60)):g}')" "$1" "$2" "$(left)"
}

declare -A PID   # job name -> the pid of its background subshell
job() {  # job NAME CMD...: CMD in the background, output to $OUT/NAME.log, stopped at the deadline
    local name=$1; shift
    local t=$(left)
    stamp "start $name (stopped after $t s): $*"
    (
        s=$(date +%s)
        timeout -s INT -k 20 "$t" "$@" > "$OUT/$name.log" 2>&1
        echo "$? $(( $(date +%s) - s ))" > "$R/$name.status"
    ) &
    PID[$name]=$!
}
want() { [[ " $JOBS " == *" $1 "* ]]; }

main() {
    mkdir -p "$R" || return 1
    stamp "setup"
    # 1. Packages: the carried wheels (none installs twice: one version of each is carried)
    if compgen -G ".whl/*.whl" > /dev/null && [ "${SMOKE:-0}" != 1 ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || { echo "wheel install failed"; return 1; }
        export PYTHONPATH=/tmp/site
    fi
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}  # qkv itself, from this tree
    # 2. Data: $QKV_DATA_DIR as given, else the carried .gpudata/ (the archive unpacked in /tmp,
    # so the working tree stays as it came)
    if [ -z "${QKV_DATA_DIR:-}" ]; then
        export QKV_DATA_DIR=/tmp/qkv-data
        mkdir -p "$QKV_DATA_DIR"
        for f in .gpudata/*; do
            case $f in
                *.tar.xz)  # Python's tarfile: the image may have no xz program
                    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
                        "$f" "$QKV_DATA_DIR" || echo "could not unpack $f" ;;
                *) ln -sfn "$PWD/$f" "$QKV_DATA_DIR/" ;;
            esac
        done
    fi
    (cd "$QKV_DATA_DIR" && sha256sum -c --ignore-missing --quiet SHA256SUMS) \
        && echo "data: $QKV_DATA_DIR: $(ls "$QKV_DATA_DIR" | tr '\n' ' ')(sha256 OK)" \
        || echo "data: $QKV_DATA_DIR: CHECKSUM MISMATCH OR MISSING (above)"
    export MPLBACKEND=Agg PYTHONUNBUFFERED=1
    export TQDM_MININTERVAL=15             # progress bars in the logs: a line every 15 s, not 10 a second
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there: fail at once, never wait
    if command -v nvidia-smi > /dev/null; then nvidia-smi -L; else echo "no nvidia-smi"; fi
    python3 - <<'PY' || { echo "qkv or torch does not import"; return 1; }
import platform, torch, qkv
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), {gpu}; "
      f"qkv from {qkv.__path__[0]}; {torch.get_num_threads()} CPU threads")
PY
    # The notebooks' tests need nbclient and a kernel; without them they are left out, said here.
    # 05 and 08 need the pretrained weights (not carried), 06 the Fashion-MNIST training set (not carried).
    local nb="--deselect tests/test_notebooks.py::test_notebook_runs_in_quick_mode[05_pretrained_encoder]"
    nb+=" --deselect tests/test_notebooks.py::test_notebook_runs_in_quick_mode[08_protein_research]"
    nb+=" --deselect tests/test_notebooks.py::test_notebook_runs_in_quick_mode[06_images_vit]"
    python3 -c "import nbclient, nbformat, ipykernel" 2> /dev/null \
        || { nb="--ignore=tests/test_notebooks.py"; echo "tests/test_notebooks.py left out: no nbclient/ipykernel"; }
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 10 \
            > "$R/gpu.csv" 2>&1 &
        local smi=$!
    fi

    # 3. MFU, alone on the GPU
    if [ "$MFU" = 1 ]; then
        stamp "mfu: $MFU_WORKLOADS"
        # shellcheck disable=SC2086  # word splitting of the lists is meant
        timeout -s INT -k 10 "$MFU_TIMEOUT" python3 benchmarks/mfu.py $MFU_ARGS --workloads $MFU_WORKLOADS \
            > "$OUT/mfu.log" 2>&1
        MFU_RC=$?
        grep -E "^\| |^matmul peak" "$OUT/mfu.log" || tail -5 "$OUT/mfu.log"
        stamp "mfu done (exit $MFU_RC)"
    fi

    # 4. The runs and the tests, all at once
    local demo full
    demo=$(fit_minutes "$DEMO_MINUTES" 75)
    full=$(fit_minutes "$FULL_MINUTES" 75)
    [ "$demo" != "$DEMO_MINUTES" ] && echo "demo budget shortened to $demo min to end before the deadline"
    [ "$full" != "$FULL_MINUTES" ] && echo "full budget shortened to $full min to end before the deadline"
    rm -rf "$R/lm" "$R/dlm" "$R/demo" "$R/full" "$R"/*.status "$R/tests.xml"
    # shellcheck disable=SC2086
    {
        want lm && job lm python3 -m qkv train lm --config configs/shakespeare_char_gpu.json --out "$R/lm" \
            train.max_minutes="$(fit_minutes 100 40)" $TRAIN_EXTRA $LM_EXTRA  # a backstop: 5,000 steps is the budget
        want dlm && job dlm python3 -m qkv train diffusion-lm --config configs/shakespeare_char_gpu.json \
            --out "$R/dlm" model.positional=learned train.max_minutes="$(fit_minutes 100 40)" $TRAIN_EXTRA $LM_EXTRA
        want demo && job demo python3 -m qkv train translation --out "$R/demo" \
            train.max_minutes="$demo" $TRAIN_EXTRA $MT_EXTRA
        want full && job full python3 -m qkv train translation --config "$FULL_CONFIG" \
            --out "$R/full" train.max_minutes="$full" train.eval_every=200 $TRAIN_EXTRA $MT_EXTRA
        local workers=""
        [ "$TEST_WORKERS" -gt 0 ] && workers="-n $TEST_WORKERS"
        want tests && job tests python3 -m pytest $TESTS $workers -p no:cacheprovider \
            --durations=15 -rfEs --junitxml="$R/tests.xml" --ignore=tests/test_server_fuzz.py $nb $TEST_ARGS
    }
    for name in "${!PID[@]}"; do wait "${PID[$name]}"; done
    [ -n "${smi:-}" ] && kill "$smi" 2> /dev/null
    stamp "all jobs done"

    # 5. What comes back: the summaries in one file, the rest of the run directories in a tarball
    python3 - "$R" "$OUT/summaries.json" <<'PY'
import json, sys
from pathlib import Path
root, out = Path(sys.argv[1]), Path(sys.argv[2])
result = {}
for name in ("lm", "dlm", "demo", "full"):
    run = root / name
    s = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else None
    rows = []
    if (run / "metrics.jsonl").is_file():
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "val_bleu" in r or "val_loss" in r]
    first40 = next((r for r in evals if r.get("val_bleu", 0) >= 40), None)
    result[name] = {"summary": s, "evaluations": evals, "first_val_bleu_40": first40}
out.write_text(json.dumps(result, indent=1))
PY
    (cd "$R" && tar -czf - --exclude='*.safetensors' --exclude='*.pt' --exclude='snapshots' \
        --exclude='*.bin' --exclude='tokenizer.json' lm dlm demo full tests.xml gpu.csv 2> /dev/null) > "$OUT/runs.tar.gz"

    # 6. The table
    echo
    echo "| job | exit | wall s | result |"
    echo "|---|---|---|---|"
    [ "$MFU" = 1 ] && echo "| mfu | $MFU_RC | - | $(grep -c '^| [a-z].*\*\*' "$OUT/mfu.log") workload rows in mfu.log |"
    for name in lm dlm demo full tests; do
        want "$name" || continue
        local rc=none wall=-
        [ -f "$R/$name.status" ] && read -r rc wall < "$R/$name.status"
        [ "$rc" = 124 ] && rc="124 (deadline)"
        local what
        if [ "$name" = tests ]; then
            what=$(grep -E "[0-9]+ (passed|failed|error)" "$OUT/tests.log" | tail -1)
        else
            what=$(python3 - "$OUT/summaries.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))[sys.argv[2]]
s = r["summary"]
if s is None:
    print("no summary.json (did not finish)")
    raise SystemExit
v = {k: round(x, 4) for k, x in s["validation"].items() if isinstance(x, float)}
parts = [f"{s['steps']} steps in {s['train_minutes']} min", f"validation {v}"]
t = s.get("test2016")
if t:
    parts.append("test2016 " + ", ".join(f"{k} {t[k]:.2f}" for k in ("bleu", "bleu_lowercase", "chrf") if k in t))
if r["first_val_bleu_40"]:
    f = r["first_val_bleu_40"]
    parts.append(f"val BLEU >= 40 first at step {f['step']}, {f.get('elapsed_min')} min")
print("; ".join(parts))
PY
)
        fi
        echo "| $name | $rc | $wall | ${what:-?} |"
    done
    stamp "end"
}

mkdir -p "$OUT" || exit 1
main 2>&1 | tee "$OUT/checklist.log"
exit "${PIPESTATUS[0]}"
