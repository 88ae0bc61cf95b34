"""Checkers for chapter 06's exercise: the LayerNorm forward kernel.

The learner writes `layernorm(x, weight, bias, eps=1e-5) -> y`, one launch:
y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension, with the biased
variance (divided by N, as torch.nn.functional.layer_norm). Besides the usual cases, rows
with a mean of 1e3 to 1e4 and a spread of 1 expose a one-pass kernel that computes the
variance as E[x^2] - E[x]^2: in float32 that difference cancels catastrophically.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from course import reference, runtime, traffic
from course.check.bandwidth import BandwidthResult, CallSpec, check_bandwidth
from course.check.cases import Case, row_shape_cases
from course.check.compare import compare
from course.check.inputs import GUARD_VALUE, guard_margin
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import CaseResult, Exercise, Inputs, Suspect, Tensors

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
EPS = 1e-5
_F32_UNIT = 2.0 ** -24  # float32 rounding: half an ulp, relative


def _cases() -> tuple[Case, ...]:
    def case(name, shape, dtype, tags, **kw):
        return Case(name, shape, dtype, frozenset(tags), eps=kw.pop("eps", EPS), **kw)

    cases = [
        *row_shape_cases(EPS),
        case("3-D input", (2, 3, 64), f32, {"nd", "pow2"}),
        case("rows of zeros", (6, 64), f32, {"zeros", "pow2"}, zero_rows=(1, 4)),
        case("custom eps", (4, 64), f32, {"eps", "pow2"}, scale=0.05, eps=0.01),
        # Mean >> spread: E[x^2] - E[x]^2 cancels. Power-of-two N, so that a kernel failing
        # only these is not mistaken for one missing a mask.
        case("mean 1e3", (8, 512), f32, {"mean", "pow2"}, offset=1e3),
        case("mean 1e4", (8, 256), f32, {"mean", "pow2"}, offset=1e4),
        case("float16", (8, 256), f16, {"half", "pow2"}),
        case("float16, odd N", (9, 300), f16, {"half", "odd_n"}),
        case("bfloat16, long rows", (4, 4096), bf16, {"half", "bf16", "long"},
             offset=1.0, scale=0.5),
    ]
    if runtime.on_gpu():
        cases += [
            case("mean 1e4, long rows", (64, 8192), f32, {"mean", "pow2"}, offset=1e4),
            case("bfloat16, very long rows", (32, 65536), bf16, {"half", "bf16", "long"},
                 offset=1.0, scale=0.5),
            case("large M", (4099, 1024), bf16, {"half", "bf16", "pow2"}),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    return {"x": case.make_input(gen), "weight": case.make_vector(gen),
            "bias": case.make_vector(gen, low=-1.0, high=1.0)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["weight"], t["bias"], eps=case.eps)


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor]:
    return (reference.layernorm(t["x"], t["weight"], t["bias"], eps=case.eps),)


def mean_error_atol(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """What a correct float32 kernel may get wrong on rows whose mean dwarfs their spread.

    No float32 kernel holds the mean more precisely than a few units in its last place, and
    summing N values to get it costs about log2(N) more. An error d in the mean shifts
    every x - mean by d, so y by d * rstd * weight. Per element: a bound on that.
    """
    n = x.shape[-1]
    mean, rstd = reference.layernorm_stats(x, eps)
    units = 4.0 * (math.log2(n) + 2.0)
    return (units * _F32_UNIT * (mean.abs() * rstd).unsqueeze(-1)
            * weight.to(torch.float64).abs())


def _extra_atol(name: str, t: Tensors, case: Case) -> torch.Tensor | None:
    if "mean" not in case.tags:
        return None
    return mean_error_atol(t["x"], t["weight"], case.eps)


def _unbiased(t: Tensors, case: Case) -> torch.Tensor | None:
    return None if case.n < 2 else _statistics_divided_by(t, case, case.n, case.n - 1)


def _no_mean(t: Tensors, case: Case) -> torch.Tensor:
    return reference.rmsnorm(t["x"], t["weight"], eps=case.eps) + t["bias"].to(torch.float64)


def _padded(t: Tensors, case: Case, fill: float, in_variance: bool) -> torch.Tensor | None:
    """y from a kernel whose whole row is one block of BLOCK_N = next_power_of_2(N) lanes,
    with x loaded as `fill` past the end of the row: the BLOCK_N - N padding lanes add
    `fill` each to the row's sum (so to the mean), and, `in_variance`, (fill - mean)^2 each
    to the sum of squares (x - mean left unmasked). None where N is a power of two (no
    padding, so no such error)."""
    n = case.n
    padding = (1 << (n - 1).bit_length()) - n
    if padding == 0:
        return None
    x64 = t["x"].to(torch.float64)
    mean = (x64.sum(dim=-1, keepdim=True) + padding * fill) / n
    squares = (x64 - mean).square().sum(dim=-1, keepdim=True)
    if in_variance:
        squares = squares + padding * (fill - mean).square()
    rstd = torch.rsqrt(squares / n + case.eps)
    return ((x64 - mean) * rstd * t["weight"].to(torch.float64)
            + t["bias"].to(torch.float64))


def _padding_in_variance(t: Tensors, case: Case) -> torch.Tensor | None:
    """y with the padding loaded as 0 but an unmasked x - mean: each of the BLOCK_N - N
    padding lanes then holds -mean and adds mean^2 to the sum of squares."""
    return _padded(t, case, 0.0, in_variance=True)


def _padding_of_ones(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is what x loaded with other=1.0 gives (one block a row), with the
    centred values masked or not; only where the ones change the answer beyond the
    tolerance."""
    padding = (1 << (case.n - 1).bit_length()) - case.n
    right = _padded(t, case, 0.0, in_variance=False)
    for in_variance, where in ((False, "the mean"), (True, "the mean and the variance")):
        want = _padded(t, case, 1.0, in_variance)
        if want is None or compare("y", want.to(got.dtype), right, got.dtype) is None:
            continue
        if compare("y", got, want, got.dtype) is None:
            return (f"y is what {padding} ones past N = {case.n} in each row's block of "
                    f"{case.n + padding} give, counted in {where}")
    return None


def _bias_before_weight(t: Tensors, case: Case) -> torch.Tensor:
    """y with the bias added before the weight multiply: ((x - mean) * rstd + bias) * weight."""
    y = ((_normalised(t, case) + t["bias"].to(torch.float64).reshape(-1))
         * t["weight"].to(torch.float64).reshape(-1))
    return y.reshape(t["x"].shape)


def _statistics_divided_by(t: Tensors, case: Case, mean_by: int, var_by: int,
                           eps_inside: bool = True) -> torch.Tensor:
    """y with the row's sum divided by `mean_by` for the mean, the centred squares' sum by
    `var_by` for the variance, and eps inside the square root or outside it."""
    x64 = t["x"].to(torch.float64)
    centred = x64 - x64.sum(dim=-1, keepdim=True) / mean_by
    var = centred.square().sum(dim=-1, keepdim=True) / var_by
    scale = torch.rsqrt(var + case.eps) if eps_inside else 1.0 / (var.sqrt() + case.eps)
    return centred * scale * t["weight"].to(torch.float64) + t["bias"].to(torch.float64)


def _divided_by_block(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """Which statistic was divided by BLOCK_N = next_power_of_2(N) instead of N, when y is
    that; None otherwise, and where N is a power of two (the block is then the row)."""
    n, block = case.n, 1 << (case.n - 1).bit_length()
    if block == n:
        return None
    for what, mean_by, var_by in (("the mean and variance both", block, block),
                                  ("the mean", block, n), ("the variance", n, block)):
        want = _statistics_divided_by(t, case, mean_by, var_by)
        if compare("y", got, want, got.dtype) is None:
            return f"{what} divided by {block} (BLOCK_N), not by N = {n}"
    return None


def _centred_once(t: Tensors, case: Case, in_variance: bool) -> torch.Tensor:
    """y with the mean subtracted in the variance only (y from x itself), or in y only (the
    variance from the raw squares, mean(x^2))."""
    x64 = t["x"].to(torch.float64)
    centred = x64 - x64.mean(dim=-1, keepdim=True)
    var = (centred if in_variance else x64).square().mean(dim=-1, keepdim=True)
    y = (x64 if in_variance else centred) * torch.rsqrt(var + case.eps)
    return y * t["weight"].to(torch.float64) + t["bias"].to(torch.float64)


def _eps_outside_sqrt(t: Tensors, case: Case) -> torch.Tensor:
    return _statistics_divided_by(t, case, case.n, case.n, eps_inside=False)


def _rstd_misshapen(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is (x - mean) times (var + eps) to a power other than -1/2, * weight
    + bias: the square root left out (1 / (var + eps)), or the standard deviation multiplied
    by instead of divided by (sqrt(var + eps))."""
    x64 = t["x"].to(torch.float64)
    centred = x64 - x64.mean(dim=-1, keepdim=True)
    var_eps = centred.square().mean(dim=-1, keepdim=True) + case.eps
    w, b = t["weight"].to(torch.float64), t["bias"].to(torch.float64)
    for scale, what in ((1.0 / var_eps, "1 / (var + eps): the square root is missing"),
                        (var_eps.sqrt(), "sqrt(var + eps): multiplied by, not divided by")):
        if compare("y", got, centred * scale * w + b, got.dtype) is None:
            return f"y is (x - mean) * {what}"
    return None


def _row_statistics(t: Tensors, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """x - mean and the biased variance in float64, rows flattened: (M, N) and (M, 1)."""
    x64 = t["x"].to(torch.float64).reshape(-1, case.n)
    centred = x64 - x64.mean(dim=-1, keepdim=True)
    return centred, centred.square().mean(dim=-1, keepdim=True)


_NOT_WITHOUT_EPS = "not y without eps"


def _eps_after_rstd(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is (x - mean) * (1 / sqrt(var) + eps) * weight + bias: eps added after
    the division, not under the root. Rows of variance 0 then come out NaN (or inf), as
    without eps at all, since 1 / sqrt(0) is inf; other rows differ from no eps at all by
    eps * (x - mean) * weight, which only a larger eps shows: the detail says where it does
    (_NOT_WITHOUT_EPS), and the suspect's `across` asks for one such case, so that a kernel
    with no eps at all keeps its own advice."""
    centred, var = _row_statistics(t, case)
    flat = got.reshape(-1, case.n)
    zero = (var == 0).reshape(-1)
    if bool(torch.isfinite(flat[zero]).any()):
        return None
    nan_rows = ", and rows whose variance is 0 come out NaN (1 / sqrt(0) is inf)"
    rows = ~zero
    if not bool(rows.any()):
        return "rows whose variance is 0 come out NaN: 1 / sqrt(0) is inf, before eps is added"
    w, b = t["weight"].to(torch.float64), t["bias"].to(torch.float64)
    root = var[rows].sqrt()
    if compare("y", flat[rows], (centred[rows] / root + case.eps * centred[rows]) * w + b,
               got.dtype) is not None:
        return None
    detail = "y is (x - mean) * (1 / sqrt(var) + eps) * weight + bias"
    if compare("y", flat[rows], centred[rows] / root * w + b, got.dtype) is not None:
        detail += f" with eps = {case.eps:g}, {_NOT_WITHOUT_EPS}"
    return detail + (nan_rows if bool(zero.any()) else "")


def _eps_after_rstd_shown(results: Sequence[CaseResult]) -> bool:
    """Whether some case tells eps added after 1 / sqrt(var) from no eps at all."""
    return any(name == "eps_after_rstd" and _NOT_WITHOUT_EPS in detail
               for r in results for name, detail in r.hints)


def _bias_subtracted(t: Tensors, case: Case) -> torch.Tensor:
    """y with the bias subtracted: (x - mean) * rstd * weight - bias."""
    return (reference.layernorm(t["x"], t["weight"], t["bias"], eps=case.eps)
            - 2.0 * t["bias"].to(torch.float64))


def _mean_added(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is what x + mean in place of x - mean gives: in the variance and in
    y, or in y only (the variance right)."""
    x64 = t["x"].to(torch.float64).reshape(-1, case.n)
    plus = x64 + x64.mean(dim=-1, keepdim=True)
    _, var = _row_statistics(t, case)
    w, b = t["weight"].to(torch.float64), t["bias"].to(torch.float64)
    flat = got.reshape(-1, case.n)
    for var_of, where in ((plus.square().mean(dim=-1, keepdim=True), "in the variance and in y"),
                          (var, "in y (the variance uses x - mean)")):
        if compare("y", flat, plus * torch.rsqrt(var_of + case.eps) * w + b, got.dtype) is None:
            return f"y is what x + mean gives, {where}"
    return None


def _variance_not_divided(t: Tensors, case: Case) -> torch.Tensor | None:
    """y with the sum of squared deviations as the variance, never divided by N; None where
    N = 1 (the sum is then the mean)."""
    return None if case.n < 2 else _statistics_divided_by(t, case, case.n, 1)


def _weight_before_centring(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is what the weight applied to x before it is centred gives: x * weight
    normalised (the weight in the mean and the variance), then the bias; or the statistics
    from x but y = (x * weight - mean) * rstd + bias."""
    x64 = t["x"].to(torch.float64).reshape(-1, case.n)
    w, b = t["weight"].to(torch.float64), t["bias"].to(torch.float64)
    xw = x64 * w
    centred_xw = xw - xw.mean(dim=-1, keepdim=True)
    var_xw = centred_xw.square().mean(dim=-1, keepdim=True)
    _, var = _row_statistics(t, case)
    mean = x64.mean(dim=-1, keepdim=True)
    flat = got.reshape(-1, case.n)
    for want, what in (
            (centred_xw * torch.rsqrt(var_xw + case.eps) + b,
             "x * weight normalised, the weight in the mean and the variance"),
            ((xw - mean) * torch.rsqrt(var + case.eps) + b,
             "(x * weight - mean) * rstd + bias, the statistics from x")):
        if compare("y", flat, want, got.dtype) is None:
            return f"y is {what}"
    return None


def _variance_zero(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is (x - mean) * rstd * weight + bias with a variance of about 0 in
    each row: rstd = 1 / sqrt(v + eps) with |v| under a tenth of eps. The deviations summed
    without squaring them (or their sum squared) cancel to rounding noise, not to 0 exactly,
    so each row's scale is fitted and must lie that close to 1 / sqrt(eps). Rows of
    variance 0 are left out (y is the bias there either way)."""
    centred, var = _row_statistics(t, case)
    w, b = t["weight"].to(torch.float64), t["bias"].to(torch.float64)
    rows = (var > 0).reshape(-1)
    if not bool(rows.any()):
        return None
    flat = got.reshape(-1, case.n)[rows]
    scaled = centred[rows] * w
    shifted = flat.to(torch.float64) - b
    scale = (shifted * scaled).sum(dim=-1, keepdim=True) / scaled.square().sum(
        dim=-1, keepdim=True)
    v = 1.0 / scale.square() - case.eps  # the variance each row's scale implies
    if not bool((scale > 0).all() and (v.abs() <= 0.1 * case.eps).all()):
        return None
    if compare("y", flat, scaled * scale + b, got.dtype) is not None:
        return None
    return f"each row is scaled by 1 / sqrt(var + eps) with |var| under {0.1 * case.eps:g}"


def _normalised(t: Tensors, case: Case) -> torch.Tensor:
    """(x - mean) * rstd in float64, rows flattened."""
    x = t["x"].to(torch.float64).reshape(-1, case.n)
    mean, rstd = reference.layernorm_stats(x, case.eps)
    return (x - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)


def _swapped_parameters(t: Tensors, case: Case) -> torch.Tensor:
    """y with the weight and the bias swapped: (x - mean) * rstd * bias + weight."""
    y = (_normalised(t, case) * t["bias"].to(torch.float64).reshape(-1)
         + t["weight"].to(torch.float64).reshape(-1))
    return y.reshape(t["x"].shape)


def _parameter_row_offset(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is what a weight (or bias, or both) loaded at ptr + row * stride +
    cols gives: row r uses the memory r * stride entries past the vector's start, which past
    its end is the checker's guard value, as far as the margin goes; rows that read beyond
    it read memory nobody knows, and are left out (as rmsnorm's weight_row_offset)."""
    n = case.n
    normalised = _normalised(t, case)
    guard = torch.full((guard_margin(n),), GUARD_VALUE, dtype=torch.float64,
                       device=normalised.device)
    vectors = {k: t[k].to(torch.float64).reshape(-1) for k in ("weight", "bias")}
    memory = {k: torch.cat([v, guard]) for k, v in vectors.items()}
    y = got.reshape(-1, n)
    for stride in dict.fromkeys((n + case.row_padding, n)):  # x's row stride, or N
        rows = [r for r in range(normalised.shape[0]) if r * stride + n <= guard.numel() + n]
        if len(rows) < 2:
            continue
        shifted = {k: torch.stack([m[r * stride:r * stride + n] for r in rows])
                   for k, m in memory.items()}
        for offset in (("weight",), ("bias",), ("weight", "bias")):
            w, b = (shifted[k] if k in offset else vectors[k] for k in ("weight", "bias"))
            want = normalised[rows] * w + b
            if compare("y", y[rows], want, got.dtype) is None:
                which = " and the ".join(offset)
                return (f"the {which} loaded with a row offset: row 1 of y uses the "
                        f"{GUARD_VALUE:g}s the checker keeps past the end of the {which}")
    return None


SUSPECTS = (
    Suspect("divided_by_block", "y",
            "A statistic is divided by BLOCK_N, the padded block size, instead of N: rows "
            "whose length is a power of two pass, the others fail. The masked lanes add zeros "
            "to the sums but are not elements of the row: divide the sum of x and the sum of "
            "squared deviations by n_cols.", matches=_divided_by_block),
    Suspect("eps_outside_sqrt", "y",
            "eps is added outside the square root: you divide by sqrt(var) + eps. LayerNorm "
            "adds it inside, rstd = 1 / sqrt(var + eps). With the default eps the two barely "
            "differ, so only a case with a larger eps shows it.", expected=_eps_outside_sqrt),
    # Before the unbiased variance: on rows of small mean both nudge the variance up a
    # little, and this one is the pattern that matches every padded case.
    Suspect("padding_in_variance", "y",
            "The variance counts the padding lanes. With BLOCK_N = next_power_of_2(N) > N, "
            "the masked loads give 0 past the end of the row, but x - mean there is -mean, "
            "so each of the BLOCK_N - N padding lanes adds mean^2 to the sum of squares. "
            "Mask the centred values: d = tl.where(mask, x - mean, 0.0), then sum d * d.",
            expected=_padding_in_variance),
    Suspect("padding_of_ones", "y",
            "The masked lanes' fill value enters the statistics: x is loaded with other=1.0 "
            "(or another value that is not 0), so each of the BLOCK_N - N lanes past the end "
            "of the row adds 1 to sum(x) and shifts the mean, and rows whose N is not a "
            "power of two come out wrong. The mask is right; its fill is not. Load x with "
            "other=0.0, and keep the centred values masked: tl.where(mask, x - mean, 0.0).",
            matches=_padding_of_ones),
    Suspect("weight_row_offset", "y",
            "y's first row is right, but each later row uses memory past the end of the "
            "weight or the bias: it is loaded with a row offset (weight_ptr + row * stride + "
            "cols). The weight and the bias are one row of N entries each, which every row "
            "of x shares: load them at weight_ptr + cols and bias_ptr + cols, with the row's "
            "mask, the same in every program.", matches=_parameter_row_offset),
    Suspect("eps_after_rstd", "y",
            "eps is added after taking 1 / sqrt(var): rstd = 1 / sqrt(var) + eps. eps belongs "
            "under the root, where it keeps a row of variance 0 finite; added after the "
            "division it comes too late (1 / sqrt(0) is already inf, and 0 * inf is NaN), "
            "and it shifts every other row's scale by eps. With the default eps = 1e-5 most "
            "rows barely differ; rows of variance 0 and a larger eps show it. Compute rstd = "
            "1.0 / tl.sqrt(var + eps).", matches=_eps_after_rstd, across=_eps_after_rstd_shown),
    Suspect("rstd_not_inverse_sqrt", "y",
            "rstd is not 1 / sqrt(var + eps): y is scaled by 1 / (var + eps) (the square root "
            "left out) or by sqrt(var + eps) (the standard deviation multiplied by instead of "
            "divided by). Compute rstd = 1.0 / tl.sqrt(var + eps) and multiply (x - mean) by "
            "it.", matches=_rstd_misshapen),
    Suspect("weight_not_applied", "y",
            "y lacks the weight: y = (x - mean) * rstd * weight + bias. Load the weight with "
            "the same column offsets and mask as x and multiply by it before adding the "
            "bias.", expected=lambda t, c: reference.layernorm(
                t["x"], torch.ones_like(t["weight"]), t["bias"], eps=c.eps)),
    Suspect("weight_and_bias_swapped", "y",
            "The weight and the bias are swapped: y is (x - mean) * rstd * bias + weight. "
            "The kernel takes weight_ptr before bias_ptr: pass weight, then bias, in that "
            "order, and multiply by the weight, add the bias.", expected=_swapped_parameters),
    Suspect("bias_before_weight", "y",
            "The bias is added before the weight multiply: y is ((x - mean) * rstd + bias) * "
            "weight, so the weight scales the bias too. Multiply by the weight first, then add "
            "the bias: y = (x - mean) * rstd * weight + bias.", expected=_bias_before_weight),
    Suspect("bias_subtracted", "y",
            "The bias is subtracted: y is (x - mean) * rstd * weight - bias. Add it: y = "
            "(x - mean) * rstd * weight + bias.", expected=_bias_subtracted),
    Suspect("weight_before_centring", "y",
            "The weight is applied to x before it is centred, so it mixes into the "
            "normalisation instead of scaling its result. Compute the mean and the variance "
            "of x itself, normalise, then scale and shift: y = (x - mean) * rstd * weight + "
            "bias.", matches=_weight_before_centring),
    Suspect("missing_bias", "y",
            "y lacks the bias: y = (x - mean) * rstd * weight + bias.",
            expected=lambda t, c: reference.layernorm(t["x"], t["weight"],
                                                      torch.zeros_like(t["bias"]), eps=c.eps)),
    Suspect("unbiased_variance", "y",
            "You divide the sum of squared deviations by N - 1 (the unbiased variance, "
            "torch.var's default). LayerNorm uses the biased variance, divided by N, as "
            "torch.nn.functional.layer_norm does.", expected=_unbiased),
    Suspect("variance_not_divided", "y",
            "The variance is the sum of squared deviations, not their mean: each row's rstd "
            "is sqrt(N) times too small. Divide the sum by the row's length: var = "
            "tl.sum(centred * centred, axis=0) / n_cols.", expected=_variance_not_divided),
    Suspect("variance_zero", "y",
            "The variance comes out about 0: y is (x - mean) / sqrt(eps) * weight + bias. "
            "The deviations x - mean sum to 0, so summing them without squaring each one "
            "(or squaring their sum) gives nothing. Square, then sum: var = "
            "tl.sum(centred * centred, axis=0) / n_cols.", matches=_variance_zero),
    Suspect("centred_in_variance_only", "y",
            "y is x * rstd * weight + bias: the mean is subtracted in the variance but not in "
            "y. Both use the centred row: y = (x - mean) * rstd * weight + bias.",
            expected=lambda t, c: _centred_once(t, c, in_variance=True)),
    Suspect("centred_in_output_only", "y",
            "The variance is mean(x^2), the raw squares: the mean is subtracted in y but not "
            "in the variance. Sum the squared deviations, (x - mean)^2, over the row.",
            expected=lambda t, c: _centred_once(t, c, in_variance=False)),
    Suspect("mean_added", "y",
            "The mean is added, not subtracted: the centred values are x + mean. LayerNorm "
            "centres each row, x - mean, and uses those values both in the variance and in "
            "y: centred = tl.where(mask, x - mean, 0.0), var = tl.sum(centred * centred, "
            "axis=0) / n_cols, y = centred * rstd * weight + bias.", matches=_mean_added),
    Suspect("mean_not_subtracted", "y",
            "y is x / sqrt(mean(x^2) + eps) * weight + bias: the mean is never subtracted "
            "(that is RMSNorm plus a bias). Compute mean = sum(x) / N, then use x - mean both "
            "in the variance and in the output.", expected=_no_mean),
)

LAYERNORM_FORWARD = Exercise(
    name="layernorm_forward",
    signature="layernorm(x, weight, bias, eps=1e-5) -> y",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("y",),
    max_launches=1,
    extra_atol=_extra_atol,
    suspects=SUSPECTS,
    advice={
        "input_written:x": ("Your kernel writes into `x`. Store to the output pointer (y_ptr), "
                            "never to x_ptr, the weight or the bias."),
        "zeros": ("Rows of zeros fail: their variance is 0, so y must be the bias exactly. Is "
                  "eps added inside the square root, and is every masked lane loaded as 0?"),
    },
)


@learner_facing
def layernorm_forward(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's `layernorm(x, weight, bias, eps=1e-5)` on every case; raise
    AssertionError with advice on failure, return the report (printed unless quiet)."""
    from course.check.address_pictures import check_with_pictures  # imports Triton

    return check_with_pictures(LAYERNORM_FORWARD, fn, seed=seed, quiet=quiet)


@learner_facing
def layernorm_forward_bandwidth(fn: Callable, *, target: float = 0.75,
                                shape: tuple[int, int] = (16384, 4096),
                                dtype: torch.dtype | None = None, retries: int = 3,
                                on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check the output at `shape`, require one load of each element of x (as
    rmsnorm_forward_bandwidth does), then `target` of the copy bandwidth (ideal bytes: x,
    the weight and the bias read once, y written once)."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"layernorm {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args(rows: int = m):
        return (torch.randn((rows, n), dtype=dtype, device=runtime.DEVICE),
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5,
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) - 0.5)

    spec = CallSpec(("y",), lambda x, w, b: reference.layernorm(x, w, b, eps=EPS), (dtype,),
                    max_launches=LAYERNORM_FORWARD.max_launches,
                    arg_names=("x", "weight", "bias"), read_once="x",
                    read_once_advice=ONE_READ_ADVICE, scratch_advice=SCRATCH_ADVICE)
    nbytes = traffic.layernorm(m, n, dtype, save_stats=False).bytes
    return check_bandwidth(label, fn, make_args, nbytes, spec=spec, target=target,
                           retries=retries, small_args=lambda: make_args(4),
                           on_cpu=on_cpu, advice="A fused LayerNorm reads each row once: keep "
                           "the row in registers for both statistics and the output, "
                           "BLOCK_N = next_power_of_2(N), num_warps by block size.")


ONE_READ_ADVICE = (
    "Chapter 06 asks for one read of x: load the whole row once (BLOCK_N = "
    "triton.next_power_of_2(N)) and compute the mean, the variance and y from those values, "
    "kept in registers.")

SCRATCH_ADVICE = (
    "Chapter 06 keeps the row in registers: load x once, compute the mean, the centred "
    "values, the variance and y from the values tl.load gave you (x.to(tl.float32)), and "
    "store y once; load nothing your kernel stored, in y or in a buffer of its own.")
