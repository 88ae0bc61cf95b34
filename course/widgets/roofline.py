"""The roofline explorer: where a norm kernel sits against a GPU's ridge point.

    roofline_explorer()

Attainable FLOP/s is the lesser of the peak compute and intensity x peak bandwidth. The
ridge point (`course.traffic.ridge_point`) is the intensity where the two meet. A norm
does well under one FLOP per byte, so it sits far to the left: its time is decided by
bytes, and the distance (`course.traffic.distance_from_ridge`) says by how much.
"""

from __future__ import annotations

from course import hardware, traffic
from course.widgets.common import (
    MAX_M,
    MAX_N,
    MAX_WIDTH,
    CourseWidget,
    FigureImage,
    control_row,
    dtype_choice,
    dtype_dropdown,
    format_seconds,
    gpu_choice,
    gpu_dropdown,
    lines_html,
    observe_all,
    positive_int,
    shape_slider,
)

import ipywidgets as widgets
import numpy as np
import torch

# Each choice is a `course.traffic` model with its defaults.
KERNELS: dict[str, tuple[str, object]] = {
    "rmsnorm": ("RMSNorm (fused)", traffic.fused_rmsnorm),
    "layernorm": ("LayerNorm (fused)", traffic.layernorm),
    "add_rmsnorm": ("add + RMSNorm (fused)", traffic.fused_add_rmsnorm),
    "backward": ("RMSNorm backward", traffic.rmsnorm_backward),
}

_INTENSITY_RANGE = (1e-2, 1e4)  # FLOP/byte shown on the x axis


class RooflineExplorer(CourseWidget):
    """Controls: `gpu`, `dtype`, `kernel`, `m_slider`, `n_slider`. State: `spec`,
    `current_traffic`, `ridge`, `distance`, `time_floor_s`, `summary_text`, `figure`."""

    def __init__(self, *, kernel: str = "rmsnorm", M: int = 16384, N: int = 4096,
                 dtype: traffic.DTypeLike = "bfloat16", gpu: str | None = None) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        M = positive_int(M, "M")
        N = positive_int(N, "N")
        self.gpu = gpu_dropdown(gpu_choice(gpu))
        self.dtype = dtype_dropdown(dtype_choice(dtype))
        self.kernel = widgets.Dropdown(
            options=[(label, key) for key, (label, _) in KERNELS.items()], value=kernel,
            description="kernel", layout=widgets.Layout(width="300px"))
        self.m_slider = shape_slider("M (rows)", M, max(MAX_M, M))
        self.n_slider = shape_slider("N (row)", N, max(MAX_N, N))
        self.summary = widgets.HTML()
        self.plot = FigureImage()
        self.figure = self.plot.figure
        observe_all([self.gpu, self.dtype, self.kernel, self.m_slider, self.n_slider],
                    self._on_change)
        self.widget = widgets.VBox([
            widgets.HTML("<b>Roofline: where the norm sits</b>"),
            control_row([self.gpu, self.dtype, self.kernel]),
            control_row([self.m_slider, self.n_slider]),
            self.summary, self.plot.image,
        ], layout=widgets.Layout(max_width=MAX_WIDTH))
        self.update()

    def _on_change(self, _change: dict) -> None:
        self.update()

    @property
    def kernel_label(self) -> str:
        return KERNELS[self.kernel.value][0]

    def update(self) -> None:
        self.spec = hardware.lookup(self.gpu.value)
        model = KERNELS[self.kernel.value][1]
        self.current_traffic = model(self.m_slider.value, self.n_slider.value, self.dtype.value)
        self.ridge = traffic.ridge_point(self.spec, self.dtype.value)
        self.distance = traffic.distance_from_ridge(self.current_traffic, self.spec,
                                                    self.dtype.value)
        self.time_floor_s = traffic.time_floor_at_peak(self.current_traffic, self.spec)
        self.summary_text = self._summary_text()
        self.summary.value = lines_html(self.summary_text)
        self._draw()

    def _summary_text(self) -> str:
        t, spec, dtype = self.current_traffic, self.spec, self.dtype.value
        if self.distance >= 1:
            where = f"{self.distance:.0f}x left of the ridge: memory-bound"
        else:
            where = f"{1 / self.distance:.0f}x right of the ridge: compute-bound"
        memory_s = t.bytes / spec.hbm_bytes_per_s
        compute_s = t.flops / spec.peak_flops(torch.float32)
        ridge_line = (f"{spec.name} ridge point for {dtype}: {self.ridge:.1f} FLOP/byte "
                      f"({spec.peak_flops(traffic.as_torch_dtype(dtype)) / 1e12:.0f} TFLOP/s "
                      f"over {spec.hbm_gbps:.0f} GB/s)")
        if self._no_bf16_units():
            ridge_line += (f"; the {spec.name} has no bfloat16 tensor cores, so this is the "
                           "roof of its float32 units")
        return "\n".join([
            f"{self.kernel_label}, M = {self.m_slider.value}, N = {self.n_slider.value}, "
            f"{dtype}: {t.intensity:.3f} FLOP/byte",
            ridge_line,
            where,
            f"time floor at peak: {format_seconds(self.time_floor_s)} (bytes at peak "
            f"bandwidth {format_seconds(memory_s)}; FLOPs at the fp32 peak "
            f"{format_seconds(compute_s)})",
        ])

    def _no_bf16_units(self) -> bool:
        """bfloat16 chosen on a GPU without bfloat16 tensor cores (its fp32 peak stands in)."""
        return (traffic.as_torch_dtype(self.dtype.value) == torch.bfloat16
                and self.spec.bf16_tflops is None)

    def _draw(self) -> None:
        spec, dtype = self.spec, traffic.as_torch_dtype(self.dtype.value)
        bandwidth = spec.hbm_bytes_per_s
        peak = spec.peak_flops(dtype)
        intensities = np.logspace(np.log10(_INTENSITY_RANGE[0]), np.log10(_INTENSITY_RANGE[1]),
                                  200)
        ax = self.plot.new_axes()
        roof = (f"{spec.name}, fp32 peak (no bf16 tensor cores)" if self._no_bf16_units()
                else f"{spec.name}, {self.dtype.value} peak")
        ax.plot(intensities, np.minimum(peak, intensities * bandwidth), color="tab:blue",
                label=roof)
        fp32_peak = spec.peak_flops(torch.float32)
        if fp32_peak != peak:
            # A norm's arithmetic runs on the fp32 CUDA cores, whose roof is lower.
            ax.plot(intensities, np.minimum(fp32_peak, intensities * bandwidth), "--",
                    color="tab:blue", alpha=0.5, label="fp32 CUDA cores")
        ax.axvline(self.ridge, color="grey", linestyle=":")
        ax.plot([self.ridge], [peak], "s", color="grey")
        ax.annotate(f"ridge {self.ridge:.0f} FLOP/B", (self.ridge, peak),
                    xytext=(6, -14), textcoords="offset points", fontsize=8)
        intensity = self.current_traffic.intensity
        attained = min(peak, intensity * bandwidth)
        ax.plot([intensity], [attained], "o", color="tab:red",
                label=f"{self.kernel_label}: {intensity:.2f} FLOP/B")
        ax.annotate("", xy=(self.ridge, attained), xytext=(intensity, attained),
                    arrowprops={"arrowstyle": "<->", "color": "tab:red", "alpha": 0.6})
        ax.text(np.sqrt(intensity * self.ridge), attained * 1.4, f"{self.distance:.0f}x",
                ha="center", fontsize=8, color="tab:red")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(*_INTENSITY_RANGE)
        ax.set_ylim(_INTENSITY_RANGE[0] * bandwidth / 2, peak * 3)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("attainable FLOP/s")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        self.figure.subplots_adjust(left=0.12, right=0.97, top=0.91, bottom=0.14)
        self.plot.show()


def roofline_explorer(*, kernel: str = "rmsnorm", M: int = 16384, N: int = 4096,
                      dtype: traffic.DTypeLike = "bfloat16",
                      gpu: str | None = None) -> RooflineExplorer:
    """A roofline for a GPU of the spec table, with a norm kernel placed on it. `kernel` is
    one of 'rmsnorm', 'layernorm', 'add_rmsnorm', 'backward'."""
    return RooflineExplorer(kernel=kernel, M=M, N=N, dtype=dtype, gpu=gpu)


__all__ = ["KERNELS", "RooflineExplorer", "roofline_explorer"]
