"""Typed settings trees: defaults < config file (JSON) < ``key=value`` overrides.

A recipe's settings are a frozen dataclass whose sections are dataclasses too: ``model`` (the
family's config from :mod:`qkv.models.config`), ``train`` (:class:`qkv.train.train_settings.TrainSettings`)
and the recipe's own data/task fields at the top. Keys are dotted (``model.d_model=256``,
``train.lr=3e-4``, ``src_lang=fr``). A flat key that names a field of exactly one section is
accepted for it (``d_model=256`` is ``model.d_model=256``); one that several sections have is
refused with the dotted names to use.

Keys of earlier versions are listed per section class in :mod:`qkv.compat`, in one of two
tables (the settings classes themselves describe only today's keys):

- renamed keys (:func:`qkv.compat.renamed_keys`): ``{old name: (new name, old type, old value
  → new value)}``, a key that was renamed (``train.amp_bf16`` → ``train.precision``). It is
  read from config files and overrides as today's key, with a deprecation warning in the log.
- dropped keys (:func:`qkv.compat.dropped_keys`): ``{name: the value the model always used}``,
  a key that the section no longer has (the protein encoder's ``model.tie_embeddings``, always
  ``true``). Older ``config.json`` files and settings files hold it: with that value it is
  accepted and ignored (with a warning in the log); with any other value it is refused, saying
  that the key was dropped. :meth:`qkv.models.config.ModelConfig.from_dict` drops it the same
  way, silently.

Every value is converted and checked against its field's annotation (``int``, ``float``,
``bool``, ``str``, ``X | None``, ``Literal[...]``) before anything else happens; a ``float``
field takes finite numbers only (``nan``, ``inf`` and ``1e400`` are refused), and a model
config's float fields what float32 holds (``1e308`` is refused there: :func:`float32_problems`).
Every problem is reported at once, in one line, each naming the key, the expected type and the
value.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import math
import struct
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from . import compat
from .errors import ConfigError, QkvError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger(__name__)

_Settings = TypeVar("_Settings", bound="DataclassInstance")

_NULLS = ("null", "none", "None")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # resolved once per class: configs are built often (dataclasses.replace) and check types each time
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def type_name(tp: Any) -> str:
    """How an annotation reads in an error message: ``int``, ``float or null``, ``one of 'a', 'b'``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if tp is bool:
        return "bool (true or false)"
    return getattr(tp, "__name__", str(tp))


class _Invalid(Exception):
    pass


def convert(value: Any, tp: Any, from_text: bool = False) -> Any:
    """``value`` as the annotation ``tp`` wants it, or :class:`_Invalid`.

    ``from_text``: ``value`` is a command-line string (``"3"``, ``"true"``, ``"null"``, ``"relu"``);
    otherwise a JSON value. An ``int`` field takes whole numbers only (``2.0`` is refused), a
    ``float`` field finite ints and floats (not NaN, not an infinity), a ``bool`` field only
    true/false.
    """
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if type(None) in options and (value is None or (from_text and value in _NULLS)):
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return convert(value, option, from_text)
            except _Invalid:
                pass
        raise _Invalid
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise _Invalid
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Invalid
    if from_text and isinstance(value, str):
        if tp is bool:
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise _Invalid
        try:
            value = json.loads(value)
        except ValueError:
            raise _Invalid from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Invalid
    if tp is int:
        # 64-bit: what torch and NumPy take; a larger count is never meant
        if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
            return value
        raise _Invalid
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an int beyond the float range
                raise _Invalid from None
            if math.isfinite(value):
                return value
        raise _Invalid
    raise _Invalid


def _takes_float(tp: Any) -> bool:
    return tp is float or float in typing.get_args(tp)


def _non_finite(value: Any, from_text: bool) -> bool:
    """Whether ``value`` is a number outside what a ``float`` field takes (NaN, an infinity,
    an int beyond the float range), written as text (``nan``, ``-inf``, ``1e400``) or not."""
    if isinstance(value, bool):
        return False
    if from_text and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    try:
        return isinstance(value, (int, float)) and not math.isfinite(float(value))
    except OverflowError:
        return True


def _mismatch(key: str, tp: Any, value: Any, from_text: bool = False) -> str:
    """The message for a value that the annotation ``tp`` refuses."""
    if _takes_float(tp) and _non_finite(value, from_text):
        return f"{key} must be a finite number, got {_shown(value)}"
    if "int" in type_name(tp).split(" or ") and _is_huge_int(value, from_text):
        return f"{key} must be an integer in [-2**63, 2**63), got {_shown(value)}"
    return f"{key} must be {type_name(tp)}, got {_shown(value)}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _is_huge_int(value: Any, from_text: bool) -> bool:
    try:
        number = json.loads(value) if from_text and isinstance(value, str) else value
    except ValueError:
        return False
    return isinstance(number, int) and not isinstance(number, bool) and not -(2**63) <= number < 2**63


def show_key(key: Any) -> str:
    """A key as an error message shows it: as typed, or quoted when it is empty or holds
    characters that would not print on one line."""
    return key if isinstance(key, str) and key.isprintable() and key.strip() == key and key else repr(key)


def one_line(text: str) -> str:
    """``text`` with every character that does not print (line breaks among them) escaped as
    Python writes it: a message is one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def field_problems(obj: DataclassInstance) -> list[str]:
    """Fields of the dataclass instance ``obj`` whose value does not match its annotation
    (constructing a config in Python gets the same checks as the command line)."""
    out = []
    names = {f.name for f in dataclasses.fields(obj)}
    for name, tp in _hints(type(obj)).items():
        if name not in names or _is_section(tp):
            continue
        value = getattr(obj, name)
        try:
            convert(value, tp)
        except _Invalid:
            out.append(_mismatch(name, tp, value))
    return out


def float32_problems(obj: DataclassInstance, named: Sequence[str] = ()) -> list[str]:
    """The float fields of the dataclass instance ``obj`` whose value float32 cannot hold: one
    beyond its range (about 3.4e38), or a number other than 0 that rounds to 0 (below about
    1.4e-45). Fields that a message of ``named`` already names (it starts with the field's name)
    are skipped: one problem per field."""
    out: list[str] = []
    for name, tp in _hints(type(obj)).items():
        value = getattr(obj, name, None)
        if not _takes_float(tp) or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if any(message.startswith(f"{name} ") for message in (*named, *out)):
            continue
        try:
            stored = struct.unpack("f", struct.pack("f", value))[0]  # rounded as torch rounds it
        except OverflowError:
            stored = math.inf
        if not math.isfinite(stored):
            out.append(
                f"{name} ({_shown(value)}) does not fit in float32, the model's number type (|x| < 3.4e+38)"
            )
        elif stored == 0 and value != 0:
            out.append(
                f"{name} ({_shown(value)}) is 0 in float32, the model's number type (|x| >= 1.4e-45, or 0)"
            )
    return out


def check(obj: Any, float32: bool = False) -> None:
    """Raise :class:`~qkv.errors.ConfigError` (a ``ValueError``) listing every problem of the
    dataclass instance ``obj`` in one line: values of the wrong type (:func:`field_problems`),
    then what its ``problems()`` method finds (range and consistency checks, skipped where a
    wrong type makes them impossible), then, with ``float32`` (a model's config: its numbers
    become float32 parameters and arithmetic), the float values float32 cannot hold
    (:func:`float32_problems`)."""
    problems = field_problems(obj)
    try:
        problems += obj.problems()
    except Exception:
        if not problems:  # every value has its type: a bug in problems()
            raise
        # else a value of the wrong type, already named, made the range checks impossible
    if float32:
        problems += float32_problems(obj, problems)
    if problems:
        raise ConfigError(one_line(f"invalid {type(obj).__name__}: " + "; ".join(problems)))


def field_names(cls: type[DataclassInstance], prefix: str = "") -> list[str]:
    """Every dotted key of the settings class ``cls``."""
    names = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        names += field_names(tp, f"{prefix}{f.name}.") if _is_section(tp) else [prefix + f.name]
    return names


def dotted_key(cls: type[DataclassInstance], key: str) -> str:
    """The full dotted key for ``key`` (see the module docstring); raises ``KeyError`` with
    the message to show."""
    names = field_names(cls)
    if key in names:
        return key
    if "." not in key:
        matches = [n for n in names if n.rsplit(".", 1)[-1] == key]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise KeyError(f"{key} is ambiguous: use {' or '.join(matches)}")
    close = difflib.get_close_matches(key, names, n=3) or difflib.get_close_matches(
        key.rsplit(".", 1)[-1], [n.rsplit(".", 1)[-1] for n in names], n=3
    )
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise KeyError(f"unknown key {show_key(key)}{hint}")


def _section_keys(
    cls: type[DataclassInstance], table: Callable[[type], dict], prefix: str = ""
) -> list[tuple[str, type, dict]]:
    """``(dotted prefix, section class, table(section class))`` for ``cls`` and each of its
    sections, where ``table`` is :func:`qkv.compat.renamed_keys` or
    :func:`qkv.compat.dropped_keys` (see the module docstring)."""
    out = [(prefix, cls, table(cls))]
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        if _is_section(tp):
            out += _section_keys(tp, table, f"{prefix}{f.name}.")
    return out


def _renamed(cls: type[DataclassInstance], key: str, value: Any, from_text: bool) -> tuple[str, Any] | None:
    """Today's ``(dotted key, value)`` for a key renamed in a section (dotted, or flat),
    logging a deprecation warning; ``None`` for other keys. Raises :class:`_Invalid` with the
    message for a value the old key's type refuses."""
    name = key.rsplit(".", 1)[-1]
    for prefix, _, renamed in _section_keys(cls, compat.renamed_keys):
        if name in renamed and key in (prefix + name, name):
            new, old_type, to_new = renamed[name]
            try:
                new_value = to_new(convert(value, old_type, from_text))
            except _Invalid:
                raise _Invalid(_mismatch(key, old_type, value, from_text)) from None
            logger.warning(f"{key} is deprecated: read as {prefix}{new}={new_value}")
            return prefix + new, new_value
    return None


def dropped_value_matches(value: Any, dropped: Any, from_text: bool = False) -> bool:
    """Whether ``value`` (a JSON value, or command-line text) is ``dropped``, the value a
    dropped key always held (``true`` is ``True``; ``1`` is not)."""
    if dropped is None:
        return value is None or (from_text and value in _NULLS)
    try:
        return convert(value, type(dropped), from_text) == dropped
    except _Invalid:
        return False


def _dropped(cls: type[DataclassInstance], key: str, value: Any, from_text: bool) -> bool:
    """``True`` for a key that a section dropped (dotted, or flat) given the value it always
    held: accepted and ignored, with a warning; ``False`` for other keys. Raises
    :class:`_Invalid` with the message for a dropped key of any other value."""
    name = key.rsplit(".", 1)[-1]
    for prefix, section, dropped in _section_keys(cls, compat.dropped_keys):
        if name in dropped and key in (prefix + name, name):
            old = json.dumps(dropped[name])
            if not dropped_value_matches(value, dropped[name], from_text):
                raise _Invalid(
                    f"{prefix}{name} is no longer a setting ({section.__name__} dropped "
                    f"it; only the value it always had, {old}, is still read), "
                    f"got {value!r}"
                )
            logger.warning(
                f"{key} is no longer a setting: ignored ({section.__name__} always has {prefix}{name}={old})"
            )
            return True
    return False


def _annotation(cls: type[DataclassInstance], dotted: str) -> Any:
    *sections, name = dotted.split(".")
    for section in sections:
        cls = _hints(cls)[section]
    return _hints(cls)[name]


def flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """The leaves of a nested dict as ``(dotted key, value)`` pairs (``{"train": {"lr": 1}}`` →
    ``[("train.lr", 1)]``), ``prefix`` before each key: how settings files and overrides are read,
    and how the trackers name settings and summaries."""
    items = []
    for key, value in data.items():
        if isinstance(value, dict):
            items += flatten(value, f"{prefix}{key}.")
        else:
            items.append((prefix + key, value))
    return items


def _replace(default: _Settings, values: dict[str, Any], problems: list[str], where: str) -> _Settings | None:
    """``default`` with ``values`` (dotted keys) applied, section by section; what a section's
    validation refuses is appended to ``problems``."""
    changes = {}
    for f in dataclasses.fields(default):
        if _is_section(_hints(type(default))[f.name]):
            own = {k[len(f.name) + 1 :]: v for k, v in values.items() if k.startswith(f.name + ".")}
            if own:
                section = _replace(getattr(default, f.name), own, problems, f.name)
                changes[f.name] = section if section is not None else getattr(default, f.name)
        elif f.name in values:
            changes[f.name] = values[f.name]
    try:
        return dataclasses.replace(default, **changes)
    except (ValueError, TypeError) as exc:  # a section's or a recipe's validation
        problems.append(f"{where}: {exc}")
        return None


def resolve(
    cls: type[_Settings],
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: dict | None = None,
) -> _Settings:
    """The settings ``cls`` from its defaults < ``base`` < ``config_file`` (JSON, nested
    sections or flat keys) < ``overrides`` (``"key=value"`` strings). ``base``: a settings tree
    as :func:`to_dict` gives it (a resumed run's own settings, so ``--resume`` alone continues
    the run as it was).

    Raises:
        QkvError: one line listing every problem: an unreadable file, a malformed override, an
            unknown or ambiguous key, a value of the wrong type (key, expected type, value), a
            renamed key's value of the wrong type, a dropped key not at its old value, or a
            value the section's validation refuses.
    """
    raw: list[tuple[str, Any, bool]] = []  # (key, value, from_text)
    problems: list[str] = []
    if base:
        raw += [(k, v, False) for k, v in flatten(base)]
    if config_file:
        try:
            data = json.loads(Path(config_file).read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise QkvError(one_line(f"cannot read config file {config_file}: {exc}"[:300])) from None
        raw += [(k, v, False) for k, v in flatten(data)]
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {item!r} is not of the form key=value")
            continue
        key, text = item.split("=", 1)
        raw.append((key, text, True))
    values: dict[str, Any] = {}
    for key, value, from_text in raw:
        try:
            renamed = _renamed(cls, key, value, from_text)
        except _Invalid as exc:
            problems.append(exc.args[0])
            continue
        if renamed:
            key, value, from_text = *renamed, False
        try:
            dotted = dotted_key(cls, key)
        except KeyError as exc:
            try:
                if not _dropped(cls, key, value, from_text):
                    problems.append(exc.args[0])
            except _Invalid as dropped:
                problems.append(dropped.args[0])
            continue
        tp = _annotation(cls, dotted)
        try:
            values[dotted] = convert(value, tp, from_text)
        except _Invalid:
            problems.append(_mismatch(dotted, tp, value, from_text))
    if not problems:
        settings = _replace(cls(), values, problems, cls.__name__)
    if problems:
        raise QkvError(one_line("invalid settings: " + "; ".join(problems)))
    assert settings is not None  # _replace returns None only after adding to problems
    return settings


def to_dict(settings: DataclassInstance) -> dict[str, Any]:
    """The nested JSON-ready dict of a settings tree (what ``--print-config`` prints and
    ``--config`` reads back)."""
    return dataclasses.asdict(settings)
