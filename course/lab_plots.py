"""Chapter 08's plots: the lab's sweeps drawn the same way, recorded or live.

Every plot takes `panels`, a mapping from a panel's title (a GPU) to its sweep points
(`course.lab_sweeps.SweepPoint`), and draws one panel per entry, side by side on one y
axis: the recorded H100 and H200 sweeps, and the GPU in hand when the notebook measured
it. A panel draws whatever points it holds, so a live sweep of a dozen launches and a
recorded one of hundreds go through the same code. Only 16-bit rows are drawn (the
sweeps' bfloat16; float16 where a GPU has no bfloat16). A launch that failed to compile is
drawn as an x on the axis, not left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from course import lab_sweeps, traffic
from course.lab_sweeps import SweepPoint

Panels = Mapping[str, Sequence[SweepPoint]]
ELEMENT_SIZE = 2  # the experiments' rows are 16-bit


def swept(points: Sequence[SweepPoint], impl: str = "lab", **fields) -> list[SweepPoint]:
    """`impl`'s points at the sweeps' shapes (GPU time, 16-bit rows, about 2**26 elements:
    not the small shapes timed for the host's cost) whose fields match `fields`."""
    return [p for p in lab_sweeps.select(points, impl=impl, timer="gpu", **fields)
            if lab_sweeps.DTYPE_BYTES[p.dtype] == ELEMENT_SIZE
            and p.n_rows == lab_sweeps.rows_for(p.n_cols)]


def lab_points(points: Sequence[SweepPoint], **fields) -> list[SweepPoint]:
    """The chapter's own launches at the sweeps' shapes whose fields match `fields`."""
    return swept(points, "lab", **fields)


def best_of(points: Sequence[SweepPoint], n_cols: int, **fields) -> SweepPoint | None:
    """The fastest timed launch at `n_cols` among those matching `fields`, None if none."""
    return _fastest(lab_points(points, n_cols=n_cols, **fields))


def one_per_tile(points: Sequence[SweepPoint], **fields) -> list[SweepPoint]:
    """Whole rows in registers, one program per tile (neither persistent nor chunked)."""
    return lab_points(points, programs_per_sm=0, chunk_n=0, **fields)


def best_one_per_tile(points: Sequence[SweepPoint], n_cols: int, **fields) -> SweepPoint | None:
    """The fastest launch of one program per tile at `n_cols`, None if none was timed."""
    return best_of(points, n_cols, programs_per_sm=0, chunk_n=0, **fields)


def _fastest(points: Sequence[SweepPoint]) -> SweepPoint | None:
    return min((p for p in points if p.ok), key=lambda p: p.seconds, default=None)


def best_persistent(points: Sequence[SweepPoint], n_cols: int) -> SweepPoint | None:
    """The fastest persistent launch at `n_cols`, None if none was timed."""
    return _fastest([p for p in lab_points(points, n_cols=n_cols) if p.programs_per_sm])


def best_chunked(points: Sequence[SweepPoint], n_cols: int) -> SweepPoint | None:
    """The fastest launch of the chunked kernel at `n_cols`, None if none was timed."""
    return _fastest([p for p in lab_points(points, n_cols=n_cols) if p.chunk_n])


def per_panel(panels: Panels, keys: Sequence, measure: Callable[[Sequence[SweepPoint], object],
                                                                 object]) -> dict[str, dict]:
    """panel -> key -> measure(points, key): what `against_prediction` sets beside yours."""
    return {name: {key: measure(points, key) for key in keys} for name, points in panels.items()}


def _figure(panels: Panels, title: str):
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("nothing to plot: pass at least one panel of sweep points")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), sharey=True,
                             squeeze=False)
    for ax, (name, points) in zip(axes[0], panels.items(), strict=True):
        device = points[0].device_name if points else "no points"
        ax.set_title(f"{name}\n{device}", fontsize=9)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return fig, axes[0]


def _percent_axis(ax) -> None:
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of copy bandwidth")


def _log2_axis(ax, ticks: Sequence[int], label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks), [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(label)


def _curve(ax, xs_points: Sequence[tuple[float, SweepPoint | None]], label: str, **style):
    """Timed points as a line; failed ones as an x on the axis (a result, not a gap)."""
    timed = [(x, 100 * p.fraction_of_copy) for x, p in xs_points if p is not None and p.ok]
    failed = [x for x, p in xs_points if p is not None and not p.ok]
    line = None
    if timed:
        (line,) = ax.plot(*zip(*timed, strict=True), marker="o", label=label, **style)
    if failed:
        color = line.get_color() if line is not None else None
        ax.plot(failed, [0] * len(failed), "x", color=color, markersize=9, clip_on=False,
                label=None if line is not None else f"{label} (failed)")


def _finish(fig, axes) -> None:
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()


def warps(panels: Panels, n_cols: Sequence[int]):
    """Experiment 1: one row per program, % of copy against num_warps, a line per N."""
    fig, axes = _figure(panels, "One row per program: warps per program")
    for ax, points in zip(axes, panels.values(), strict=True):
        for n in n_cols:
            curve = [(p.num_warps, p) for p in one_per_tile(points, n_cols=n, rows_per_tile=1)]
            _curve(ax, sorted(curve, key=lambda xp: xp[0]), f"N = {n}")
        _log2_axis(ax, lab_sweeps.WARPS, "num_warps")
    _percent_axis(axes[0])
    _finish(fig, axes)
    return fig


def rows_per_tile(panels: Panels, n_cols: Sequence[int]):
    """Experiment 2: the best over warps for each rows_per_tile, a line per N."""
    fig, axes = _figure(panels, "Short rows: rows per program (best num_warps for each)")
    for ax, points in zip(axes, panels.values(), strict=True):
        for n in n_cols:
            curve = []
            for rows in lab_sweeps.ROWS_PER_TILE:
                tried = one_per_tile(points, n_cols=n, rows_per_tile=rows)
                if tried:  # the best warps for these rows; a failed point if none ran
                    curve.append((rows, _fastest(tried) or tried[0]))
            _curve(ax, curve, f"N = {n}")
        _log2_axis(ax, lab_sweeps.ROWS_PER_TILE, "rows per program (rows_per_tile)")
    _percent_axis(axes[0])
    _finish(fig, axes)
    return fig


def persistent(panels: Panels, n_cols: int):
    """Experiment 3: persistent programs (a line per num_stages) against programs per SM;
    the dashed line is the best launch of one program per tile at the same N."""
    fig, axes = _figure(panels, f"N = {n_cols}: persistent programs against one per tile")
    for ax, points in zip(axes, panels.values(), strict=True):
        kept = lab_points(points, n_cols=n_cols, chunk_n=0)
        per_tile = best_one_per_tile(points, n_cols)
        if per_tile is not None:
            ax.axhline(100 * per_tile.fraction_of_copy, color="black", linestyle="--",
                       label=f"one per tile ({per_tile.rows_per_tile} rows, "
                             f"{per_tile.num_warps} warps)")
        for stages in lab_sweeps.STAGES:
            curve = sorted((p.programs_per_sm, p) for p in kept
                           if p.programs_per_sm and p.num_stages == stages)
            _curve(ax, curve, f"{stages} stage(s)")
        _log2_axis(ax, lab_sweeps.PROGRAMS_PER_SM, "persistent programs per SM")
    _percent_axis(axes[0])
    _finish(fig, axes)
    return fig


def whole_vs_chunked(panels: Panels, from_cols: int = 4096, read_twice_cap: float | None = None):
    """Experiment 4: for each N from `from_cols`, the best whole-row launch and the best
    chunked launch; `read_twice_cap` (a fraction) draws the ceiling of a kernel that reads
    each row twice from HBM."""
    fig, axes = _figure(panels, "Long rows: whole rows in registers against a loop over chunks")
    for ax, points in zip(axes, panels.values(), strict=True):
        # powers of two only: the other recorded lengths are the graded rule's hidden ones
        ns = sorted({p.n_cols for p in lab_points(points)
                     if p.n_cols >= from_cols and p.n_cols & (p.n_cols - 1) == 0})
        _curve(ax, [(n, best_one_per_tile(points, n)) for n in ns], "whole rows (best launch)")
        _curve(ax, [(n, best_chunked(points, n)) for n in ns], "chunked (best launch)")
        if read_twice_cap is not None:
            ax.axhline(100 * read_twice_cap, color="grey", linestyle=":",
                       label="every row read twice from HBM")
        ticks = [n for n in ns if n & (n - 1) == 0]
        _log2_axis(ax, ticks, "N (row length)")
        ax.tick_params(axis="x", labelrotation=45)
    _percent_axis(axes[0])
    _finish(fig, axes)
    return fig


HOST_BARS = (("lab", "gpu", "lab, GPU time"), ("lab", "call", "lab, launch counted"),
             ("torch.compile", "gpu", "torch.compile, GPU time"),
             ("torch.compile", "call", "torch.compile, launch counted"))
# The same calls captured into one CUDA graph and replayed: (impl, timer, bar label).
GRAPH_BARS = (("lab", "graph", "lab, CUDA graph"),
              ("torch.compile", "graph", "torch.compile, CUDA graph"))
FLOOR_BAR = "bytes at copy bandwidth"


def floor_seconds(point: SweepPoint) -> float:
    """The time of the ideal bytes at the copy bandwidth measured beside `point`."""
    nbytes = traffic.fused_rmsnorm(point.n_rows, point.n_cols, point.dtype).bytes
    return nbytes / (point.copy_gbps * 1e9)


def small_shape_times(points: Sequence[SweepPoint], shape: tuple[int, int],
                      bars: Sequence[tuple[str, str, str]] = HOST_BARS) -> dict[str, float]:
    """Experiment 5: microseconds per call at a small shape, by bar label (`bars`: HOST_BARS,
    and GRAPH_BARS where asked for), and FLOOR_BAR; a bar that was not timed is left out."""
    n_rows, n_cols = shape
    times: dict[str, float] = {}
    for impl, timer, label in bars:
        found = [p for p in lab_sweeps.select(points, impl=impl, timer=timer, n_rows=n_rows,
                                              n_cols=n_cols) if p.ok]
        if found:
            times[label] = found[0].seconds * 1e6
            times.setdefault(FLOOR_BAR, floor_seconds(found[0]) * 1e6)
    return times


def not_recorded(points: Sequence[SweepPoint], shapes: Sequence[tuple[int, int]],
                 bars: Sequence[tuple[str, str, str]] = GRAPH_BARS) -> list[str]:
    """The labels of `bars` with no timed point at any of `shapes` among `points`: what
    this GPU's recording (or this notebook's live run) did not measure."""
    timed = set().union(*(small_shape_times(points, s, bars) for s in shapes))
    return [label for *_, label in bars if label not in timed]


def graph_reading(points: Sequence[SweepPoint], shape: tuple[int, int]) -> list[str]:
    """Experiment 5's reading of the CUDA-graph points at `shape`, one line per
    implementation, its figures read from `points`, or why there is none (one line where
    neither has any)."""
    times = small_shape_times(points, shape, HOST_BARS + GRAPH_BARS)
    if not any(label in times for *_, label in GRAPH_BARS):
        return ["no CUDA graph's replay was recorded on this GPU"]
    lines = []
    for impl in ("lab", "torch.compile"):
        graph = times.get(f"{impl}, CUDA graph")
        if graph is None:
            lines.append(f"{impl}: a CUDA graph's replay was not recorded on this GPU")
            continue
        line = f"{impl}: {graph:.1f} us a call replayed from a CUDA graph"
        gpu, call = times.get(f"{impl}, GPU time"), times.get(f"{impl}, launch counted")
        if gpu is not None:
            line += f"; {graph / gpu:.2f} x its GPU time timed alone ({gpu:.1f} us)"
        if call is not None:
            line += f"; a call with its launch counted ({call:.1f} us) took {call / graph:.1f} x"
        lines.append(line)
    return lines


def host_overhead(panels: Panels, shapes: Sequence[tuple[int, int]],
                  bars: Sequence[tuple[str, str, str]] = HOST_BARS):
    """Experiment 5: a group of bars per small shape, microseconds per call (log scale),
    one bar per entry of `bars` and the bytes' floor; a panel says which bars it lacks."""
    labels = (FLOOR_BAR, *(label for _, _, label in bars))
    width = 0.8 / len(labels)
    fig, axes = _figure(panels, "Small shapes: microseconds per call")
    for ax, points in zip(axes, panels.values(), strict=True):
        for i, label in enumerate(labels):
            drawn = [(k, small_shape_times(points, s, bars).get(label))
                     for k, s in enumerate(shapes)]
            drawn = [(k, t) for k, t in drawn if t is not None]
            if drawn:
                ax.bar([k - 0.4 + (i + 0.5) * width for k, _ in drawn], [t for _, t in drawn],
                       width, label=label, color=f"C{i}")
        missing = not_recorded(points, shapes, bars)
        if missing:  # said under the panel's title: a bar left out is not a bar of zero
            ax.set_title(f"{ax.get_title()}\nnot recorded on this GPU:\n{'; '.join(missing)}",
                         fontsize=8)
        ax.set_xticks(range(len(shapes)), [f"{m} x {n}" for m, n in shapes])
        ax.set_yscale("log")
    axes[0].set_ylabel("us per call")
    # One legend under the panels: inside one, it would hide the bars.
    handles, names = max((ax.get_legend_handles_labels() for ax in axes), key=lambda h: len(h[0]))
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def compile_vs_lab(panels: Panels, persistent_limit: int | None = None):
    """Experiment 6: torch.compile against the lab's best launch at each N it was timed;
    a vertical line where Inductor switches from a persistent to a looped reduction."""
    fig, axes = _figure(panels, "torch.compile against the lab's best launch")
    for ax, points in zip(axes, panels.values(), strict=True):
        compiled = swept(points, "torch.compile")
        ns = sorted({p.n_cols for p in compiled})
        _curve(ax, [(p.n_cols, p) for p in sorted(compiled, key=lambda p: p.n_cols)],
               "torch.compile")
        _curve(ax, [(n, best_of(points, n)) for n in ns], "lab, best launch timed")
        if persistent_limit is not None:
            ax.axvline(persistent_limit, color="grey", linestyle=":",
                       label="Inductor: persistent | looped")
        _log2_axis(ax, ns, "N (row length)")
        ax.tick_params(axis="x", labelrotation=45)
    _percent_axis(axes[0])
    _finish(fig, axes)
    return fig


def against_prediction(what: str, predicted: Mapping, measured: Mapping[str, Mapping],
                       show: Callable[[object], str] = str, missing: str = "-") -> None:
    """Print your prediction beside what each panel measured, one row per key of
    `predicted` (`measured`: panel -> key -> value; `show` formats a measured value;
    `missing` stands where a panel has none). Nothing here is graded: the point is to see
    where your reasoning held."""
    names = list(measured)
    rows = [(f"{what}", "you", *names)]
    for key, guess in predicted.items():
        rows.append((f"{key}", "-" if guess is None else str(guess),
                     *(missing if measured[n].get(key) is None else show(measured[n][key])
                       for n in names)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    if all(v is None for v in predicted.values()):
        print("(no prediction written: set it in the cell above, then run this one again)")


def percent(point: SweepPoint | None) -> str:
    """A point's % of copy bandwidth, or why it has none."""
    if point is None:
        return "not timed"
    if not point.ok or math.isnan(point.fraction_of_copy):
        return "failed"
    return f"{100 * point.fraction_of_copy:.1f} %"
