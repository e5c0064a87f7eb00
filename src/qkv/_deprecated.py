"""Old import paths and keyword arguments that keep working for one release, with a
``DeprecationWarning``."""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast


def moved(module: str, new_homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for names that moved: ``new_homes`` maps each old
    name to ``"new.module"`` or ``"new.module:new_name"`` (a dotted ``new_name`` reaches an
    attribute: ``"qkv.recipes.lm:LMRun.train"``). Getting one warns
    (``DeprecationWarning``, naming the new path) and returns the object from its new home;
    any other name raises ``AttributeError`` as usual.

    The new module is imported by name when the old one is used, not when this module is
    imported: a shim in a low layer never imports a higher one at import time."""

    def __getattr__(name: str) -> Any:
        if name not in new_homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, _, new_name = new_homes[name].partition(":")
        new_name = new_name or name
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release: use {target}.{new_name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return functools.reduce(getattr, new_name.split("."), importlib.import_module(target))

    return __getattr__


def moved_module(module: str, new_module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a module that moved whole (``qkv.generate.lm`` is
    ``qkv.inference.lm``): every name the new module has is forwarded, with a
    ``DeprecationWarning`` naming the new path."""

    def __getattr__(name: str) -> Any:
        target = importlib.import_module(new_module)
        if name.startswith("__") or not hasattr(target, name):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module} is deprecated and will be removed in the next release: use {new_module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(target, name)

    return __getattr__


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
