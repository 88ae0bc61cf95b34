"""The HBM-traffic calculator: what one kernel variant moves, and how long that must take.

    calc = traffic_calculator("fused_rmsnorm", fn=rmsnorm)   # fn is optional
    calc                                                      # last line of a cell shows it

Every number comes from `course.traffic` (bytes, FLOPs, launches, intensity) and
`course.hardware` (the spec table; on a GPU the measured copy bandwidth): the widget only
arranges them. With a GPU and the learner's kernel, the "measure" button times the kernel
at the chosen shape with `course.bench.measure` and puts the result beside the prediction.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from course import bench, hardware, runtime, traffic
from course.widgets.common import (
    MAX_M,
    MAX_N,
    MAX_WIDTH,
    CourseWidget,
    FigureImage,
    control_row,
    dtype_choice,
    dtype_dropdown,
    format_bytes,
    format_count,
    format_seconds,
    gpu_choice,
    gpu_dropdown,
    lines_html,
    measured_gpu_name,
    observe_all,
    positive_int,
    shape_slider,
)

import ipywidgets as widgets
import torch

NO_GPU_LABEL = "measuring needs a GPU (predictions above still hold)"
# Below this, a launch's fixed cost (a few microseconds) outweighs the traffic.
_LAUNCH_DOMINATES_S = 5e-6

# ipywidgets reads a Dropdown value of None as "nothing selected", and the browser then shows
# an empty box: the choices that mean "no particular value" have names of their own.
SAME_AS_X = "same as x"
AUTO = "auto"

_OPTION_LABELS = {
    "save_rstd": "save rstd (for the backward)",
    "write_residual": "write the updated residual",
    "save_stats": "save mean and rstd (for the backward)",
    "partial_rows": "rows per program (dW partials)",
}


# ---------------------------------------------------------------- exercise inputs


def _rmsnorm_args(M: int, N: int, dtype: torch.dtype, w_dtype: torch.dtype) -> tuple:
    device = runtime.DEVICE
    return (torch.randn(M, N, dtype=dtype, device=device),
            torch.rand(N, dtype=w_dtype, device=device) + 0.5, 1e-6)


def _add_rmsnorm_args(M: int, N: int, dtype: torch.dtype, w_dtype: torch.dtype) -> tuple:
    device = runtime.DEVICE
    return (torch.randn(M, N, dtype=dtype, device=device),
            torch.randn(M, N, dtype=dtype, device=device),
            torch.rand(N, dtype=w_dtype, device=device) + 0.5, 1e-6)


def _layernorm_args(M: int, N: int, dtype: torch.dtype, w_dtype: torch.dtype) -> tuple:
    device = runtime.DEVICE
    return (torch.randn(M, N, dtype=dtype, device=device),
            torch.rand(N, dtype=w_dtype, device=device) + 0.5,
            torch.randn(N, dtype=w_dtype, device=device), 1e-5)


def _rmsnorm_backward_args(M: int, N: int, dtype: torch.dtype, w_dtype: torch.dtype) -> tuple:
    device = runtime.DEVICE
    x = torch.randn(M, N, dtype=dtype, device=device)
    # rstd as a forward saves it: float32, one per row.
    rstd = torch.rsqrt(x.float().square().mean(dim=-1) + 1e-6)
    return (x, torch.rand(N, dtype=w_dtype, device=device) + 0.5, rstd,
            torch.randn(M, N, dtype=dtype, device=device))


def _layernorm_backward_args(M: int, N: int, dtype: torch.dtype, w_dtype: torch.dtype
                             ) -> tuple:
    device = runtime.DEVICE
    x = torch.randn(M, N, dtype=dtype, device=device)
    # mean and rstd as a forward saves them: float32, one per row.
    var, mean = torch.var_mean(x.float(), dim=-1, correction=0)
    return (x, torch.rand(N, dtype=w_dtype, device=device) + 0.5, mean,
            torch.rsqrt(var + 1e-5), torch.randn(M, N, dtype=dtype, device=device))


# ---------------------------------------------------------------- the variants


@dataclass(frozen=True)
class Variant:
    """One kernel variant the calculator knows: its model in `course.traffic`, the options
    that model takes (with their defaults), the ideal single-pass bytes of the same job,
    the wrapper signature the measure button calls, and a maker of inputs for that call."""

    title: str
    model: Callable[..., traffic.Traffic]
    options: dict[str, Any]
    ideal: Callable[[int, int, str, str | None, dict[str, Any]], int]
    exercise: str
    make_args: Callable[[int, int, torch.dtype, torch.dtype], tuple]


def _ideal_rmsnorm(M, N, dtype, w_dtype, options) -> int:
    return traffic.fused_rmsnorm(M, N, dtype, w_dtype,
                                 save_rstd=options.get("save_rstd", False)).bytes


def _ideal_add_rmsnorm(M, N, dtype, w_dtype, options) -> int:
    # Unfused or fused, the job is the same: read x and the residual, write y and the sum.
    return traffic.fused_add_rmsnorm(M, N, dtype, w_dtype,
                                     save_rstd=options.get("save_rstd", False),
                                     write_residual=options.get("write_residual", True)).bytes


def _ideal_layernorm(M, N, dtype, w_dtype, options) -> int:
    return traffic.layernorm(M, N, dtype, w_dtype, save_stats=options["save_stats"]).bytes


def _ideal_rmsnorm_backward(M, N, dtype, w_dtype, options) -> int:
    return traffic.ideal_backward_bytes(M, N, dtype, w_dtype, with_bias=False)


def _ideal_layernorm_backward(M, N, dtype, w_dtype, options) -> int:
    return traffic.ideal_backward_bytes(M, N, dtype, w_dtype, with_bias=True)


VARIANTS: dict[str, Variant] = {
    "eager_rmsnorm": Variant(
        "eager PyTorch RMSNorm (op by op)", traffic.eager_rmsnorm, {}, _ideal_rmsnorm,
        "rmsnorm(x, weight, eps)", _rmsnorm_args),
    "two_pass_rmsnorm": Variant(
        "two-pass RMSNorm", traffic.two_pass_rmsnorm, {"save_rstd": False}, _ideal_rmsnorm,
        "rmsnorm_two_pass(x, weight, eps)", _rmsnorm_args),
    "fused_rmsnorm": Variant(
        "fused RMSNorm", traffic.fused_rmsnorm, {"save_rstd": False}, _ideal_rmsnorm,
        "rmsnorm(x, weight, eps)", _rmsnorm_args),
    "unfused_add_rmsnorm": Variant(
        "residual add, then RMSNorm (two launches)", traffic.unfused_add_rmsnorm,
        {"save_rstd": False}, _ideal_add_rmsnorm,
        "add_rmsnorm(x, residual, weight, eps)", _add_rmsnorm_args),
    "fused_add_rmsnorm": Variant(
        "fused residual add + RMSNorm", traffic.fused_add_rmsnorm,
        {"save_rstd": False, "write_residual": True}, _ideal_add_rmsnorm,
        "add_rmsnorm(x, residual, weight, eps)", _add_rmsnorm_args),
    "layernorm": Variant(
        "fused LayerNorm", traffic.layernorm, {"save_stats": True}, _ideal_layernorm,
        "layernorm(x, weight, bias, eps)", _layernorm_args),
    "rmsnorm_backward": Variant(
        "RMSNorm backward (dX, dW)", traffic.rmsnorm_backward, {"partial_rows": None},
        _ideal_rmsnorm_backward, "rmsnorm_backward(x, weight, rstd, dy)",
        _rmsnorm_backward_args),
    # Chapter 07's LayerNorm exercise and the reference kernel share this signature.
    "layernorm_backward": Variant(
        "LayerNorm backward (dX, dW, dB)", traffic.layernorm_backward, {"partial_rows": None},
        _ideal_layernorm_backward, "layernorm_backward(x, weight, mean, rstd, dy)",
        _layernorm_backward_args),
}


def _variant(kernel: str) -> Variant:
    if kernel not in VARIANTS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(VARIANTS)}")
    return VARIANTS[kernel]


# The values the "rows per program" dropdown offers (None: "auto").
PARTIAL_ROWS_CHOICES = tuple(2**k for k in range(13))


def _option_defaults(kernel: str, variant: Variant, given: Mapping[str, Any] | None
                     ) -> dict[str, Any]:
    """The variant's options as the controls open: its defaults, with `given` over them.
    A name the variant does not have, or a value its control cannot show, is refused."""
    defaults = dict(variant.options)
    if given is None:
        return defaults
    if not isinstance(given, Mapping):
        raise TypeError(f"options must be a dict of option name -> value, got {given!r}")
    for name, value in given.items():
        if name not in defaults:
            known = ", ".join(defaults) if defaults else "none"
            raise ValueError(f"{kernel!r} has no option {name!r}; its options: {known}")
        if name == "partial_rows":
            if value is not None and (isinstance(value, bool)
                                      or value not in PARTIAL_ROWS_CHOICES):
                raise ValueError(f"partial_rows must be None (auto) or a power of two from 1 "
                                 f"to {PARTIAL_ROWS_CHOICES[-1]}, got {value!r}")
        elif not isinstance(value, bool):
            raise TypeError(f"option {name!r} is ticked or not: pass True or False, "
                            f"got {value!r}")
        defaults[name] = value
    return defaults


@dataclass(frozen=True)
class DeviceRates:
    """What the GPU in hand was measured to do (course.hardware, once per process)."""

    device_name: str
    copy_bytes_per_s: float
    broadcast_bytes_per_s: float   # PyTorch's non-vectorised elementwise path
    launch_s: float                # each extra launch's fixed cost

    @classmethod
    def measure(cls) -> DeviceRates:
        return cls(measured_gpu_name(), hardware.copy_bandwidth(),
                   hardware.broadcast_bandwidth(), hardware.launch_overhead())

    def predicted_time(self, model: traffic.Traffic) -> float:
        return model.predicted_time(self.copy_bytes_per_s, self.broadcast_bytes_per_s,
                                    self.launch_s)


# ---------------------------------------------------------------- the widget


class TrafficCalculator(CourseWidget):
    """Controls: `m_slider`, `n_slider`, `dtype`, `weight_dtype`, `gpu`, `options` (the
    variant's own, by name), `measure_button`. State, recomputed on every change:
    `current_traffic`, `ideal_bytes`, `predicted_at_peak_s`, `predicted_on_this_gpu_s`,
    `table_html`, `summary_text`, `measurement`, `figure`."""

    def __init__(self, kernel: str, fn: Callable[..., Any] | None = None, *, M: int = 16384,
                 N: int = 4096, dtype: traffic.DTypeLike = "bfloat16",
                 gpu: str | None = None, options: Mapping[str, Any] | None = None) -> None:
        self.kernel = kernel
        self.variant = _variant(kernel)
        option_defaults = _option_defaults(kernel, self.variant, options)
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be your kernel's wrapper function (or None), got {fn!r}")
        self.fn = fn
        M = positive_int(M, "M")
        N = positive_int(N, "N")
        dtype, gpu = dtype_choice(dtype), gpu_choice(gpu)
        self.rates = DeviceRates.measure() if runtime.on_gpu() else None
        # (settings, measurement), settings as _settings() gives them
        self.measurements: list[tuple[tuple, bench.Measurement]] = []

        self.m_slider = shape_slider("M (rows)", M, max(MAX_M, M))
        self.n_slider = shape_slider("N (row)", N, max(MAX_N, N))
        self.dtype = dtype_dropdown(dtype)
        self.weight_dtype = widgets.Dropdown(
            options=[SAME_AS_X, "float32"], value=SAME_AS_X,
            description="weight", layout=widgets.Layout(width="220px"))
        self.gpu = gpu_dropdown(gpu)
        self.options: dict[str, widgets.ValueWidget] = {
            name: self._option_control(name, default)
            for name, default in option_defaults.items()}
        self.measure_button = widgets.Button(description="measure", icon="stopwatch",
                                             layout=widgets.Layout(width="120px"))
        # HTML rather than Label: a long message wraps instead of being cut off.
        self.measure_label = widgets.HTML()
        self.table = widgets.HTML()
        self.summary = widgets.HTML()
        self.plot = FigureImage()
        self.figure = self.plot.figure
        self._set_measure_state()

        observe_all([self.m_slider, self.n_slider, self.dtype, self.weight_dtype, self.gpu,
                     *self.options.values()], self._on_change)
        self.measure_button.on_click(self._on_measure)
        self.widget = widgets.VBox([
            widgets.HTML(f"<b>HBM traffic: {html.escape(self.variant.title)}</b>"),
            control_row([self.m_slider, self.n_slider]),
            control_row([self.dtype, self.weight_dtype, self.gpu]),
            control_row(list(self.options.values())),
            self.table, self.summary, self.plot.image,
            widgets.HBox([self.measure_button, self.measure_label]),
        ], layout=widgets.Layout(max_width=MAX_WIDTH))
        self.update()

    @staticmethod
    def _option_control(name: str, default: Any) -> widgets.ValueWidget:
        label = _OPTION_LABELS[name]
        if name == "partial_rows":
            choices = [(AUTO, AUTO)] + [(str(rows), rows) for rows in PARTIAL_ROWS_CHOICES]
            return widgets.Dropdown(options=choices, value=AUTO if default is None else default,
                                    description=label,
                                    style={"description_width": "initial"},
                                    layout=widgets.Layout(width="300px"))
        return widgets.Checkbox(value=default, description=label, indent=False,
                                layout=widgets.Layout(width="290px"))

    # ------------------------------------------------------------ state

    @property
    def shape(self) -> tuple[int, int]:
        return self.m_slider.value, self.n_slider.value

    @property
    def option_values(self) -> dict[str, Any]:
        """The variant's options as its model takes them ("auto" is None)."""
        return {name: None if control.value == AUTO else control.value
                for name, control in self.options.items()}

    @property
    def weight_dtype_name(self) -> str | None:
        """The weight's dtype as the models take it: None when it is x's."""
        return None if self.weight_dtype.value == SAME_AS_X else self.weight_dtype.value

    @property
    def spec(self) -> hardware.GPUSpec:
        return hardware.lookup(self.gpu.value)

    def model(self, M: int, N: int) -> traffic.Traffic:
        """The variant's traffic at this shape with the current dtype and options."""
        return self.variant.model(M, N, self.dtype.value, self.weight_dtype_name,
                                  **self.option_values)

    def ideal(self, M: int, N: int) -> int:
        """The ideal single-pass bytes of the same job at this shape."""
        return self.variant.ideal(M, N, self.dtype.value, self.weight_dtype_name,
                                  self.option_values)

    def _settings(self) -> tuple:
        """What a measurement depends on besides N: every control but the GPU in the table."""
        return (self.m_slider.value, self.dtype.value, self.weight_dtype_name,
                tuple(sorted(self.option_values.items())))

    @property
    def measurement(self) -> bench.Measurement | None:
        """The latest measurement at exactly the current settings, if any."""
        settings, N = self._settings(), self.n_slider.value
        for measured_settings, measured in reversed(self.measurements):
            if measured_settings == settings and measured.extra["N"] == N:
                return measured
        return None

    # ------------------------------------------------------------ recomputing

    def _on_change(self, _change: dict) -> None:
        self.update()

    def update(self) -> None:
        M, N = self.shape
        spec = self.spec
        self.current_traffic = self.model(M, N)
        self.ideal_bytes = self.ideal(M, N)
        self.predicted_at_peak_s = self.current_traffic.predicted_time(spec.hbm_bytes_per_s)
        self.predicted_on_this_gpu_s = (self.rates.predicted_time(self.current_traffic)
                                        if self.rates is not None else None)
        self.table_html = self._table_html()
        self.summary_text = self._summary_text()
        # On a very narrow screen the table scrolls sideways rather than run off the edge.
        self.table.value = f'<div style="overflow-x:auto">{self.table_html}</div>'
        self.summary.value = lines_html(self.summary_text)
        self._draw()

    def _table_html(self) -> str:
        cell = 'style="padding:1px 8px;text-align:{}"'
        left, right = cell.format("left"), cell.format("right")
        head = "".join(f"<th {right if i in (1, 2, 3, 4) else left}>{h}</th>"
                       for i, h in enumerate(("launch", "read", "written", "total", "FLOPs",
                                              "access", "note")))
        rows = []
        for k in self.current_traffic.kernels:
            access = "vectorised" if k.vectorized else "NOT vectorised"
            rows.append(
                f"<tr><td {left}>{html.escape(k.name)}</td>"
                f"<td {right}>{format_bytes(k.bytes_read)}</td>"
                f"<td {right}>{format_bytes(k.bytes_written)}</td>"
                f"<td {right}>{format_bytes(k.bytes)}</td>"
                f"<td {right}>{format_count(k.flops)}</td>"
                f"<td {left}>{access}</td><td {left}>{html.escape(k.note)}</td></tr>")
        t = self.current_traffic
        rows.append(f"<tr style='font-weight:bold'><td {left}>total</td>"
                    f"<td {right}>{format_bytes(t.bytes_read)}</td>"
                    f"<td {right}>{format_bytes(t.bytes_written)}</td>"
                    f"<td {right}>{format_bytes(t.bytes)}</td>"
                    f"<td {right}>{format_count(t.flops)}</td><td></td><td></td></tr>")
        return ("<table style='border-collapse:collapse;font-size:90%'>"
                f"<tr>{head}</tr>{''.join(rows)}</table>")

    def _summary_text(self) -> str:
        t = self.current_traffic
        M, N = self.shape
        spec = self.spec
        lines = [
            f"{t.variant} at M = {M}, N = {N}: {format_bytes(t.bytes)} in {t.launches} "
            f"launch(es) ({format_bytes(t.bytes_read)} read, "
            f"{format_bytes(t.bytes_written)} written)",
            f"ideal single pass: {format_bytes(self.ideal_bytes)}; this variant moves "
            f"{t.bytes / self.ideal_bytes:.2f}x that",
            f"{format_count(t.flops, 'FLOP')}, arithmetic intensity "
            f"{t.intensity:.3f} FLOP/byte",
            f"predicted at the {spec.name}'s peak HBM bandwidth ({spec.hbm_gbps:.0f} GB/s): "
            f"{format_seconds(self.predicted_at_peak_s)}",
        ]
        if self.rates is None:
            lines.append("predicted at the measured copy bandwidth: needs a GPU (kernels run "
                         "in Triton's interpreter here)")
        else:
            r = self.rates
            slower = (f", non-vectorised launches at {r.broadcast_bytes_per_s / 1e9:.0f} GB/s"
                      if any(not k.vectorized for k in t.kernels) else "")
            lines.append(
                f"predicted on this GPU ({r.device_name}), at its measured copy bandwidth "
                f"{r.copy_bytes_per_s / 1e9:.0f} GB/s{slower}, plus {r.launch_s * 1e6:.1f} us "
                f"per launch: {format_seconds(self.predicted_on_this_gpu_s)}")
        if self.predicted_at_peak_s < _LAUNCH_DOMINATES_S:
            lines.append("at this size a launch's fixed cost (a few microseconds) outweighs "
                         "the traffic: the prediction is a floor, not an estimate")
        measured = self.measurement
        if measured is not None:
            lines.append(f"measured: {format_seconds(measured.seconds)}, "
                         f"{measured.gbps:.0f} GB/s of ideal bytes, "
                         f"{100 * measured.fraction_of_copy:.1f} % of copy bandwidth "
                         f"(predicted on this GPU: "
                         f"{format_seconds(self.predicted_on_this_gpu_s)})")
        return "\n".join(lines)

    def _draw(self) -> None:
        M, N = self.shape
        spec = self.spec
        ns = list(self.n_slider.options)
        ax = self.plot.new_axes()
        models = [self.model(M, n) for n in ns]
        at_ideal = all(m.bytes == self.ideal(M, n) for m, n in zip(models, ns, strict=True))
        # A variant that moves the ideal bytes would hide the ideal line under its own.
        ax.plot(ns, [1e6 * m.predicted_time(spec.hbm_bytes_per_s) for m in models],
                label=f"this variant{' (= ideal single pass)' if at_ideal else ''}, "
                      f"{spec.name} peak")
        if not at_ideal:
            ax.plot(ns, [1e6 * self.ideal(M, n) / spec.hbm_bytes_per_s for n in ns], "--",
                    color="grey", label="ideal single pass, peak")
        if self.rates is not None:
            ax.plot(ns, [1e6 * self.rates.predicted_time(m) for m in models], ":",
                    label="this variant, this GPU (measured rates)")
        ax.plot([N], [1e6 * self.predicted_at_peak_s], "o", color="tab:red",
                label=f"N = {N}")
        settings = self._settings()
        points = [(m.extra["N"], m.seconds) for s, m in self.measurements if s == settings]
        if points:
            ax.plot([n for n, _ in points], [1e6 * s for _, s in points], "x", color="black",
                    markersize=8, mew=2, label="measured (your kernel)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (row length)")
        ax.set_ylabel("time (us)")
        ax.set_title(f"{self.current_traffic.variant}, M = {M}", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
        self.figure.subplots_adjust(left=0.12, right=0.97, top=0.91, bottom=0.14)
        self.plot.show()

    # ------------------------------------------------------------ measuring

    def _say(self, text: str) -> None:
        self.measure_label.value = html.escape(text)

    def _set_measure_state(self) -> None:
        if not runtime.on_gpu():
            self.measure_button.disabled = True
            self._say(NO_GPU_LABEL)
        elif self.fn is None:
            self.measure_button.disabled = True
            self._say(f"to measure, pass your kernel: traffic_calculator({self.kernel!r}, "
                      f"fn=...) with fn called as {self.variant.exercise}")
        else:
            self.measure_button.disabled = False
            self._say(f"times {self.variant.exercise} at the shape above (rotating inputs, "
                      "median of 100 runs)")

    def measure(self) -> bench.Measurement:
        """Time `fn` at the current shape and dtype; the result joins the summary and plot.

        Bandwidth is over the ideal single-pass bytes, as a fraction of the copy bandwidth
        measured on this GPU."""
        if not runtime.on_gpu():
            raise hardware.NeedsGPU(NO_GPU_LABEL)
        if self.fn is None:
            raise ValueError(f"no kernel to measure: pass fn, called as "
                             f"{self.variant.exercise}")
        M, N = self.shape
        x_dtype = traffic.as_torch_dtype(self.dtype.value)
        w_dtype = traffic.as_torch_dtype(self.weight_dtype_name or self.dtype.value)
        nbytes = self.ideal_bytes
        # inputs in rotating copies, plus the recent outputs the timer keeps alive
        needed = (nbytes * (bench.copies_needed(nbytes) + 1)
                  + int(bench.L2_MULTIPLE * hardware.l2_bytes()))
        free = torch.cuda.mem_get_info()[0]
        if needed > 0.8 * free:
            raise ValueError(f"M = {M}, N = {N} needs about {format_bytes(needed)} of GPU memory "
                             f"(inputs in rotating copies, recent outputs kept), but "
                             f"{format_bytes(free)} is free: choose a smaller M or N")
        make_args = self.variant.make_args
        measured = bench.measure(f"{self.kernel} {M}x{N} {self.dtype.value}", self.fn,
                                 lambda: make_args(M, N, x_dtype, w_dtype), nbytes,
                                 hide_launch=True)
        measured = bench.Measurement(measured.label, measured.seconds, measured.nbytes,
                                     measured.copy_bytes_per_s, {"M": M, "N": N})
        self.measurements.append((self._settings(), measured))
        self.update()
        return measured

    def _on_measure(self, _button: widgets.Button) -> None:
        if self.measure_button.disabled:  # click() from code reaches here even then
            return
        self._say("measuring ...")
        self.measure_button.disabled = True
        try:
            measured = self.measure()
        except Exception as exc:  # a broken kernel must not break the widget: say what failed
            self._say(f"measurement failed: {type(exc).__name__}: {exc}")
        else:
            self._say(str(measured))
        finally:
            self.measure_button.disabled = False


def traffic_calculator(kernel: str, fn: Callable[..., Any] | None = None, *, M: int = 16384,
                       N: int = 4096, dtype: traffic.DTypeLike = "bfloat16",
                       gpu: str | None = None, options: Mapping[str, Any] | None = None
                       ) -> TrafficCalculator:
    """The HBM-traffic calculator for one kernel variant (see VARIANTS for the names).

    `fn` is your exercise's wrapper (for example `rmsnorm(x, weight, eps)`); with it and a
    GPU the "measure" button times it at the chosen shape. `gpu` names a row of the spec
    table; by default the GPU in hand if the table knows it, else the H100 SXM. `options`
    sets how the variant's own controls open, by name (VARIANTS[kernel].options lists them
    with their defaults): for example {"save_stats": False} for a LayerNorm that saves no
    statistics.
    """
    return TrafficCalculator(kernel, fn, M=M, N=N, dtype=dtype, gpu=gpu, options=options)


__all__ = ["NO_GPU_LABEL", "VARIANTS", "DeviceRates", "TrafficCalculator", "Variant",
           "traffic_calculator"]
