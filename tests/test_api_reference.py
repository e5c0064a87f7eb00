"""The API reference (docs/api/*.md, rendered by mkdocstrings) lists every public symbol.

Public: a package's ``__all__``; for a package without one (``qkv.inference``, ``qkv.hub``), the
``__all__`` of each of its modules, else the classes and functions a module defines under a
name without a leading underscore (what mkdocstrings renders for ``::: module``). Read from the
``:::`` directives and their ``members`` option, not from a built site: no build needed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
PACKAGES = ["qkv.nn", "qkv.models", "qkv.inference", "qkv.hub", "qkv.explain"]


def public_names(module: ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    ]


def public_symbols(package: str) -> dict[str, object]:
    """``{dotted path: object}`` of what the package offers."""
    pkg = importlib.import_module(package)
    if hasattr(pkg, "__all__"):
        modules = [pkg]
    else:
        modules = [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    return {f"{m.__name__}.{name}": getattr(m, name) for m in modules for name in public_names(m)}


def resolve(path: str) -> object:
    """The object a ``::: path`` directive names (a module, or an attribute of one)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def directives(text: str) -> list[tuple[str, list[str] | None]]:
    """``(identifier, members)`` per ``::: identifier``; ``members`` is the list given in its
    ``options:`` (``None`` when absent: every public member is rendered)."""
    found = []
    for match in re.finditer(r"^::: ([\w.]+)\n((?:[ \t]+.*\n)*)", text, flags=re.M):
        options = match.group(2)
        members = re.search(r"^[ \t]+members:[ \t]*(.*)$", options, flags=re.M)
        if members is None:
            found.append((match.group(1), None))
        else:
            value = members.group(1).strip()
            if value.startswith("["):
                names = [n.strip(" '\"") for n in value.strip("[]").split(",") if n.strip()]
            else:  # a YAML block list, or false
                names = re.findall(r"^[ \t]+- (\w+)", options[members.end() :], flags=re.M)
            found.append((match.group(1), names))
    return found


def documented() -> dict[str, object]:
    """``{dotted path: object}`` of everything the API pages render."""
    out: dict[str, object] = {}
    for page in sorted(API.glob("*.md")):
        for ident, members in directives(page.read_text(encoding="utf-8")):
            obj = resolve(ident)
            if isinstance(obj, ModuleType):
                for name in public_names(obj) if members is None else members:
                    out[f"{ident}.{name}"] = getattr(obj, name)
            out[ident] = obj
    return out


def test_directives_are_read_with_their_member_lists():
    text = "::: a.b\n\n::: a.c\n    options:\n      members: [x, y]\n      show_root_heading: false\n"
    text += "::: a.d\n    options:\n      members:\n        - z\n"
    assert directives(text) == [("a.b", None), ("a.c", ["x", "y"]), ("a.d", ["z"])]


def test_every_page_directive_resolves():
    idents = [i for page in API.glob("*.md") for i, _ in directives(page.read_text(encoding="utf-8"))]
    assert len(idents) >= 20
    for ident in idents:
        resolve(ident)  # raises for a directive naming nothing


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_symbol_is_in_the_api_reference(package):
    required = public_symbols(package)
    assert required, f"{package} exports nothing"
    shown = documented()
    # An object re-exported elsewhere counts where it is rendered: the same object, any path.
    shown_ids = {id(obj) for obj in shown.values()}
    missing = [path for path, obj in required.items() if path not in shown and id(obj) not in shown_ids]
    assert not missing, f"not in docs/api/*.md: {missing}"


def test_symbols_without_a_docstring_are_rendered_too():
    """mkdocstrings leaves out members without a docstring unless told otherwise."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+show_if_no_docstring: true$", config, flags=re.M)
    assert re.search(r'^\s+filters: \["!\^_"\]$', config, flags=re.M)


def test_sphinx_roles_in_docstrings_are_shown_as_code():
    """docs/griffe_roles.py: ``:func:`x``` would show verbatim in Markdown."""
    pytest.importorskip("griffe", reason="the docs extra is not installed (pip install -e '.[docs]')")
    spec = importlib.util.spec_from_file_location("griffe_roles", ROOT / "docs" / "griffe_roles.py")
    assert spec is not None and spec.loader is not None
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    text = "See :func:`attention_steps`, :class:`~qkv.explain.Explanation` and :py:meth:`Cache.set`."
    assert roles.plain(text) == "See `attention_steps`, `Explanation` and `Cache.set`."
