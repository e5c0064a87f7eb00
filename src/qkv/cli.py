"""The ``qkv`` command line: one verb per user intent.

Human-readable progress goes to stderr; results (translations, JSON) go to stdout. Errors are
one line on stderr with a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from .errors import QkvError


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cmd_train(args) -> int:
    if args.recipe != "translation":
        raise QkvError(f"unknown recipe {args.recipe!r}; available: translation")
    from .recipes.translation import resolve_config, train_translation

    overrides = list(args.overrides)
    for flag in ("max_steps", "max_minutes"):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{flag}={value}")
    recipe = resolve_config(args.config, overrides)
    try:
        summary = train_translation(recipe, args.out, resume=args.resume, progress=not args.quiet, log=_log)
    except KeyboardInterrupt:
        _log(f"interrupted: the last checkpoint is in {args.out}; continue with the same command plus --resume")
        return 130
    test = summary["test2016"]
    _log(f"\nexample translations (test2016, beam {test['beam_size']}):")
    for ex in test["examples"][:3]:
        _log(f"  DE:  {ex['src']}\n  REF: {ex['ref']}\n  QKV: {ex['hyp']}")
    _log(f"\ntest2016 BLEU {test['bleu']:.2f} (lowercased {test['bleu_lowercase']:.2f}, chrF "
         f"{test['chrf']:.2f}) after {summary['train_minutes']:.1f} min of training; "
         f"run directory: {Path(args.out).resolve()}")
    print(json.dumps({k: v for k, v in summary.items()}, ensure_ascii=False))
    return 0


def _read_inputs(args) -> list[str]:
    if args.text:
        return list(args.text)
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise QkvError(f"standard input is not valid UTF-8 (byte {exc.start}: "
                       f"{data[exc.start:exc.start + 1]!r})") from None
    return text.splitlines()


def _cmd_translate(args) -> int:
    from .generate.translator import Translator

    from .device import resolve_device

    translator = Translator.from_run(args.run_dir, device=resolve_device(args.device),
                                     beam_size=args.beam, alpha=args.alpha)
    for line in translator.translate(_read_inputs(args)):
        print(line, flush=False)
    return 0


def _cmd_evaluate(args) -> int:
    from .recipes.translation import evaluate_run

    from .device import resolve_device

    result = evaluate_run(args.run_dir, args.split, args.beam, args.alpha, args.limit,
                          device=resolve_device(args.device))
    result.pop("examples")
    print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkv", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model with a recipe")
    p.add_argument("recipe", help="recipe name: translation")
    p.add_argument("overrides", nargs="*", help="key=value settings (see the recipe's fields)")
    p.add_argument("--config", help="JSON file of settings (overridden by key=value)")
    p.add_argument("--out", required=True, help="run directory to create (or continue with --resume)")
    p.add_argument("--resume", action="store_true", help="continue training in --out")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--max-minutes", type=float, help="stop after this many minutes of training")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("translate", help="translate text with a trained run")
    p.add_argument("run_dir")
    p.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy; default 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (default 0.6)")
    p.add_argument("--device", default="auto", help="auto (CUDA, MPS, else CPU), cpu, cuda, ...")
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser("evaluate", help="score a run on a data split (JSON on stdout)")
    p.add_argument("run_dir")
    p.add_argument("--split", default="test2016", help="train, val or test2016 (default)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--limit", type=int, help="score only the first N sentences")
    p.add_argument("--device", default="auto", help="auto (CUDA, MPS, else CPU), cpu, cuda, ...")
    p.set_defaults(func=_cmd_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        return args.func(args)
    except KeyboardInterrupt:
        _log("interrupted")
        return 130
    except (QkvError, ValueError, OSError) as exc:
        if args.debug:
            raise
        _log(f"error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
