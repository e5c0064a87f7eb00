"""Behaviour unchanged at the command line: every verb's ``--help`` and a set of refusals, recorded
from one checkout and compared with another's, byte for byte.

A refactoring that moves code must not change what a user sees: the help of ``qkv`` and of every
verb and sub-verb (found by walking the parser, so a new verb is covered without editing this
file), and the one-line refusals of bad input (their text and exit status). Paths in the output
are replaced by placeholders, so two checkouts in different folders compare.

Run (from the repository root, ``$QKV_DATA_DIR`` pointing at the shared data):
    PYTHONPATH=/path/to/old/checkout/src .venv/bin/python benchmarks/cli_surface.py record runs/cli-old
    .venv/bin/python benchmarks/cli_surface.py record runs/cli-now
    .venv/bin/python benchmarks/cli_surface.py compare runs/cli-old runs/cli-now
``compare`` exits 0 when every file is identical, 1 otherwise (and shows the first difference).
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LM = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1", "model.max_len=16"]
LM += ["batch_size=4", "train.eval_every=1000", "train.threads=1"]

# name → arguments of a command that must be refused ({run}: a finished tiny LM run, {tmp}: a
# scratch folder, {missing}: a path that does not exist)
REFUSALS = {
    "unknown-recipe": ["train", "no-such-recipe", "--out", "{tmp}/x"],
    "unknown-key": ["train", "lm", "--out", "{tmp}/x", "no_such_key=1"],
    "bad-type": ["train", "lm", "--out", "{tmp}/x", "train.max_steps=ten"],
    "out-exists": ["train", "lm", "--out", "{run}", "train.max_steps=1"],
    "resume-other-recipe": ["train", "translation", "--out", "{run}", "--resume"],
    "resume-other-model": ["train", "lm", "--out", "{run}", "--resume", "model.d_model=32"],
    "resume-missing": ["train", "lm", "--out", "{missing}", "--resume"],
    "generate-missing-run": ["generate", "{missing}", "--prompt", "a"],
    "translate-lm-run": ["translate", "{run}", "Ein Hund."],
    "evaluate-bad-split": ["evaluate", "{run}", "--split", "nope"],
    "evaluate-missing": ["evaluate", "{missing}"],
    "generate-negative-tokens": ["generate", "{run}", "--prompt", "a", "--max-new-tokens", "-1"],
    "embed-missing-input": ["embed", "{missing}.fasta", "--model", "{run}", "--out", "{tmp}/e"],
    "convert-missing": ["convert", "{missing}", "{tmp}/c"],
    "explain-missing": ["explain", "{missing}", "--input", "a", "--html", "{tmp}/p.html"],
    "explain-lm-pair": ["explain", "{run}", "--input", "a", "--pair", "b", "--html", "{tmp}/p.html"],
    "dry-run-unknown-key": ["train", "lm", "--out", "{tmp}/d", "--dry-run", "no_such_key=1"],
}


def qkv(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qkv", *args], capture_output=True, text=True, env=env)


def verbs() -> list[list[str]]:
    """Every command path of the parser: ``[]`` (``qkv`` itself), ``["train"]``,
    ``["convert", "hf"]``, ..."""
    from qkv.cli import build_parser

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        found.append(path)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])

    walk(build_parser(), [])
    return found


def recipes() -> list[str]:
    from qkv.recipes.registry import RECIPES

    return list(RECIPES)


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": "100"}
    for path in verbs():
        done = qkv(*path, "--help", env=env)
        name = "help-" + ("-".join(path) or "qkv")
        (out / f"{name}.txt").write_text(f"rc {done.returncode}\n{done.stdout}{done.stderr}")
    for recipe in recipes():  # every recipe's resolved defaults: the settings trees
        done = qkv("train", recipe, "--print-config", env=env)
        (out / f"config-{recipe}.txt").write_text(f"rc {done.returncode}\n{done.stdout}{done.stderr}")
    with tempfile.TemporaryDirectory() as tmp:
        run = f"{tmp}/lm"
        done = qkv("train", "lm", "--out", run, "--quiet", "train.max_steps=2", *LM)
        if done.returncode:
            sys.exit(f"the tiny LM run failed:\n{done.stderr[-2000:]}")
        places = {"{run}": run, "{tmp}": tmp, "{missing}": f"{tmp}/missing"}
        for name, args in REFUSALS.items():
            args = [_fill(a, places) for a in args]
            done = qkv(*args, env=env)
            text = f"rc {done.returncode}\n{done.stdout}{done.stderr}".replace(tmp, "TMP")
            (out / f"refusal-{name}.txt").write_text(text)
    print(f"{len(list(out.iterdir()))} files in {out}")


def _fill(arg: str, places: dict[str, str]) -> str:
    for key, value in places.items():
        arg = arg.replace(key, value)
    return arg


def compare(old: Path, new: Path) -> int:
    names = sorted({p.name for p in old.iterdir()} | {p.name for p in new.iterdir()})
    bad = 0
    for name in names:
        a, b = old / name, new / name
        if not (a.is_file() and b.is_file()):
            print(f"{name}: only in {old if a.is_file() else new}")
            bad += 1
        elif a.read_text() != b.read_text():
            bad += 1
            diff = difflib.unified_diff(a.read_text().splitlines(), b.read_text().splitlines(), lineterm="")
            print(f"{name}: differs\n" + "\n".join(list(diff)[:12]))
    print(f"{len(names) - bad} of {len(names)} identical")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("record").add_argument("out", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
