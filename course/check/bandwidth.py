"""Bandwidth checks: a kernel's speed as a fraction of the copy bandwidth measured on the
same GPU in the same process. GPU only; without one they say so instead of guessing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from course import bench, hardware, runtime
from course.hardware import NeedsGPU


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


def needs_gpu_message(label: str) -> str:
    return (f"{label}: the bandwidth check needs a GPU. Kernels here run in Triton's interpreter "
            "on the CPU, which says nothing about memory bandwidth. Run this cell on a machine "
            "with a CUDA GPU (for example Colab with a GPU runtime).")


def check_bandwidth(label: str, fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]],
                    nbytes: int, *, target: float, retries: int = 3, reps: int = 50,
                    on_cpu: str = "fail", advice: str = "") -> BandwidthResult | None:
    """Time `fn(*make_args())` on rotating inputs; pass when some attempt reaches `target`
    (a fraction of copy bandwidth). Retries absorb a noisy neighbour or clock ramp.

    Without a GPU: on_cpu="skip" prints why and returns None, on_cpu="fail" raises NeedsGPU.
    """
    if on_cpu not in ("skip", "fail"):
        raise ValueError(f"on_cpu must be 'skip' or 'fail', not {on_cpu!r}")
    if not runtime.on_gpu():
        if on_cpu == "skip":
            print(needs_gpu_message(label) + " Skipped.")
            return None
        raise NeedsGPU(needs_gpu_message(label))
    attempts = []
    for _ in range(max(1, retries)):
        attempts.append(bench.measure(label, fn, make_args, nbytes, reps=reps))
        if (attempts[-1].fraction_of_copy or 0.0) >= target:
            break
    result = BandwidthResult(label, target, tuple(attempts))
    if not result.passed:
        raise AssertionError(f"{result}.\nIdeal bytes counted: {nbytes / 1e6:.1f} MB per call "
                             f"(each input read once, each output written once). {advice}")
    return result
