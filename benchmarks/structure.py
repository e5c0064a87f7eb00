"""The package's shape in numbers: import edges between its top-level modules and folders, the
modules over 500 lines, the number of functions and the longest one.

What a refactoring that claims a cleaner layout reports before and after, read from the source
with the same parser the layer tests use (``tests/test_imports.py``: every import counts, at
module level, in functions, under ``if TYPE_CHECKING:``, ``importlib.import_module`` of a
literal qkv name).

Run (from the repository root): ``.venv/bin/python benchmarks/structure.py [--json]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_imports  # noqa: E402  (the layer tests' own parser)

LONG = 500  # lines: a module this long probably holds more than one concept


def structure() -> dict:
    """The numbers: ``modules``, ``module_edges`` (qkv module → qkv module), ``folders`` and
    ``folder_edges`` (between top-level modules and folders), ``long_modules`` (path → lines,
    longest first), ``functions`` and ``longest_function`` (lines)."""
    graph = test_imports.import_graph()
    folders = test_imports.folder_graph(graph)
    paths = sorted(test_imports.PKG.rglob("*.py"))
    lines = {
        str(p.relative_to(test_imports.SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in paths
    }
    lengths = [n for p in paths for _, n in test_imports.function_lengths(p)]
    return {
        "modules": len(graph),
        "module_edges": sum(len(b) for b in graph.values()),
        "folders": len(folders),
        "folder_edges": sum(len(b) for b in folders.values()),
        "long_modules": dict(sorted(((p, n) for p, n in lines.items() if n > LONG), key=lambda x: -x[1])),
        "functions": len(lengths),
        "longest_function": max(lengths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    numbers = structure()
    if parser.parse_args().json:
        print(json.dumps(numbers, indent=1))
        return
    print(f"{numbers['modules']} modules, {numbers['module_edges']} import edges between them")
    print(f"{numbers['folders']} top-level modules and folders, {numbers['folder_edges']} edges between them")
    print(f"{numbers['functions']} functions, the longest {numbers['longest_function']} lines")
    print(f"{len(numbers['long_modules'])} modules over {LONG} lines:")
    for path, n in numbers["long_modules"].items():
        print(f"  {n:5d}  {path}")


if __name__ == "__main__":
    main()
