"""Pieces the course's widgets share: number formatting, the dtype, GPU and shape controls,
and a matplotlib figure shown as a PNG image widget.

A widget draws into one matplotlib `Figure` of its own, made without pyplot and redrawn in
place, and shows it as PNG bytes in an `ipywidgets.Image`. Nothing is registered with
pyplot, so moving a slider a thousand times leaves no figures behind, and the same code
renders in JupyterLab, Colab and a headless test.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Sequence

from course import hardware, traffic

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

# The largest widths a widget takes, so that it fits a notebook's column.
MAX_WIDTH = "900px"
FIGURE_SIZE_IN = (6.0, 3.5)
FIGURE_WIDTH_PX = 600   # on screen, drawn at 100 dpi: one pixel per pixel
_PNG_DPI = FIGURE_WIDTH_PX / FIGURE_SIZE_IN[0]

DTYPE_CHOICES = ("float32", "float16", "bfloat16")
FALLBACK_GPU = "H100 SXM"
MAX_N = 2**18   # 262144: the top of the N slider
MAX_M = 2**20   # 1048576: the top of the M slider


# ---------------------------------------------------------------- formatting


def format_bytes(nbytes: float) -> str:
    """Decimal units, as the rest of the course (1 MB = 1e6 bytes): '134.23 MB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def format_seconds(seconds: float) -> str:
    """'12.3 ns', '45.6 us', '7.89 ms' or '1.23 s'."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.1f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_count(count: float, unit: str = "") -> str:
    """'268.5 M' + unit, with k, M, G, T prefixes."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {prefix}{unit}"
    return f"{count:.0f} {unit}".rstrip()


# ---------------------------------------------------------------- argument checks


def dtype_choice(dtype: traffic.DTypeLike) -> str:
    """The dropdown value ('float32', 'float16' or 'bfloat16') for a dtype or its name."""
    try:
        short = traffic.dtype_name(dtype)
    except ValueError:
        short = None
    name = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(short)
    if name is None:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)} (or the torch "
                         f"dtype); got {dtype!r}")
    return name


def positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def gpu_choice(gpu: str | None) -> str:
    """A name from the spec table: `gpu` itself, else the GPU in hand if the table knows
    it, else the H100 SXM."""
    if gpu is None:
        in_hand = hardware.current()
        return in_hand.name if in_hand is not None else FALLBACK_GPU
    try:
        return hardware.lookup(gpu).name
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def measured_gpu_name() -> str:
    """The name the driver gives the GPU in use."""
    return torch.cuda.get_device_name()


# ---------------------------------------------------------------- controls


def shape_values(largest: int, extra: int | None = None) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, ... up to `largest`: powers of two and 1.5 times them, a
    log scale that also holds common odd widths (3072, 6144, 12288); plus `extra`."""
    values = {1}
    power = 1
    while power <= largest:
        values.add(power)
        if 3 * power // 2 <= largest and power >= 2:
            values.add(3 * power // 2)
        power *= 2
    if extra is not None:
        values.add(extra)
    return sorted(values)


def shape_slider(description: str, value: int, largest: int) -> widgets.SelectionSlider:
    return widgets.SelectionSlider(
        options=shape_values(largest, value), value=value, description=description,
        continuous_update=False, layout=widgets.Layout(width="440px"))


def dtype_dropdown(value: str) -> widgets.Dropdown:
    return widgets.Dropdown(options=list(DTYPE_CHOICES), value=value, description="dtype",
                            layout=widgets.Layout(width="220px"))


def gpu_dropdown(value: str) -> widgets.Dropdown:
    return widgets.Dropdown(options=[spec.name for spec in hardware.SPECS], value=value,
                            description="GPU", layout=widgets.Layout(width="220px"))


def control_row(controls: Sequence[widgets.Widget]) -> widgets.HBox:
    """Controls side by side, moving to a new line where the notebook is too narrow for
    them all (a small screen, a side panel open) instead of running past its edge."""
    return widgets.HBox(list(controls), layout=widgets.Layout(flex_flow="row wrap"))


def lines_html(text: str) -> str:
    """Each line of `text` as a paragraph of its own: a line too long for the notebook
    wraps tightly, and a small gap separates one line from the next (ipywidgets' own
    line height, one control's height, would make a wrapped line look like two)."""
    return "".join(f'<div style="line-height:1.4;margin-bottom:4px">{html.escape(line)}</div>'
                   for line in text.splitlines())


def observe_all(controls: Sequence[widgets.Widget], callback: Callable[[dict], None]) -> None:
    for control in controls:
        control.observe(callback, names="value")


# ---------------------------------------------------------------- figures


class FigureImage:
    """One matplotlib figure, redrawn in place and shown as a PNG `ipywidgets.Image`."""

    def __init__(self, figsize: tuple[float, float] = FIGURE_SIZE_IN) -> None:
        self.figure = Figure(figsize=figsize)
        # Drawn for FIGURE_WIDTH_PX, and scaled down where the notebook is narrower (less
        # the 2 px margin ipywidgets gives every widget on either side).
        self.image = widgets.Image(format="png",
                                   layout=widgets.Layout(width=f"{FIGURE_WIDTH_PX}px",
                                                         max_width="calc(100% - 4px)",
                                                         height="auto"))

    def new_axes(self):
        """Clear the figure and return a fresh axes to draw on."""
        self.figure.clear()
        return self.figure.add_subplot()

    def show(self) -> None:
        """Render what was drawn into the image widget."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=_PNG_DPI)
        self.image.value = buffer.getvalue()


class CourseWidget:
    """Base of the course's widgets: `.widget` is the ipywidgets container; displaying the
    object (the last line of a cell, or `display(obj)`) shows it."""

    widget: widgets.Widget

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
