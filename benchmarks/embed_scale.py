"""``qkv embed`` at scale: sequences/s against a plain transformers loop, peak memory as the input
grows, and kill-and-resume to the same bytes.

The model: a random ESM-2-shaped encoder (transformers' ``EsmForMaskedLM``: d_model 64, 2 layers,
4 heads, d_ff 256, rotary positions, max_len 128, so 126 residues per window), saved as an HF
folder that both sides load: ``qkv embed`` converts it (qkv's encoder), the reference runs it in
transformers (``EsmModel``). Inputs of N sequences replicate the 17 shared RefSeq proteomes
(48,857 proteins, mean length 312), written to ``--work`` as a stream (ids suffixed with the
copy number).

For each N, one process at a time, on ``--threads`` torch threads:
- ``qkv embed MODEL FASTA --out DIR --quiet`` (mean of the last layer, default shard size): wall
  seconds from process start to exit, sequences/s, peak RSS of that process (``os.wait4``);
- the reference (this script with ``--hf-worker``): the same FASTA streamed in chunks of the
  same shard size, the SAME rows and length-sorted token-budget batches
  (:func:`qkv.inference.embed.plan_chunk`: overlapping windows, ``--max-tokens`` padded tokens
  per batch), ``EsmModel(...).last_hidden_state`` under ``torch.inference_mode``, pooled by the
  same :class:`~qkv.inference.embed.Pooler`; nothing written but the first chunk's means, which
  are compared with qkv's (max |difference|).
The ratio is qkv's sequences/s over the reference's (both end to end: start-up, model loading,
reading the FASTA; qkv also checks the whole file first and writes its shards).

Kill and resume (``--resume-check N``, default 1000): ``qkv embed`` with shards of
N/5 sequences is killed (SIGKILL) once its manifest lists two shards, run again to the end, and
its files are compared byte for byte with an uninterrupted run's.

Run from the repository root (the lead's sizes; 2 CPUs, one thread each side):
    QKV_DATA_DIR=../shared/data python benchmarks/embed_scale.py --sizes 10000 100000 1000000 --append-results
    QKV_DATA_DIR=../shared/data python benchmarks/embed_scale.py --sizes 2000     # a check, not a result
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "HISTORY.md"  # the dated record; RESULTS.md holds the current figures


def build_model(folder: Path) -> Path:
    """A random ESM-2-shaped ``EsmForMaskedLM`` (seed 0) saved as an HF folder with its vocabulary."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    import transformers

    from qkv.hub.fair_esm import ESM_ALPHABET

    torch.manual_seed(0)
    cfg = transformers.EsmConfig(
        vocab_size=len(ESM_ALPHABET),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
        position_embedding_type="rotary",
        token_dropout=True,
        mask_token_id=ESM_ALPHABET.index("<mask>"),
        pad_token_id=ESM_ALPHABET.index("<pad>"),
    )
    transformers.EsmForMaskedLM(cfg).eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(ESM_ALPHABET) + "\n", encoding="utf-8")
    return folder


INPUTS = {
    "proteomes": "the 17 RefSeq proteomes replicated (48,857 proteins, mean 312 residues)",
    "peptides": "the shared peptide sets but sol_han, replicated (short peptides)",
}


def source_files(source: str) -> list[Path]:
    """The FASTA files an input replicates: the 17 RefSeq proteomes, or the peptide sets (all but
    ``sol_han``, whose sequences are whole proteins)."""
    data = Path(os.environ.get("QKV_DATA_DIR", HERE.parent.parent / "shared" / "data"))
    if source == "peptides":
        files = sorted(p for p in (data / "peptides").glob("*/seqs.fasta") if p.parent.name != "sol_han")
    else:
        files = sorted((data / "refseq_proteomes").glob("*.faa"))
    if not files:
        raise SystemExit(f"no {source} FASTA files: set QKV_DATA_DIR to the shared data directory")
    return files


def write_fasta(path: Path, n: int, source: str = "proteomes") -> Path:
    """The first ``n`` records of ``source`` (:func:`source_files`) repeated (streamed: one
    record in memory)."""
    if path.is_file():
        return path
    from qkv.data.protein import fasta_entries, record_id

    files = source_files(source)
    tmp = path.with_suffix(".tmp")
    written, copy = 0, 0
    with open(tmp, "w") as out:
        while written < n:
            for k, f in enumerate(files):  # the file's index in the id: peptide sets share ids
                for title, seq, _ in fasta_entries(f):
                    if written == n:
                        break
                    out.write(f">{k}_{record_id(title)}_{copy}\n{seq}\n")
                    written += 1
            copy += 1
    tmp.rename(path)
    return path


def measure(cmd: list[str], threads: int) -> dict:
    """Run ``cmd`` to its end on ``threads`` threads: wall seconds and peak RSS (MB) of that
    process alone (``os.wait4``), its stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    t = time.perf_counter()
    with open(os.devnull, "w") as null:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=null, text=True, env=env)
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)  # reaps it: the peak RSS of this child alone
    wall = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed with exit status {code} (rerun it to see why)")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "stdout": out}


def qkv_embed(model: Path, fasta: Path, out: Path, args, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "qkv", "embed", str(model), str(fasta), "--out", str(out),
        "--max-tokens", str(args.max_tokens), "--device", "cpu", "--quiet", *extra,
    ]  # fmt: skip


def hf_worker(model: Path, fasta: Path, max_tokens: int, shard_size: int, means: Path) -> None:
    """The reference: transformers' EsmModel over qkv's rows and batches; saves the first chunk's
    mean vectors to ``means`` (``.npy``)."""
    import numpy as np
    import torch
    import transformers

    from qkv.data.protein import fasta_entries, record_id
    from qkv.data.tokenizers import protein_tokenizer
    from qkv.hub.convert import read_tokenizer
    from qkv.inference.embed import Pooler, plan_chunk

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hf = transformers.EsmModel.from_pretrained(model, add_pooling_layer=False).eval()
    tok = protein_tokenizer(read_tokenizer(model))
    width, last, d = hf.config.max_position_embeddings - 2, hf.config.num_hidden_layers, hf.config.hidden_size

    def run(chunk: list[tuple[str, str]]) -> np.ndarray:
        ids, seqs = [c[0] for c in chunk], [c[1] for c in chunk]
        plan = plan_chunk(tok, width, max_tokens, seqs, ids)
        pool = Pooler(plan, [last], d, per_residue=False)
        for batch in plan.batches:
            tokens = plan.tokens(batch, tok.pad_id)
            hidden = hf(input_ids=tokens, attention_mask=(tokens != tok.pad_id).long()).last_hidden_state
            pool.add(batch, {last: hidden})
        return pool.means()[last].numpy()

    chunk: list[tuple[str, str]] = []
    first = None
    with torch.inference_mode():
        for title, seq, _ in fasta_entries(fasta):
            chunk.append((record_id(title), seq))
            if len(chunk) == shard_size:
                result = run(chunk)
                first = result if first is None else first
                chunk = []
        if chunk:
            result = run(chunk)
            first = result if first is None else first
    assert first is not None  # the benchmark wrote at least one record
    np.save(means, first)


def resume_check(model: Path, work: Path, n: int, args) -> str:
    """Kill ``qkv embed`` (SIGKILL) once two shards are listed, rerun it; compare every file
    with an uninterrupted run's. Returns a one-line verdict."""
    import shutil

    fasta = write_fasta(work / f"in_proteomes_{n}.fasta", n)
    shard = str(max(n // 5, 1))
    whole, killed = work / f"resume_{n}_whole", work / f"resume_{n}_killed"
    for d in (whole, killed):
        shutil.rmtree(d, ignore_errors=True)
    measure(qkv_embed(model, fasta, whole, args, "--shard-size", shard), args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cmd = qkv_embed(model, fasta, killed, args, "--shard-size", shard)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    manifest = killed / "manifest.json"
    while proc.poll() is None:
        if manifest.is_file() and len(json.loads(manifest.read_text())["shards"]) >= 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    listed = len(json.loads(manifest.read_text())["shards"]) if manifest.is_file() else 0
    measure(cmd, args.threads)
    files = sorted(p.name for p in whole.iterdir())
    same = files == sorted(p.name for p in killed.iterdir()) and all(
        (whole / f).read_bytes() == (killed / f).read_bytes() for f in files
    )
    return (
        f"kill-and-resume: N={n}, shards of {shard}, SIGKILL with {listed} of {len(files) - 1} shards "
        f"written, rerun: {len(files)} files {'byte-identical' if same else 'DIFFERENT'} to an "
        "uninterrupted run"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2000])
    p.add_argument("--work", type=Path, default=Path("/tmp/qkv_embed_scale"))
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--shard-size", type=int, default=10000, help="qkv's default; the reference's chunk size")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--source",
        choices=("proteomes", "peptides"),
        default="proteomes",
        help="what the inputs replicate: the RefSeq proteomes (mean 312 residues) or the shared "
        "peptide sets (short: a million fit in minutes)",
    )
    p.add_argument("--resume-check", type=int, default=1000, help="N for the kill-and-resume check")
    p.add_argument("--append-results", action="store_true")
    p.add_argument("--hf-worker", nargs=3, metavar=("MODEL", "FASTA", "MEANS_NPY"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.hf_worker:
        model, fasta, means = map(Path, args.hf_worker)
        hf_worker(model, fasta, args.max_tokens, args.shard_size, means)
        return 0
    import shutil

    import numpy as np
    import torch
    import transformers
    from common import machine, publish  # noqa: E402  (benchmarks/common.py)

    from qkv.inference.embed import read_embeddings

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    model = build_model(args.work / "esm_tiny")
    rows = []
    for n in args.sizes:
        fasta = write_fasta(args.work / f"in_{args.source}_{n}.fasta", n, args.source)
        out, means = args.work / f"out_{n}", args.work / f"hf_means_{n}.npy"
        shutil.rmtree(out, ignore_errors=True)
        ours = measure(qkv_embed(model, fasta, out, args, "--shard-size", str(args.shard_size)), args.threads)
        ref_cmd = [sys.executable, __file__, "--hf-worker", str(model), str(fasta), str(means)]
        ref = measure(
            [*ref_cmd, "--max-tokens", str(args.max_tokens), "--shard-size", str(args.shard_size)],
            args.threads,
        )
        ids, ours_means = read_embeddings(out)
        first = np.load(means)
        diff = float(np.abs(ours_means[: len(first)] - first).max())
        shutil.rmtree(out)
        rate, ref_rate = n / ours["wall_s"], n / ref["wall_s"]
        rows.append(
            f"| {n:,} | {ours['wall_s']:,.1f} | {rate:,.0f} | {ours['peak_rss_mb']:,.0f} | "
            f"{ref['wall_s']:,.1f} | {ref_rate:,.0f} | {ref['peak_rss_mb']:,.0f} | "
            f"**{rate / ref_rate:.2f}** | {diff:.1e} |"
        )
        print(rows[-1], flush=True)
    verdict = resume_check(model, args.work, args.resume_check, args)
    rss = [float(r.split("|")[4].replace(",", "")) for r in rows]
    text = "\n".join(
        [
            f"## qkv embed at scale ({datetime.date.today()})",
            "",
            f"`python benchmarks/embed_scale.py {shlex.join(argv if argv is not None else sys.argv[1:])}` "
            f"on {machine()}, transformers {transformers.__version__}. A random ESM-2-shaped encoder "
            f"(d_model 64, 2 layers, max_len 128), mean of the last layer; {args.max_tokens} padded tokens "
            f"per batch, shards/chunks of {args.shard_size}; inputs: {INPUTS[args.source]}. "
            "Wall time end to end (process start to exit), one process at a time.",
            "",
            "| N | qkv s | qkv seq/s | qkv peak RSS MB | HF s | HF seq/s | HF peak RSS MB | qkv / HF "
            "| max abs diff of means |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"qkv peak RSS: largest / smallest = {max(rss) / min(rss):.3f}. {verdict}.",
        ]
    )
    publish(text, args.append_results, RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
