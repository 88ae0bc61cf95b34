"""Timing kernels honestly, and turning times into bandwidth.

On a GPU, every repetition is timed with CUDA events around the call alone, after a
warm-up (compilation, autotuning, clocks), and the median is reported. Inputs rotate
through enough copies that their total size is several times the L2 cache, so a
repetition never finds the previous repetition's data waiting in L2. Outputs rotate too:
the timer keeps the latest outputs alive, so the allocator cannot hand a call the memory
it wrote a moment ago. Written lines wait in L2 before they go to HBM, and a repetition
that overwrites them while they wait saves those writes: on an H100, RMSNorm at
32768 x 256 in bfloat16 (16 MB out) measured 90 % of the copy bandwidth with its output
reused and 72 % with fresh outputs, close to a plain copy of its bytes (74 %).

`time_graph` times calls back to back in a CUDA graph instead, as a model runs its kernels:
each call then no longer pays for an idle GPU starting and draining it, which on an H100
is a few microseconds, a large part of a call at short rows (`course bench --timer graph`).

Without a GPU the same functions time with the CPU clock: useful to exercise the code,
meaningless as a measure of a kernel (Triton's interpreter runs it with NumPy).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from course import gpu_lock, hardware, runtime

import torch

# Rotating inputs, and the outputs kept alive, add up to this many times the L2 cache.
L2_MULTIPLE = 3.0
# How a repetition is timed: each call alone between two events, its launch hidden ("call",
# `time_fn`), or from the host's call on ("eager": what an eager PyTorch user waits); calls
# back to back in a CUDA graph ("graph", `time_graph`); calls back to back from Python,
# wall-clock ("host", `time_back_to_back`: where the host's cost per call shows).
TIMERS = ("call", "graph", "eager", "host")


@dataclass(frozen=True)
class Timing:
    """Per-repetition times of one function, in seconds."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    def quantile_s(self, q: float) -> float:
        ordered = sorted(self.times_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _alone_on_the_gpu(timer: Callable[..., Timing]) -> Callable[..., Timing]:
    """`timer` holding the GPU alone while it runs, where chapters are graded side by side
    on one GPU (course.gpu_lock; nothing happens elsewhere)."""
    @functools.wraps(timer)
    def alone(*args: Any, **kwargs: Any) -> Timing:
        runtime.synchronize()  # the inputs just made: not beside another chapter's timing
        with gpu_lock.alone():
            return timer(*args, **kwargs)
    return alone


@_alone_on_the_gpu
def time_fn(fn: Callable[[], Any], *, warmup: int = 10, reps: int = 100,
            before_each: Callable[[int], Any] | None = None,
            hide_launch: bool = False) -> Timing:
    """Time `fn()` `reps` times after `warmup` untimed calls.

    `before_each(i)` runs before repetition i, outside the timed region (to pick the
    next rotating input, for instance).

    With `hide_launch`, each repetition is GPU time only: a sleep kernel queued ahead of
    the start event keeps the GPU busy while Python enqueues the whole call, so the CPU's
    cost of launching (which a CUDA graph or a busy model hides too) is not counted, while
    gaps between the kernels of a multi-kernel call still are if the GPU has to wait.
    Without it, a call shorter than its own launch overhead measures the overhead.

    The latest results of `fn` are kept alive (`outputs_to_hold`), so that each repetition
    writes memory that no recent repetition wrote (see the module docstring).
    """
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    hold = output_keeper()
    enqueue_s = 0.0
    for i in range(warmup):
        if before_each is not None:
            before_each(i)
        t0 = time.perf_counter()
        result = fn()
        enqueue_s = time.perf_counter() - t0  # the last warm-up call's CPU time
        hold(result)
        runtime.synchronize()
    times = []
    if runtime.on_gpu():
        # Twice the CPU time of a call plus a margin, at a generous 2 GHz clock.
        sleep_cycles = int((2 * enqueue_s + 50e-6) * 2e9)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if before_each is not None:
                before_each(i)
            if hide_launch:
                torch.cuda._sleep(sleep_cycles)
            starts[i].record()
            result = fn()
            ends[i].record()
            hold(result)
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends, strict=True)]
    else:
        for i in range(reps):
            if before_each is not None:
                before_each(i)
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
            hold(result)
    return Timing(tuple(times))


@_alone_on_the_gpu
def time_graph(calls: Sequence[Callable[[], Any]], *, warmup: int = 2, reps: int = 20
               ) -> Timing:
    """Per-call times of the calls run back to back, as a model runs its kernels: the
    calls are captured in turn into one CUDA graph, which is replayed `reps` times, and
    each replay's time is divided by the number of calls in it.

    `time_fn` times one call between two events on an otherwise idle GPU, so each
    repetition also pays for the GPU starting and draining a kernel (an empty kernel
    measures 3.7 us that way on an H100, 1.2 us a call in a graph). Short calls, 10 to 30
    us, are where that matters. The graph holds enough calls, taken in turn, that their
    outputs, all kept alive, add up to several times L2, as `time_fn`'s held outputs do.

    Without a GPU there is no graph: the calls run back to back on the CPU clock.
    A call that cannot be captured (one that synchronises, for instance) raises here.
    The capture runs on the current stream unless that is the default one; a backward
    through autograd needs its forward run on that same stream (`graph_stream`).
    """
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    if not calls:
        raise ValueError("time_graph needs at least one call")
    if not runtime.on_gpu():
        return _per_call(time_fn(lambda: [call() for call in calls], warmup=0, reps=reps),
                         len(calls))
    # Warm up (lazy set-up, compilation) and capture off the default stream.
    on_default = torch.cuda.current_stream() == torch.cuda.default_stream()
    with graph_stream() if on_default else contextlib.nullcontext():
        for _ in range(max(1, warmup)):
            first = [call() for call in calls][0]
        torch.cuda.synchronize()
        in_graph = max(len(calls), outputs_to_hold(result_bytes(first)))
        del first
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
            # Kept alive, so each call in the graph writes its own outputs.
            outputs = [calls[i % len(calls)]() for i in range(in_graph)]
    # The replay's own launch stays out of the time (hide_launch).
    replays = time_fn(graph.replay, warmup=1, reps=reps, hide_launch=True)
    del graph, outputs
    return _per_call(replays, in_graph)


@_alone_on_the_gpu
def time_back_to_back(calls: Sequence[Callable[[], Any]], *, warmup: int = 10, reps: int = 20,
                      calls_per_rep: int = 100) -> Timing:
    """Per-call wall-clock times of `calls_per_rep` calls made back to back from Python, as a
    model's eager forward makes them, then one synchronisation: a call costs the longer of
    its host's work (checks, planning, the launch) and its kernel's, so at short rows this
    measures the wrapper. Nothing is held: each call's output is freed before the next."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    for i in range(warmup):
        calls[i % len(calls)]()
    runtime.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(calls_per_rep):
            calls[i % len(calls)]()
        runtime.synchronize()
        times.append((time.perf_counter() - t0) / calls_per_rep)
    return Timing(tuple(times))


def _per_call(timing: Timing, calls: int) -> Timing:
    """The times of runs of `calls` calls each, as times a call."""
    return Timing(tuple(t / calls for t in timing.times_s))


@contextlib.contextmanager
def graph_stream() -> Iterator[None]:
    """Run the block on a side stream, as everything a graph-timed measurement does should
    (inputs, forward passes, `time_graph`'s capture). Autograd runs each backward op on the
    stream its forward op ran on, and the default stream cannot join a capture: a backward
    whose forward ran there failed to capture ("operation would make the legacy stream
    depend on a capturing blocking stream"). Without a GPU it does nothing."""
    if not runtime.on_gpu():
        yield
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)


def output_keeper() -> Callable[[Any], None]:
    """A function that keeps the latest results it is given alive, as many as
    `outputs_to_hold` says for the first one (every call of a timed function returns the
    same shapes)."""
    held: collections.deque | None = None

    def hold(result: Any) -> None:
        nonlocal held
        if held is None:
            held = collections.deque(maxlen=outputs_to_hold(result_bytes(result)))
        held.append(result)
    return hold


def result_bytes(result: Any) -> int:
    """Bytes of the tensors a call returned: one tensor, or a tuple or list of them."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))


def outputs_to_hold(output_bytes: int, *, l2_multiple: float = L2_MULTIPLE, cap: int = 64,
                    l2_bytes: int | None = None) -> int:
    """How many of a timed function's latest results `time_fn` keeps alive: enough that
    they add up to `l2_multiple` times the L2 cache (at most `cap`), none when one result
    alone is that large (or there is no L2, as without a GPU). A function that returns the
    same tensor every time (an `out=` argument) gains nothing and loses nothing by it."""
    l2 = hardware.l2_bytes() if l2_bytes is None else l2_bytes
    if output_bytes <= 0 or l2 <= 0 or output_bytes >= l2_multiple * l2:
        return 0
    return min(cap, math.ceil(l2_multiple * l2 / output_bytes))


def copies_needed(bytes_per_call: int, *, l2_multiple: float = L2_MULTIPLE, cap: int = 64) -> int:
    """How many input copies keep every repetition's data out of L2 (at least 2)."""
    l2 = hardware.l2_bytes()
    if bytes_per_call <= 0 or l2 == 0:
        return 2
    return max(2, min(cap, math.ceil(l2_multiple * l2 / bytes_per_call)))


def time_rotating(fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]],
                  bytes_per_call: int, *, warmup: int = 10, reps: int = 100,
                  hide_launch: bool = False) -> Timing:
    """Time `fn(*args)` with args drawn in turn from fresh copies made by `make_args()`."""
    arg_sets = [tuple(make_args()) for _ in range(copies_needed(bytes_per_call))]
    return time_in_turn([functools.partial(fn, *args) for args in arg_sets], warmup=warmup,
                        reps=reps, hide_launch=hide_launch)


def in_alternating_order(items: Sequence[Any], rounds: int) -> Iterator[Any]:
    """Each item once a round for `rounds` rounds, every other round in reverse order, so
    that no item is always the one timed first (right after the inputs were made)."""
    for turn in range(rounds):
        yield from (items if turn % 2 == 0 else items[::-1])


def time_in_turn(calls: Sequence[Callable[[], Any]], *, warmup: int = 10, reps: int = 100,
                 hide_launch: bool = False, timer: str = "call") -> Timing:
    """Time the calls taken in turn, repetition i running calls[i % len(calls)]: each call
    bound to its own copy of the inputs, so that the inputs rotate. `timer` is one of TIMERS:
    "call" (each call on its own, `time_fn`, launch hidden if `hide_launch`), "eager" (the
    same, launch never hidden), "graph" (`time_graph`) or "host" (`time_back_to_back`)."""
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
    if timer == "graph":
        return time_graph(calls, reps=reps)
    if timer == "host":
        return time_back_to_back(calls, warmup=warmup, reps=max(5, reps // 5))
    hide_launch = hide_launch and timer == "call"
    current = [calls[0]]

    def pick(i: int) -> None:
        current[0] = calls[i % len(calls)]

    return time_fn(lambda: current[0](), warmup=warmup, reps=reps, before_each=pick,
                   hide_launch=hide_launch)


@dataclass(frozen=True)
class Measurement:
    """One timed kernel: time, the ideal bytes it had to move, and what that makes."""

    label: str
    seconds: float
    nbytes: int
    copy_bytes_per_s: float | None = None  # measured on the same device, same process
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9

    @property
    def fraction_of_copy(self) -> float | None:
        if self.copy_bytes_per_s is None:
            return None
        return self.nbytes / self.seconds / self.copy_bytes_per_s

    def __str__(self) -> str:
        frac = self.fraction_of_copy
        tail = f", {100 * frac:.1f} % of copy bandwidth" if frac is not None else ""
        return f"{self.label}: {self.seconds * 1e6:.1f} us, {self.gbps:.0f} GB/s{tail}"


def measure(label: str, fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]],
            nbytes: int, *, warmup: int = 10, reps: int = 100,
            hide_launch: bool = False) -> Measurement:
    """Median time of `fn` on rotating inputs, as bandwidth over `nbytes` ideal bytes.
    `hide_launch`: GPU time only, without Python's launch cost (see `time_fn`)."""
    timing = time_rotating(fn, make_args, nbytes, warmup=warmup, reps=reps,
                           hide_launch=hide_launch)
    copy = hardware.copy_bandwidth() if runtime.on_gpu() else None
    return Measurement(label, timing.median_s, int(nbytes), copy)


def sweep(points: Sequence[Any], run_point: Callable[[Any], Measurement | Sequence[Measurement]],
          *, desc: str = "sweep") -> list[Measurement]:
    """Run `run_point(p)` for every point with a progress bar; flatten the measurements."""
    from tqdm.auto import tqdm

    out: list[Measurement] = []
    for point in tqdm(points, desc=desc):
        result = run_point(point)
        out.extend([result] if isinstance(result, Measurement) else result)
    return out


def plot_fraction_of_copy(measurements: Sequence[Measurement], *, x_key: str = "N",
                          title: str = "", ax=None):
    """Percent of copy bandwidth against `extra[x_key]`, one line per label."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    by_label: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_label.setdefault(m.label, []).append(m)
    for label, ms in by_label.items():
        ms = sorted(ms, key=lambda m: m.extra[x_key])
        ys = [100 * (m.fraction_of_copy or 0.0) for m in ms]
        ax.plot([m.extra[x_key] for m in ms], ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(x_key)
    ax.set_ylabel("% of measured copy bandwidth")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return ax
