"""A picture of what a kernel touched: one cell per element of its 2-D inputs and outputs,
coloured by the program that read or wrote it, with a one-line caption saying what is
wrong.

    course.show_accesses(rmsnorm, x, weight)    # x small: at most 32 rows of 64

The kernel runs once in Triton's interpreter under `course.accesses.record()`. In the
picture an input's cells are coloured by the program that loaded them and an output's by
the program that stored them (its number in the cell where there is room); cross-hatched
cells were touched by more than one program, red-hatched output cells were never written,
dots are lanes the mask switched off (drawn where their address points; nothing was read
or written there), grey columns are row padding and dashed rows lie outside the tensor.
Accesses outside a tensor are outlined in red and listed under the picture with their
program and offset. The checkers show the same picture under a failure about addresses
(`course.check.address_pictures`).
"""

from __future__ import annotations

import base64
import html
import inspect
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from course import accesses, runtime
from course.access_diagnosis import (
    looks_right,
    matrices,
    never_written,
    outside_lines,
    own_kind,
    problem,
)
from course.accesses import LOAD, STORE, Launch, Recording, TensorAccesses

import numpy as np
import torch

MAX_ROWS, MAX_COLS = 32, 64   # the largest tensor drawn: rows, and columns with row padding


def _drawn(tensors: dict[str, TensorAccesses]) -> list[TensorAccesses]:
    return [t for t in matrices(tensors) if t.layout.rows <= MAX_ROWS
            and t.layout.cols + t.layout.padding <= MAX_COLS]


# ---------------------------------------------------------------- the picture


@dataclass
class AccessPicture:
    """What one run of a kernel touched: `caption` says what is wrong, `tensors` holds
    every access placed in the caller's tensors, `figure()` draws them. Shows itself as a
    picture and text when it is a cell's last value."""

    title: str
    caption: str
    tensors: dict[str, TensorAccesses] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    error: str | None = None
    wrong: bool = True   # whether the caption names a problem

    def panels(self) -> list[tuple[TensorAccesses, str]]:
        """(tensor, kind) drawn: inputs read, outputs written, and any other kind seen."""
        panels = []
        for t in _drawn(self.tensors):
            own = own_kind(t)
            panels.append((t, own))
            other = STORE if own == LOAD else LOAD
            if any(a.kind == other for a in t.accesses):
                panels.append((t, other))
        return panels

    def figure(self):
        """A matplotlib Figure (not registered with pyplot), or None with nothing to draw."""
        panels = self.panels()
        if not panels or not self.launches:
            return None
        return _draw(self.title, panels)

    def png(self) -> bytes | None:
        figure = self.figure()
        if figure is None:
            return None
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()

    def text(self) -> str:
        lines = [f"{self.title}: {self.caption}"]
        lines += [f"  {line}" for line in self.outside]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        png = self.png()
        parts = ['<div class="course-access-picture" style="max-width:1000px">']
        if png is not None:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f'<img alt="{html.escape(self.title)}" style="max-width:100%" '
                         f'src="data:image/png;base64,{data}">')
        parts.append(f'<div style="line-height:1.4;margin:4px 0"><b>{html.escape(self.title)}'
                     f':</b> {html.escape(self.caption)}</div>')
        if self.outside:
            items = "".join(f"<li>{html.escape(line)}</li>" for line in self.outside)
            parts.append('<div style="line-height:1.4">Outside the tensors:'
                         f'<ul style="margin:2px 0">{items}</ul></div>')
        parts.append("</div>")
        return "".join(parts)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<AccessPicture {self.title}: {self.caption}>"


def picture(recording: Recording, inputs: dict[str, object], outputs: dict[str, object], *,
            title: str, error: str | None = None) -> AccessPicture:
    tensors = recording.place(inputs, outputs)
    found = problem(tensors, recording.launches, error)
    return AccessPicture(title, found or looks_right(tensors), tensors, recording.launches,
                         outside_lines(tensors), error, wrong=found is not None)


def check_drawable(name: str, t: torch.Tensor) -> None:
    """Refuse a tensor too large (or not laid out in rows) to draw, saying what can be."""
    if t.dim() < 2:
        return  # vectors (the weight) are listed, not drawn
    shape = accesses.layout(t)
    if shape is None:
        raise ValueError(f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) is not laid "
                         "out as evenly spaced rows with contiguous columns: the picture draws "
                         "such rows only")
    width = shape.cols + shape.padding
    if shape.rows > MAX_ROWS or width > MAX_COLS:
        padding = f" with its row padding, {width} columns," if shape.padding else ""
        raise ValueError(f"{name} has {shape.rows} rows of {shape.cols}{padding} too large to "
                         f"draw: the largest the picture draws is {MAX_ROWS} rows of "
                         f"{MAX_COLS} columns (row padding included), for example "
                         f"torch.randn({min(shape.rows, 8)}, {min(shape.cols, 48)})")


def _describe_error(exc: BaseException) -> str:
    cause = exc.__cause__ if type(exc).__name__ == "InterpreterError" and exc.__cause__ else exc
    text = f"{type(cause).__name__}: {cause}".strip()
    return text if len(text) <= 300 else text[:300] + " ..."


def run_and_picture(fn: Callable, args: tuple, kwargs: dict, names: dict[str, object], *,
                    title: str, output_names: Sequence[str] = ()) -> AccessPicture:
    """Call fn(*args, **kwargs) under the recorder and draw what it touched; `names` maps
    the inputs' names to the arguments. An exception the call raises is caught and named
    in the caption, with what the launches did until then."""
    error = None
    with accesses.record() as recording:
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:  # the kernel's or the wrapper's: it belongs in the caption
            error, out = _describe_error(exc), None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not output_names:
        output_names = ("y",) if len(outs) == 1 else tuple(f"y{i}" for i in range(len(outs)))
    outputs = {n: o for n, o in zip(output_names, outs, strict=False)
               if isinstance(o, torch.Tensor)}
    for name, t in outputs.items():
        check_drawable(name, t)
    return picture(recording, names, outputs, title=title, error=error)


def show_accesses(fn: Callable, *args: object, **kwargs: object) -> AccessPicture:
    """Run `fn(*args, **kwargs)` (your wrapper: it launches your kernel) once in Triton's
    interpreter and show which program loaded and stored which element of its 2-D inputs
    and of what it returns, with a caption saying what is wrong, if anything. Tensors of
    at most 32 rows of 64 columns (row padding included) can be drawn."""
    if not callable(fn):
        raise TypeError(f"pass your function itself, e.g. rmsnorm, not {type(fn).__name__}")
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"show_accesses calls fn with the arguments that follow it: {exc}") \
            from None
    except ValueError:  # no signature to read (a builtin): name them by position
        bound = None
    names = dict(bound.arguments) if bound is not None else {
        f"arg{i}": a for i, a in enumerate(args)}
    for name, value in names.items():
        if isinstance(value, torch.Tensor):
            check_drawable(name, value)
    title = getattr(fn, "__name__", "your function")
    if not runtime.interpreted():
        return AccessPicture(title, accesses.NEEDS_INTERPRETER)
    return run_and_picture(fn, args, kwargs, names, title=title)


def show_after_cell(pictures: Sequence[AccessPicture]) -> bool:
    """In IPython, display `pictures` once the running cell has finished, under its output
    (a failed check's message comes first); False where there is no IPython to show them."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "events") or not pictures:
        return False

    def after_cell(*_):
        shell.events.unregister("post_run_cell", after_cell)
        for p in pictures:
            display(p)

    shell.events.register("post_run_cell", after_cell)
    return True


# ---------------------------------------------------------------- drawing

# Programs' colours: tab20 without its reds and greys (red marks problems, grey padding);
# a program's number is written in its cells where there is room.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
            "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2",
            "#dbdb8d", "#9edae5")
_DARK = 8   # the first eight take white numbers
_PADDING, _OUTSIDE, _PROBLEM = "#d9d9d9", "#f2f2f2", "#d62728"
def _colour(program: int) -> str:
    return _PALETTE[program % len(_PALETTE)]


# Drawn 600 pixels wide (100 dpi): a notebook's output column on a 1024-pixel screen shows
# it at nearly full size. Panels go one under another while the figure stays about a
# screen tall, else side by side with smaller cells.
_FIGURE_WIDTH_IN, _MOST_HEIGHT_IN = 6.0, 6.4
_LARGEST_CELL_IN = 0.24
_LEFT_IN, _RIGHT_IN, _GAP_IN = 0.5, 0.1, 0.55       # margins, and between two panels
_TITLE_IN, _PANEL_TOP_IN, _PANEL_BOTTOM_IN, _LEGEND_ROW_IN = 0.35, 0.3, 0.45, 0.22


def _width(t: TensorAccesses) -> int:
    return t.layout.cols + t.layout.padding


def _layout(panels, extents) -> tuple[int, float]:
    """(panels per line, cell size in inches)."""
    widest = max(_width(t) for t, _ in panels)
    rows = [hi - lo + 1 for lo, hi in extents]
    for columns in (1, 2):
        space = (_FIGURE_WIDTH_IN - _LEFT_IN - _RIGHT_IN - _GAP_IN * (columns - 1)) / columns
        cell = min(_LARGEST_CELL_IN, space / widest)
        lines = [rows[i:i + columns] for i in range(0, len(rows), columns)]
        height = sum(max(line) * cell + _PANEL_TOP_IN + _PANEL_BOTTOM_IN for line in lines)
        if height <= _MOST_HEIGHT_IN or columns == 2 or len(panels) == 1:
            return columns, cell
    return 2, cell  # not reached


def _draw(title: str, panels: list[tuple[TensorAccesses, str]]):
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    extents = [_extent(t, kind) for t, kind in panels]
    columns, cell = _layout(panels, extents)
    sizes = [(cell * _width(t), cell * (hi - lo + 1))
             for (t, _), (lo, hi) in zip(panels, extents, strict=True)]
    line_h = [max(h for _, h in sizes[i:i + columns]) + _PANEL_TOP_IN + _PANEL_BOTTOM_IN
              for i in range(0, len(sizes), columns)]
    column_w = (_FIGURE_WIDTH_IN - _LEFT_IN - _RIGHT_IN - _GAP_IN * (columns - 1)) / columns
    figure = Figure(figsize=(_FIGURE_WIDTH_IN, 1.0))
    seen: set[str] = set()
    placed = []  # (axes, left, top, width, height) in inches from the top left
    top = _TITLE_IN
    for number, ((t, kind), extent, (w, h)) in enumerate(zip(panels, extents, sizes,
                                                            strict=True)):
        line, column = divmod(number, columns)
        if column == 0 and line:
            top += line_h[line - 1]
        ax = figure.add_axes((0, 0, 1, 1))
        placed.append((ax, _LEFT_IN + column * (column_w + _GAP_IN), top + _PANEL_TOP_IN, w, h))
        seen |= _draw_panel(ax, t, kind, extent, cell_px=100 * cell)
    legend = [Patch(facecolor=_PALETTE[0], label="colour, number: the program")]
    key = {
        "several": Patch(facecolor=_PALETTE[9], hatch="xxx", edgecolor="#333333",
                         label="touched by 2+ programs"),
        "never": Patch(facecolor="white", hatch="////", edgecolor=_PROBLEM,
                       label="never written"),
        "masked": Line2D([], [], marker="o", linestyle="", color="#444444", markersize=4,
                         label="masked-off lane (nothing accessed)"),
        "padding": Patch(facecolor=_PADDING, label="row padding"),
        "outside": Patch(facecolor=_OUTSIDE, edgecolor="#888888", linestyle="--",
                         label="outside the tensor"),
        "oob": Patch(facecolor="white", edgecolor=_PROBLEM, linewidth=2,
                     label="access outside the tensor"),
    }
    legend += [handle for name, handle in key.items() if name in seen]
    height = _TITLE_IN + sum(line_h) + -(-len(legend) // 2) * _LEGEND_ROW_IN + 0.1
    figure.set_size_inches(_FIGURE_WIDTH_IN, height)
    for ax, left, top, w, h in placed:
        ax.set_position((left / _FIGURE_WIDTH_IN, 1 - (top + h) / height,
                         w / _FIGURE_WIDTH_IN, h / height))
    figure.suptitle(title, fontsize=10, x=0.02, y=1 - 0.08 / height, ha="left", va="top")
    figure.legend(handles=legend, loc="lower left", bbox_to_anchor=(0.01, 0.0), ncol=2,
                  fontsize=8, frameon=False, handlelength=1.5, columnspacing=1.2)
    return figure


def _extent(t: TensorAccesses, kind: str) -> tuple[int, int]:
    """First and last row drawn: the tensor's, and up to two rows either side that the
    accesses (or masked lanes) reach."""
    shape = t.layout
    lo, hi = 0, shape.rows - 1
    for a in t.accesses:
        if a.kind != kind:
            continue
        rows, _ = shape.cell(a.offsets)
        lo = max(min(lo, int(rows.min())), -2)
        hi = min(max(hi, int(rows.max())), shape.rows + 1)
    return lo, hi


def _draw_panel(ax, t: TensorAccesses, kind: str, extent: tuple[int, int], *,
                cell_px: float) -> set[str]:
    from matplotlib.patches import Rectangle

    shape = t.layout
    width = shape.cols + shape.padding
    lo, hi = extent
    n_rows = hi - lo + 1
    seen: set[str] = set()
    owners: dict[tuple[int, int], list[int]] = {}
    outside: set[tuple[int, int]] = set()
    masked: set[tuple[int, int]] = set()
    for a in t.accesses:
        if a.kind != kind:
            continue
        rows, cols = shape.cell(a.offsets)
        for r, c, on in zip(rows.reshape(-1).tolist(), cols.reshape(-1).tolist(),
                            a.on.reshape(-1).tolist(), strict=True):
            if not lo <= r <= hi or c >= width:
                continue
            if on:
                owners.setdefault((r, c), [])
                if a.program not in owners[(r, c)]:
                    owners[(r, c)].append(a.program)
                if not (0 <= r < shape.rows and c < shape.cols):
                    outside.add((r, c))
            else:
                masked.add((r, c))
    image = np.ones((n_rows, width, 3))
    def rgb(colour: str):
        return [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    for r in range(lo, hi + 1):
        for c in range(width):
            inside = 0 <= r < shape.rows
            fill = "#ffffff" if inside and c < shape.cols else (_PADDING if inside else _OUTSIDE)
            if (r, c) in owners:
                fill = _colour(owners[(r, c)][0])
            image[r - lo, c] = rgb(fill)
    if any(not 0 <= r < shape.rows for r in range(lo, hi + 1)):
        seen.add("outside")
    if shape.padding:
        seen.add("padding")
    ax.imshow(image, extent=(-0.5, width - 0.5, hi + 0.5, lo - 0.5), interpolation="nearest",
              aspect="equal")
    for (r, c), programs in owners.items():
        if len(programs) > 1:
            several = Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, hatch="xx",
                                edgecolor="#333333", linewidth=0)
            several.set_hatch_linewidth(0.6)  # the program's number stays readable
            ax.add_patch(several)
            seen.add("several")
        if cell_px >= 13:
            p = programs[0]
            ax.text(c, r, str(p), ha="center", va="center", fontsize=min(8, cell_px / 2.4),
                    color="white" if p % len(_PALETTE) < _DARK else "black")
    if kind == STORE and t.role == "output":
        never = never_written(t)
        for r, c in zip(*np.nonzero(never), strict=True):
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, hatch="////",
                                   edgecolor=_PROBLEM, linewidth=0))
            seen.add("never")
    for r, c in outside:
        ax.add_patch(Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, fill=False,
                               edgecolor=_PROBLEM, linewidth=1.6))
        seen.add("oob")
    if masked:
        # Centred in a free cell; in a cell another lane accessed, in its corner.
        xs = [c + (0.3 if (r, c) in owners else 0) for r, c in masked]
        ys = [r - (0.3 if (r, c) in owners else 0) for r, c in masked]
        ax.scatter(xs, ys, s=max(2.0, min(cell_px / 2.5, 14)), color="#333333",
                   edgecolors="white", linewidths=0.5, zorder=3)
        seen.add("masked")
    # Cell borders, the tensor's edges, and the padding boundary.
    ax.set_xticks(np.arange(-0.5, width, 1), minor=True)
    ax.set_yticks(np.arange(lo - 0.5, hi + 1, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6 if cell_px >= 6 else 0.2)
    ax.tick_params(which="minor", length=0)
    ax.hlines([-0.5, shape.rows - 0.5], -0.5, width - 0.5, colors="#555555", linewidth=1.2,
              linestyles="--")
    if shape.padding:
        ax.vlines(shape.cols - 0.5, -0.5, shape.rows - 0.5, colors="#555555", linewidth=1.0)
    step_x = max(1, _nice_step(width, 16))
    ax.set_xticks(range(0, width, step_x))
    rows = list(range(lo, hi + 1))
    step_y = max(1, _nice_step(len(rows), 12))
    ax.set_yticks(rows[::step_y])
    ax.set_yticklabels([str(r) if 0 <= r < shape.rows else ("after" if r >= 0 else "before")
                        for r in rows[::step_y]])
    ax.tick_params(labelsize=8)
    verb = "loaded" if kind == LOAD else "stored"
    ax.set_title(f"{t.name}: {verb}, by program ({shape.rows} rows × {shape.cols}"
                 + (f", row stride {shape.row_stride}" if shape.padding else "") + ")",
                 fontsize=9)
    ax.set_xlabel("column", fontsize=8)
    return seen


def _nice_step(count: int, most: int) -> int:
    for step in (1, 2, 4, 5, 8, 10, 16, 20, 32):
        if count / step <= most:
            return step
    return 64
