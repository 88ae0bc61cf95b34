"""Checkers for chapter 07's LayerNorm exercise: its backward kernels.

The learner writes `layernorm_backward(x, weight, mean, rstd, dy) -> (dx, dw, db)`, from
the statistics the forward saved (mean and rstd, float32, shape x.shape[:-1]). Per row,
with x_hat = (x - mean) * rstd and g = weight * dy,

    dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g))
    dw = sum over rows of dy * x_hat          db = sum over rows of dy

dx comes back in x's dtype, dw and db in the weight's. As for RMSNorm, kernel 1 writes dx
and each program's float32 partial sums (two rows a program now: dW's and dB's), and a
second kernel adds the partial rows up (launched once per sum, or once for both): three
launches at most, no atomics.

The reference (`course.reference.layernorm_backward_from_stats`) takes the same saved
statistics as the kernel: a float32 mean of a row near 1e4 is off by up to half a unit in
its last place, and the gradient is judged for the statistics given. Rows with large
means then test what the backward itself does with them: x - mean first (exact for
neighbouring float32 values), never x * rstd - mean * rstd (two products near 1e4 * rstd,
each rounded, whose difference loses the digits).

The chapter grades dx, dw and db in a cell each (`only=`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from course import reference, runtime, traffic
from course.check.backward import (
    BLOCK_BOUNDS_ADVICE,
    ROWS_LEFT_OVER,
    STRIDED_ADVICE,
    constant_factor,
    dw_sum_atol,
    dy_like,
    graded_part,
    padded_block,
    sum_suspects,
)
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
EPS = 1e-5  # of the forward that saved the statistics
_F32_UNIT = 2.0 ** -24  # float32 rounding: half an ulp, relative


def _cases() -> tuple[Case, ...]:
    def case(name, shape, dtype, tags, **kw):
        return Case(name, shape, dtype, frozenset(tags), eps=EPS, **kw)

    cases = [
        case("power-of-two N", (64, 128), f32, {"pow2"}),
        case("odd N, odd M", (37, 100), f32, {"odd_n"}),
        case("N = 1", (5, 1), f32, {"edge"}),
        case("M = 1", (1, 257), f32, {"edge", "odd_n"}),
        case("wide rows", (6, 3000), f32, {"wide", "odd_n"}),
        case("strided rows", (16, 128), f32, {"strided"}, row_padding=40),
        case("3-D input", (2, 8, 64), f32, {"nd", "pow2"}),
        case("rows of zeros", (8, 64), f32, {"zeros", "pow2"}, zero_rows=(1, 4)),
        # Mean >> spread: x - mean must come first. Power-of-two N, so that a kernel failing
        # only these is not mistaken for one missing a mask.
        case("mean 1e3", (16, 256), f32, {"mean", "pow2"}, offset=1e3),
        case("mean 1e4, odd M", (9, 512), f32, {"mean", "pow2"}, offset=1e4),
        case("float16", (32, 256), f16, {"half", "pow2"}),
        case("bfloat16, float32 weight", (32, 256), bf16, {"half", "bf16", "pow2"},
             param_dtype=f32),
    ]
    if runtime.on_gpu():
        cases += [
            case("large M", (8192, 1024), bf16, {"half", "bf16", "pow2"}),
            case("long rows", (512, 16384), bf16, {"half", "bf16", "long"}),
            dataclasses.replace(ROWS_LEFT_OVER, eps=EPS),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    x = case.make_input(gen)
    mean, rstd = reference.layernorm_stats(x.tensor, case.eps)  # as a forward saved them
    return {"x": x, "weight": case.make_vector(gen), "mean": guarded(mean.to(f32)),
            "rstd": guarded(rstd.to(f32)), "dy": dy_like(case, gen)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["weight"], t["mean"], t["rstd"], t["dy"])


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return reference.layernorm_backward_from_stats(t["x"], t["weight"], t["mean"], t["rstd"],
                                                   t["dy"])


def _dtypes(case: Case) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    return (case.dtype, case.weight_dtype, case.weight_dtype)


def _x_hat(t: Tensors, *, centred: bool = True, scaled: bool = True) -> torch.Tensor:
    """(x - mean) * rstd in float64 from the saved statistics, rows flattened; without the
    mean or without rstd for the slips that leave one out."""
    n = t["x"].shape[-1]
    x = t["x"].to(F64).reshape(-1, n)
    if centred:
        x = x - t["mean"].to(F64).reshape(-1, 1)
    return x * t["rstd"].to(F64).reshape(-1, 1) if scaled else x


def dw_terms(t: Tensors) -> torch.Tensor:
    """dy * x_hat per element, rows flattened: dw is their column sum."""
    n = t["x"].shape[-1]
    return t["dy"].to(F64).reshape(-1, n) * _x_hat(t)


def db_terms(t: Tensors) -> torch.Tensor:
    """dy per element, rows flattened: db is their column sum."""
    return t["dy"].to(F64).reshape(-1, t["x"].shape[-1])


def dx_means_atol(t: Tensors) -> torch.Tensor:
    """Per element of dx: what a correct float32 kernel may get wrong in the two per-row
    means, mean(g) and mean(x_hat * g), magnified by rstd. Each is a sum of N values
    (log2(N) roundings deep when summed as a tree) divided by N, and a GPU's division is
    itself within 2 units (Triton's fast division): a few units of the means' magnitudes.
    rstd magnifies them: on a row of one value (N = 1) or a constant row, the variance is 0,
    rstd = 1 / sqrt(eps) (316 for eps = 1e-5), and dx should be exactly 0."""
    n = t["x"].shape[-1]
    x_hat = _x_hat(t)
    g = t["dy"].to(F64).reshape(-1, n) * t["weight"].to(F64)
    units = 4.0 * (math.log2(n) + 2.0) * _F32_UNIT
    size = g.abs().mean(dim=-1, keepdim=True) + \
        x_hat.abs() * (x_hat * g).abs().mean(dim=-1, keepdim=True)
    return (units * t["rstd"].to(F64).reshape(-1, 1) * size).reshape(t["x"].shape)


def _extra_atol(name: str, t: Tensors, case: Case) -> torch.Tensor | None:
    if name == "dx":
        return dx_means_atol(t)
    if name == "dw":
        return dw_sum_atol(dw_terms(t))
    if name == "db":
        return dw_sum_atol(db_terms(t))
    return None


def _dx(t: Tensors, case: Case, *, mean_g: bool = True, projection: bool = True,
        centred: bool = True, over_block: bool = False, weight: bool = True) -> torch.Tensor:
    """dx with one of the usual slips: no -mean(g), no -x_hat * c, x_hat without the mean,
    both means over the padded block (BLOCK_N lanes, not N), g = dy without the weight."""
    shape = t["x"].shape
    x_hat = _x_hat(t, centred=centred)
    g = t["dy"].to(F64).reshape(-1, shape[-1])
    if weight:
        g = g * t["weight"].to(F64)
    count = padded_block(shape[-1]) if over_block else shape[-1]
    inner = g
    if mean_g:
        inner = inner - g.sum(dim=-1, keepdim=True) / count
    if projection:
        inner = inner - x_hat * (x_hat * g).sum(dim=-1, keepdim=True) / count
    return (t["rstd"].to(F64).reshape(-1, 1) * inner).reshape(shape)


DX_SUSPECTS = (
    Suspect("dx_is_dy", "dx",
            "dx is dy unchanged. The gradient goes through the normalisation: with "
            "x_hat = (x - mean) * rstd and g = weight * dy, "
            "dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)) per row.",
            expected=lambda t, c: t["dy"].to(F64)),
    Suspect("dx_without_mean_g", "dx",
            "dx misses -mean(g), the term LayerNorm adds to RMSNorm's: every x_j also moves "
            "the row's mean, which shifts every x - mean by the same amount. "
            "dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)), with g = weight * dy and "
            "mean(g) = sum(g) / N over the row.",
            expected=lambda t, c: _dx(t, c, mean_g=False)),
    Suspect("dx_without_projection", "dx",
            "dx misses -x_hat * mean(x_hat * g), the term that flows through rstd: every x_j "
            "changes the row's variance, which rescales all of x_hat. "
            "dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)).",
            expected=lambda t, c: _dx(t, c, projection=False)),
    Suspect("dx_means_over_block", "dx",
            "dx is right where N is a power of two and wrong elsewhere: mean(g) and "
            "mean(x_hat * g) are divided by BLOCK_N, the padded block, where the row's N "
            "elements belong. The lanes past N add 0 to both sums, but they must not count: "
            "divide by n_cols.", expected=lambda t, c: _dx(t, c, over_block=True)),
    Suspect("dx_x_hat_not_centred", "dx",
            "dx uses x * rstd where x_hat = (x - mean) * rstd belongs: subtract the saved "
            "mean before multiplying by rstd (load it, mean_ptr + row).",
            expected=lambda t, c: _dx(t, c, centred=False)),
    Suspect("dx_without_weight", "dx",
            "dx leaves out the weight: the gradient reaching x_hat is g = weight * dy, in all "
            "three places it appears, dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)).",
            expected=lambda t, c: _dx(t, c, weight=False)),
    Suspect("dx_wrong_sign", "dx",
            "dx has the wrong sign: dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)).",
            matches=constant_factor("dx", lambda t, c: _expected(t, c)[0], sign=-1)),
    Suspect("dx_constant_factor", "dx",
            "dx is off by a constant factor: every element is the right value times the same "
            "number (below). dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)): rstd once, "
            "and each mean a sum divided by N, nothing else.",
            matches=constant_factor("dx", lambda t, c: _expected(t, c)[0])),
)


def _terms_wrong_x(t: Tensors, *, centred: bool) -> torch.Tensor:
    n = t["x"].shape[-1]
    return t["dy"].to(F64).reshape(-1, n) * _x_hat(t, centred=centred, scaled=False)


PARAM_SUSPECTS = (
    Suspect("dw_from_x", "dw",
            "dW is summed from the un-normalised x: dw = sum over rows of dy * x_hat, with "
            "x_hat = (x - mean) * rstd, the value the weight multiplied in the forward, not "
            "x itself.", expected=lambda t, c: _terms_wrong_x(t, centred=False).sum(dim=0)),
    Suspect("dw_x_hat_not_centred", "dw",
            "dW is summed from x * rstd: x_hat = (x - mean) * rstd, the saved mean subtracted "
            "before multiplying by rstd (load it, mean_ptr + row), so dw = sum over rows of "
            "dy * x_hat.", expected=lambda t, c: (db_terms(t) * _x_hat(t, centred=False)
                                                  ).sum(dim=0)),
    Suspect("dw_from_centred_x", "dw",
            "dW is summed from x - mean without rstd: the weight multiplied "
            "x_hat = (x - mean) * rstd in the forward, so dw = sum over rows of dy * x_hat.",
            expected=lambda t, c: _terms_wrong_x(t, centred=True).sum(dim=0)),
    Suspect("dw_holds_db", "dw",
            "dw holds dB's sums (the sum of dy): the two partial rows, or the two outputs, "
            "are swapped. dw = sum over rows of dy * x_hat; db = sum over rows of dy.",
            expected=lambda t, c: db_terms(t).sum(dim=0)),
    *sum_suspects("dw", lambda t, c: dw_terms(t), what="dy * x_hat",
                  zero_acc="dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)",
                  workspace="workspace"),
    Suspect("db_sum_of_g", "db",
            "db sums g = weight * dy: the bias is added to y after the weight, so its "
            "gradient is the sum of dy alone, db = sum over rows of dy.",
            expected=lambda t, c: (db_terms(t) * t["weight"].to(F64)).sum(dim=0)),
    Suspect("db_holds_dw", "db",
            "db holds dW's sums (dy * x_hat): the two partial rows, or the two outputs, are "
            "swapped. db = sum over rows of dy.",
            expected=lambda t, c: dw_terms(t).sum(dim=0)),
    *sum_suspects("db", lambda t, c: db_terms(t), what="dy",
                  zero_acc="db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)",
                  workspace="workspace"),
)

LAYERNORM_BACKWARD = Exercise(
    name="layernorm_backward",
    signature="layernorm_backward(x, weight, mean, rstd, dy) -> (dx, dw, db)",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("dx", "dw", "db"),
    max_launches=3,
    atomics_allowed=False,
    dtypes=_dtypes,
    extra_atol=_extra_atol,
    suspects=DX_SUSPECTS + PARAM_SUSPECTS,
    dtype_reasons={"dx": "x's dtype: compute in float32, store in x's dtype",
                   "dw": "the weight's dtype: accumulate in float32, store in weight.dtype",
                   "db": "the weight's dtype (the bias has the weight's): accumulate in "
                         "float32, store in weight.dtype"},
    advice={
        "input_written:dy": (
            "Your kernel writes dX over dY (into dy's memory): the caller still owns dy. "
            "Allocate dx = torch.empty_like(x) and store dx there."),
        "input_written:mean": ("Your kernel writes into mean: it is the forward's saved "
                               "statistic, an input here. Only read it."),
        "input_written:rstd": ("Your kernel writes into rstd: it is the forward's saved "
                               "statistic, an input here. Only read it."),
        "extra_launches": (
            "This exercise allows three launches: kernel 1 computes dx and each program's "
            "two float32 partial rows (dW's and dB's); kernel 2 adds partial rows up, "
            "launched once for dW and once for dB (or once for both)."),
        "torch_ops": (
            "Your wrapper computes with PyTorch (a partials.sum(0) for dW or dB counts too). "
            "Only allocation, views and your kernel launches belong in the wrapper: reduce "
            "the partial sums in a second kernel."),
        "output_not_from_kernel": (
            "A tensor you return was never passed to a kernel, so no kernel computed it. "
            "Allocate dx, dw and db, pass them to your kernels, and return them."),
        "mean": (
            "Only rows with a large mean (or of one element, equal to their mean) fail: "
            "x - mean loses its digits. With a mean of 1e4 "
            "and a spread of 1, x * rstd and mean * rstd are each near 1e4 * rstd and rounded "
            "there: their difference keeps three digits or so. Subtract first, "
            "x_hat = (x - mean) * rstd: two neighbouring float32 values subtract exactly."),
        "strided": STRIDED_ADVICE,
        **BLOCK_BOUNDS_ADVICE,
    },
)


@learner_facing
def layernorm_backward(fn: Callable, *, seed: int | None = None, quiet: bool = False,
                       only: str | tuple[str, ...] | None = None) -> Report:
    """Check a learner's `layernorm_backward(x, weight, mean, rstd, dy) -> (dx, dw, db)`
    against `course.reference.layernorm_backward_from_stats`; raise AssertionError with
    advice on failure. `only="dx"`, `only="dw"` or `only="db"` grades that output alone."""
    return check_and_raise(graded_part(LAYERNORM_BACKWARD, only), fn, seed=seed, quiet=quiet)


@learner_facing
def layernorm_backward_bandwidth(fn: Callable, *, target: float = 0.6,
                                 shape: tuple[int, int] = (16384, 4096),
                                 dtype: torch.dtype | None = None, retries: int = 3,
                                 on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check dx, dw and db at `shape`, then require `target` of the copy
    bandwidth. Ideal bytes (`course.traffic.ideal_backward_bytes(..., with_bias=True)`): x,
    dy and the weight read once, dx, dw and db written once; the statistics and the partial
    sums are overheads a kernel pays for."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"layernorm_backward {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args():
        x = torch.randn(shape, dtype=dtype, device=runtime.DEVICE)
        w = torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5
        x32 = x.float()
        mean = x32.mean(-1)
        rstd = torch.rsqrt((x32 - mean[:, None]).square().mean(-1) + EPS)
        return x, w, mean, rstd, torch.randn(shape, dtype=dtype, device=runtime.DEVICE)

    def extra(x, w, mean, rstd, dy):
        t = {"x": x, "weight": w, "mean": mean, "rstd": rstd, "dy": dy}
        return dx_means_atol(t), dw_sum_atol(dw_terms(t)), dw_sum_atol(db_terms(t))

    spec = CallSpec(LAYERNORM_BACKWARD.output_names,
                    reference.layernorm_backward_from_stats, (dtype, dtype, dtype),
                    extra_atol=extra, max_launches=LAYERNORM_BACKWARD.max_launches,
                    arg_names=("x", "weight", "mean", "rstd", "dy"))
    nbytes = traffic.ideal_backward_bytes(m, n, dtype, with_bias=True)
    return check_bandwidth(label, fn, make_args, nbytes, spec=spec, target=target,
                           retries=retries, on_cpu=on_cpu,
                           advice="Kernel 1 should read x and dy once and keep both partial "
                           "sums (dW's and dB's) in registers over its rows; give each "
                           "program enough rows that the float32 partials stay small (your "
                           "split_programs rule). Kernel 2: many narrow column strips, each "
                           "loading all P partial rows at once.")
