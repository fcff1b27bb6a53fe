"""``pyalloc-stats plot FILE -o OUT.png|OUT.html``: a segment map, and for a trace the
timeline of allocated and reserved bytes.

Uses matplotlib's Agg canvas directly rather than pyplot, so plotting from inside another
program (the tests, a notebook) never changes that program's matplotlib backend.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import math
from typing import Any, Dict, List, Optional, Tuple

from .analysis import (ALLOCATED, AWAITING, FREE, is_trace, key_figures, replay_trace,
                       snapshot_of)
from .common import (CliError, check_output_path, format_address, format_bytes, format_ratio,
                     load_document, write_output)

SUFFIXES = (".png", ".html")
# Past this many bars a segment map stops being readable at any sensible figure height.
MAX_SEGMENTS = 64
STATE_COLORS = {ALLOCATED: "#4e79a7", AWAITING: "#f28e2c", FREE: "#d9d9d9"}
STATE_LABELS = {ALLOCATED: "allocated", AWAITING: "awaiting (freed, stream pending)",
                FREE: "free (cached)"}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plot", help="draw a segment map (and a trace's memory timeline) to PNG or HTML",
        description="Draw the segment map of a snapshot (for a trace: of its final state, "
                    "above a timeline of allocated and reserved bytes with the budget and "
                    "OOMs). Writes a PNG, or one self-contained HTML file with the image and "
                    f"a summary table. At most {MAX_SEGMENTS} segments (the largest) are drawn.")
    p.add_argument("file", metavar="FILE", help="a pyalloc snapshot or trace")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="output file: OUT.png or OUT.html")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = check_output_path(args.output, SUFFIXES)
    doc = load_document(args.file)
    png = render_png(doc, title=args.file)
    if out.suffix.lower() == ".html":
        write_output(out, html_page(doc, png, args.file).encode())
    else:
        write_output(out, png)
    return 0


def render_png(doc: Dict[str, Any], title: str = "", dpi: int = 110) -> bytes:
    """The figure for ``doc`` as PNG bytes."""
    figure = build_figure(doc, title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def build_figure(doc: Dict[str, Any], title: str = "") -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CliError("plot needs matplotlib: pip install matplotlib") from None
    segments = snapshot_of(doc)["segments"]
    shown = min(len(segments), MAX_SEGMENTS)
    # Rows get thinner as they multiply, down to what 8-point labels still fit.
    map_height = 1.4 + (0.32 if shown <= 16 else 0.22) * max(shown, 1)
    timeline_height = 3.6 if is_trace(doc) else 0.0
    figure = Figure(figsize=(11, map_height + timeline_height), layout="constrained")
    if is_trace(doc):
        top, bottom = figure.subfigures(2, 1, height_ratios=[timeline_height, map_height])
        draw_timeline(top.add_subplot(), doc)
        draw_segment_map(bottom.add_subplot(), doc)
    else:
        draw_segment_map(figure.add_subplot(), doc)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


def _byte_axis(axis: Any, max_value: float) -> None:
    """Labels an axis in the binary unit that suits its range, with ticks at round
    numbers of that unit (1, 2, 2.5 or 5 times a power of ten)."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    unit, scale = "B", 1
    for name, factor in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40)):
        if max_value >= 2 * factor:
            unit, scale = name, factor
    axis.set_major_locator(MultipleLocator(_round_step(max_value / scale / 6) * scale))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / scale:g}"))
    axis.set_label_text(unit)


def _round_step(rough: float) -> float:
    if rough <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(rough))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)


def chosen_segments(segments: List[Dict[str, Any]], limit: int = MAX_SEGMENTS
                    ) -> List[Dict[str, Any]]:
    """The ``limit`` largest segments, then in address order, so the map keeps the layout."""
    largest = sorted(segments, key=lambda s: (-s["total_size"], s["address"]))[:limit]
    return sorted(largest, key=lambda s: s["address"])


def draw_segment_map(ax: Any, doc: Dict[str, Any]) -> None:
    segments = snapshot_of(doc)["segments"]
    if not segments:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no segments: nothing is reserved", ha="center", va="center",
                transform=ax.transAxes)
        return
    shown = chosen_segments(segments)
    many_blocks = sum(len(s["blocks"]) for s in shown) > 3000
    for row, seg in enumerate(shown):
        spans: Dict[str, List[Tuple[int, int]]] = {state: [] for state in STATE_COLORS}
        offset = 0
        for block in seg["blocks"]:
            spans[block["state"]].append((offset, block["size"]))
            offset += block["size"]
        for state, ranges in spans.items():
            if ranges:
                # A white edge separates neighbouring blocks; with thousands of blocks the
                # edges would hide the blocks themselves, so they go.
                ax.broken_barh(ranges, (row - 0.38, 0.76), facecolors=STATE_COLORS[state],
                               edgecolor="white", linewidth=0 if many_blocks else 0.4)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([_segment_label(seg) for seg in shown], fontsize=8, family="monospace")
    ax.set_ylim(len(shown) - 0.5, -0.5)  # first address at the top
    _byte_axis(ax.xaxis, max((s["total_size"] for s in shown), default=1))
    ax.xaxis.set_label_text(f"offset in segment ({ax.xaxis.get_label_text()})")
    ax.set_xlim(0, max((s["total_size"] for s in shown), default=1))
    title = f"Segment map: {len(segments)} segments"
    if len(shown) < len(segments):
        title += f" (showing the {len(shown)} largest)"
    ax.set_title(title, fontsize=10, loc="left")
    _state_legend(ax)


def _segment_label(seg: Dict[str, Any]) -> str:
    allocated = sum(b["size"] for b in seg["blocks"] if b["state"] == ALLOCATED)
    share = allocated / seg["total_size"] if seg["total_size"] else 0.0
    return (f"{format_address(seg['address'])} {seg.get('segment_type', '?'):5} "
            f"{format_bytes(seg['total_size']):>10} {format_ratio(share):>6}")


def _state_legend(ax: Any) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=STATE_LABELS[s]) for s, c in STATE_COLORS.items()]
    ax.legend(handles=handles, loc="lower right", fontsize=8, framealpha=0.9,
              bbox_to_anchor=(1.0, 1.0), ncol=3, borderaxespad=0.2)


def draw_timeline(ax: Any, doc: Dict[str, Any]) -> None:
    replay = replay_trace(doc)
    timeline = replay.timeline
    t0 = timeline.times_ns[0]
    end_ns = max(timeline.times_ns[-1], replay.last_t_ns)
    unit, divisor = _time_unit(end_ns - t0)
    times = [(t - t0) / divisor for t in timeline.times_ns]
    end = (end_ns - t0) / divisor
    # Extend the last step to the last event, which may have moved no bytes.
    ax.step(times + [end], timeline.reserved + timeline.reserved[-1:], where="post",
            color="#e15759", label="reserved")
    ax.step(times + [end], timeline.allocated + timeline.allocated[-1:], where="post",
            color="#4e79a7", label="allocated")
    ax.fill_between(times + [end], timeline.allocated + timeline.allocated[-1:], step="post",
                    color="#4e79a7", alpha=0.15)
    top = max(max(timeline.reserved), 1)
    top = max(top, _draw_budget(ax, replay.budgets, t0, divisor, end))
    _mark_ooms(ax, replay.ooms, t0, divisor)
    ax.set_ylim(0, top * 1.08)
    ax.set_xlim(0, end or 1)  # one instant still gets a readable axis
    ax.set_xlabel(f"time since the first event ({unit})")
    _byte_axis(ax.yaxis, top)
    ax.set_title("Memory over the trace", fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)


def _draw_budget(ax: Any, budgets: List[Tuple[int, Optional[int]]], t0: int,
                 divisor: float, end: float) -> int:
    """The budget as a step line (``set_budget`` events move it); returns its maximum."""
    steps = [((t - t0) / divisor, b) for t, b in budgets if b]
    if not steps:
        return 0
    xs = [x for x, _ in steps] + [end]
    ys = [b for _, b in steps] + [steps[-1][1]]
    label = f"budget {format_bytes(ys[-1])}" if len(set(ys)) == 1 else \
        f"budget (set_budget: {len(steps) - 1}x, now {format_bytes(ys[-1])})"
    ax.step(xs, ys, where="post", color="black", linestyle="--", linewidth=1, label=label)
    return max(ys)


def _time_unit(span_ns: int) -> Tuple[str, float]:
    for unit, divisor in (("s", 1e9), ("ms", 1e6)):
        if span_ns >= 5 * divisor:
            return unit, divisor
    return "µs", 1e3


def _mark_ooms(ax: Any, ooms: List[Dict[str, int]], t0: int, divisor: float) -> None:
    if not ooms:
        return
    xs = [(o["t_ns"] - t0) / divisor for o in ooms]
    ys = [o["reserved_bytes"] for o in ooms]
    ax.scatter(xs, ys, marker="X", s=60, color="#d62728", zorder=5, label=f"OOM ({len(ooms)})")
    if len(ooms) <= 10:  # past that, labels would pile up; the markers still show
        for x, y, o in zip(xs, ys, ooms):
            ax.annotate(f"OOM: {format_bytes(o['requested'] or o['size'])}", (x, y),
                        xytext=(4, 6), textcoords="offset points", fontsize=8,
                        color="#d62728")


def summary_rows(doc: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The key figures, formatted for the HTML summary."""
    figures = key_figures(doc)
    rows = []
    for name, value in figures.items():
        if value is None:
            text = "-"
        elif name.endswith("_bytes") or name == "largest_free_block":
            text = f"{format_bytes(value)}"
        elif name in ("utilization", "external_fragmentation"):
            text = format_ratio(value)
        elif name == "duration_ns":
            name, text = "duration", f"{value / 1e6:.3f} ms"
        else:
            text = str(value)
        rows.append((name, text))
    return rows


def html_page(doc: Dict[str, Any], png: bytes, name: str,
              extra: Optional[List[Tuple[str, str]]] = None) -> str:
    """One self-contained page: the PNG inline (base64) and a table of key figures."""
    rows = summary_rows(doc) + list(extra or [])
    kind = "trace" if is_trace(doc) else "snapshot"
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                      for k, v in rows)
    warning = ""
    if kind == "trace" and doc.get("dropped_events"):
        warning = (f"<p class=warn>{doc['dropped_events']} events were dropped: the timeline "
                   "is incomplete.</p>")
    alt = "segment map and memory timeline" if kind == "trace" else "segment map"
    image = base64.b64encode(png).decode("ascii")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>pyalloc {kind}: {html.escape(name)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 10px; text-align: left; }}
td {{ font-family: monospace; text-align: right; }}
.warn {{ color: #b00; font-weight: bold; }}
img {{ max-width: 100%; }}
</style></head>
<body>
<h1>pyalloc {kind}: {html.escape(name)}</h1>
{warning}
<table>
{table}
</table>
<img alt="{alt}" src="data:image/png;base64,{image}">
</body></html>
"""
