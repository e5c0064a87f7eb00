"""``qkv runs``: a table of the runs under folders (recipe, steps, minutes, the headline
validation and test figures, the machine's quiet share, status) on stdout, ``--json`` as one
JSON list; ``--plot`` overlays their training curves in a PNG."""

from __future__ import annotations

import argparse

from .. import extras
from ..runs.table import COLUMNS, RunRow
from .console import log
from .options import file_output_option
from .output import write_json, write_line

# columns right-aligned in the table (numbers)
NUMERIC = ("steps", "minutes", "val", "test", "quiet")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``runs``."""
    p = sub.add_parser(
        "runs",
        help="compare runs: a table of the runs under folders (recipe, steps, minutes, scores, status)",
        description="A table of the run directories under each DIR: recipe, steps, minutes of "
        "training, the headline metric on the validation and test splits, the share of a quiet "
        "machine's steps it made, and its status (running, finished, stopped, converted, unreadable).",
    )
    p.add_argument(
        "folders",
        nargs="+",
        metavar="DIR",
        help="a run directory, or a folder searched for runs at any depth",
    )
    p.add_argument(
        "--sort",
        choices=COLUMNS,
        metavar="KEY",
        help=f"order the rows by this column ({', '.join(COLUMNS)}): numbers by value, missing values "
        "last (default: as found)",
    )
    p.add_argument("--reverse", action="store_true", help="the largest (or last) first")
    p.add_argument(
        "--json", action="store_true", help="one JSON list of the rows on stdout instead of the table"
    )
    file_output_option(
        p,
        "--plot",
        "also draw the runs' train and validation loss against the step into this PNG, one colour "
        "per run (needs qkv[plot])",
        metavar="OUT.png",
    )
    p.set_defaults(func=_cmd_runs)


def _cmd_runs(args) -> int:
    from ..runs.table import plot_curves, run_table, sort_rows

    if args.plot:
        extras.require("plot", "qkv runs --plot")
    rows = run_table(args.folders)
    if args.sort:
        rows = sort_rows(rows, args.sort, args.reverse)
    elif args.reverse:
        rows = rows[::-1]
    if args.plot:
        plot_curves([row.run for row in rows if row.status != "unreadable"], args.plot)
        log(f"curves -> {args.plot}")
    if args.json:
        write_json([row.to_dict() for row in rows])
    else:
        for line in table_lines(rows):
            write_line(line)
    return 0


def table_lines(rows: list[RunRow]) -> list[str]:
    """The rows as aligned text: a header of the :data:`~qkv.runs.table.COLUMNS`, numbers
    right-aligned, ``-`` for a missing value."""
    cells = [list(COLUMNS)] + [[_cell(row, key) for key in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return [
        "  ".join(
            text.rjust(width) if key in NUMERIC else text.ljust(width)
            for key, text, width in zip(COLUMNS, line, widths, strict=True)
        ).rstrip()
        for line in cells
    ]


def _cell(row: RunRow, key: str) -> str:
    value = getattr(row, key)
    if value is None:
        return "-"
    if key == "minutes":
        return f"{value:.2f}"
    if key in ("val", "test"):
        return f"{value:.4g}"
    if key == "quiet":
        return f"{value:.0%}"
    return str(value)
