"""The options several verbs share, each declared once, and the parser they are added to."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..errors import QkvError
from ..files import folder_obstacle


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (``error: ...``, exit 2) instead of a usage
    block; ``--help`` still shows the usage."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def file_output_option(p: argparse._ActionsContainer, flag: str, help: str, metavar: str = "FILE") -> None:
    """An option naming a file the verb writes (``--out``, ``--heatmap``, ``--html``, ...). The
    one rule for every such file (:func:`check_file_outputs`, run by :func:`qkv.cli.main` before
    the verb starts): one that exists is refused unless ``--overwrite`` is given, which the first
    such option adds to the verb."""
    action = p.add_argument(flag, metavar=metavar, help=help)
    overwrite_option(p)
    p.set_defaults(file_outputs=(*(p.get_default("file_outputs") or ()), action.dest))


def folder_output_option(
    p: argparse._ActionsContainer, flag: str, help: str, metavar: str = "DIR", new: bool = False
) -> None:
    """An option naming a folder the verb writes files into (``explain --out DIR``), under the
    same rule as :func:`file_output_option` (:func:`check_file_outputs`, before the verb
    starts): a folder that holds files is refused unless ``--overwrite`` (added to the verb
    here too), since the verb would replace files of the names it writes there. ``new``: the
    verb writes a new folder and refuses one that holds files whatever is given
    (``explain --live DIR``); it adds no ``--overwrite``. Either way a path that is a file or
    lies under one is refused."""
    action = p.add_argument(flag, metavar=metavar, help=help)
    if not new:
        overwrite_option(p)
    p.set_defaults(folder_outputs=(*(p.get_default("folder_outputs") or ()), (action.dest, new)))


def overwrite_option(p: argparse._ActionsContainer) -> None:
    """``--overwrite``: replace the files the verb's output options name when they exist (added
    once, by the first output option that needs it)."""
    if not any(action.dest == "overwrite" for action in p._actions):
        p.add_argument("--overwrite", action="store_true", help="replace output files that exist")


def check_new_file(path: str | Path, flag: str, overwrite: bool = False) -> Path:
    """``path`` as a file an option (``flag``) may write, or :class:`QkvError` in one line
    naming it: a directory, a file that exists (unless ``overwrite``), or a folder that does
    not exist (or is a file)."""
    path = Path(path)
    if path.is_dir():
        raise QkvError(f"{flag} {path} is a directory; give a file name")
    if path.exists() and not overwrite:
        raise QkvError(f"{flag} {path} already exists; choose a new name, or give --overwrite to replace it")
    if not path.parent.is_dir():
        raise QkvError(f"{flag} {path}: the folder {path.parent} does not exist")
    return path


def check_new_folder(path: str | Path, flag: str, overwrite: bool | None = None) -> Path:
    """``path`` as a folder an option (``flag``) may write files into, or :class:`QkvError` in
    one line naming it: a file, a path under a file, or a folder that holds files, unless
    ``overwrite`` is true (``None``: the verb writes a new folder, there is no ``--overwrite``).
    A folder that does not exist yet is fine (the verb creates it and its parents); the rule is
    :func:`qkv.files.folder_obstacle`'s."""
    path = Path(path)
    kind, where = folder_obstacle(path)
    if kind == "file":
        raise QkvError(f"{flag} {path} is a file; give a folder")
    if kind == "under a file":
        raise QkvError(f"{flag} {path}: {where} is a file, not a folder")
    if kind == "not empty" and not overwrite:
        how = (
            "a new folder"
            if overwrite is None
            else "a new or empty folder, or give --overwrite to write into it"
        )
        raise QkvError(f"{flag} {path} already exists and is not empty; choose {how}")
    return path


def check_file_outputs(args: argparse.Namespace) -> None:
    """Check every file and folder the verb will write (its :func:`file_output_option` and
    :func:`folder_output_option` options that were given) with :func:`check_new_file` and
    :func:`check_new_folder`, before any work."""
    for dest in getattr(args, "file_outputs", ()):
        if getattr(args, dest, None) is not None:
            check_new_file(getattr(args, dest), _flag(dest), args.overwrite)
    for dest, new in getattr(args, "folder_outputs", ()):
        if getattr(args, dest, None) is not None:
            check_new_folder(getattr(args, dest), _flag(dest), None if new else args.overwrite)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def debug_option(p: argparse.ArgumentParser) -> None:
    """``--debug``: debug messages, and the traceback of an error instead of its one line."""
    p.add_argument("--debug", action="store_true", help="show debug messages and tracebacks")


def quiet_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--quiet``, for a verb that shows a progress bar (the library then logs warnings only)."""
    p.add_argument("--quiet", action="store_true", help=help)


def device_option(p: argparse.ArgumentParser, default: str = "auto") -> None:
    """``--device``, as every command that runs a model takes it."""
    where = (
        "auto (CUDA, MPS, else CPU), cpu, cuda, ..."
        if default == "auto"
        else f"{default} (default), cuda, ..."
    )
    p.add_argument("--device", default=default, help=where)


def revision_option(p: argparse.ArgumentParser) -> None:
    """``--revision``: the branch, tag or commit of a Hugging Face Hub model name."""
    p.add_argument(
        "--revision", help="with a Hub model name (org/name): its branch, tag or commit (default main)"
    )


def search_options(
    p: argparse.ArgumentParser,
    beam: int | None,
    alpha: float | None = None,
    length_penalty: bool = True,
    who: str = "translation",
    default_beam: str = "4",
    default_alpha: str = "0.6",
) -> None:
    """``--beam`` and (with ``length_penalty``) ``--alpha``: beam search (§6.1) of ``who``'s runs,
    with these defaults (``None``: the option's absence can be told apart); ``default_beam`` and
    ``default_alpha`` say in the help what they are when the option is absent."""
    p.add_argument(
        "--beam", type=int, default=beam, help=f"{who}: beam size (1 = greedy; default {default_beam})"
    )
    if length_penalty:
        p.add_argument(
            "--alpha", type=float, default=alpha, help=f"{who}: length penalty (default {default_alpha})"
        )


def onnx_weights_option(p: argparse.ArgumentParser, who: str) -> None:
    """``--weights``: how ``who`` stores the ONNX graphs' weights (qkv.hub.onnx_export's
    ``weights``; the library refuses anything else in one line)."""
    p.add_argument(
        "--weights",
        default="float32",
        help=f"{who}: float32, or float16 to store the weights in half the bytes (float32 arithmetic)",
    )


def sampling_options(
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


def words_after_options(
    p: argparse.ArgumentParser, dest: str, accept: Callable[[str], bool] = lambda word: True
) -> None:
    """Let words given after the options still fill the ``nargs="*"`` positional ``dest``:
    argparse stops filling it at the first option and leaves the rest unrecognized
    (``translate RUN --beam 1 "Hallo"``). :func:`take_late_words` hands them back, if none
    looks like an option and each passes ``accept``."""

    def take(args: argparse.Namespace, words: list[str]) -> bool:
        if any(word.startswith("-") or not accept(word) for word in words):
            return False
        setattr(args, dest, [*getattr(args, dest), *words])
        return True

    p.set_defaults(take_late_words=take)


def take_late_words(args: argparse.Namespace, words: list[str]) -> bool:
    """Whether the verb of ``args`` took the words its parser left unrecognized (see
    :func:`words_after_options`); a verb that declared none takes none."""
    take = getattr(args, "take_late_words", None)
    return take is not None and take(args, words)


# The MODEL of the protein verbs (embed, score-variants, contacts): every kind they accept.
MODEL_HELP = (
    "a qkv run directory (trained, or made by `qkv convert hf`); an HF folder (config.json and "
    "weights, converted in memory); a short name (antiberty, sapiens-vh, sapiens-vl); a Hub name "
    "org/name[@REVISION] (downloaded into, or found in, the Hugging Face cache); a fair-esm ESM-2 "
    "checkpoint file NAME.pt as torch hub saves it (NAME-contact-regression.pt beside it is read "
    "too; a file named as an ESM model must have its layers and width); or an ESM-2 model as "
    "fair-esm names it, esm2_t6_8M_UR50D ... esm2_t48_15B_UR50D (torch hub's cached "
    "$TORCH_HOME/hub/checkpoints/NAME.pt when it is there, else facebook/NAME from the Hub). A "
    "path that exists wins over a name"
)
