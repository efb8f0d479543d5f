"""The terminal of `demo` and `bench --suite drafters`: our lines on it, the engines' own output in a log.

vLLM, torch and the OpenMP runtime print warnings and progress a user cannot act on, to the
process's file descriptors 1 and 2 (also from the engines' worker processes, which inherit them).
`engine_output(log)` points both descriptors at the file `log` while engines run and gives the
terminal back after; meanwhile `out()` and `err()` are streams on the terminal, which our tables,
summaries and progress lines use (outside it they are `sys.stdout` and `sys.stderr`). `width()`:
the columns our tables and lines are laid out in.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

MAX_WIDTH = 100   # our lines fit a 100-column terminal; a narrower one (COLUMNS) is followed
_TERMINAL: list[tuple[TextIO, TextIO]] = []   # (stdout, stderr) on the terminal while output is redirected


def out() -> TextIO:
    return _TERMINAL[-1][0] if _TERMINAL else sys.stdout


def err() -> TextIO:
    return _TERMINAL[-1][1] if _TERMINAL else sys.stderr


def width() -> int:
    """The terminal's columns (COLUMNS, else the terminal's size, else 80), at most `MAX_WIDTH`."""
    return max(40, min(MAX_WIDTH, shutil.get_terminal_size((80, 24)).columns))


def table_box():
    """The tables' box: a rule under the header, in ASCII (a log read by byte counts the width it shows)."""
    from rich.box import Box

    return Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def line(text: str, indent: str = "  ") -> str:
    """`text` wrapped to `width()` columns, the lines after the first indented by `indent`."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width(), subsequent_indent=indent, break_on_hyphens=False)) or text


def show(*renderables) -> None:
    """Print rich renderables (tables, text) on `out()`, laid out in `width()` columns (long lines wrap
    there), without the padding rich adds up to the width."""
    from rich.console import Console

    con = Console(width=width(), soft_wrap=False, highlight=False, force_terminal=False, color_system=None)
    with con.capture() as cap:
        for r in renderables:
            con.print(r)
    f = out()
    f.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))
    f.flush()


@contextlib.contextmanager
def engine_output(log: Path) -> Iterator[Path]:
    """File descriptors 1 and 2 appended to `log` (created with its folder) for the block's duration."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    terminal = (os.fdopen(os.dup(saved[0]), "w", buffering=1), os.fdopen(os.dup(saved[1]), "w", buffering=1))
    with log.open("a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    _TERMINAL.append(terminal)
    try:
        yield log
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        _TERMINAL.pop()
        for s in terminal:
            s.close()


__all__ = ["MAX_WIDTH", "engine_output", "err", "line", "out", "show", "table_box", "width"]
