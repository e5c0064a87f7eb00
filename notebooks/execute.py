"""Execute qkv's notebooks top to bottom and report each one's wall time and key results.

    python notebooks/execute.py                  # every notebook, full budget, outputs saved in place
    python notebooks/execute.py 01 03            # some notebooks (a file name, stem or number prefix)
    python notebooks/execute.py --quick          # QKV_QUICK=1: small budgets, outputs to a temp copy

Full-budget runs rewrite the notebooks with their outputs (what the docs site shows without
running them); quick runs (CI's smoke test) never touch the committed files: the executed
copies go to ``--out`` (default: a fresh temporary directory). The kernel is ``python3`` run
by this interpreter, started in the repository root, with ``QKV_QUICK`` set to ``1`` or
removed. A notebook's headline figures are printed by its cell tagged ``key-result``; this
script echoes them after the notebook's time. Volatile metadata (timings, widget state) is
stripped before writing so that re-running changes only what the computation changed.

Exit status: 0 when every notebook ran, 1 when any cell raised, timed out or its kernel died
(the failing notebook's error is printed, the others still run; a failed full run leaves the
committed notebook untouched and writes its partial outputs to a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

NOTEBOOKS = Path(__file__).resolve().parent
ROOT = NOTEBOOKS.parent
KEY_TAG = "key-result"
# Full budgets are <= 5 minutes per notebook in all; one cell may take most of that.
FULL_CELL_TIMEOUT = 900
QUICK_CELL_TIMEOUT = 300


@dataclass
class Executed:
    """One executed notebook: its path, the executed node, wall seconds, the error if any."""

    path: Path
    notebook: nbformat.NotebookNode
    seconds: float
    error: str | None = None


def all_notebooks() -> list[Path]:
    """Every ``notebooks/*.ipynb``, in name order (the reading order)."""
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def resolve(names: list[str]) -> list[Path]:
    """Notebook paths for names given as a path, a file name, a stem or a prefix ("01").

    Raises:
        SystemExit: a name that matches no notebook, or several.
    """
    if not names:
        return all_notebooks()
    found = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            found.append(path.resolve())
            continue
        matches = [p for p in all_notebooks() if p.stem == path.stem or p.name.startswith(path.name)]
        if len(matches) != 1:
            known = ", ".join(p.stem for p in all_notebooks())
            raise SystemExit(f"{name!r} matches {len(matches)} notebooks; known: {known}")
        found.append(matches[0])
    return found


def kernel_env(quick: bool) -> dict[str, str]:
    """This process's environment with ``QKV_QUICK`` set to ``1`` (quick) or removed (full)."""
    env = {k: v for k, v in os.environ.items() if k != "QKV_QUICK"}
    if quick:
        env["QKV_QUICK"] = "1"
    # The inline backend would otherwise pick the screen's resolution; the notebooks set dpi too.
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return env


def strip_volatile(nb: nbformat.NotebookNode) -> None:
    """Remove metadata that changes on every run without the computation changing."""
    for key in ("widgets", "papermill", "execution"):
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
            cell.metadata.pop(key, None)


def execute(
    path: Path, quick: bool, timeout: int | None = None, env: dict[str, str] | None = None
) -> Executed:
    """Run one notebook in a fresh ``python3`` kernel (cwd: the repository root).

    ``env``: variables set in the kernel on top of this process's (e.g. ``TMPDIR``, where the
    notebooks write their runs). Returns the executed notebook (with the outputs up to the
    failing cell when one raised) and the wall time; never writes a file itself.
    """
    nb = nbformat.read(path, as_version=4)
    if timeout is None:
        timeout = QUICK_CELL_TIMEOUT if quick else FULL_CELL_TIMEOUT
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3")
    client.record_timing = False
    start = time.perf_counter()
    error = None
    try:
        client.execute(env={**kernel_env(quick), **(env or {})}, cwd=str(ROOT))
    except CellExecutionError as exc:
        error = str(exc)
    except (DeadKernelError, CellTimeoutError) as exc:  # killed from outside, or a cell over its timeout
        error = f"{type(exc).__name__}: {exc}"
    strip_volatile(nb)
    return Executed(path, nb, time.perf_counter() - start, error)


def stream_text(cell: nbformat.NotebookNode, name: str = "stdout") -> str:
    """Everything a code cell wrote to one stream (``stdout`` or ``stderr``)."""
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == name)


def key_results(nb: nbformat.NotebookNode) -> str:
    """The stdout of the cells tagged ``key-result``: the notebook's headline figures."""
    cells = [c for c in nb.cells if c.cell_type == "code" and KEY_TAG in c.metadata.get("tags", [])]
    return "".join(stream_text(c) for c in cells)


def parse_figures(text: str) -> dict[str, str]:
    """``name: value`` lines of a key-result output as a dict (the value as printed)."""
    figures = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() and value.strip():
            figures[name.strip()] = value.strip()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "names", nargs="*", help="notebooks (path, file name, stem or prefix); all by default"
    )
    parser.add_argument("--quick", action="store_true", help="QKV_QUICK=1; do not overwrite the notebooks")
    parser.add_argument(
        "--out", type=Path, help="write executed copies here (default: in place, or a temp dir)"
    )
    parser.add_argument("--timeout", type=int, help="seconds per cell (default 900, quick 300)")
    args = parser.parse_args(argv)

    paths = resolve(args.names)
    out = args.out
    if out is None and args.quick:
        out = Path(tempfile.mkdtemp(prefix="qkv-notebooks-"))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    failed = []
    total = 0.0
    for path in paths:
        print(f"{path.name}: running{' (quick)' if args.quick else ''} ...", flush=True)
        result = execute(path, args.quick, args.timeout)
        total += result.seconds
        target = path if out is None else out / path.name
        if result.error and out is None:  # keep the committed outputs; show the failed run elsewhere
            target = Path(tempfile.mkdtemp(prefix="qkv-notebooks-failed-")) / path.name
        nbformat.write(result.notebook, target)
        status = "FAILED" if result.error else "ok"
        print(f"{path.name}: {status} in {result.seconds:.1f} s -> {target}", flush=True)
        for line in key_results(result.notebook).splitlines():
            print(f"    {line}")
        if result.error:
            failed.append(path.name)
            print(result.error, file=sys.stderr)
    print(f"{len(paths) - len(failed)}/{len(paths)} notebooks ran in {total:.1f} s", flush=True)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
