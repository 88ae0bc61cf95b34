"""Checkers for chapter 07's first exercise: the RMSNorm backward kernels.

The learner writes `rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)`. rstd is float32 of
shape x.shape[:-1], as a forward saved it; dx comes back in x's dtype, dw in the weight's.
dW is a sum over every row: each program of kernel 1 sums its own rows into a float32
partial row, and kernel 2 adds the partial rows up. No atomics, at most two launches.

dW's tolerance reflects that it is a sum over M rows: on top of the usual tolerance for
its dtype, each column may be off by the float32 rounding of summing |dy * x_hat| over the
rows (see `dw_sum_atol`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from course import reference, runtime, traffic
from course.check.bandwidth import BandwidthResult, CallSpec, check_bandwidth
from course.check.cases import Case
from course.check.inputs import guarded
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import Exercise, Inputs, Suspect, Tensors
from course.check.suite import check_and_raise

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
F64 = torch.float64
_F32_UNIT = 2.0 ** -24


def _cases() -> tuple[Case, ...]:
    cases = [
        # M well above any sensible rows-per-program, so that several programs' partial
        # sums must be added up.
        Case("power-of-two N", (64, 128), f32, frozenset({"pow2"})),
        Case("odd N, odd M", (37, 100), f32, frozenset({"odd_n"})),
        Case("N = 1", (5, 1), f32, frozenset({"edge"})),
        Case("M = 1", (1, 257), f32, frozenset({"edge", "odd_n"})),
        Case("wide rows", (6, 3000), f32, frozenset({"wide", "odd_n"})),
        Case("strided rows", (16, 128), f32, frozenset({"strided"}), row_padding=40),
        Case("3-D input", (2, 8, 64), f32, frozenset({"nd", "pow2"})),
        Case("rows of zeros", (8, 64), f32, frozenset({"zeros", "pow2"}), zero_rows=(1, 4)),
        Case("float16", (32, 256), f16, frozenset({"half", "pow2"})),
        Case("bfloat16, float32 weight", (32, 256), bf16, frozenset({"half", "bf16", "pow2"}),
             param_dtype=f32),
    ]
    if runtime.on_gpu():
        cases += [
            Case("large M", (8192, 1024), bf16, frozenset({"half", "bf16", "pow2"})),
            Case("long rows", (512, 16384), bf16, frozenset({"half", "bf16", "long"})),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    x = case.make_input(gen)
    rstd = reference.rmsnorm_rstd(x.tensor, case.eps).to(f32)  # as a forward saved it
    return {"x": x, "weight": case.make_vector(gen), "rstd": guarded(rstd),
            "dy": case.make_like_input(gen)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["weight"], t["rstd"], t["dy"])


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.rmsnorm_backward(t["x"], t["weight"], t["dy"], eps=case.eps)


def _dtypes(case: Case) -> tuple[torch.dtype, torch.dtype]:
    return (case.dtype, case.weight_dtype)


def dw_terms(t: Tensors) -> torch.Tensor:
    """dy * x_hat per element, rows flattened: dw is their column sum."""
    n = t["x"].shape[-1]
    x64 = t["x"].to(F64).reshape(-1, n)
    x_hat = x64 * t["rstd"].to(F64).reshape(-1, 1)
    return t["dy"].to(F64).reshape(-1, n) * x_hat


def dw_sum_atol(terms: torch.Tensor) -> torch.Tensor:
    """Per column of dw: the float32 rounding a correct sum of M terms may collect, taken
    as 4 * sqrt(M) units of the sum of the terms' magnitudes (rounding errors of a long sum
    add up like a random walk; the bound is loose enough for any order of summation)."""
    m = terms.shape[0]
    return 4.0 * math.sqrt(m) * _F32_UNIT * terms.abs().sum(dim=0)


def _extra_atol(name: str, t: Tensors, case: Case) -> torch.Tensor | None:
    return dw_sum_atol(dw_terms(t)) if name == "dw" else None


def _rowwise(t: Tensors, case: Case, *, weight: bool = True, projection: bool = True,
             mean: bool = True) -> torch.Tensor:
    """dx with one of the usual slips: no weight in g, no term through rstd, a row sum
    where the row mean belongs."""
    x64, dy64 = t["x"].to(F64), t["dy"].to(F64)
    rstd = reference.rmsnorm_rstd(x64, case.eps).unsqueeze(-1)
    x_hat = x64 * rstd
    g = dy64 * t["weight"].to(F64) if weight else dy64
    if not projection:
        return rstd * g
    c = (x_hat * g).mean(dim=-1, keepdim=True) if mean else (x_hat * g).sum(dim=-1, keepdim=True)
    return rstd * (g - x_hat * c)


def _never_written(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    if bool(torch.isnan(got).all()):
        return "dw is all NaN, memory that was never written"
    if bool((got == 0).all()):
        return "dw is all zeros"
    return None


def _partial_rows(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """dw equal to the sum over the first k rows only (or the last k), k < M: the partial
    sums of one program, or of some programs, never added up with the others."""
    terms = dw_terms(t)
    m = terms.shape[0]
    if m < 2:
        return None
    prefix = terms.cumsum(dim=0)[:-1]                       # rows 0..k-1, k = 1..M-1
    suffix = terms.flip(0).cumsum(dim=0)[:-1]               # rows M-k..M-1
    have = got.detach().to(F64).reshape(1, -1)
    tol = 1e-2 * (terms.abs().sum(dim=0) + 1e-6)           # generous: any rounding passes
    for label, sums in (("first", prefix), ("last", suffix)):
        close = ((sums - have).abs() <= tol).all(dim=1)
        if bool(close.any()):
            k = int(close.nonzero()[0]) + 1
            rows = f"0..{k - 1}" if label == "first" else f"{m - k}..{m - 1}"
            return f"dw equals the sum over rows {rows} only, {k} of the {m} rows"
    return None


SUSPECTS = (
    Suspect("dx_is_dy", "dx",
            "dx is dy unchanged (dX = dY: a published RMSNorm backward does exactly this). "
            "The gradient goes through the normalisation: with x_hat = x * rstd and "
            "g = weight * dy, dx = rstd * (g - x_hat * mean(x_hat * g)) per row.",
            expected=lambda t, c: t["dy"].to(F64)),
    Suspect("dx_without_projection", "dx",
            "dx = rstd * weight * dy misses the term that flows through rstd: every x_j "
            "changes the row's rms, so dx = rstd * (g - x_hat * mean(x_hat * g)) with "
            "g = weight * dy and x_hat = x * rstd.",
            expected=lambda t, c: _rowwise(t, c, projection=False)),
    Suspect("dx_sum_not_mean", "dx",
            "dx uses the row sum of x_hat * g where its mean belongs: divide that sum by N, "
            "dx = rstd * (g - x_hat * sum(x_hat * g) / N).",
            expected=lambda t, c: _rowwise(t, c, mean=False)),
    Suspect("dx_without_weight", "dx",
            "dx leaves out the weight: the gradient reaching x_hat is g = weight * dy, in "
            "both places it appears, dx = rstd * (g - x_hat * mean(x_hat * g)).",
            expected=lambda t, c: _rowwise(t, c, weight=False)),
    Suspect("dw_never_computed", "dw",
            "dW is never computed: dw = sum over rows of dy * x_hat (x_hat = x * rstd). Let "
            "kernel 1 accumulate each program's rows into a float32 partial row, and kernel 2 "
            "add the partial rows into dw.", matches=_never_written),
    Suspect("dw_partial_rows", "dw",
            "dW holds the sum of only some rows: the partial sums of the programs of kernel 1 "
            "are not all added up. Write one float32 partial row per program "
            "(partial[pid, :]), then launch a second kernel in which each program sums one "
            "block of columns over all the partial rows and stores dw.",
            matches=_partial_rows),
)

RMSNORM_BACKWARD = Exercise(
    name="rmsnorm_backward",
    signature="rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("dx", "dw"),
    max_launches=2,
    atomics_allowed=False,
    dtypes=_dtypes,
    extra_atol=_extra_atol,
    suspects=SUSPECTS,
    dtype_reasons={"dx": "x's dtype: compute in float32, store in x's dtype",
                   "dw": "the weight's dtype: accumulate in float32, store in weight.dtype"},
    advice={
        "input_written:dy": (
            "Your kernel writes dX over dY (into dy's memory): the caller still owns dy, and "
            "autograd may hand the same gradient to other branches of the graph. Allocate "
            "dx = torch.empty_like(x) and store dx there."),
        "input_written:rstd": ("Your kernel writes into rstd: it is the forward's saved "
                               "statistic, an input here. Only read it."),
        "extra_launches": (
            "This exercise allows two launches: kernel 1 computes dx and each program's "
            "partial dW sums (float32), kernel 2 adds the partial rows into dw."),
        "torch_ops": (
            "Your wrapper computes with PyTorch (a partial.sum(0) for dW counts too). Only "
            "allocation, views and your two kernel launches belong in the wrapper: reduce the "
            "partial sums in a second kernel."),
        "output_not_from_kernel": (
            "A tensor you return was never passed to a kernel, so no kernel computed it. "
            "Allocate dx (and the dw that kernel 2 writes), pass them to your kernels, and "
            "return them."),
    },
)


@learner_facing
def rmsnorm_backward(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's `rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)` against
    `course.reference.rmsnorm_backward`; raise AssertionError with advice on failure."""
    return check_and_raise(RMSNORM_BACKWARD, fn, seed=seed, quiet=quiet)


@learner_facing
def rmsnorm_backward_bandwidth(fn: Callable, *, target: float = 0.6,
                               shape: tuple[int, int] = (16384, 4096),
                               dtype: torch.dtype | None = None, retries: int = 3,
                               on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check dx and dw at `shape`, then require `target` of the copy bandwidth.
    Ideal bytes (`course.traffic.ideal_backward_bytes`): x, dy and the weight read once,
    dx and dw written once; rstd and the partial sums are overheads a kernel pays for."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"rmsnorm_backward {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args():
        x = torch.randn(shape, dtype=dtype, device=runtime.DEVICE)
        w = torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        return x, w, rstd, torch.randn(shape, dtype=dtype, device=runtime.DEVICE)

    spec = CallSpec(RMSNORM_BACKWARD.output_names,
                    lambda x, w, rstd, dy: reference.rmsnorm_backward(x, w, dy, eps=1e-6),
                    (dtype, dtype),
                    extra_atol=lambda x, w, rstd, dy: (
                        None, dw_sum_atol(dw_terms({"x": x, "rstd": rstd, "dy": dy}))),
                    max_launches=RMSNORM_BACKWARD.max_launches,
                    arg_names=("x", "weight", "rstd", "dy"))
    nbytes = traffic.ideal_backward_bytes(m, n, dtype)
    return check_bandwidth(label, fn, make_args, nbytes, spec=spec, target=target,
                           retries=retries,
                           on_cpu=on_cpu, advice="Kernel 1 should read x and dy once; give "
                           "each program enough rows that the float32 partials stay small "
                           "(a few programs per SM). Kernel 2 moves few bytes but can still "
                           "cost time: give it many narrow column strips (16 columns a "
                           "program), each loading all P partial rows at once, rather than a "
                           "few wide programs that walk the partial rows block by block.")
