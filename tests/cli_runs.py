"""Running qkv as a user does, for the refusal and run-directory tests: ``python -m qkv`` in a
subprocess, a directory's files hashed, a refusal checked to be one clean line."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))

# a language model small enough for a run of a few steps in seconds
TINY_LM = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_layers=1",
    "model.max_len=32",
    "batch_size=4",
    "eval_batches=1",
    "num_samples=1",
    "sample_tokens=4",
    "train.eval_every=3",
    "train.precision=fp32",
]

# a translation run of seconds on the first 300 Multi30k pairs
TINY_TRANSLATION = [
    "train_limit=300",
    "val_limit=8",
    "vocab_size=200",
    "model.d_model=16",
    "model.n_heads=2",
    "model.d_ff=32",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "model.max_len=64",
    "max_tokens=512",
    "test=false",
    "train.eval_every=3",
    "train.snapshot_minutes=0",
    "train.keep_snapshots=3",
    "train.warmup_steps=2",
    "train.precision=fp32",
]


def tiny_mlm_run(run: Path) -> Path:
    """A tiny protein-mlm run directory in ``run`` (random weights, seed 0) to start probes,
    LoRA and fine-tunes from."""
    import torch

    from qkv.data.tokenizers import AminoAcidTokenizer
    from qkv.files import save_weights, write_json
    from qkv.models.config import EncoderConfig
    from qkv.models.encoder import EncoderModel

    run.mkdir(parents=True)
    cfg = EncoderConfig(
        vocab_size=AminoAcidTokenizer().vocab_size,
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_layers=1,
        max_len=64,
        pad_id=1,
        dropout=0.0,
        positional="rotary",
    )
    torch.manual_seed(0)
    save_weights(EncoderModel(cfg), run / "model.safetensors")
    write_json(run / "config.json", cfg.to_dict())
    write_json(run / "train_config.json", {"recipe": "protein-mlm"})
    AminoAcidTokenizer().save(run / "tokenizer.json")
    return run


# ESM's residue vocabulary (its vocab.txt, in order): tiny ESM checkpoints' tokenizer
ESM_VOCAB = ["<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO", ".", "-", "<null_1>", "<mask>"]


def tiny_gpt2_folder(folder: Path, sentences: list[str]) -> Path:
    """A random-init (seed 0) tiny GPT-2 saved by ``transformers`` into ``folder`` with a
    byte-level BPE tokenizer of 300 pieces learnt from ``sentences``: what ``qkv convert`` and
    ``--init`` read from an HF folder. GPT-2's default start/end id (50256) lies outside this
    vocabulary, so the converted config names none."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(sentences * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    cfg = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2, n_head=2, n_positions=64
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """``qkv.cli.main(args)`` in this process: ``(exit status, stdout, stderr)``."""
    from qkv.cli import main

    capsys.readouterr()
    code = main(list(args))
    res = capsys.readouterr()
    return code, res.out, res.err


def qkv(
    *args: str, cwd: Path | None = None, data: Path = DATA, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m qkv ARGS`` (one thread, no stdin) from ``cwd``, with ``data`` as the data
    directory and ``env`` over the environment."""
    env = {**os.environ, "QKV_DATA_DIR": str(Path(data).resolve()), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "qkv", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def digest(run: Path) -> dict[str, str]:
    """Every file under ``run`` (hidden ones too) → SHA-256 of its bytes."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def refused(done: subprocess.CompletedProcess | tuple[int, str, str], *needles: str) -> str:
    """Assert a clean refusal of a command run by :func:`qkv` or :func:`run_main`: exit 2, one
    line on stderr starting ``error:``, no traceback, nothing on stdout; return the line."""
    if isinstance(done, tuple):
        done = subprocess.CompletedProcess((), *done)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not done.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def huge_png_header(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A PNG whose header claims width x height: enough for the guard, which must refuse it
    before decoding (the pixel data is not even there)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )
    return path
