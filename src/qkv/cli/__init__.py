"""The ``qkv`` command line: one verb per user intent.

Human-readable progress goes to stderr; results (translations, JSON) go to stdout. Errors are
one line on stderr with a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from ..errors import QkvError


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _StderrHandler(logging.Handler):
    """Log records to stderr through ``tqdm.write``, so a progress bar is redrawn below them
    instead of being broken; warnings and errors say so."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        msg = record.getMessage()
        if record.name == "py.warnings":  # "file:line: Category: message" and the source line
            msg = msg.strip().splitlines()[0]
        if record.levelno >= logging.WARNING:
            msg = f"{record.levelname.lower()}: {msg}"
        tqdm.write(msg, file=sys.stderr)


def _setup_logging(quiet: bool, debug: bool) -> None:
    """The library logs to ``logging.getLogger("qkv")``; the CLI shows INFO and up on stderr
    (``--quiet``: warnings only, ``--debug``: everything), and Python warnings the same way."""
    handler = _StderrHandler()
    for name in ("qkv", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    logging.captureWarnings(True)


# train options that are settings (``--max-steps N`` is ``train.max_steps=N``, ``--task X`` is ``task=X``)
SETTING_FLAGS = {
    "max_steps": "train.max_steps",
    "max_minutes": "train.max_minutes",
    "task": "task",
    "init": "init",
    "labels": "labels",
}


def _cmd_train(args) -> int:
    from ..recipes.registry import get
    from ..settings import resolve, to_dict

    recipe_kind = get(args.recipe)
    if recipe_kind.train is None or recipe_kind.settings is None:
        raise QkvError(f"{args.recipe!r} runs are converted (qkv convert hf), not trained")
    overrides = list(args.overrides)
    for flag, key in SETTING_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.freeze:
        overrides.append("freeze=true")
    base = _saved_settings(args.out, args.recipe) if args.resume else None
    # The named recipe's settings dataclass (Recipe.settings is typed `type`: any recipe's).
    recipe: Any = resolve(recipe_kind.settings, args.config, overrides, base=base)
    if args.print_config:
        print(json.dumps(to_dict(recipe), indent=2, ensure_ascii=False))
        return 0
    if recipe.train.lora_rank and not recipe_kind.adapters:
        raise QkvError(
            f"train.lora_rank adapts a pretrained model; {args.recipe!r} runs train from random weights "
            "(LoRA: lm, text-cls, protein-cls, protein-residue with --init)"
        )
    if args.out is None:
        raise QkvError("qkv train needs --out RUN_DIR (where the run is written)")
    from ..train import distributed

    ctx = distributed.init(recipe.train.device)  # under torchrun: join its processes
    created = not Path(args.out).exists()
    finished = False
    try:
        summary = recipe_kind.train(recipe, args.out, resume=args.resume, progress=not args.quiet)
        finished = True
    except Exception:  # refused (or failed) before its first checkpoint: leave nothing behind
        if created and ctx.is_main:
            _remove_unstarted(Path(args.out))
        raise
    except KeyboardInterrupt:
        if ctx.is_main:
            _log(
                f"interrupted: the last checkpoint is in {args.out}; continue with the same command "
                "plus --resume"
            )
        return 130
    finally:
        distributed.shutdown(finished=finished)
    if ctx.is_main:
        if recipe_kind.summary is not None:
            _log("\n" + recipe_kind.summary(summary, Path(args.out)))
        # stdout holds the result alone, so it pipes: the scores as JSON on request (the same
        # object as summary.json), else the run directory, what every next command takes.
        print(json.dumps(summary, ensure_ascii=False) if args.json else Path(args.out).resolve())
    return 0


def _saved_settings(run_dir: str | None, recipe: str) -> dict | None:
    """The settings a run of ``recipe`` saved in ``train_config.json``: what ``--resume``
    starts from (``--config`` and ``key=value`` still override them). ``None`` where there is
    none to read; the recipe's checks then say what is wrong with the directory."""
    from ..recipes.common import PROVENANCE, read_run_json

    try:
        saved = read_run_json(Path(run_dir or ""), "train_config.json")
    except QkvError:
        return None
    if saved.get("recipe") != recipe:
        return None
    return {k: v for k, v in saved.items() if k not in PROVENANCE}


def _remove_unstarted(out: Path, started_by: str | None = "train_state.pt") -> None:
    """Remove a directory this command created if it was refused before the file
    ``started_by`` was written (a refused command leaves nothing behind); a run with a training
    state is kept. ``None``: removed whatever it holds."""
    import shutil

    if out.is_dir() and not (started_by and (out / started_by).exists()):
        shutil.rmtree(out, ignore_errors=True)


def _read_inputs(args) -> list[str]:
    if args.text:
        for i, text in enumerate(args.text):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:  # bytes the shell passed that are not UTF-8
                raise QkvError(f"argument {i + 1} is not valid UTF-8 (character {exc.start})") from None
        return list(args.text)
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise QkvError(
            f"standard input is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
    return text.splitlines()


def _cmd_prepare(args) -> int:
    # options left out take the library's defaults (declared once, in qkv.data.prepare)
    given = {
        k: getattr(args, k)
        for k in ("val_fraction", "shard_tokens", "vocab_size", "bpe_sample_chars", "seed", "val_corpus")
        if getattr(args, k) is not None
    }
    created = not Path(args.out).exists()
    try:
        meta = _prepare(args, given)
    except QkvError:  # refused: a directory this command created is left out, not half-made
        if created:
            _remove_unstarted(Path(args.out), started_by=None)
        raise
    tokens, seqs = meta["tokens"], meta["sequences"]
    _log(
        f"{tokens['train']:,} training and {tokens['val']:,} validation tokens "
        f"({seqs['train']:,} and {seqs['val']:,} sequences) in {len(meta['splits']['train'])} + "
        f"{len(meta['splits']['val'])} shard(s) of {meta['dtype']}; train with data={args.out}"
    )
    print(Path(args.out).resolve())
    return 0


def _prepare(args, given: dict) -> dict:
    from ..data import prepare

    if args.kind == "lm":
        if args.keep_duplicates:
            raise QkvError("--keep-duplicates: for qkv prepare protein-mlm (a text is one stream)")
        tokenizer = args.tokenizer or "char"
        return prepare.prepare_lm(
            args.inputs, args.out, tokenizer=tokenizer, progress=not args.quiet, **given
        )
    lm_only = sorted({"vocab_size", "bpe_sample_chars", "seed", "val_corpus"} & given.keys())
    if lm_only or args.tokenizer:
        flags = [f"--{k.replace('_', '-')}" for k in lm_only] + (["--tokenizer"] if args.tokenizer else [])
        raise QkvError(f"{', '.join(flags)}: for qkv prepare lm (proteins are read residue by residue)")
    return prepare.prepare_protein_mlm(
        args.inputs, args.out, dedup=not args.keep_duplicates, progress=not args.quiet, **given
    )


def _cmd_translate(args) -> int:
    from ..device import resolve_device
    from ..generate.translator import Translator

    translator = Translator.from_run(
        args.run_dir, device=resolve_device(args.device), beam_size=args.beam, alpha=args.alpha
    )
    for line in translator.translate(_read_inputs(args)):
        print(line, flush=False)
    if args.verbose:
        sys.stdout.flush()
        assert translator.last_stats is not None  # translate() sets it
        print(translator.last_stats.summary("sentences"), file=sys.stderr)
    return 0


def _cmd_evaluate(args) -> int:
    from ..device import resolve_device
    from ..recipes.registry import kind_of

    kind = kind_of(args.run_dir)
    if kind.evaluate is None:
        raise QkvError(f"{args.run_dir} is a {kind.name!r} run, which qkv evaluate does not score")
    given = {"beam_size": args.beam, "alpha": args.alpha, "limit": args.limit}
    given = {k: v for k, v in given.items() if v is not None}
    if unused := [k for k in given if k not in kind.evaluate_options]:
        flags = ", ".join("--" + {"beam_size": "beam"}.get(k, k) for k in unused)
        raise QkvError(f"{flags}: not an option of a {kind.name} run's evaluation")
    if args.limit is not None and args.limit < 1:
        raise QkvError(f"--limit must be >= 1 (got {args.limit})")
    split = args.split or kind.splits[0]
    if split not in kind.splits:
        raise QkvError(f"a {kind.name} run has the splits {', '.join(kind.splits)} (got --split {split})")
    result = kind.evaluate(args.run_dir, split, device=resolve_device(args.device), **given)
    result.pop("examples", None)  # the scores only; summary.json keeps examples
    print(json.dumps(result))
    return 0


class _PromptEcho:
    """Streams one sample to stdout, the prompt echoed with its first new text: a prompt or
    setting the generator refuses leaves nothing on stdout."""

    def __init__(self, prompt: str) -> None:
        self.prompt, self.echoed = prompt, False

    def __call__(self, row: int, text: str) -> None:
        if not self.echoed:
            sys.stdout.write(self.prompt)
            self.echoed = True
        sys.stdout.write(text)
        sys.stdout.flush()

    def end(self) -> None:
        self(0, "\n")


def _cmd_generate(args) -> int:
    import torch

    from ..device import resolve_device, resolve_precision
    from ..generate.lm import TextGenerator

    device = resolve_device(args.device)
    quantize = "int8" if args.dtype == "int8" else None
    names = {"auto": "auto", "float32": "fp32", "bfloat16": "bf16", "int8": "bf16"}
    precision, why = resolve_precision(names[args.dtype], device, decoding=True)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    logging.getLogger("qkv.cli").debug(
        f"dtype: {args.dtype if quantize else str(dtype).removeprefix('torch.')} ({why})"
    )
    if (args.run_dir is None) == (args.model is None):
        raise QkvError("give a run directory or --model NAME|PATH (a pretrained language model)")
    if args.num_samples < 1 or args.max_new_tokens < 0:
        raise QkvError(
            f"--num-samples must be >= 1 and --max-new-tokens >= 0 (got {args.num_samples} and "
            f"{args.max_new_tokens})"
        )
    gen = TextGenerator.from_run(args.run_dir or args.model, device=device, dtype=dtype, quantize=quantize)
    temperature = 1.0 if args.temperature is None else args.temperature
    if args.top_probs is not None:
        if args.top_probs < 1:
            raise QkvError(f"--top-probs must be >= 1 (got {args.top_probs})")
        for token, prob in gen.next_token_probs(args.prompt, args.top_probs, temperature, args.top_p):
            print(f"{prob:.4f}\t{token!r}")
        return 0
    do_sample = not args.greedy
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---", file=sys.stderr, flush=True)
        echo = _PromptEcho(args.prompt)
        gen.generate(
            [args.prompt],
            args.max_new_tokens,
            do_sample,
            temperature,
            args.top_k,
            args.top_p,
            stop=args.stop,
            seed=None if args.seed is None else args.seed + i,
            stream=echo,
        )
        echo.end()
        if args.verbose:
            sys.stdout.flush()
            assert gen.last_stats is not None  # generate() sets it
            print(gen.last_stats.summary(), file=sys.stderr)
    sys.stdout.flush()
    return 0


def _read_protein_file(path: str):
    from ..data.protein import read_fasta

    records = read_fasta(path)
    return [r.id for r in records], [r.sequence for r in records]


def _classify_images(args) -> int:
    from ..device import resolve_device
    from ..generate.vision import ImageClassifier

    classifier = ImageClassifier.from_run(args.run_dir, resolve_device(args.device))
    probs = classifier.predict(classifier.read(args.inputs))  # every file read before any output
    out = sys.stdout
    out.write("\t".join(["id", "label", *(f"p_{c}" for c in classifier.classes)]) + "\n")
    for path, p in zip(args.inputs, probs, strict=True):
        out.write("\t".join([path, classifier.classes[int(p.argmax())], *(f"{x:.4f}" for x in p)]) + "\n")
    out.flush()
    return 0


def _classify_texts(args) -> int:
    if len(args.inputs) != 1:
        raise QkvError("a text classifier takes one text file (one text per line)")
    texts = _read_lines(args.inputs[0])
    encoder = _text_encoder(args.run_dir, args.device)
    probs = encoder.predict(texts)
    out = sys.stdout
    out.write("\t".join(["text", "label", *(f"p_{c}" for c in encoder.classes)]) + "\n")
    for text, p in zip(texts, probs, strict=True):
        out.write("\t".join([text, encoder.classes[int(p.argmax())], *(f"{x:.4f}" for x in p)]) + "\n")
    out.flush()
    return 0


def _cmd_classify(args) -> int:
    from ..device import resolve_device
    from ..generate.protein import ProteinEncoder
    from ..recipes.registry import RECIPES, kind_of

    kind = kind_of(args.run_dir)
    if not kind.classifier:
        heads = ", ".join(name for name, r in RECIPES.items() if r.classifier)
        raise QkvError(
            f"{args.run_dir} is a {kind.name} run, without a task head; classify needs a run of {heads}"
        )
    if kind.inputs == "image":
        return _classify_images(args)
    if kind.inputs == "text":
        return _classify_texts(args)
    if len(args.inputs) != 1:
        raise QkvError("a protein classifier takes one FASTA file")
    encoder = ProteinEncoder.from_run(args.run_dir, resolve_device(args.device))
    if encoder.level == "mlm":
        raise QkvError(
            f"{args.run_dir} is a pretrained encoder without a task head; classify needs a "
            "protein-cls or protein-residue run"
        )
    ids, seqs = _read_protein_file(args.inputs[0])
    probs = encoder.predict(seqs, ids)
    out = sys.stdout
    if encoder.level == "sequence":
        out.write("\t".join(["id", "label", *(f"p_{c}" for c in encoder.classes)]) + "\n")
        for i, p in zip(ids, probs, strict=True):
            out.write("\t".join([i, encoder.classes[int(p.argmax())], *(f"{x:.4f}" for x in p)]) + "\n")
    else:
        out.write("id\tlabels\n")  # one class letter per residue
        for i, p in zip(ids, probs, strict=True):
            out.write(f"{i}\t{''.join(encoder.classes[k] for k in p.argmax(1))}\n")
    out.flush()
    return 0


def _read_lines(path: str) -> list[str]:
    """Non-empty lines of a UTF-8 text file (``-``: standard input)."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise QkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        lines = [line.strip() for line in data.decode("utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise QkvError(f"{path} is not valid UTF-8 (byte {exc.start})") from None
    lines = [line for line in lines if line]
    if not lines:
        raise QkvError(f"{path} holds no text")
    return lines


def _text_encoder(source: str, device: str):
    from ..device import resolve_device
    from ..generate.text import TextEncoder

    return TextEncoder.load(source, resolve_device(device))


def _save_embeddings(out: str, vectors, ids: list[str], source: str, extra: dict | None = None) -> None:
    import torch
    from safetensors.torch import save_file

    from ..train.checkpoint import atomic_write

    tensors = {"mean": torch.from_numpy(vectors).contiguous(), **(extra or {})}
    metadata = {"ids": json.dumps(ids, ensure_ascii=False), "model": source}
    atomic_write(Path(out), lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _cmd_embed(args) -> int:
    import torch

    from ..device import resolve_device

    if args.model is not None:  # a pretrained text encoder: one text per line
        if len(args.inputs) != 1:
            raise QkvError("with --model, give one text file (one sentence per line)")
        texts = _read_lines(args.inputs[0])
        vectors = _text_encoder(args.model, args.device).embed(texts)
        _save_embeddings(args.out, vectors, texts, str(args.model))
        _log(
            f"{len(texts)} sentence embeddings of width {vectors.shape[1]} (mean pooling, L2-normalised) "
            f"-> {args.out} (tensor 'mean', texts in metadata 'ids')"
        )
        return 0
    if len(args.inputs) != 2:
        raise QkvError("give RUN_DIR FASTA (a protein encoder), or --model NAME TEXT_FILE")
    from ..generate.protein import ProteinEncoder

    run_dir, fasta = args.inputs
    encoder = ProteinEncoder.from_run(run_dir, resolve_device(args.device))
    ids, seqs = _read_protein_file(fasta)
    pooled, residues = encoder.embed(seqs, ids, per_residue=args.per_residue)
    # residues is empty without --per-residue: then there is nothing extra to save
    extra = {f"residues/{i}": torch.from_numpy(r).contiguous() for i, r in zip(ids, residues, strict=False)}
    _save_embeddings(args.out, pooled, ids, str(Path(run_dir).resolve()), extra)
    _log(
        f"{len(ids)} embeddings of width {pooled.shape[1]} -> {args.out} (tensor 'mean', ids in metadata"
        + (", per-residue tensors 'residues/<id>')" if args.per_residue else ")")
    )
    return 0


def _cmd_similarity(args) -> int:
    print(f"{_text_encoder(args.model, args.device).similarity(args.first, args.second):.4f}")
    return 0


def _cmd_search(args) -> int:
    corpus = _read_lines(args.corpus)
    for score, i in _text_encoder(args.model, args.device).search(args.query, corpus, args.top_k):
        print(f"{score:.4f}\t{corpus[i]}")
    return 0


def _cmd_convert(args) -> int:
    from ..hub.convert import export_hf, import_hf

    if args.to == "hf":
        if len(args.paths) != 2:
            raise QkvError("usage: qkv convert --to hf RUN_DIR HF_DIR")
        out = export_hf(*args.paths)
        _log(
            f"wrote {out} (config.json, model.safetensors, tokenizer.json): load it with "
            f"transformers' from_pretrained"
        )
        return 0
    if len(args.paths) != 3 or args.paths[0] != "hf":
        raise QkvError("usage: qkv convert hf HF_DIR|NAME RUN_DIR  (or: qkv convert --to hf RUN_DIR HF_DIR)")
    from ..hub.pretrained import is_short_name, locate

    source, run_dir = args.paths[1:]
    folder, tokenizer, settings = locate(source) if is_short_name(source) else (source, None, {})
    conv = import_hf(folder, run_dir, args.tokenizer or tokenizer, settings)
    n = sum(p.numel() for p in conv.model.parameters())
    _log(
        f"{conv.family.name} ({', '.join(sorted(conv.parts))}; {n / 1e6:.1f} M parameters) -> {run_dir}\n"
        f"next: qkv convert --to hf {run_dir} HF_DIR"
    )
    return 0


def _decoding_options(args):
    from ..explain.explainers import DecodingOptions

    return DecodingOptions(
        beam_size=args.beam,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


def _check_explain_options(args, info: dict) -> None:
    """Refuse ``qkv explain`` options outside the model, before any picture is written."""
    layers, heads = info["n_layers"], info["n_heads"]
    problems = []
    if not -layers <= args.layer < layers:
        problems.append(
            f"--layer {args.layer} is outside the model's layers 0..{layers - 1} (or -1 for the last)"
        )
    if not 1 <= args.head <= heads:
        problems.append(f"--head {args.head} is outside the model's heads 1..{heads}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        problems.append(
            f"--temperature must be a finite number >= 0, 0 meaning greedy (got {args.temperature})"
        )
    if args.beam < 1:
        problems.append(f"--beam must be >= 1 (got {args.beam})")
    if problems:
        raise QkvError("; ".join(problems))


def _cmd_explain(args) -> int:
    from ..device import resolve_device
    from ..explain.loader import load_explainer

    if args.max_chars is not None and args.max_chars < 1:
        raise QkvError(f"--max-chars must be >= 1 (got {args.max_chars})")
    if args.max_tokens < 1:
        raise QkvError(f"--max-tokens must be >= 1 (got {args.max_tokens})")
    if args.serve == (args.input is not None):
        raise QkvError(
            "give either --input TEXT (an image file for a vit run; with --out DIR and/or --html FILE) "
            "or --serve"
        )
    if args.serve and args.html:
        raise QkvError("--html writes the page of one --input; --serve serves the interactive page")
    if not args.serve and args.out is None and args.html is None:
        raise QkvError("--input needs --out DIR (PNG pictures) or --html FILE (a standalone page), or both")
    from ..explain.explainers import DEFAULT_MAX_CHARS
    from ..explain.standalone import UNCAPPED_CHARS

    # A standalone page cuts its input to --max-tokens (and says so): no character cap by default.
    max_chars = args.max_chars or (UNCAPPED_CHARS if args.html else DEFAULT_MAX_CHARS)
    explainer = load_explainer(args.run_dir, resolve_device(args.device), max_chars=max_chars)
    if args.serve:
        from ..explain.server import serve

        return serve(explainer, host=args.host, port=args.port)
    _check_explain_options(args, explainer.info())
    if args.pair is not None and explainer.family != "text":
        raise QkvError(f"--pair is for sentence encoders (text runs); this is a {explainer.family} model")
    if args.html is not None:
        from ..explain.standalone import show

        page = show(
            explainer,
            args.input,
            pair=args.pair,
            options=_decoding_options(args),
            max_tokens=args.max_tokens,
            merge_words=not args.pieces,
        )
        for note in page.notes:
            _log(f"note: {note}")
        print(page.save(args.html))
    if args.out is not None:
        from ..explain.plots import write_pictures

        text = args.input if args.pair is None else f"{args.input} ||| {args.pair}"
        for path in write_pictures(
            explainer,
            text,
            args.out,
            _decoding_options(args),
            merge_words=not args.pieces,
            layer=args.layer,
            head=args.head - 1,
        ):
            print(path)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (``error: ...``, exit 2) instead of a usage
    block; ``--help`` still shows the usage."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _device_option(p: argparse.ArgumentParser, default: str = "auto") -> None:
    """``--device``, as every command that runs a model takes it."""
    where = (
        "auto (CUDA, MPS, else CPU), cpu, cuda, ..."
        if default == "auto"
        else f"{default} (default), cuda, ..."
    )
    p.add_argument("--device", default=default, help=where)


def _search_options(
    p: argparse.ArgumentParser, beam: int | None, alpha: float | None = None, length_penalty: bool = True
) -> None:
    """``--beam`` and (with ``length_penalty``) ``--alpha``: translation's beam search (§6.1),
    with these defaults (``None``: the option's absence can be told apart)."""
    p.add_argument("--beam", type=int, default=beam, help="translation: beam size (1 = greedy; default 4)")
    if length_penalty:
        p.add_argument("--alpha", type=float, default=alpha, help="translation: length penalty (default 0.6)")


def _sampling_options(
    p: argparse.ArgumentParser, max_new_tokens: int, temperature: float | None, seed: int | None
) -> None:
    """How a language model samples its continuation, with these defaults."""
    p.add_argument(
        "--max-new-tokens", type=int, default=max_new_tokens, help="LM: length of the continuation"
    )
    p.add_argument(
        "--temperature", type=float, default=temperature, help="LM: sampling temperature (default 1.0)"
    )
    p.add_argument("--top-k", type=int, help="LM: sample only among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="LM: sample only in the nucleus of probability p, 0 < p <= 1")
    p.add_argument("--seed", type=int, default=seed, help="LM: random seed for reproducible samples")


def build_parser() -> argparse.ArgumentParser:
    from ..explain.standalone import MAX_TOKENS
    from ..recipes.registry import RECIPES, trainable

    parser = _Parser(prog="qkv", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show debug messages and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("train", help="train a model with a recipe")
    p.add_argument("recipe", help="recipe name: " + ", ".join(trainable()))
    p.add_argument(
        "overrides",
        nargs="*",
        help="settings as dotted key=value (model.d_model=256 train.lr=3e-4 src_lang=fr); "
        "a key of one section may be given flat (d_model=256)",
    )
    p.add_argument("--config", help="JSON file of settings (overridden by key=value)")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved settings as JSON (what --config reads) and exit",
    )
    p.add_argument("--out", help="run directory to create (or continue with --resume)")
    p.add_argument("--resume", action="store_true", help="continue training in --out")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--max-minutes", type=float, help="stop after this many minutes of training")
    p.add_argument("--quiet", action="store_true", help="no progress bar, only warnings from the library")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the run's summary (scores, steps, times; the content of summary.json) as one "
        "JSON object on stdout instead of the run directory",
    )
    p.add_argument(
        "--task",
        help="protein-cls: signalp, amp-scanner, developability; protein-residue: "
        "secondary-structure, paratope; or a CSV/TSV (sequence,label) or FASTA "
        "file (with --labels); text-cls: sst2 or a TSV/CSV (sentence,label); "
        "vit: fashion-mnist, digits or an image folder DIR/<class>/<image>",
    )
    p.add_argument("--labels", help="labels file for a FASTA --task (one label per record)")
    p.add_argument(
        "--init",
        metavar="MODEL",
        help="start from a pretrained model: protein-*: a protein-mlm run directory or antiberty; "
        "text-cls: minilm, an HF folder or a converted run; lm: an lm run, a GPT-2 HF folder or "
        "iglm (with train.lora_rank=R: LoRA adapters instead of every weight)",
    )
    p.add_argument("--freeze", action="store_true", help="with --init: train only the head (linear probe)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "prepare",
        help="tokenize a corpus once into token shards on disk (train with data=DIR)",
        description="Tokenize text (lm) or FASTA (protein-mlm) files into memory-mapped token "
        "shards, streaming them in bounded memory; run the same command again to resume an "
        "interrupted preparation.",
    )
    p.add_argument("kind", choices=("lm", "protein-mlm"))
    p.add_argument(
        "inputs",
        nargs="*",
        help="lm: UTF-8 text files (or tinyshakespeare), read as one text; protein-mlm: FASTA files "
        "(plain or .gz; default: the UniProt + RefSeq corpus)",
    )
    p.add_argument("--out", required=True, help="directory to write (new, or an unfinished one to resume)")
    p.add_argument("--tokenizer", choices=("char", "bpe"), help="lm: characters (default) or byte-level BPE")
    p.add_argument("--vocab-size", type=int, help="lm with --tokenizer bpe: pieces (default 8000)")
    p.add_argument(
        "--bpe-sample-chars",
        type=int,
        help="lm with bpe: learn the merges from a random sample of about this many characters of "
        "the training text's paragraphs (default 32,000,000; all of them if the text is smaller)",
    )
    p.add_argument("--seed", type=int, help="of the BPE sample (default 0)")
    p.add_argument(
        "--val-fraction", type=float, help="held out: lm 0.1 (the last characters), protein-mlm 0.02 (by id)"
    )
    p.add_argument("--val-corpus", help="lm: a separate validation text instead of the last characters")
    p.add_argument("--keep-duplicates", action="store_true", help="protein-mlm: keep repeated sequences")
    p.add_argument("--shard-tokens", type=int, help="tokens per shard (default 67,108,864)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("translate", help="translate text with a trained run")
    p.add_argument("run_dir")
    p.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    _search_options(p, beam=4, alpha=0.6)
    _device_option(p)
    p.add_argument("--verbose", action="store_true", help="print sentences/s on stderr at the end")
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser("evaluate", help="score a run on a data split (JSON on stdout)")
    p.add_argument("run_dir")
    defaults = "; ".join(f"{name}: {', '.join(r.splits)}" for name, r in RECIPES.items() if r.evaluate)
    p.add_argument("--split", help=f"the data split to score, the first named being the default ({defaults})")
    _search_options(p, beam=None)  # None: given or not (only translation takes them)
    p.add_argument("--limit", type=int, help="translation: score only the first N sentences")
    _device_option(p)
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("generate", help="continue a prompt with a trained language model (streams to stdout)")
    p.add_argument("run_dir", nargs="?", help="a language-model run directory (or give --model)")
    p.add_argument(
        "--model",
        help='a pretrained LM instead: iglm (antibodies: --prompt "[HEAVY] [HUMAN] EVQ"), '
        "an HF GPT-2 folder or a converted run",
    )
    p.add_argument("--prompt", default="", help="text to continue (empty: start from the start token)")
    _sampling_options(p, max_new_tokens=200, temperature=None, seed=None)
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--stop", action="append", default=[], help="stop at this string (repeatable)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument(
        "--top-probs",
        type=int,
        metavar="K",
        help="instead of generating, print the K most likely next tokens and their probabilities",
    )
    _device_option(p)
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "int8"),
        default="auto",
        help="weights' precision for decoding (auto: bfloat16 on CUDA and on CPUs with "
        "AMX bfloat16 units, else float32; int8: int8 weights, bfloat16 activations, "
        "faster on CPUs with native bfloat16, at a small quality cost)",
    )
    p.add_argument("--verbose", action="store_true", help="print tokens/s on stderr after each sample")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("classify", help="predict classes of proteins, texts or images (TSV on stdout)")
    p.add_argument("run_dir")
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="FILE",
        help="protein run: one FASTA file; text-cls run: one text file (a text per line); "
        "vit run: image files (PNG, JPEG, ...), each "
        "converted to the model's channels and resized to its image size",
    )
    _device_option(p)
    p.set_defaults(func=_cmd_classify)

    p = sub.add_parser(
        "embed",
        help="embeddings: sentences with a pretrained text encoder (--model), or "
        "proteins with a protein encoder run",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="--model NAME TEXT_FILE (one sentence per line), or RUN_DIR FASTA",
    )
    p.add_argument("--model", help="pretrained text encoder: minilm, an HF folder or a converted run")
    p.add_argument("--out", required=True, help="output .safetensors file")
    p.add_argument(
        "--per-residue", action="store_true", help="proteins: also store one (L, D) tensor per sequence"
    )
    _device_option(p)
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("similarity", help="cosine similarity of two sentences' embeddings")
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--model", default="minilm", help="text encoder (default minilm)")
    _device_option(p)
    p.set_defaults(func=_cmd_similarity)

    p = sub.add_parser(
        "search", help="semantic search: the corpus lines closest to a query (TSV: score, line)"
    )
    p.add_argument("query")
    p.add_argument("--corpus", required=True, help="text file, one entry per line (- for stdin)")
    p.add_argument("--model", default="minilm", help="text encoder (default minilm)")
    p.add_argument("--top-k", type=int, default=5)
    _device_option(p)
    p.set_defaults(func=_cmd_search)

    p = sub.add_parser(
        "convert",
        help="HF checkpoints in and out: `convert hf HF_DIR RUN_DIR`, `convert --to hf RUN_DIR HF_DIR`",
    )
    p.add_argument("paths", nargs="+", help="hf HF_DIR|NAME RUN_DIR, or (with --to hf) RUN_DIR HF_DIR")
    p.add_argument("--to", choices=("hf",), help="export a qkv run directory as an HF folder")
    p.add_argument("--tokenizer", help="tokenizer.json or vocab.txt, when the HF folder has none")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "explain",
        help="a model's attention on an input: pictures, a standalone HTML page, or a local web page",
    )
    p.add_argument("run_dir")
    p.add_argument(
        "--input",
        help="the text (sentence, prompt or protein sequence) to explain; for a "
        "vit run an image file (PNG, JPEG, ...) or test:INDEX (an image of its test set)",
    )
    p.add_argument(
        "--pair",
        metavar="SECOND",
        help="sentence encoders (MiniLM, BERT, text-cls runs): the second sentence of a pair "
        "(the page shows the pair's cosine similarity)",
    )
    p.add_argument("--out", help="directory for the PNG files (with --input)")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="write the explainer page of --input as one self-contained HTML file (no server; "
        "opens offline in any browser)",
    )
    p.add_argument("--serve", action="store_true", help="start the interactive page instead")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--max-chars",
        type=int,
        help="longest input accepted, in characters (default 400; --html: none, --max-tokens cuts)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"--html: a longer input is cut to this many tokens and the page says so (default {MAX_TOKENS})",
    )
    p.add_argument(
        "--pieces", action="store_true", help="label subword pieces instead of merging them into words"
    )
    p.add_argument(
        "--layer",
        type=int,
        default=-1,
        help="layer (0-based, -1 = last) of the alignment and step-through pictures",
    )
    p.add_argument("--head", type=int, default=1, help="head (1-based) of the step-through picture")
    _search_options(p, beam=4, length_penalty=False)
    _sampling_options(p, max_new_tokens=40, temperature=1.0, seed=0)
    _device_option(p, default="cpu")
    p.set_defaults(func=_cmd_explain)
    return parser


def _bug(exc: BaseException) -> int:
    _log(
        f"internal error (a bug in qkv, not a problem with your input): {type(exc).__name__}: "
        f"{_one_line(exc)[:300]}; run the same command with `qkv --debug ...` for the traceback and "
        "report it to the qkv developers"
    )
    return 1


def _out_of_memory(exc: RuntimeError) -> bool:
    """Whether torch failed to allocate memory: the CPU allocator's message, or CUDA's
    (``torch.OutOfMemoryError`` is a ``RuntimeError`` that says "out of memory")."""
    return "can't allocate memory" in str(exc) or "out of memory" in str(exc)


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its message's lines joined (an ``OSError``: the file and why)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # key=value overrides may come anywhere after the recipe, also after options.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "translate" and not any(x.startswith("-") for x in extra):
        args.text = list(args.text) + extra  # sentences after options: `translate RUN --beam 1 "Hallo"`
    elif extra and args.command == "prepare" and not any(x.startswith("-") for x in extra):
        args.inputs = list(args.inputs) + extra  # files after options: `prepare lm --tokenizer bpe a.txt`
    elif extra:
        if args.command != "train" or any(x.startswith("-") or "=" not in x for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    _setup_logging(getattr(args, "quiet", False), args.debug)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        _log("interrupted")
        return 130
    except (QkvError, OSError) as exc:  # the user's input, or the environment (files, disk)
        if args.debug:
            raise
        _log(f"error: {_one_line(exc)}")
        return 2
    except (MemoryError, OverflowError, RuntimeError) as exc:
        if args.debug:
            raise
        if isinstance(exc, RuntimeError) and not _out_of_memory(exc):
            return _bug(exc)
        # a size or number the user chose that this machine cannot hold
        _log(
            f"error: {'a number is too large' if isinstance(exc, OverflowError) else 'out of memory'}: "
            f"{_one_line(exc)[:300]} (choose smaller sizes: model, batch, max_len, vocabulary)"
        )
        return 2
    except Exception as exc:  # anything else is a bug: say so, never disguise it as a user error
        if args.debug:
            raise
        return _bug(exc)
