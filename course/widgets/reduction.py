"""How a GPU sums one row: a shared-memory tree with barriers, or warp shuffles.

    reduction_visualiser()

`tl.sum` hides this; here it is step by step. First every thread adds up its own strided
share of the row in registers (thread t takes elements t, t + T, t + 2T, ...; threads
past the end of a short row load zeros, as a masked load with other=0 does). Then the
T partial sums are combined in log2(T) steps, in one of two ways. A norm needs the total
in every thread (each multiplies its own values by rstd), so both end with it there:

- shared-memory tree: the partials go to shared memory, behind a barrier (__syncthreads);
  at each level the lower half of the slots adds in the upper half, and the next level
  reads what this one wrote, so each level ends at a barrier too. After the last, every
  thread reads the total from slot 0: log2(T) + 1 barriers.
- warp shuffle (butterfly): lanes of a warp swap registers directly, lane l adding the
  value of lane l XOR offset, no memory and no barrier; after log2(32) steps every lane
  holds the warp's sum. With one warp that is the end. With more, lane 0 of each writes
  its sum to shared memory, a barrier, and the first warp combines those sums with
  shuffles; its lane 0 writes the total back to shared memory, and after a second barrier
  every thread reads it. That is how Triton 3.6 compiles tl.sum (two bar.sync in the
  PTX); Triton 3.9 instead lets every warp read all the warps' sums and combine them
  itself, a few redundant shuffles in exchange for the second barrier.
"""

from __future__ import annotations

import random
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from course.widgets.common import MAX_WIDTH, CourseWidget, FigureImage, control_row, lines_html

import ipywidgets as widgets
from matplotlib.patches import Rectangle
from matplotlib.transforms import blended_transform_factory

WARP_SIZE = 32
MODES = {"tree": "shared-memory tree with barriers", "shuffle": "warp shuffle (butterfly)"}
THREAD_CHOICES = (2, 4, 8, 16, 32, 64)
ROW_LENGTHS = (8, 64)   # the slider's range

_BOXES_PER_LINE = 32
_COLOURS = {"changed": "#f4a259", "live": "#cfe3f7", "dead": "#eeeeee", "input": "#ffffff"}


@dataclass(frozen=True)
class ReductionStep:
    """One step of a row reduction.

    `before` holds the values this step reads (the row itself for the first step), `after`
    the value each lane (a thread's register, or a shared-memory slot in tree mode) holds
    once it is done. `edges` are (index in before, index in after) pairs: which values are
    added into which lane. `live` marks the lanes whose value still counts toward the sum.
    """

    description: str
    before: tuple[float, ...]
    after: tuple[float, ...]
    live: tuple[bool, ...]
    edges: tuple[tuple[int, int], ...]
    barrier: bool        # the step holds a __syncthreads() before its values may be read
    combines: bool       # one of the log2(threads) levels that add partial sums together
    after_label: str = "lanes"


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _butterfly(values: list[float], lanes: range, offset: int
               ) -> tuple[list[float], list[tuple[int, int]]]:
    """Every lane in `lanes` adds the value of lane (l XOR offset) of its warp."""
    out = list(values)
    edges = []
    base = lanes.start
    for lane in lanes:
        partner = base + ((lane - base) ^ offset)
        out[lane] = values[lane] + values[partner]
        edges += [(lane, lane), (partner, lane)]
    return out, edges


def reduction_schedule(row: Sequence[float], threads: int, mode: str,
                       warp_size: int = WARP_SIZE) -> list[ReductionStep]:
    """Every step of summing `row` with `threads` threads, in `mode` 'tree' or 'shuffle'.

    The first step is each thread's own serial sum; `combines` marks the log2(threads)
    steps after it that add partial sums together. After the last step every lane holds
    the sum, as a norm needs (the last step is the broadcast where one is needed).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 2 \
            or not _is_power_of_two(threads):
        raise ValueError(f"threads must be a power of two, at least 2; got {threads!r}")
    if not _is_power_of_two(warp_size):
        raise ValueError(f"warp_size must be a power of two; got {warp_size!r}")
    row = tuple(row)
    if not row:
        raise ValueError("row must hold at least one value")

    T = threads
    partials = [sum(row[t::T]) for t in range(T)]  # sum(()) == 0: a masked load's zeros
    load_edges = tuple((i, i % T) for i in range(len(row)))
    per_thread = -(-len(row) // T)
    load_text = (f"each thread adds up its share of the row (thread t: elements t, t+{T}, ...;"
                 f" up to {per_thread} each)")
    if mode == "tree":
        steps = [ReductionStep(load_text + ", then writes it to shared memory slot t",
                               row, tuple(partials), (True,) * T, load_edges, barrier=True,
                               combines=False, after_label="smem slots")]
        stride = T // 2
        while stride >= 1:
            before = tuple(partials)
            edges = []
            for t in range(stride):
                partials[t] = before[t] + before[t + stride]
                edges += [(t, t), (t + stride, t)]
            steps.append(ReductionStep(
                f"threads 0..{stride - 1} add slot t+{stride} into slot t",
                before, tuple(partials), tuple(t < stride for t in range(T)), tuple(edges),
                barrier=True, combines=True, after_label="smem slots"))
            stride //= 2
        steps.append(_broadcast(partials, "every thread reads the total from slot 0 (the "
                                "last barrier let them: the norm needs it in every thread)",
                                barrier=False))
        return steps

    warps = max(1, T // warp_size)
    warp_lanes = min(T, warp_size)
    steps = [ReductionStep(load_text + " in a register", row, tuple(partials), (True,) * T,
                           load_edges, barrier=False, combines=False)]
    offset = warp_lanes // 2
    while offset >= 1:
        before = list(partials)
        edges: list[tuple[int, int]] = []
        for w in range(warps):
            partials, warp_edges = _butterfly(partials, range(w * warp_lanes,
                                                              (w + 1) * warp_lanes), offset)
            edges += warp_edges
        steps.append(ReductionStep(
            f"shuffle: every lane adds the value of lane (l XOR {offset})"
            + (" in each warp" if warps > 1 else ""),
            tuple(before), tuple(partials), (True,) * T, tuple(edges), barrier=False,
            combines=True))
        offset //= 2
    if warps > 1:
        before = tuple(partials)
        partials = [before[w * warp_lanes] if w < warps else 0 for w in range(T)]
        steps.append(ReductionStep(
            f"lane 0 of each of the {warps} warps writes its warp's sum to shared memory; "
            f"one barrier; lanes 0..{warps - 1} of warp 0 read them back",
            before, tuple(partials), tuple(t < warps for t in range(T)),
            tuple((w * warp_lanes, w) for w in range(warps)), barrier=True, combines=False))
        offset = warps // 2
        while offset >= 1:
            before = tuple(partials)
            partials, edges = _butterfly(list(before), range(warps), offset)
            steps.append(ReductionStep(
                f"warp 0 shuffles: lanes 0..{warps - 1} add lane (l XOR {offset})",
                before, tuple(partials), tuple(t < warps for t in range(T)), tuple(edges),
                barrier=False, combines=True))
            offset //= 2
        steps.append(_broadcast(partials, "lane 0 of warp 0 writes the total to shared "
                                "memory; a second barrier; every thread reads it back (the "
                                "norm needs it in every thread)", barrier=True))
    return steps


def _broadcast(before: Sequence[float], description: str, *, barrier: bool) -> ReductionStep:
    """The total, in slot or lane 0 of `before`, read by every thread."""
    threads = len(before)
    return ReductionStep(description, tuple(before), (before[0],) * threads, (True,) * threads,
                         tuple((0, t) for t in range(threads)), barrier=barrier,
                         combines=False)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


class ReductionVisualiser(CourseWidget):
    """Controls: `length`, `threads`, `mode`, `step`, `prev_button`, `next_button`,
    `new_row_button`. State: `row`, `steps` (ReductionStep list), `partials_at(step)`,
    `levels` (log2 threads), `barriers`, `summary_text`, `figure`."""

    def __init__(self, *, length: int = 16, threads: int = 8, mode: str = "tree",
                 seed: int = 0) -> None:
        if isinstance(length, bool) or not isinstance(length, int) \
                or not ROW_LENGTHS[0] <= length <= ROW_LENGTHS[1]:
            raise ValueError(f"length must be an int from {ROW_LENGTHS[0]} to "
                             f"{ROW_LENGTHS[1]}; got {length!r}")
        if threads not in THREAD_CHOICES:
            raise ValueError(f"threads must be one of {THREAD_CHOICES}; got {threads!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        self._random = random.Random(seed)
        self._values = self._new_values()
        self.length = widgets.IntSlider(value=length, min=ROW_LENGTHS[0], max=ROW_LENGTHS[1],
                                        description="row length", continuous_update=False)
        self.threads = widgets.Dropdown(options=list(THREAD_CHOICES), value=threads,
                                        description="threads",
                                        layout=widgets.Layout(width="160px"))
        self.mode = widgets.ToggleButtons(options=[(label, key) for key, label in MODES.items()],
                                          value=mode, style={"button_width": "auto"})
        self.step = widgets.IntSlider(value=0, min=0, max=1, description="step")
        self.prev_button = widgets.Button(description="previous", icon="step-backward",
                                          layout=widgets.Layout(width="110px"))
        self.next_button = widgets.Button(description="next", icon="step-forward",
                                          layout=widgets.Layout(width="110px"))
        self.new_row_button = widgets.Button(description="new numbers", icon="random",
                                             layout=widgets.Layout(width="130px"))
        self.summary = widgets.HTML()
        self.plot = FigureImage()
        self.figure = self.plot.figure
        for control in (self.length, self.threads, self.mode):
            control.observe(self._on_setup_change, names="value")
        self.step.observe(self._on_step_change, names="value")
        self.prev_button.on_click(lambda _: self._move(-1))
        self.next_button.on_click(lambda _: self._move(+1))
        self.new_row_button.on_click(self._on_new_row)
        self.widget = widgets.VBox([
            widgets.HTML("<b>Reducing one row: who holds which partial sum</b>"),
            self.mode,
            control_row([self.length, self.threads, self.new_row_button]),
            control_row([self.step, self.prev_button, self.next_button]),
            self.summary, self.plot.image,
        ], layout=widgets.Layout(max_width=MAX_WIDTH))
        self._rebuild()

    # ------------------------------------------------------------ state

    def _new_values(self) -> list[int]:
        # Small whole numbers, so the learner can check the sums by hand.
        return [self._random.randint(1, 9) for _ in range(ROW_LENGTHS[1])]

    @property
    def row(self) -> tuple[int, ...]:
        return tuple(self._values[:self.length.value])

    @property
    def levels(self) -> int:
        """Steps that combine partial sums: log2(threads), in either mode."""
        return sum(step.combines for step in self.steps)

    @property
    def barriers(self) -> int:
        """__syncthreads() the whole reduction needs in the current mode."""
        return sum(step.barrier for step in self.steps)

    @property
    def warps(self) -> int:
        return max(1, self.threads.value // WARP_SIZE)

    def partials_at(self, step: int) -> list[float]:
        """What each lane holds after `step` (0 is the threads' own serial sums)."""
        if not 0 <= step < len(self.steps):
            raise ValueError(f"step must be from 0 to {len(self.steps) - 1}; got {step!r}")
        return list(self.steps[step].after)

    @property
    def result(self) -> float:
        """Lane 0's value after the last step: the row's sum (every lane holds it)."""
        return self.steps[-1].after[0]

    # ------------------------------------------------------------ recomputing

    def _on_setup_change(self, _change: dict) -> None:
        self._rebuild()

    def _on_new_row(self, _button: widgets.Button) -> None:
        self._values = self._new_values()
        self._rebuild()

    def _on_step_change(self, _change: dict) -> None:
        self.update()

    def _move(self, delta: int) -> None:
        self.step.value = min(self.step.max, max(0, self.step.value + delta))

    def _rebuild(self) -> None:
        self.steps = reduction_schedule(self.row, self.threads.value, self.mode.value)
        last = len(self.steps) - 1
        # Setting max may clamp value, which would redraw through the observer: hold it.
        self.step.unobserve(self._on_step_change, names="value")
        self.step.max = last
        self.step.value = min(self.step.value, last)
        self.step.observe(self._on_step_change, names="value")
        self.update()

    def update(self) -> None:
        self.summary_text = self._summary_text()
        self.summary.value = lines_html(self.summary_text)
        self._draw()

    def _barrier_rule(self) -> str:
        if self.mode.value == "tree":
            return (f"{self.barriers} (one after the threads write their sums, then one per "
                    "level: each level, and at the end every thread, reads slots other "
                    "threads wrote)")
        if self.warps == 1:
            return ("0 (shuffles move registers within a warp, and leave the total in every "
                    "lane: nothing to wait for)")
        return (f"{self.barriers} (none within a warp; one before warp 0 reads the "
                f"{self.warps} warps' sums from shared memory, one before every thread reads "
                "the total back)")

    def _summary_text(self) -> str:
        k = self.step.value
        step = self.steps[k]
        T = self.threads.value
        barriers_so_far = sum(s.barrier for s in self.steps[:k + 1])
        lines = [
            f"row of {len(self.row)} values, sum {_fmt(sum(self.row))}; {T} threads "
            f"({self.warps} warp{'s' if self.warps > 1 else ''} of up to {WARP_SIZE} lanes)",
            f"combining steps: log2({T}) = {self.levels}; barriers (__syncthreads): "
            f"{self._barrier_rule()}",
            f"step {k} of {len(self.steps) - 1}: {step.description}"
            # Steps that go through shared memory name their barrier where it falls.
            + (" -- then a barrier" if step.barrier and "barrier" not in step.description
               else ""),
            f"barriers so far: {barriers_so_far}; lane 0 holds {_fmt(step.after[0])}",
        ]
        if k == len(self.steps) - 1:
            verdict = "equals" if self.result == sum(self.row) else "DOES NOT equal"
            everywhere = all(v == self.result for v in step.after)
            lines.append(f"done: lane 0 holds {_fmt(self.result)}, which {verdict} the row's "
                         f"sum {_fmt(sum(self.row))}"
                         + ("; so does every other thread" if everywhere else ""))
        return "\n".join(lines)

    # ------------------------------------------------------------ drawing

    def _strip_positions(self, count: int, top: float) -> tuple[list[tuple[float, float]], float]:
        """Box centres for `count` values laid out 32 to a line from height `top` down."""
        positions = [(i % _BOXES_PER_LINE, top - i // _BOXES_PER_LINE) for i in range(count)]
        lines = -(-count // _BOXES_PER_LINE)
        return positions, top - lines

    def _draw(self) -> None:
        k = self.step.value
        step = self.steps[k]
        ax = self.plot.new_axes()
        # What a step reads is what the step before it left: slots or lanes.
        before_label = "row x" if k == 0 else (
            "smem before" if self.steps[k - 1].after_label == "smem slots" else "lanes before")
        before_pos, bottom = self._strip_positions(len(step.before), 0.0)
        after_pos, _ = self._strip_positions(len(step.after), bottom - 1.2)
        for src, dst in step.edges:
            (x0, y0), (x1, y1) = before_pos[src], after_pos[dst]
            ax.plot([x0, x1], [y0 - 0.4, y1 + 0.4], color="tab:orange", lw=0.6, alpha=0.7,
                    zorder=1)
        if k == 0:
            before_live = [True] * len(step.before)
        else:
            before_live = list(self.steps[k - 1].live)
        changed = {dst for src, dst in step.edges if src != dst or k == 0}
        columns = min(_BOXES_PER_LINE, max(len(step.before), len(step.after)))
        digits = max(len(_fmt(v)) for v in (*step.before, *step.after))
        font = 9 if columns <= 16 else (7 if digits <= 2 else 5.5)
        for values, positions, live, is_after in ((step.before, before_pos, before_live, False),
                                                  (step.after, after_pos, step.live, True)):
            for i, (value, (x, y)) in enumerate(zip(values, positions, strict=True)):
                if not live[i]:
                    colour = _COLOURS["dead"]
                elif k == 0 and not is_after:
                    colour = _COLOURS["input"]
                elif is_after and i in changed:
                    colour = _COLOURS["changed"]
                else:
                    colour = _COLOURS["live"]
                ax.add_patch(_box(x, y, colour))
                ax.text(x, y, _fmt(value), ha="center", va="center", fontsize=font, zorder=3,
                        color="black" if live[i] else "#999999")
        # Labels sit just left of the axes, whatever the width of a box.
        margin = blended_transform_factory(ax.transAxes, ax.transData)
        for label, positions in ((before_label, before_pos), (step.after_label, after_pos)):
            ax.text(-0.01, positions[0][1], label, ha="right", va="center", fontsize=8,
                    transform=margin)
            for start in range(_BOXES_PER_LINE, len(positions), _BOXES_PER_LINE):
                end = min(len(positions), start + _BOXES_PER_LINE) - 1
                ax.text(-0.01, positions[start][1], f"{start}..{end}", ha="right",
                        va="center", fontsize=7, color="#666666", transform=margin)
        lowest = min(y for _, y in after_pos)
        ax.set_xlim(-0.6, columns - 0.4)
        ax.set_ylim(lowest - 0.8, 0.8)
        ax.set_axis_off()
        ax.set_title(textwrap.fill(f"step {k}: {step.description}", 88), fontsize=8)
        self.figure.subplots_adjust(left=0.14, right=0.98, top=0.86, bottom=0.03)
        self.plot.show()


def _box(x: float, y: float, colour: str) -> Rectangle:
    return Rectangle((x - 0.45, y - 0.4), 0.9, 0.8, facecolor=colour, edgecolor="#555555",
                     linewidth=0.5, zorder=2)


def reduction_visualiser(*, length: int = 16, threads: int = 8, mode: str = "tree",
                         seed: int = 0) -> ReductionVisualiser:
    """Step through one row's reduction. `mode` is 'tree' (shared memory, barriers) or
    'shuffle' (warp shuffles); the row holds `length` random whole numbers from `seed`."""
    return ReductionVisualiser(length=length, threads=threads, mode=mode, seed=seed)


__all__ = ["MODES", "THREAD_CHOICES", "WARP_SIZE", "ReductionStep", "ReductionVisualiser",
           "reduction_schedule", "reduction_visualiser"]
