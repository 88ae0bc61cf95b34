"""Checker for chapter 01's exercise: RMSNorm in plain PyTorch.

The learner writes `rmsnorm_torch(x, weight, eps=1e-6) -> y` with torch operations (no
Triton): statistics in float32, y in x's dtype. Here torch ops are the point, so the
dishonesty checks of the kernel exercises (launch count, torch ops, output provenance) are
left out; what is checked hard is precision.

"Statistics in float32" is checked on the ops themselves: a reduction (mean, sum, norm,
var) or a square root computed on a float16 or bfloat16 tensor fails, with the line that
ran it. The values alone cannot tell reliably: PyTorch accumulates 16-bit reductions in
float32 internally and rounds only the result, so a bfloat16 mean of squares scales each
row by a few tenths of a percent, about as much as the legitimate habit of rounding
x * rstd to bfloat16 before multiplying by the weight (as Hugging Face's Llama does, and
`course.baselines.eager_rmsnorm`): multiplying a row of 8-bit mantissas by one scalar and
rounding moves the whole row coherently, by up to 2^-9. The bfloat16 row-scale tolerance
is widened to admit that; float16 statistics also fail on values whose squares overflow.
"""

from __future__ import annotations

from collections.abc import Callable

from course.check.cases import Case
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.rmsnorm import RMSNORM_FORWARD
from course.check.runner import Exercise, Finding
from course.check.sandbox import CallRecord
from course.check.suite import check_and_raise

import torch

# PyTorch is fast: more rows than a kernel exercise can afford, so that a wrongly rounded
# statistic shows on many rows at once, and the coherent rounding described above is met.
_EXTRA_CASES = (
    Case("bfloat16, many long rows", (32, 4096), torch.bfloat16,
         frozenset({"half", "bf16", "long"}), offset=1.0, scale=0.5),
    Case("bfloat16, many rows", (1024, 1024), torch.bfloat16,
         frozenset({"half", "bf16", "pow2"})),
)

# Ops whose result is a row statistic, or a function of one.
_STATISTICS = ("aten.mean", "aten.sum", "aten.nansum", "aten.nanmean", "aten.var",
               "aten.var_mean", "aten.std", "aten.std_mean", "aten.norm",
               "aten.linalg_vector_norm", "aten.rsqrt", "aten.sqrt")
_LOW_PRECISION = ("float16", "bfloat16")


def _statistics_precision(record: CallRecord, case: Case) -> list[Finding]:
    """A finding for each line that computes a statistic in a 16-bit dtype."""
    by_site: dict[str, list[str]] = {}
    for use in record.forbidden_ops:  # every compute op the call ran (allowed here)
        if use.dtype in _LOW_PRECISION and ".".join(use.op.split(".")[:2]) in _STATISTICS:
            ops = by_site.setdefault(use.site, [])
            entry = f"{use.op} on {use.dtype}"
            if entry not in ops:
                ops.append(entry)
    if not by_site:
        return []
    where = "; ".join(f"{', '.join(ops)} at {site}" for site, ops in by_site.items())
    return [Finding("low_precision_statistics", f"computed statistics in 16 bits: {where}")]

_UPCAST = ("Upcast first, h = x.to(torch.float32), take the mean of h * h and its rsqrt in "
           "float32, and convert only the result back with .to(x.dtype).")

_ADVICE = {
    "low_precision_statistics": (
        "Your statistics are computed in 16 bits: " + _UPCAST + " A 16-bit mean of squares "
        "is rounded to 8 (bfloat16) or 11 (float16) significant bits, which scales the whole "
        "row by a wrong factor, and in float16 the square of a value near 300 overflows."),
    "half": (
        "float32 inputs pass but 16-bit inputs fail: your statistics are computed in the "
        "input's precision. " + _UPCAST + " In bfloat16 (8 significant bits) the mean of "
        "squares and its rsqrt are each rounded by up to 0.4 %, which scales a whole row by a "
        "wrong factor; in float16 the square of a value near 300 overflows to inf."),
    "extra_launches": (
        "This chapter's exercise is plain PyTorch: write the formula with torch operations; "
        "Triton kernels come from chapter 03 on."),
}

TORCH_RMSNORM = Exercise(
    name="torch_rmsnorm",
    signature="rmsnorm_torch(x, weight, eps=1e-6) -> y",
    cases=RMSNORM_FORWARD.cases + _EXTRA_CASES,
    make_inputs=RMSNORM_FORWARD.make_inputs,
    call=RMSNORM_FORWARD.call,
    expected=RMSNORM_FORWARD.expected,
    output_names=("y",),
    max_launches=0,
    min_launches=0,
    torch_ops_allowed=True,
    advice=_ADVICE,
    dtype_reasons={"y": "the input's dtype: compute the statistics in float32, then convert "
                        "y back with .to(x.dtype)"},
    outputs_from_triton=False,
    # Rounding x * rstd to bfloat16, then multiplying by the weight, moves a row coherently
    # by up to 2^-9 (measured: 0.22 % at worst over 4099 rows); bfloat16 statistics are
    # caught on the ops instead.
    row_scale_tolerances={torch.bfloat16: 2.0 ** -8},
    inspect=_statistics_precision,
)


@learner_facing
def torch_rmsnorm(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's plain-PyTorch `rmsnorm_torch(x, weight, eps=1e-6)`; raise
    AssertionError with advice on failure, return the report (printed unless quiet)."""
    return check_and_raise(TORCH_RMSNORM, fn, seed=seed, quiet=quiet)
