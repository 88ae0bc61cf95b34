"""Checkers for chapter 05's exercise: residual add fused with RMSNorm.

The learner writes `add_rmsnorm(x, residual, weight, eps=1e-6) -> (y, residual_out)`, out
of place and in one launch: residual_out = x + residual in x's dtype, y = RMSNorm of that
sum (see `course.reference.add_rmsnorm`). Both inputs must be left untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from course import reference, runtime, traffic
from course.check.bandwidth import BandwidthResult, check_bandwidth, verify_outputs
from course.check.cases import Case, row_shape_cases
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import Exercise, Inputs, Suspect, Tensors
from course.check.suite import check_and_raise

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


def _cases() -> tuple[Case, ...]:
    cases = [
        *row_shape_cases(),
        # x contiguous, the residual's rows padded: each input needs its own row stride.
        Case("residual laid out unlike x", (6, 128), f32, frozenset({"own_strides", "pow2"})),
        Case("3-D input", (2, 3, 64), f32, frozenset({"nd", "pow2"})),
        # x + residual is zero on these rows: the norm must give 0, not NaN.
        Case("sums of zeros", (6, 64), f32, frozenset({"zeros", "pow2"}), zero_rows=(1, 4)),
        Case("custom eps", (4, 64), f32, frozenset({"eps", "pow2"}), scale=0.05, eps=0.01),
        Case("float16", (8, 256), f16, frozenset({"half", "pow2"})),
        Case("float16, odd N", (9, 300), f16, frozenset({"half", "odd_n"})),
        Case("bfloat16, long rows", (4, 4096), bf16, frozenset({"half", "bf16", "long"}),
             offset=1.0, scale=0.5),
    ]
    if runtime.on_gpu():
        cases += [
            Case("bfloat16, very long rows", (32, 65536), bf16,
                 frozenset({"half", "bf16", "long"}), offset=1.0, scale=0.5),
            Case("large M", (4099, 1024), bf16, frozenset({"half", "bf16", "pow2"})),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    # On the case's zero rows both x and the residual are zero, so their sum is too.
    return {"x": case.make_input(gen),
            "residual": case.make_like_input(gen, scale=case.scale, zero_rows=True,
                                             row_padding=24 if "own_strides" in case.tags
                                             else None),
            "weight": case.make_vector(gen)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["residual"], t["weight"], eps=case.eps)


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.add_rmsnorm(t["x"], t["residual"], t["weight"], eps=case.eps)


def _all_nan(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    return "" if bool(torch.isnan(got).all()) else None


SUSPECTS = (
    Suspect("norm_of_x", "y",
            "y is the RMSNorm of x alone. Normalise the sum h = x + residual (the same h you "
            "store as residual_out): that is what the next layer needs.",
            expected=lambda t, c: reference.rmsnorm(t["x"], t["weight"], eps=c.eps)),
    Suspect("norm_of_residual", "y",
            "y is the RMSNorm of the residual alone. Normalise the sum h = x + residual.",
            expected=lambda t, c: reference.rmsnorm(t["residual"], t["weight"], eps=c.eps)),
    Suspect("residual_out_never_written", "residual_out",
            "residual_out is never written (it still holds the checker's NaN): store the sum "
            "h = x + residual into residual_out in the same kernel, next to y.",
            matches=_all_nan),
    Suspect("residual_out_is_residual", "residual_out",
            "residual_out holds the residual you were given, unchanged: it must be the new "
            "residual, h = x + residual, stored by your kernel.",
            expected=lambda t, c: t["residual"].to(torch.float64)),
    Suspect("residual_out_is_x", "residual_out",
            "residual_out holds x: it must be the sum h = x + residual.",
            expected=lambda t, c: t["x"].to(torch.float64)),
    Suspect("residual_out_is_y", "residual_out",
            "residual_out holds the normalised output y: it must be the sum before the norm, "
            "h = x + residual.",
            expected=lambda t, c: _expected(t, c)[0]),
)

ADD_RMSNORM = Exercise(
    name="add_rmsnorm",
    signature="add_rmsnorm(x, residual, weight, eps=1e-6) -> (y, residual_out)",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("y", "residual_out"),
    max_launches=1,
    suspects=SUSPECTS,
    advice={
        "row_offset": (
            "Row 0 is right but the other rows are wrong: each program must offset its "
            "pointers by its row, and each tensor by its own row stride. x, the residual "
            "and the two outputs can be laid out differently (one of the checks pads the "
            "residual's rows but not x's): pass residual.stride(0) and use it for the "
            "residual, x.stride(0) for x."),
        "input_written:residual": (
            "Your kernel writes x + residual into `residual`, in place. Inference stacks "
            "(vLLM's fused_add_rms_norm) do that on purpose, but this exercise is out of "
            "place: allocate residual_out = torch.empty_like(x), store the sum there, and "
            "leave both inputs untouched."),
        "input_written:x": (
            "Your kernel writes into `x`. Store y and the sum into tensors you allocate "
            "(torch.empty_like(x)), and leave both inputs untouched."),
        "extra_launches": (
            "Your function launches more than one kernel. The point of the fusion is one "
            "launch: add, store the sum, and normalise it while it is still in registers, so "
            "the sum never makes a round trip through memory before the norm reads it."),
        "output_not_from_kernel": (
            "A tensor you return was never passed to your kernel, so your kernel did not "
            "compute it. Allocate y and residual_out with torch.empty_like(x), pass both to "
            "the kernel, and return them."),
    },
)


@learner_facing
def add_rmsnorm(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's `add_rmsnorm(x, residual, weight, eps=1e-6)` on every case; raise
    AssertionError with advice on failure, return the report (printed unless quiet)."""
    return check_and_raise(ADD_RMSNORM, fn, seed=seed, quiet=quiet)


@learner_facing
def add_rmsnorm_bandwidth(fn: Callable, *, target: float = 0.75,
                          shape: tuple[int, int] = (16384, 4096),
                          dtype: torch.dtype | None = None, retries: int = 3,
                          on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check both outputs at `shape`, then require `target` of the copy bandwidth
    (ideal bytes: x, residual and the weight read once, y and residual_out written once)."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"add_rmsnorm {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args():
        return (torch.randn(shape, dtype=dtype, device=runtime.DEVICE),
                torch.randn(shape, dtype=dtype, device=runtime.DEVICE),
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5)

    if runtime.on_gpu():
        x, residual, w = make_args()
        verify_outputs(label, ADD_RMSNORM.output_names, fn(x, residual, w, eps=1e-6),
                       reference.add_rmsnorm(x, residual, w, eps=1e-6), (dtype, dtype))
    nbytes = traffic.fused_add_rmsnorm(m, n, dtype).bytes
    return check_bandwidth(label, fn, make_args, nbytes, target=target, retries=retries,
                           on_cpu=on_cpu, advice="One launch reads x and the residual once "
                           "and writes y and residual_out once: keep the sum in registers "
                           "between the add and the norm, BLOCK_N = next_power_of_2(N), and "
                           "choose num_warps by block size.")
