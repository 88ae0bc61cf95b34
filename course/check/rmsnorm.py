"""Checkers for the RMSNorm exercises.

The learner writes `rmsnorm(x, weight, eps=1e-6) -> y`: y = x / sqrt(mean(x^2) + eps) * weight
over the last dimension of an input of any shape, y in x's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from course import reference, runtime, traffic
from course.check.bandwidth import BandwidthResult, check_bandwidth
from course.check.cases import Case, row_shape_cases
from course.check.compare import compare
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import Exercise
from course.check.suite import check_and_raise

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


def _cases() -> tuple[Case, ...]:
    cases = [
        *row_shape_cases(),
        Case("3-D input", (2, 3, 64), f32, frozenset({"nd", "pow2"})),
        Case("rows of zeros", (6, 64), f32, frozenset({"zeros", "pow2"}), zero_rows=(1, 4)),
        Case("custom eps", (4, 64), f32, frozenset({"eps", "pow2"}), scale=0.05, eps=0.01),
        Case("float16", (8, 256), f16, frozenset({"half", "pow2"})),
        Case("float16, odd N", (9, 300), f16, frozenset({"half", "odd_n"})),
        Case("float16, large values", (4, 512), f16, frozenset({"half", "magnitude"}),
             scale=300.0),
        Case("bfloat16", (8, 256), bf16, frozenset({"half", "bf16", "pow2"})),
        Case("bfloat16, long rows", (4, 8192), bf16, frozenset({"half", "bf16", "long"}),
             offset=1.0, scale=0.5),
        Case("many rows", (257, 512), f16, frozenset({"half", "pow2"})),
    ]
    if runtime.on_gpu():  # sizes the interpreter would take minutes over
        cases += [
            Case("bfloat16, very long rows", (64, 65536), bf16,
                 frozenset({"half", "bf16", "long"}), offset=1.0, scale=0.5),
            Case("large M", (4099, 1024), bf16, frozenset({"half", "bf16", "pow2"})),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator):
    return {"x": case.make_input(gen), "weight": case.make_vector(gen)}


def _call(fn: Callable, t: dict[str, torch.Tensor], case: Case):
    return fn(t["x"], t["weight"], eps=case.eps)


def _expected(t: dict[str, torch.Tensor], case: Case):
    return (reference.rmsnorm(t["x"], t["weight"], eps=case.eps),)


RMSNORM_FORWARD = Exercise(
    name="rmsnorm_forward",
    signature="rmsnorm(x, weight, eps=1e-6) -> y",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("y",),
    max_launches=1,
)


@learner_facing
def rmsnorm_forward(fn: Callable, *, seed: int | None = None, max_launches: int = 1,
                    quiet: bool = False) -> Report:
    """Check a learner's `rmsnorm(x, weight, eps=1e-6)` on every case; raise AssertionError
    with advice on failure, return the report (printed unless quiet) on success."""
    exercise = RMSNORM_FORWARD
    if max_launches != exercise.max_launches:
        exercise = replace(exercise, max_launches=max_launches)
    return check_and_raise(exercise, fn, seed=seed, quiet=quiet)


@learner_facing
def rmsnorm_forward_bandwidth(fn: Callable, *, target: float = 0.75,
                              shape: tuple[int, int] = (16384, 4096),
                              dtype: torch.dtype | None = None, retries: int = 3,
                              on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check the output at `shape` against the reference, then require `target` of
    the copy bandwidth (ideal bytes: read x and the weight once, write y once)."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"rmsnorm {m}x{n} {str(dtype).replace('torch.', '')}"
    if runtime.on_gpu():
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=gen).to(dtype).to(runtime.DEVICE)
        w = (torch.rand(n, generator=gen) + 0.5).to(dtype).to(runtime.DEVICE)
        mismatch = compare("y", fn(x, w, eps=1e-6), reference.rmsnorm(x, w, eps=1e-6), dtype)
        if mismatch is not None:
            raise AssertionError(f"{label}: wrong output at the timing shape, so it is not "
                                 f"timed.\n{mismatch.describe()}")

    def make_args():
        return (torch.randn(shape, dtype=dtype, device=runtime.DEVICE),
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5)

    nbytes = traffic.fused_rmsnorm(m, n, dtype).bytes
    return check_bandwidth(label, fn, make_args, nbytes, target=target, retries=retries,
                           on_cpu=on_cpu, advice="A fused kernel reads each row once: keep the "
                           "row in registers, BLOCK_N = next_power_of_2(N), and choose "
                           "num_warps by block size (8 or 16 for N of several thousand).")
