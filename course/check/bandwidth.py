"""Bandwidth checks: a kernel's speed as a fraction of the copy bandwidth measured on the
same GPU in the same process. GPU only; without one they say so instead of guessing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from course import bench, hardware, runtime
from course.check.compare import compare
from course.check.learner_facing import learner_facing
from course.hardware import NeedsGPU

import torch


@dataclass(frozen=True)
class BandwidthResult:
    label: str
    target: float
    attempts: tuple[bench.Measurement, ...]

    @property
    def best(self) -> bench.Measurement:
        return max(self.attempts, key=lambda m: m.fraction_of_copy or 0.0)

    @property
    def passed(self) -> bool:
        return (self.best.fraction_of_copy or 0.0) >= self.target

    def __str__(self) -> str:
        best = self.best
        verdict = "passes" if self.passed else "is below"
        return (f"{best} (best of {len(self.attempts)}); {verdict} the target of "
                f"{100 * self.target:.0f} % of copy bandwidth "
                f"({hardware.copy_bandwidth() / 1e9:.0f} GB/s measured here)")


def verify_outputs(label: str, names: Sequence[str], got: object,
                   expected: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype],
                   extra_atol: Sequence[float | torch.Tensor | None] | None = None) -> None:
    """Raise AssertionError when a kernel's outputs at the timing shape are wrong: a wrong
    kernel is not timed (it might be fast because it skips work)."""
    outs = got if isinstance(got, (tuple, list)) else (got,)
    if len(outs) != len(names):
        raise AssertionError(f"{label}: returned {len(outs)} value(s), expected {len(names)} "
                             f"({', '.join(names)})")
    extras = list(extra_atol) if extra_atol is not None else [None] * len(names)
    problems = []
    for name, out, want, dtype, extra in zip(names, outs, expected, dtypes, extras, strict=True):
        mismatch = compare(name, out, want, dtype, extra_atol=extra)
        if mismatch is not None:
            problems.append(mismatch.describe())
    if problems:
        raise AssertionError(f"{label}: wrong output at the timing shape, so it is not timed.\n"
                             + "\n".join(problems))


def needs_gpu_message(label: str) -> str:
    return (f"{label}: the bandwidth check needs a GPU. Kernels here run in Triton's interpreter "
            "on the CPU, which says nothing about memory bandwidth. Run this cell on a machine "
            "with a CUDA GPU (for example Colab with a GPU runtime).")


def resolve_on_cpu(on_cpu: str) -> str:
    """What a check without a GPU does: the notebook's choice, except under the autograder
    (COURSE_GRADING=1, set by `make autograde`), where it always fails. A learner reading on
    a laptop sees a skip; a submission graded without a GPU earns no bandwidth points."""
    if on_cpu not in ("skip", "fail"):
        raise ValueError(f"on_cpu must be 'skip' or 'fail', not {on_cpu!r}")
    return "fail" if runtime.grading() else on_cpu


@learner_facing
def check_bandwidth(label: str, fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]],
                    nbytes: int, *, target: float, retries: int = 3, reps: int = 50,
                    on_cpu: str = "fail", advice: str = "") -> BandwidthResult | None:
    """Time `fn(*make_args())` on rotating inputs; pass when some attempt reaches `target`
    (a fraction of copy bandwidth). Retries absorb a noisy neighbour or clock ramp.

    Without a GPU: on_cpu="skip" prints why and returns None, on_cpu="fail" raises NeedsGPU.
    """
    on_cpu = resolve_on_cpu(on_cpu)
    if not runtime.on_gpu():
        if on_cpu == "skip":
            print(needs_gpu_message(label) + " Skipped.")
            return None
        raise NeedsGPU(needs_gpu_message(label))
    attempts = []
    for _ in range(max(1, retries)):
        # GPU time only (hide_launch): the grading machine's Python speed is not the
        # learner's kernel. Under nbgrader one call's host time was measured at 71 us on an
        # H100 host, enough to starve a 95 us kernel between per-call events (docs/benchmarks.md).
        attempts.append(bench.measure(label, fn, make_args, nbytes, reps=reps,
                                      hide_launch=True))
        if (attempts[-1].fraction_of_copy or 0.0) >= target:
            break
    result = BandwidthResult(label, target, tuple(attempts))
    if not result.passed:
        raise AssertionError(f"{result}.\nIdeal bytes counted: {nbytes / 1e6:.1f} MB per call "
                             f"(each input read once, each output written once). {advice}")
    return result
