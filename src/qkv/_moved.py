"""Every old (0.1.0) import path that still answers, in one table, and what serves it.

:data:`MOVED` maps each old name to its new home. Its keys take three forms:

- ``"qkv.generate.lm"``: a module that moved whole. Every name the new module has answers
  from the old path.
- ``"qkv.train.checkpoint:write_json"``: one name of a module. The value is
  ``"new.module:new_name"``; a dotted ``new_name`` reaches an attribute
  (``"qkv.recipes.lm:LMRun.train"``).
- ``"qkv.explain.show(run_dir)"``: a call that moved. The old function forwards such calls
  itself (it warns with its own text) and reaches the new one through :func:`new_home`.

Using an old name warns (``DeprecationWarning``, naming the new path) and gives the very object
at its new home. Keyword arguments renamed since are the same kind of old name, served by one
decorator, :func:`renamed_arguments`. The old names are removed in 0.2.0, with this module.

How the table is served, and why so:

- A module that is still there but lost some names ends with one line,
  ``__getattr__ = _moved.names_of(__name__)`` (PEP 562): the module's names that moved are
  whatever the table says, so no module keeps a list of its own.
- A module that is gone (``qkv.generate.*``, ``qkv.train.run_files``, ``qkv.explain.loader``)
  has no file. Its parent ends with ``_moved.forward_children(__name__)``, which puts a small
  forwarding module object for each gone child into ``sys.modules`` when the parent is
  imported. Python's import looks in ``sys.modules`` for ``a.b.c`` right after importing
  ``a.b``, so ``import qkv.generate.lm``, ``from qkv.generate import lm`` and
  ``from qkv.generate.lm import TextGenerator`` work without any file or import hook.
  ``qkv.generate`` itself is one file, ``qkv/generate.py``, doing only that for its children:
  the smallest thing that keeps ``import qkv.generate`` answering. Nothing is installed by
  ``import qkv`` (no ``sys.meta_path`` finder): only importing an old parent places its
  forwarders, and they import nothing.

The new homes are imported by name (``importlib``) when an old name is used, never when this
module or a forwarder is made: the table names modules of every layer, and this module sits in
the lowest one, so reading the table must not import them (a shim in a low layer would otherwise
import a higher one, and the higher one imports the shim back).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

_HOW = "is deprecated and will be removed in the next release: use"

MOVED: dict[str, str] = {
    # the inference APIs, qkv.generate.* before issue 42
    "qkv.generate.classify": "qkv.inference.classify",
    "qkv.generate.layout": "qkv.inference.layout",
    "qkv.generate.lm": "qkv.inference.lm",
    "qkv.generate.protein": "qkv.inference.protein",
    "qkv.generate.quantize": "qkv.inference.quantize",
    "qkv.generate.sampling": "qkv.inference.sampling",
    "qkv.generate.search": "qkv.inference.search",
    "qkv.generate.stats": "qkv.inference.stats",
    "qkv.generate.text": "qkv.inference.text",
    "qkv.generate.translator": "qkv.inference.translator",
    "qkv.generate.vision": "qkv.inference.vision",
    # the "invariant" backend joined the other attention backends
    "qkv.generate.invariant": "qkv.nn.attention",
    # the paths inside a run directory: the run directory's layout (issue 58)
    **{
        f"{old}:{name}": f"qkv.runs.layout:{name}"
        for old in ("qkv.train.run_files", "qkv.run_files")
        for name in ("SNAPSHOTS", "remove_run_file", "run_file", "snapshot_name")
    },
    # the atomic writers and weights files (issue 42); atomic_write and torch_load_refusal are
    # also imported there for its own use, so they answer without a warning until that changes
    "qkv.train.checkpoint:atomic_write": "qkv.files:atomic_write",
    "qkv.train.checkpoint:write_text": "qkv.files:write_text",
    "qkv.train.checkpoint:write_json": "qkv.files:write_json",
    "qkv.train.checkpoint:save_weights": "qkv.files:save_weights",
    "qkv.train.checkpoint:load_weights": "qkv.files:load_weights",
    "qkv.train.checkpoint:torch_load_refusal": "qkv.files:torch_load_refusal",
    # issue 58: the training state's file (its versions and upgrades too, from qkv.compat) and
    # what the loop saves and restores have one module each, named for the difference
    **{
        f"qkv.train.checkpoint:{name}": f"qkv.train.train_state:{name}"
        for name in ("previous_state_path", "save_state", "load_state", "check_state")
    },
    "qkv.train.checkpoint:average_weights": "qkv.train.checkpointer:average_weights",
    **{
        f"qkv.compat:{name}": f"qkv.train.train_state:{name}"
        for name in (
            "STATE_FORMAT_VERSION",
            "check_state_version",
            "upgrade_train_state",
            "recorded_snapshot",
        )
    },
    "qkv.train.checkpointing": "qkv.train.checkpointer",
    "qkv.train.settings": "qkv.train.train_settings",
    "qkv.train.distributed": "qkv.distributed",
    "qkv.data.files": "qkv.data.sources",
    # issue 58: the run's flow is the training machinery's; the run directory has one home
    "qkv.recipes.skeleton": "qkv.train.run",
    "qkv.recipes.base": "qkv.recipes.recipe",
    **{
        f"qkv.recipes.common:{name}": f"qkv.runs.record:{name}"
        for name in (
            "prepare_run_dir",
            "prepared_data_record",
            "refuse_other_data",
            "NOT_THE_RUNS_DATA",
            "PROVENANCE",
            "git_commit",
            "write_settings",
            "INPUT_PATHS",
            "recorded_input",
            "input_names",
        )
    },
    "qkv.recipes.common:read_run_json": "qkv.runs.info:resumed_json",
    **{
        f"qkv.recipes.common:{name}": f"qkv.train.run:{name}"
        for name in ("RunContext", "start_run", "keep_best")
    },
    # a run's explainer is its recipe's: picking it is the recipes' layer's job
    "qkv.explain:load_explainer": "qkv.recipes.loading:load_explainer",
    "qkv.explain.loader:load_explainer": "qkv.recipes.loading:load_explainer",
    "qkv.explain.show(run_dir)": "qkv.recipes.loading:show",
    # the recipes' train_* functions and *Recipe settings (issue 42)
    "qkv.recipes.lm:train_lm": "qkv.recipes.lm:LMRun.train",
    "qkv.recipes.lm:LMRecipe": "qkv.recipes.lm:LMSettings",
    "qkv.recipes.lm:evaluate_lm_run": "qkv.recipes.lm:evaluate_run",
    "qkv.recipes.translation:train_translation": "qkv.recipes.translation:TranslationRun.train",
    "qkv.recipes.translation:TranslationRecipe": "qkv.recipes.translation:TranslationSettings",
    "qkv.recipes.translation:RNNTranslationRecipe": "qkv.recipes.translation:RNNTranslationSettings",
    "qkv.recipes.vit:train_vit": "qkv.recipes.vit:ViTRun.train",
    "qkv.recipes.vit:ViTRecipe": "qkv.recipes.vit:ViTSettings",
    "qkv.recipes.vit:evaluate_vit_run": "qkv.recipes.vit:split_scores",
    "qkv.recipes.vit:evaluate_with_confusion": "qkv.recipes.vit:evaluate_run",
    "qkv.recipes.protein_mlm:train_protein_mlm": "qkv.recipes.protein_mlm:ProteinMLMRun.train",
    "qkv.recipes.protein_mlm:ProteinMLMRecipe": "qkv.recipes.protein_mlm:ProteinMLMSettings",
    "qkv.recipes.protein_mlm:evaluate_mlm_run": "qkv.recipes.protein_mlm:evaluate_run",
    "qkv.recipes.protein_tasks:train_protein_cls": "qkv.recipes.protein_tasks:ProteinCLSRun.train",
    "qkv.recipes.protein_tasks:train_protein_residue": "qkv.recipes.protein_tasks:ProteinResidueRun.train",
    "qkv.recipes.protein_tasks:ProteinTaskRecipe": "qkv.recipes.protein_tasks:ProteinTaskSettings",
    "qkv.recipes.protein_tasks:evaluate_protein_run": "qkv.recipes.protein_tasks:evaluate_run",
    "qkv.recipes.text_cls:train_text_cls": "qkv.recipes.text_cls:TextClsRun.train",
    "qkv.recipes.text_cls:TextClsRecipe": "qkv.recipes.text_cls:TextClsSettings",
    "qkv.recipes.text_cls:evaluate_text_run": "qkv.recipes.text_cls:evaluate_run",
}


def is_module(old: str) -> bool:
    """Whether the key ``old`` of :data:`MOVED` is a module that moved whole."""
    return ":" not in old and "(" not in old


def new_home(old: str) -> Any:
    """The object at the new home of the key ``old`` of :data:`MOVED`, imported now, without a
    warning (for a caller that warns with its own text). Raises ``KeyError`` for a name the
    table does not hold."""
    module, _, name = MOVED[old].partition(":")
    target = importlib.import_module(module)
    return functools.reduce(getattr, name.split("."), target) if name else target


def names_of(module: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of ``module``: its names in :data:`MOVED` answer
    from their new home with a ``DeprecationWarning`` naming it; any other name raises
    ``AttributeError`` as usual."""
    prefix = f"{module}:"

    def __getattr__(name: str) -> Any:
        old = prefix + name
        if old not in MOVED:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, _, new_name = MOVED[old].partition(":")
        warnings.warn(f"{module}.{name} {_HOW} {target}.{new_name}", DeprecationWarning, stacklevel=2)
        return new_home(old)

    return __getattr__


def _whole(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a module that moved whole: every name its new module has
    answers, with a ``DeprecationWarning`` naming the new module."""
    new_module = MOVED[module]

    def __getattr__(name: str) -> Any:
        # a dunder is asked by tools walking sys.modules (inspect, as torch's first import
        # runs): answered without importing the new module, which may be half-imported then
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target = importlib.import_module(new_module)
        if not hasattr(target, name):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module} {_HOW} {new_module}", DeprecationWarning, stacklevel=2)
        return getattr(target, name)

    return __getattr__


def _old_modules() -> set[str]:
    """Every old module the table names: those that moved whole and those that lost names."""
    return {old.partition(":")[0] for old in MOVED if "(" not in old}


def forward_children(parent: str) -> None:
    """Place a forwarding module in ``sys.modules`` (and on ``parent``, as an import would) for
    each child of ``parent`` that the table names and that has no file of its own; a child that
    still has its file is left to be imported as usual (its old names are its own
    :func:`names_of`'s). Call it at the end of ``parent``'s module."""
    package = sys.modules[parent]
    path = getattr(package, "__path__", None)
    for old in sorted(_old_modules()):
        head, _, child = old.rpartition(".")
        if head != parent:
            continue
        if path is not None and importlib.machinery.PathFinder.find_spec(old, path) is not None:
            continue
        if old not in sys.modules:
            whole = old in MOVED  # moved whole, else only some of its names are in the table
            forward = types.ModuleType(old, f"Moved: see {MOVED[old] if whole else 'qkv._moved'}.")
            forward.__spec__ = importlib.machinery.ModuleSpec(old, None)
            forward.__getattr__ = _whole(old) if whole else names_of(old)  # type: ignore[method-assign]
            sys.modules[old] = forward
        setattr(package, child, sys.modules[old])


# --- keyword arguments renamed in this release (issue 58: one name for the mask along a path)

_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def renamed_arguments(**new_names: str) -> Callable[[_Fn], _Fn]:
    """A decorator for keyword arguments renamed in this release: ``new_names`` maps each old
    keyword to its new one (``@renamed_arguments(mask="attn_mask")``). A call that passes the
    old keyword warns (``DeprecationWarning``: ``"mask= is deprecated ...: use attn_mask="``)
    and is passed on with the new one; passing both raises ``TypeError``. Positional calls
    and calls with the new names go straight through."""

    def decorate(fn: _Fn) -> _Fn:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in new_names.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__qualname__}() got both {old}= and {new}= (the same argument)")
                    warnings.warn(
                        f"{old}= is deprecated and will be removed in the next release: use {new}=",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(_Fn, wrapper)

    return decorate
