"""Corpora bigger than memory: what preparing and training cost as the corpus grows.

For each size (default 100 MB, 1 GB, 5 GB), two corpora are written by replicating real data:
text, tiny-shakespeare repeated; proteins, the UniProt + RefSeq FASTA records repeated, each
copy's ids suffixed so the records stay distinct (prepared with ``--keep-duplicates``, since
every copy repeats the same sequences). Then, one process at a time:

- ``qkv prepare lm`` (characters) and ``qkv prepare protein-mlm``: wall time and peak RSS;
- ``qkv train lm data=DIR`` (the baby GPT of ``qkv train lm``) and ``qkv train protein-mlm
  data=DIR`` (the default encoder) for a few steps: start-up (process start until the first
  training state is on disk, i.e. until training begins), peak RSS, and the loop's median
  tokens/s (the LM counts next-token targets, the MLM masked residues).

The corpus and its shards are deleted after each measurement (disk). ``--compare-mlm`` instead
trains a small protein encoder for 800 steps from the UniProt + RefSeq corpus in memory and from
its shards, seeds 1 and 2: the held-out perplexity of the two samplers side by side.
``--baseline`` also trains on tiny-shakespeare and the UniProt + RefSeq corpus through the
in-memory path and through shards of the same corpus, with the same settings: the tokens/s to
compare, and the validation loss (identical for the LM, which draws the same windows either way).

Run from the repository root, one thread (the figures compare within one run):
    QKV_DATA_DIR=../shared/data taskset -c 0 python benchmarks/scale_data.py --out runs/scale --baseline
    QKV_DATA_DIR=../shared/data taskset -c 1 python benchmarks/scale_data.py --out runs/mlmcmp --compare-mlm
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

LM = ["train.threads=1", "train.max_steps=300", "train.eval_every=1000", "eval_batches=10", "num_samples=1"]
MLM = [
    "train.threads=1",
    "train.max_steps=41",
    "train.eval_every=1000",
    "val_limit=256",
    "train.max_minutes=null",
]
SMALL_MLM = [
    "model.d_model=128",
    "model.n_heads=4",
    "model.d_ff=512",
    "model.n_layers=4",
    "model.max_len=256",
    "max_tokens=4096",
    "train.max_steps=800",
    "train.warmup_steps=100",
    "train.eval_every=200",
    "train.max_minutes=null",
    "train.threads=1",
]
SIZES = {"100M": 100 << 20, "1G": 1 << 30, "5G": 5 << 30}


def measure(cmd: list[str], watch: Path | None = None) -> dict:
    """Run ``cmd`` to its end: wall seconds, peak RSS (MB, of that process alone), seconds until
    ``watch`` first existed, and its stdout."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = None
    while True:  # os.wait4 (not Popen.wait) reaps it: the peak RSS of this child alone
        if watch is not None and seen is None and watch.exists():
            seen = round(time.perf_counter() - t, 2)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.01)
    wall = time.perf_counter() - t
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-1500:]}")
    return {
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "start_s": seen,
        "stdout": out,
    }


def qkv(*args: str) -> list[str]:
    return [sys.executable, "-m", "qkv", *args]


def write_text_corpus(path: Path, size: int) -> None:
    from qkv.data.text import load_corpus_path

    block = load_corpus_path("tinyshakespeare").read_bytes()
    with open(path, "wb") as out:
        for _ in range(max(1, size // len(block))):
            out.write(block)


def write_fasta_corpus(path: Path, size: int) -> None:
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    from qkv.data.protein import pretraining_files

    records = []
    for f in pretraining_files():
        with gzip.open(f, "rt") if f.suffix == ".gz" else open(f) as handle:
            records += [(t.split(None, 1)[0], s) for t, s in SimpleFastaParser(handle)]
    written, copy = 0, 0
    with open(path, "w") as out:
        while written < size:
            text = "".join(f">{rid}_{copy}\n{seq}\n" for rid, seq in records)
            out.write(text)
            written += len(text)
            copy += 1


def loop_rate(run: Path) -> float:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]  # the first holds warm-up
    return statistics.median(rates)


def train(kind: str, run: Path, settings: list[str]) -> dict:
    shutil.rmtree(run, ignore_errors=True)
    m = measure(qkv("train", kind, "--out", str(run), "--quiet", "--json", *settings), run / "train_state.pt")
    summary = json.loads(m.pop("stdout"))
    return {**m, "tokens_per_s": round(loop_rate(run)), "val_loss": summary["validation"]["val_loss"]}


def compare_mlm(out: Path) -> int:
    """Held-out perplexity of short protein-MLM runs, the corpus in memory vs its shards."""
    data = out / "shards"
    if not (data / "meta.json").is_file():
        measure(qkv("prepare", "protein-mlm", "--out", str(data), "--quiet"))
    for seed in (1, 2):
        for source, extra in (("memory", []), ("shards", [f"data={data}"])):
            run = out / f"{source}-{seed}"
            shutil.rmtree(run, ignore_errors=True)
            done = measure(
                qkv(
                    "train",
                    "protein-mlm",
                    "--out",
                    str(run),
                    "--quiet",
                    "--json",
                    *SMALL_MLM,
                    f"train.seed={seed}",
                    *extra,
                )
            )
            ppl = json.loads(done["stdout"])["validation"]["val_ppl"]
            print(f"{source} seed {seed}: held-out ppl {ppl:.3f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/scale"))
    ap.add_argument("--sizes", default="100M,1G,5G", help=f"of {', '.join(SIZES)}")
    ap.add_argument("--baseline", action="store_true", help="also compare with the in-memory path")
    ap.add_argument("--compare-mlm", action="store_true", help="only the in-memory vs shards MLM runs")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compare_mlm:
        return compare_mlm(args.out)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}

    def record(key: str, value: dict) -> None:
        results[key] = value
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        print(key, json.dumps(value), flush=True)

    if args.baseline:
        data = args.out / "shakespeare"
        shutil.rmtree(data, ignore_errors=True)
        measure(qkv("prepare", "lm", "tinyshakespeare", "--out", str(data), "--quiet"))
        record("lm/in-memory", train("lm", args.out / "run", LM))
        record("lm/shards", train("lm", args.out / "run", [*LM, f"data={data}"]))
        data = args.out / "uniprot"
        shutil.rmtree(data, ignore_errors=True)
        measure(qkv("prepare", "protein-mlm", "--out", str(data), "--quiet"))
        record("protein-mlm/in-memory", train("protein-mlm", args.out / "run", MLM))
        record("protein-mlm/shards", train("protein-mlm", args.out / "run", [*MLM, f"data={data}"]))
        shutil.rmtree(args.out / "shakespeare")
        shutil.rmtree(args.out / "uniprot")

    for name in args.sizes.split(","):
        size = SIZES[name]
        for kind, write, prepare, settings in (
            ("lm", write_text_corpus, ["lm"], LM),
            ("protein-mlm", write_fasta_corpus, ["protein-mlm", "--keep-duplicates"], MLM),
        ):
            corpus, data = args.out / f"corpus-{kind}", args.out / f"data-{kind}"
            shutil.rmtree(data, ignore_errors=True)
            write(corpus, size)
            prep = measure(qkv("prepare", *prepare, str(corpus), "--out", str(data), "--quiet"))
            meta = json.loads((data / "meta.json").read_text())
            corpus_mb = round(corpus.stat().st_size / 2**20)
            corpus.unlink()
            row = {
                "corpus_mb": corpus_mb,
                "tokens": sum(meta["tokens"].values()),
                "shards_mb": round(sum(p.stat().st_size for p in data.rglob("*.bin")) / 2**20),
                "prepare_s": prep["wall_s"],
                "prepare_rss_mb": prep["peak_rss_mb"],
            }
            trained = train(kind, args.out / "run", [*settings, f"data={data}"])
            record(f"{kind}/{name}", {**row, **{f"train_{k}": v for k, v in trained.items()}})
            shutil.rmtree(data)
    shutil.rmtree(args.out / "run", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
