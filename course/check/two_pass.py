"""Checkers for chapter 03's exercise: the two-pass RMSNorm kernel.

The learner writes `rmsnorm_two_pass(x, weight, eps=1e-6) -> y`: one launch, one program
per row, a loop over column blocks for the sum of squares, then a second loop that reads
the row again and normalises it. It must work for any N, so besides the forward cases it
gets rows far longer than one block.

The bandwidth function does not grade: on a GPU it reports the measured fraction of copy
bandwidth and how the time compares with the traffic model's prediction (x read twice),
which is the chapter's point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from course import bench, hardware, reference, runtime, traffic
from course.check.bandwidth import (
    CallSpec,
    check_watched_call,
    measure_checked,
    needs_gpu_message,
    resolve_on_cpu,
)
from course.check.cases import Case
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.rmsnorm import RMSNORM_FORWARD
from course.check.runner import Exercise
from course.hardware import NeedsGPU

import torch

f32, f16 = torch.float32, torch.float16

# Rows several blocks long, one of them N = 12289 (a prime: no block size divides it).
_LONG_ROWS = (
    Case("long rows", (2, 20000), f32, frozenset({"wide", "odd_n"})),
    Case("long rows, prime N", (3, 12289), f16, frozenset({"wide", "odd_n", "half"})),
)



def _spans_blocks(case: Case) -> Case:
    """Rows of several thousand columns span several blocks of a looping kernel."""
    return replace(case, tags=case.tags | {"wide"}) if case.n > 2048 else case


TWO_PASS = Exercise(
    name="rmsnorm_two_pass",
    signature="rmsnorm_two_pass(x, weight, eps=1e-6) -> y",
    cases=tuple(_spans_blocks(c) for c in RMSNORM_FORWARD.cases) + _LONG_ROWS,
    make_inputs=RMSNORM_FORWARD.make_inputs,
    call=RMSNORM_FORWARD.call,
    expected=RMSNORM_FORWARD.expected,
    output_names=("y",),
    max_launches=1,
    # The forward exercise's known wrong answers, less the division by a padded block: a
    # looping kernel's block is not next_power_of_2(N), and the value rule for a block
    # divisor finds the block from the numbers instead.
    suspects=tuple(s for s in RMSNORM_FORWARD.suspects if s.name != "divided_by_block"),
    advice={"extra_launches": (
        "This exercise is one launch: the kernel itself reads each row twice, a loop over "
        "column blocks for the sum of squares, then a second loop that normalises. (Two "
        "kernels would work, but would also write and re-read rstd.)")},
)


@learner_facing
def rmsnorm_two_pass(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's `rmsnorm_two_pass(x, weight, eps=1e-6)` on the forward cases and on
    rows far longer than one block; raise AssertionError with advice on failure."""
    from course.check.address_pictures import check_with_pictures  # imports Triton

    return check_with_pictures(TWO_PASS, fn, seed=seed, quiet=quiet)


@dataclass(frozen=True)
class ModelComparison:
    """A measured kernel next to the traffic model's prediction for it."""

    measurement: bench.Measurement  # bandwidth over the ideal (fused) bytes
    model: traffic.Traffic
    predicted_s: float               # the model's bytes at the copy bandwidth

    @property
    def fraction_of_copy(self) -> float:
        return self.measurement.fraction_of_copy or 0.0

    @property
    def measured_over_predicted(self) -> float:
        """1.0: as fast as the model says; 1.5: takes half as long again."""
        return self.measurement.seconds / self.predicted_s

    def __str__(self) -> str:
        return (f"{self.measurement} (ideal bytes: x and the weight read once, y written "
                f"once).\nThe traffic model for this kernel, {self.model.bytes / 1e6:.1f} MB "
                f"(x read twice) at the copy bandwidth "
                f"({hardware.copy_bandwidth() / 1e9:.0f} GB/s), predicts "
                f"{self.predicted_s * 1e6:.1f} us: the kernel takes "
                f"{self.measured_over_predicted:.2f}x the prediction.")

    def __repr__(self) -> str:
        # One line under a cell that ends with the check, which has printed str() already.
        return (f"<{self.measurement.label}: {100 * self.fraction_of_copy:.0f} % of copy, "
                f"{self.measured_over_predicted:.2f}x the model's time>")


@learner_facing
def rmsnorm_two_pass_bandwidth(fn: Callable, *, shape: tuple[int, int] = (16384, 4096),
                               dtype: torch.dtype | None = None, reps: int = 50,
                               on_cpu: str = "skip", quiet: bool = False
                               ) -> ModelComparison | None:
    """On a GPU: check the output at `shape`, time it, and report the fraction of copy
    bandwidth and the ratio to the two-pass traffic model's prediction. Reports only; it
    sets no target. Without a GPU: on_cpu="skip" prints why and returns None,
    on_cpu="fail" raises NeedsGPU."""
    on_cpu = resolve_on_cpu(on_cpu)  # under the autograder, no GPU means no point
    if dtype is None:
        dtype = torch.bfloat16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"rmsnorm_two_pass {m}x{n} {str(dtype).replace('torch.', '')}"
    if not runtime.on_gpu():
        message = needs_gpu_message(label)
        if on_cpu == "skip":
            print(message + " Skipped.")
            return None
        raise NeedsGPU(message)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype).to(runtime.DEVICE)
    w = (torch.rand(n, generator=gen) + 0.5).to(dtype).to(runtime.DEVICE)
    # Every call is held to the exercise's rules and every timed output checked, as in the
    # graded speed checks: a report of a call that skips work would teach the wrong lesson.
    spec = CallSpec(("y",), lambda x, w: reference.rmsnorm(x, w, eps=1e-6), (dtype,),
                    max_launches=TWO_PASS.max_launches, arg_names=("x", "weight"))
    timed = check_watched_call(label, fn, (x, w), spec, when="before")

    def make_args():
        return (torch.randn(shape, dtype=dtype, device=runtime.DEVICE),
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5)

    ideal = traffic.fused_rmsnorm(m, n, dtype)
    model = traffic.two_pass_rmsnorm(m, n, dtype)
    measurement = measure_checked(label, timed, make_args, ideal.bytes, spec, reps=reps)
    check_watched_call(label, fn, make_args(), spec, when="after", refill=make_args)
    result = ModelComparison(measurement, model, model.time_floor(hardware.copy_bandwidth()))
    if not quiet:
        print(result)
    return result
