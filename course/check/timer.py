"""Checker for chapter 03's second exercise: a minimal honest timer.

The learner writes `time_per_call(gpu, fn, inputs, reps)`, the mean seconds a call of
`fn` takes on the GPU, and the chapter wraps it as

    time_workload(spec, reps) -> float    # time_per_call(*course.timing.workload(spec), reps)

which takes and returns plain values, so that the autograder can call it in the learner's
process. The check times simulated GPUs (`course.timing`, specs 'sim:<seed>' with seeds
drawn from its own seed) whose true time per call it knows, and whose way of fooling a
timer it can predict: a timer that reads the host's clock without synchronising measures
the launch, one without a warm-up counts the compilation, one that reuses an input or lets
its outputs be freed finds them in L2. A wrong time is compared with each of those and
the message names the one that matches it on every simulated GPU.

A timer measures: one that asks course.timing for the simulated GPU's true time
(`simulated_times`, `SimParams.kernel_s`, ...) fails whatever it returns. The timer is
handed no parameters (`timing.SimDevice` holds only the number of a simulated GPU kept
where the walls refuse to show it), and while the check calls it, a profile hook
notes any function of course.timing it calls beyond a workload, its events, synchronize and
clock (`roofline._traffic_calls`, in the learner's process too: guards.TRAFFIC_CALLS), and
whether the hook was switched off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real

from course import timing
from course.check.eager_bytes import finish
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.roofline import SWITCHED_OFF, TIMING, _traffic_calls
from course.check.runner import CaseResult, Finding, fresh_seed

import torch

REPS = 30
SIMULATIONS = 3
# An honest timer's mean: the true time, less at most this share (a first timed call that
# finds the last warm-up's output in L2), plus at most one launch spread over the reps.
BELOW = 0.04
# A wrong time matches a mistake within this share of the mistake's prediction.
MATCH = 0.08

_MISTAKES = {
    "host_clock": "it measured the launch only: gpu.clock() (like time.perf_counter) reads "
                  "the host's clock, and a call returns as soon as its kernel is queued. "
                  "Time with events recorded around each call (gpu.Event(enable_timing=True), "
                  ".record()), and gpu.synchronize() before reading them",
    "no_warmup": "it counted the first call's compilation: call fn a few times before timing "
                 "(a warm-up), then gpu.synchronize(), so the timed calls find the kernel "
                 "compiled and the GPU idle",
    "same_input": "it timed the same input every call, which is still in L2 from the call "
                  "before: take the copies in turn, inputs[i % len(inputs)], so each call "
                  "reads an input L2 no longer holds",
    "same_output": "its calls wrote to memory a recent call had written: an output nobody "
                   "keeps is freed, and the allocator hands its block, still in L2, to the "
                   "next call. Keep every output alive (append it to a list) until the "
                   "timing ends",
    "same_input_and_output": "it timed the same input every call and let each output be "
                             "freed, so both were still in L2: rotate the inputs "
                             "(inputs[i % len(inputs)]) and keep every output in a list",
    "milliseconds": "it returned milliseconds: elapsed_time gives milliseconds, and the "
                    "function returns seconds (divide by 1e3)",
    "microseconds": "it returned microseconds: the function returns seconds",
    "total": "it returned the total of all the calls: divide by reps for the time a call",
}


@dataclass(frozen=True)
class _Simulation:
    """A case of this check: one simulated GPU (its report line)."""

    spec: str

    def label(self) -> str:
        return f"simulated GPU {self.spec}"


def _matching(got: float, times: timing.SimTimes) -> dict[str, float]:
    """The mistakes whose prediction `got` matches, each with its gap (the share it is off)."""
    gaps = {name: abs(got / predicted - 1) for name, predicted in times.mistakes().items()}
    return {name: gap for name, gap in gaps.items() if gap <= MATCH}


def _diagnose(matches: list[dict[str, float]]) -> str | None:
    """The mistake that matches every simulated GPU's wrong time (`matches`: one
    `_matching` per GPU), the closest over all of them if several do; None if none does.
    One GPU alone may not tell two mistakes apart: where the first call's compilation
    costs about as much as the other calls together, no warm-up reads like the total of
    all the calls."""
    if not matches:
        return None
    common = set(matches[0]).intersection(*matches[1:])
    if not common:
        return None
    return min(common, key=lambda name: max(m[name] for m in matches))


def _is_honest(got: float, times: timing.SimTimes) -> bool:
    true = times.true_s
    return true * (1 - BELOW) <= got <= true + 1.05 * times.params.launch_s


def _looked_up(called: list[str]) -> list[str]:
    """What of course.timing beyond a timer's needs the call ran (by name), and SWITCHED_OFF
    if it switched the profile hook off: from `_traffic_calls`'s list, each once."""
    return list(dict.fromkeys(c[len(TIMING):] if c.startswith(TIMING) else c for c in called
                              if c.startswith(TIMING) or c == SWITCHED_OFF))


def _looked_up_said(looked_up: list[str]) -> str:
    names = [n for n in looked_up if n != SWITCHED_OFF]
    parts = []
    if names:
        parts.append(f"asks course.timing for the simulated GPU's true time "
                     f"({', '.join(names)})")
    if SWITCHED_OFF in looked_up:
        parts.append("switches off the check's profile hook (sys.setprofile or "
                     "threading.setprofile), which watches for calls into course.timing")
    return " and ".join(parts)


def _specs(seed: int) -> list[str]:
    gen = torch.Generator().manual_seed(seed)
    return [f"sim:{int(s)}" for s in torch.randint(0, 2**31 - 1, (SIMULATIONS,), generator=gen)]


@learner_facing
def honest_timer(time_workload: Callable[[str, int], float], *, seed: int | None = None,
                 quiet: bool = False) -> Report:
    """Check `time_workload(spec, reps)` on simulated GPUs: each time must be the true
    time of a call; raise AssertionError naming the ingredient that is missing (or the
    unit that is wrong), return the report (printed unless quiet) when all are right."""
    if not callable(time_workload):
        raise TypeError(f"pass the function time_workload itself, not "
                        f"{type(time_workload).__name__}")
    seed = fresh_seed() if seed is None else int(seed)
    results, matches, refused = [], [], []
    for spec in _specs(seed):
        times = timing.simulated_times(spec, REPS)
        problem = None
        try:
            with _traffic_calls() as called:
                got = time_workload(spec, REPS)
        except Exception as exc:  # the learner's code: reported, not raised
            problem = f"raised {type(exc).__name__}: {exc}"
        else:
            looked_up = _looked_up(called)
            if looked_up:
                refused.extend(looked_up)
                problem = (f"{_looked_up_said(looked_up)}, where a timer measures: its time "
                           "is refused, whatever it is")
            elif isinstance(got, bool) or not isinstance(got, Real) or \
                    not math.isfinite(float(got)) or got <= 0:
                problem = f"returned {got!r}: the time a call takes is a positive number"
            elif not _is_honest(float(got), times):
                matches.append(_matching(float(got), times))
                problem = (f"returned {float(got) * 1e6:,.1f} us a call; the simulated GPU "
                           f"takes {times.true_s * 1e6:,.1f} us (launch "
                           f"{times.params.launch_s * 1e6:.1f} us, first call "
                           f"{times.params.compile_s * 1e3:.0f} ms)")
        findings = () if problem is None else (
            Finding("time", f"time_workload({spec!r}, {REPS}) {problem}"),)
        results.append(CaseResult(_Simulation(spec), findings=findings))
    advice = []
    failing = [r for r in results if not r.passed]
    if refused:
        advice.append(f"time_per_call {_looked_up_said(list(dict.fromkeys(refused)))}: "
                      "it must measure. Use only what `gpu` offers (gpu.Event(enable_timing="
                      "True) recorded around each call of fn, gpu.synchronize(), then "
                      "elapsed_time), fn and inputs; while the check times, any other use "
                      "of course.timing, and switching off the profile hook that watches "
                      "for it, fails.")
    elif failing:
        first = failing[0].findings[0].message
        mistake = _diagnose(matches) if len(matches) == len(failing) else None
        if mistake is not None:
            advice.append(f"time_per_call is off: {_MISTAKES[mistake]}.\n  e.g. {first}.")
        else:
            advice.append(f"time_per_call is off on {len(failing)} of {len(results)} "
                          f"simulated GPUs, e.g. {first}.")
    return finish(Report("honest_timer", seed, results, advice), quiet)
