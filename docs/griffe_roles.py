"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings' ``extensions``).

qkv's docstrings name other objects with Sphinx roles (``:func:`attention_steps```,
``:class:`~qkv.explain.explainers.Explanation```), which Markdown would show verbatim, colons
and all. They are shown as code instead: the name as written, or its last part after ``~`` (the
Sphinx convention). Not links: many name private helpers or objects outside the reference, and
an unresolved link fails ``mkdocs build --strict``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|mod|attr|exc|obj|const):`(~?)([^`]+)`")


def plain(docstring: str) -> str:
    """``docstring`` with every Sphinx role written as inline code."""
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", docstring)


class SphinxRolesAsCode(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
