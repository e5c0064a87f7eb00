"""The package's shape, read from its source: its layers (no module imports one of a higher
layer), no import cycle between qkv modules or between its top-level folders, no ``print`` in
the library (only ``qkv.cli`` writes to the terminal), and importing any qkv module changes no
global state (DESIGN.md: "Importing qkv changes no global state")."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "qkv"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their ``__init__``)."""
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_import_by_name(node: ast.AST) -> bool:
    """``importlib.import_module("qkv....")`` (or ``import_module``) with a literal name."""
    return (
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            or (isinstance(node.func, ast.Name) and node.func.id == "import_module")
        )
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and node.args[0].value.split(".")[0] == "qkv"
    )


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The qkv modules ``name`` imports anywhere in its file (module level, functions,
    conditionals, ``if TYPE_CHECKING:`` blocks, and ``importlib.import_module`` of a literal
    qkv name). ``from pkg import x`` names module ``pkg.x`` when that is a
    module, else ``pkg`` (its ``__init__``). Edges to the module's own enclosing packages are
    left out: a submodule importing from its package's ``__init__`` is how packages are built."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in modules else module)
        elif _is_import_by_name(node):
            targets.add(node.args[0].value)
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {t for t in targets if t in modules and t != name and t not in ancestors}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component with more than one
    module (Tarjan), in a stable order."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in components:  # shortest way back to the component's first module
        start = min(comp)
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            nxt = sorted(w for w in graph[path[-1]] if w in comp)
            if start in nxt:
                cycles.append(path + [start])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append(path + [w])
    return sorted(cycles)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_resolves_relative_and_function_level_imports():
    graph = import_graph()
    assert "qkv.runs" in graph["qkv.explain.explainers"]  # `from .. import runs` is the module
    assert "qkv.explain.capture" in graph["qkv.explain"]
    assert "qkv.explain" not in graph["qkv.explain.plots"]  # own package: not an edge
    assert "qkv.cli" in graph["qkv.__main__"]


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles between qkv modules (one per tangle; break each):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


# --- layers ----------------------------------------------------------------------------------

# The package's top-level modules and folders in layers, lowest first (docs/architecture.md,
# "Layer order"). A module may import modules of its own layer and of the layers below, never of a
# layer above: data flows forward and nothing reaches back (model code never imports hub/,
# train/ or explain/; nothing but the registry and the command line imports a recipe). Every
# import counts: at module level, inside functions, under ``if TYPE_CHECKING:`` (an annotation
# that names a higher layer is a dependency on it all the same, and none is needed today) and
# ``importlib.import_module`` of a literal qkv name. Within a layer, the folder-level cycle
# test below keeps the peers apart. "qkv" is the package's own ``__init__`` (``qkv.load``).
LAYERS: list[tuple[str, ...]] = [
    ("errors",),  # what a user can act on
    ("extras",),  # which optional packages are installed (qkv[NAME])
    ("files",),  # atomic file writes and weights files
    ("nn",),  # the paper's equations
    ("compat",),  # reading what earlier qkv versions wrote (old weights name nn's modules)
    # typed settings trees (their renamed keys are compat's); device, precision, torchrun's
    # processes; CPU threads
    ("settings", "device", "distributed", "cpu_share"),
    ("models",),  # the model families
    ("data",),  # data sets, tokenizers, batches, shards
    ("evaluate",),  # metrics and baselines (what validation scores with)
    ("runs",),  # run directories: layout, what they say, creating and checking, loading a model
    ("train",),  # the run's flow, the training loop and its pieces, the dry run
    ("hub",),  # Hugging Face checkpoints in and out, pretrained short names
    ("inference",),  # inference (pretrained short names come from hub/)
    ("explain",),  # attention weights, pictures, the page
    ("recipes",),  # one module per task, the registry, a run's explainer
    ("cli", "__main__", "qkv"),  # the entry points
]

# No edge is exempt from these checks.


def _top(module: str) -> str:
    """The top-level module or folder a qkv module belongs to (``"qkv"`` for the package's own
    ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer_of() -> dict[str, int]:
    return {name: i for i, layer in enumerate(LAYERS) for name in layer}


def upward_imports(graph: dict[str, set[str]], layer_of: dict[str, int]) -> list[tuple[str, str]]:
    """Every edge ``(a, b)`` of ``graph`` whose ``b`` is in a higher layer than ``a``."""
    return sorted((a, b) for a, bs in graph.items() for b in bs if layer_of[_top(a)] < layer_of[_top(b)])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` collapsed to top-level modules and folders."""
    folders: dict[str, set[str]] = {_top(a): set() for a in graph}
    for a, bs in graph.items():
        folders[_top(a)] |= {_top(b) for b in bs} - {_top(a)}
    return folders


def test_the_layer_checks_find_what_they_look_for(tmp_path):
    graph = import_graph()
    assert "qkv.explain.explainer" in graph["qkv.recipes.recipe"]  # under `if TYPE_CHECKING:`
    toy_module = tmp_path / "toy.py"
    toy_module.write_text('import importlib\nimportlib.import_module("qkv.recipes.loading")\n')
    assert _imports("qkv.explain.toy", toy_module, _modules()) == {"qkv.recipes.loading"}  # by name
    toy = {"qkv.a.x": {"qkv.b", "qkv.a.y"}, "qkv.a.y": set(), "qkv.b": {"qkv.a.y"}, "qkv": {"qkv.b"}}
    assert upward_imports(toy, {"a": 0, "b": 1, "qkv": 2}) == [("qkv.a.x", "qkv.b")]
    assert folder_graph(toy) == {"a": {"b"}, "b": {"a"}, "qkv": {"b"}}
    assert find_cycles(folder_graph(toy)) == [["a", "b", "a"]]


def test_every_top_level_module_and_folder_has_one_layer():
    named = [name for layer in LAYERS for name in layer]
    assert len(named) == len(set(named)), "a name is in two layers"
    found = {_top(m) for m in _modules()}
    assert found == set(named), (
        f"put each in LAYERS: {sorted(found - set(named))}; no longer in the package: "
        f"{sorted(set(named) - found)}"
    )


def test_no_module_imports_a_higher_layer():
    layer_of = _layer_of()
    found = upward_imports(import_graph(), layer_of)
    assert not found, (
        "imports of a higher layer (see LAYERS; move the code to the layer it belongs to):\n"
        + "\n".join(
            f"{a} ({_top(a)}, layer {layer_of[_top(a)]}) -> {b} ({_top(b)}, layer {layer_of[_top(b)]})"
            for a, b in found
        )
    )


# 0.2.0 removed what 0.1.x kept answering for one release (CHANGELOG, "Removed"): the old names'
# table and its forwarders, the modules that only forwarded, and the old module paths they served.
GONE_MODULES = [
    "qkv._moved",
    "qkv.generate",
    "qkv.generate.lm",
    "qkv.run_files",
    "qkv.train.run_files",
    "qkv.train.checkpoint",
    "qkv.train.checkpointing",
    "qkv.train.settings",
    "qkv.train.distributed",
    "qkv.recipes.skeleton",
    "qkv.recipes.base",
    "qkv.data.files",
    "qkv.explain.loader",
]
GONE_NAMES = [
    ("qkv.recipes.lm", "train_lm"),
    ("qkv.recipes.translation", "TranslationRecipe"),
    ("qkv.recipes.common", "prepare_run_dir"),
    ("qkv.compat", "recorded_snapshot"),
    ("qkv.explain", "load_explainer"),
]


@pytest.mark.parametrize("module", GONE_MODULES)
def test_the_modules_of_0_1_that_only_forwarded_are_gone(module):
    assert not any(m == module or m.startswith(f"{module}.") for m in _modules())
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


@pytest.mark.parametrize(("module", "name"), GONE_NAMES)
def test_the_old_names_of_0_1_are_gone(module, name):
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), name)


def test_no_module_carries_deprecation_forwarding():
    """No module serves an old name: no renamed-keyword decorator, no reference to the old
    names' table, no module-level ``__getattr__`` (PEP 562) that would answer names it lacks."""
    found = []
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        found += [f"{name} mentions {word}" for word in ("renamed_arguments", "_moved") if word in text]
        if any(_binds_getattr(node) for node in ast.parse(text, str(path)).body):
            found.append(f"{name} defines a module __getattr__")
    assert not found, "\n".join(found)


def _binds_getattr(node: ast.stmt) -> bool:
    """Whether a module-level statement defines or assigns ``__getattr__``."""
    if isinstance(node, ast.FunctionDef):
        return node.name == "__getattr__"
    return isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__getattr__" for t in node.targets)


def test_the_deprecation_check_finds_a_module_getattr():
    tree = ast.parse("x = 1\n__getattr__ = make(__name__)\ndef f(): pass\n")
    assert [_binds_getattr(node) for node in tree.body] == [False, True, False]
    assert _binds_getattr(ast.parse("def __getattr__(name): ...").body[0])


@pytest.mark.parametrize("module", ["qkv.recipes.registry", "qkv.runs", "qkv.train.run", "qkv.cli"])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    """Each entry point imports as a fresh interpreter's first import: a circular import can
    hide behind the order in which other modules were imported first (``import
    qkv.recipes.registry`` failed so once, while torch's first import walked ``sys.modules``)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]


def test_no_import_cycles_between_folders():
    """The graph collapsed to top-level modules and folders has no cycle either: a folder
    never imports, however indirectly, a folder that imports it."""
    cycles = find_cycles(folder_graph(import_graph()))
    assert not cycles, "import cycles between qkv's top-level modules and folders:\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def _print_uses(path: Path) -> list[str]:
    """Calls of the builtin ``print`` and references to it (``log=print`` defaults)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    shadowed = {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == "print"
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Name)
            and node.id == "print"
            and isinstance(node.ctx, ast.Load)
            and not shadowed
        ):
            found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    return found


def test_the_library_never_prints():
    """Only the CLI writes to the terminal; the library logs to ``logging.getLogger("qkv...")``.
    Any use of the builtin ``print`` counts: a call, or a ``log=print`` default."""
    cli = PKG / "cli"  # the command line: the package and its verb modules
    found = [
        hit for path in sorted(PKG.rglob("*.py")) if cli not in path.parents for hit in _print_uses(path)
    ]
    assert not found, "print used in the library (log instead):\n" + "\n".join(found)


# Run in a fresh interpreter: snapshot global state, import every qkv module one by one
# (found on disk, so nothing is imported before the first snapshot), and name the module
# whose import changed something.
_PROBE = r"""
import json, logging, os, pkgutil, random, sys, warnings
import importlib, importlib.util
import matplotlib
import numpy as np
import torch

def snapshot():
    root = logging.getLogger()
    return {
        "matplotlib backend": repr(matplotlib.rcParams._get("backend")),
        "matplotlib.pyplot imported": "matplotlib.pyplot" in sys.modules,
        "warnings.formatwarning": repr(warnings.formatwarning),
        "warnings.showwarning": repr(warnings.showwarning),
        "warnings.filters": repr(warnings.filters),
        "root logger handlers": repr(root.handlers),
        "root logger level": root.level,
        "logging.disable": logging.root.manager.disable,
        "torch threads": torch.get_num_threads(),
        "torch initial seed": torch.random.initial_seed(),
        "torch rng state": hash(torch.get_rng_state().numpy().tobytes()),
        "torch default dtype": str(torch.get_default_dtype()),
        "torch deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch float32 matmul precision": torch.get_float32_matmul_precision(),
        "random state": repr(random.getstate()),
        "numpy random state": repr(np.random.get_state()[1].tolist()),
        "os.environ": repr(sorted(os.environ.items())),
        "sys.stdout/stderr": repr((sys.stdout, sys.stderr)),
        "sys.excepthook": repr(sys.excepthook),
    }

spec = importlib.util.find_spec("qkv")
names = []
def walk(paths, prefix):
    for info in pkgutil.iter_modules(paths, prefix):
        names.append(info.name)
        if info.ispkg:
            walk([os.path.join(p, info.name.rpartition(".")[2]) for p in paths], info.name + ".")
names.append("qkv")
walk(spec.submodule_search_locations, "qkv.")

first = before = snapshot()
changes, errors = [], {}
for name in sorted(names):
    try:
        importlib.import_module(name)
    except BaseException as exc:  # SystemExit too: importing must not run anything
        errors[name] = f"{type(exc).__name__}: {exc}"
    after = snapshot()
    changes += [[name, key] for key in after if after[key] != before[key]]
    before = after
walked = sorted(m.name for m in pkgutil.walk_packages(importlib.import_module("qkv").__path__, "qkv."))
final = snapshot()
print(json.dumps({"modules": sorted(names), "walked": walked, "errors": errors, "changes": changes,
                  "changed": [k for k in final if final[k] != first[k]]}))
"""


def test_importing_every_module_changes_no_global_state(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.pop("MPLBACKEND", None)
    res = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(report["modules"]) > 40 and set(report["walked"]) <= set(report["modules"])
    problems = [f"importing {name} failed: {err}" for name, err in report["errors"].items()]
    problems += [f"importing {name} changed {key}" for name, key in report["changes"]]
    problems += [f"net change after importing everything: {key}" for key in report["changed"]]
    assert not problems, "\n".join(problems)


# --- the explainer's pictures and server write nothing to stdout and change no global state ---

INPUTS = {"translation": "Ein Mann liest ein Buch.", "lm": "ROMEO:\nBut soft", "protein": "GIGKFLHSAKKFGKAFV"}


def _global_state():
    import logging
    import warnings

    import matplotlib

    return {
        "backend": repr(matplotlib.rcParams._get("backend")),
        "pyplot": "matplotlib.pyplot" in sys.modules,
        "formatwarning": warnings.formatwarning,
        "showwarning": warnings.showwarning,
        "root handlers": list(logging.getLogger().handlers),
        "root level": logging.getLogger().level,
        "logger handlers": {
            name: list(lg.handlers)
            for name, lg in logging.root.manager.loggerDict.items()
            if isinstance(lg, logging.Logger) and lg.handlers
        },
    }


@pytest.mark.parametrize("family", ["translation", "lm", "protein"])
def test_pictures_print_nothing_and_leave_matplotlib_alone(tiny_runs, tmp_path, capsys, family):
    from qkv.explain.explainer import DecodingOptions
    from qkv.explain.plots import write_pictures
    from qkv.recipes.loading import load_explainer

    explainer = load_explainer(tiny_runs[family])
    before = _global_state()
    capsys.readouterr()
    options = DecodingOptions(max_new_tokens=4, beam_size=2)
    written = write_pictures(explainer, INPUTS[family], tmp_path, options)
    assert capsys.readouterr().out == ""
    assert _global_state() == before
    assert all(p.exists() for p in written) and any(p.suffix == ".png" for p in written)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written if p.suffix == ".png")


def test_confusion_plot_prints_nothing_and_leaves_matplotlib_alone(tmp_path, capsys):
    from qkv.evaluate.classification import plot_confusion

    before = _global_state()
    capsys.readouterr()
    plot_confusion([[3, 1], [0, 4]], ["a", "b"], tmp_path / "confusion.png", "test")
    assert capsys.readouterr().out == ""
    assert _global_state() == before
    assert (tmp_path / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_prints_nothing(tiny_runs, capsys):
    import httpx

    from qkv.explain.server import create_app, serve_in_thread
    from qkv.recipes.loading import load_explainer

    before = _global_state()
    capsys.readouterr()
    server, thread, base = serve_in_thread(create_app(load_explainer(tiny_runs["lm"])))
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.get("/").status_code == 200
            assert http.get("/api/info").status_code == 200
            body = {"text": INPUTS["lm"], "max_new_tokens": 3}
            assert http.post("/api/explain", json=body).status_code == 200
            assert (
                http.post(
                    "/api/steps", json={"text": INPUTS["lm"], "kind": "decoder", "layer": 0, "head": 0}
                ).status_code
                == 200
            )
            assert http.post("/api/explain", json={"text": ""}).status_code == 422  # an error: no print
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert capsys.readouterr().out == ""
    assert _global_state() == before  # uvicorn was told to leave logging alone


def test_serve_logs_its_status_lines_instead_of_printing(tiny_runs, capsys, caplog, monkeypatch):
    """``serve`` without ``log=`` sends its two lines to the ``qkv.explain.server`` logger."""
    import logging
    import socket

    import uvicorn

    from qkv.explain.server import serve
    from qkv.recipes.loading import load_explainer

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="qkv.explain.server"):
        assert serve(load_explainer(tiny_runs["lm"]), port=port) == 0
    assert capsys.readouterr().out == ""
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name == "qkv.explain.server"]
    assert [(n, lv) for n, lv, _ in lines] == [("qkv.explain.server", logging.INFO)] * 2
    assert f"http://127.0.0.1:{port}/" in lines[0][2] and "stopped" in lines[1][2]
    assert calls and calls[0]["port"] == port
    got = []  # the CLI's callable still works
    assert serve(load_explainer(tiny_runs["lm"]), port=port, log=got.append) == 0
    assert len(got) == 2 and "stopped" in got[1]


# --- size -------------------------------------------------------------------------------------

# A function a reader takes in at once, and a command-line module that handles arguments only
# (CONTRIBUTING.md, "Code"): the limits are held here so that a new feature cannot break them
# silently. A function's lines run from its ``def`` to its last line, its docstring not counted.
MAX_FUNCTION_LINES = 60
MAX_CLI_MODULE_LINES = 250


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``path``."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                first = child.body[0]
                is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                if is_doc and isinstance(first.value.value, str):  # type: ignore[attr-defined]
                    lines -= (first.end_lineno or first.lineno) - first.lineno + 1
                found.append((f"{prefix}{child.name}", lines))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_size_checks_count_what_they_say(tmp_path):
    toy = tmp_path / "toy.py"
    toy.write_text('class A:\n    def f(self):\n        """Doc\n        string."""\n        return 1\n')
    assert function_lengths(toy) == [("A.f", 2)]


def test_no_function_is_longer_than_the_house_allows():
    long = [
        f"{_module_name(path)}.{name}: {lines} lines"
        for path in sorted(PKG.rglob("*.py"))
        for name, lines in function_lengths(path)
        if lines > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(long)


def test_no_command_line_module_is_longer_than_the_house_allows():
    long = [
        f"{path.name}: {n} lines"
        for path in sorted((PKG / "cli").glob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_CLI_MODULE_LINES
    ]
    assert not long, f"qkv.cli modules over {MAX_CLI_MODULE_LINES} lines:\n" + "\n".join(long)
