"""Checker for chapter 08's Exercise 8a: how much of a call's launch a timer counts.

The learner writes one function:

    launch_counted(gpu_us, timer_us, call_us) -> float

    the share of the host's part of a call (call_us - gpu_us: what a caller waits beyond
    the GPU's time) that a timer's figure counts, (timer_us - gpu_us) / (call_us - gpu_us):
    0 at the GPU's time, 1 at what a caller waits, not clamped (a figure outside the two
    comes out below 0 or above 1).

It is checked on figures recorded on an H100 and an H200 (`course/data/timers-*.csv`), on
made-up ones at both ends and outside them, and on three drawn fresh every run, so that no
table of answers passes. A wrong answer is compared with the usual slips (the share left
out instead of the share counted, a ratio upside down, the whole call or the GPU's time as
the denominator, microseconds or a percentage instead of a share, a clamp, a rounding, the
arguments in another order) and the message names the one that fits every case.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from course import timing
from course.check.eager_bytes import finish
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.roofline import _Call, _diagnose, _Function, _Mistake, _run
from course.check.runner import CaseResult, Finding, fresh_seed

# Recorded figures the check tries: (GPU, workload, M, N) in course/data/timers-*.csv.
_RECORDED = (("h100", "fused Triton RMSNorm", 8192, 4096),
             ("h200", "eager RMSNorm", 2048, 2048))  # do_bench below the GPU's time
# (where from, GPU's time, the timer's figure, what a caller waits), microseconds a call.
_MADE_UP = (
    ("halfway", 20.0, 35.0, 50.0),
    ("at the GPU's time", 8.0, 8.0, 40.0),
    ("at what a caller waits", 12.0, 60.0, 60.0),
    ("above what a caller waits", 100.0, 130.0, 120.0),
)


@functools.cache
def _fixed() -> tuple[tuple[str, float, float, float], ...]:
    """The cases every run tries: do_bench's recorded figures (_RECORDED), then _MADE_UP."""
    recorded = []
    for gpu, workload, M, N in _RECORDED:
        t = next(t for t in timing.three_timers(timing.recorded(gpu))
                 if (t.workload, t.M, t.N) == (workload, M, N))
        recorded.append((f"{gpu.upper()}, {workload.split()[0]} {M} x {N}, do_bench",
                         t.gpu_us, t.bench_us, t.call_us))
    return (*recorded, *_MADE_UP)
# The arguments taken in another order. The two orders left out give the share left out,
# and the ratio upside down: slips of their own below.
_OTHER_ORDERS = (("timer_us", "gpu_us", "call_us"), ("timer_us", "call_us", "gpu_us"),
                 ("call_us", "gpu_us", "timer_us"))


@dataclass(frozen=True)
class _Figures:
    """One case: three figures of one workload, microseconds a call."""

    name: str
    gpu_us: float
    timer_us: float
    call_us: float

    @property
    def counted(self) -> float:
        return (self.timer_us - self.gpu_us) / (self.call_us - self.gpu_us)

    def label(self) -> str:
        return (f"{self.name} (GPU {self.gpu_us:g} us, timer {self.timer_us:g}, caller "
                f"{self.call_us:g})")


def _cases(seed: int) -> list[_Figures]:
    cases = [_Figures(*fixed) for fixed in _fixed()]
    rng = random.Random(seed)
    for index in range(3):
        gpu_us = round(rng.uniform(2.0, 600.0), 3)
        host_us = round(rng.uniform(3.0, 120.0), 3)
        counted = rng.uniform(-0.25, 1.25)
        cases.append(_Figures(f"made-up {index + 1}", gpu_us,
                              round(gpu_us + counted * host_us, 3), round(gpu_us + host_us, 3)))
    return cases


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom else math.nan  # a slip's value, where it has one


def _in_order(order: tuple[str, ...]) -> Callable[[float, float, float], float]:
    """The share computed by a function that takes its arguments in `order`."""
    def value(g: float, t: float, c: float) -> float:
        given = dict(zip(order, (g, t, c), strict=True))
        return _ratio(given["timer_us"] - given["gpu_us"], given["call_us"] - given["gpu_us"])
    return value


def _rounded(digits: int) -> Callable[[float, float, float], float]:
    return lambda g, t, c: round((t - g) / (c - g), digits)


def _mistakes() -> tuple[_Mistake, ...]:
    slips = [
        _Mistake("it gives the share the timer leaves out, (call_us - timer_us) / (call_us - "
                 "gpu_us): the share it counts is (timer_us - gpu_us) / (call_us - gpu_us), "
                 "0 at the GPU's time and 1 at what a caller waits",
                 lambda g, t, c: (c - t) / (c - g)),
        _Mistake("your ratio is upside down: (call_us - gpu_us) / (timer_us - gpu_us). The "
                 "share is the part counted over the whole host's part, (timer_us - gpu_us) / "
                 "(call_us - gpu_us)", lambda g, t, c: _ratio(c - g, t - g)),
        _Mistake("the sign is flipped: the timer counts timer_us - gpu_us beyond the GPU's "
                 "time, not gpu_us - timer_us", lambda g, t, c: (g - t) / (c - g)),
        _Mistake("you divided by the whole call (call_us): the share is of the host's part, "
                 "call_us - gpu_us, what a caller waits beyond the GPU's time",
                 lambda g, t, c: (t - g) / c),
        _Mistake("you divided by the GPU's time: the share is of the host's part, call_us - "
                 "gpu_us", lambda g, t, c: (t - g) / g),
        _Mistake("you returned timer_us / call_us, the timer's figure as a share of the whole "
                 "call: the question is how much of the host's part (call_us - gpu_us) it "
                 "counts, (timer_us - gpu_us) / (call_us - gpu_us)", lambda g, t, c: t / c),
        _Mistake("you returned microseconds (timer_us - gpu_us), not a share: divide by the "
                 "host's part, call_us - gpu_us", lambda g, t, c: t - g),
        _Mistake("you returned a percentage: return the share, 0 to 1 between the two timers "
                 "(0.25, not 25)", lambda g, t, c: 100 * (t - g) / (c - g)),
        _Mistake("you clamped the share to 0..1: a figure below the GPU's time, or above what "
                 "a caller waits, is worth seeing (the check has both), so return it as it is",
                 lambda g, t, c: min(1.0, max(0.0, (t - g) / (c - g)))),
        _Mistake("you used integer division (//), which rounds the share down to a whole "
                 "number: use /", lambda g, t, c: (t - g) // (c - g)),
    ]
    for digits in (0, 1, 2, 3):
        slips.append(_Mistake("you rounded the share: return it as computed, and round only "
                              "where you print it", _rounded(digits)))
    for order in _OTHER_ORDERS:
        slips.append(_Mistake(
            f"your answers are those of a function that takes ({', '.join(order)}): the "
            "check calls launch_counted(gpu_us, timer_us, call_us), in that order",
            _in_order(order)))
    return tuple(slips)


_LAUNCH_COUNTED = _Function("launch_counted", False, _mistakes)


@learner_facing
def launch_counted(launch_counted: Callable[[float, float, float], float], *,
                   seed: int | None = None, quiet: bool = False) -> Report:
    """Check chapter 08's `launch_counted(gpu_us, timer_us, call_us)` on recorded, made-up
    and fresh figures; raise AssertionError naming its likely mistake, return the report
    (printed unless quiet) when it is right."""
    if not callable(launch_counted):
        raise TypeError(f"pass your function launch_counted itself, not "
                        f"{type(launch_counted).__name__}")
    seed = fresh_seed() if seed is None else int(seed)
    results: list[CaseResult] = []
    calls: list[_Call] = []
    for case in _cases(seed):
        figures = (case.gpu_us, case.timer_us, case.call_us)
        call = _Call(figures, figures, case.counted)
        calls.append(call)
        problem = _run(launch_counted, call, _LAUNCH_COUNTED)
        findings = () if problem is None else (
            Finding("launch_counted", f"launch_counted({', '.join(map(repr, figures))}) "
                                      f"{problem}"),)
        results.append(CaseResult(case, findings=findings))  # type: ignore[arg-type]
    advice = []
    failing = [r for r in results if r.finding("launch_counted")]
    if failing:
        advice.append(f"launch_counted is off: {_diagnose(_LAUNCH_COUNTED, calls)}.\n  Wrong on "
                      f"{len(failing)} of {len(results)} cases, e.g. "
                      f"{failing[0].finding('launch_counted').message}.")
    return finish(Report("launch_counted", seed, results, advice), quiet)
