"""Tables for the terminal: ``rich`` when stdout is a terminal (and rich is installed),
plain aligned text otherwise, so output stays readable in a pipe or a CI log.

Subcommands build :class:`Section` objects; only this module decides how they look.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, TextIO


@dataclass
class Section:
    """A titled table. Without ``columns`` it is a list of ``(name, value)`` pairs."""

    title: str
    rows: List[Sequence[str]]
    columns: Optional[List[str]] = None
    # "l" or "r" per column; numbers read best right-aligned.
    align: Optional[str] = None
    notes: List[str] = field(default_factory=list)


def use_rich(stream: TextIO) -> bool:
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return False
    # rich is optional: plain text needs nothing.
    import importlib.util

    return importlib.util.find_spec("rich") is not None


def render_plain(sections: Sequence[Section]) -> str:
    return "\n".join(_plain_section(s) for s in sections)


def _plain_section(section: Section) -> str:
    lines = [section.title, "-" * len(section.title)]
    if section.columns is None:
        width = max((len(name) for name, _ in section.rows), default=0)
        lines += [f"  {name.ljust(width)}  {value}" for name, value in section.rows]
    elif section.rows:
        lines += _plain_table(section)
    lines += [f"  {note}" for note in section.notes]
    return "\n".join(lines) + "\n"


def _plain_table(section: Section) -> List[str]:
    header = list(section.columns or [])
    align = section.align or "l" + "r" * (len(header) - 1)
    widths = [max(len(str(row[i])) for row in [header, *section.rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [str(c).rjust(w) if a == "r" else str(c).ljust(w)
                 for c, w, a in zip(cells, widths, align)]
        return "  " + "  ".join(parts).rstrip()

    return [line(header), *(line(row) for row in section.rows)]


def print_sections(sections: Sequence[Section], stream: Optional[TextIO] = None,
                   rich: Optional[bool] = None) -> None:
    """Prints with rich on a terminal, plain otherwise (``rich`` forces either way)."""
    stream = stream or sys.stdout
    if rich is None:
        rich = use_rich(stream)
    if not rich:
        stream.write(render_plain(sections))
        stream.flush()
        return
    from rich.console import Console

    console = Console(file=stream, force_terminal=stream.isatty() if hasattr(stream, "isatty")
                      else None)
    for renderable in rich_renderables(sections):
        console.print(renderable)
        console.print()


def rich_renderables(sections: Sequence[Section]) -> list:
    from rich.table import Table
    from rich.text import Text

    out = []
    for section in sections:
        if section.columns is not None and not section.rows:
            # An empty table's header says nothing the notes don't.
            out.append(Text("\n".join([section.title, *("  " + n for n in section.notes)])))
            continue
        table = Table(title=section.title, title_justify="left", title_style="bold",
                      show_header=section.columns is not None,
                      caption="\n".join(section.notes) or None, caption_justify="left")
        columns = section.columns or ["", ""]
        align = section.align or "l" + "r" * (len(columns) - 1)
        if section.columns is None:
            align = "ll"
        for name, a in zip(columns, align):
            table.add_column(name, justify="right" if a == "r" else "left")
        for row in section.rows:
            table.add_row(*(str(c) for c in row))
        out.append(table)
    return out
