"""A correct LayerNorm forward (chapter 06) and the bugs a learner writes.

Every wrapper has the exercise's signature: layernorm(x, weight, bias, eps=1e-5) -> y.
"""

from __future__ import annotations

import course  # noqa: F401  (sets the execution mode before any kernel is defined)

import torch
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                     BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr, BIAS: tl.constexpr,
                     UNBIASED: tl.constexpr, CENTRE: tl.constexpr, MEAN_BY_BLOCK: tl.constexpr,
                     VAR_BY_BLOCK: tl.constexpr, EPS_OUTSIDE: tl.constexpr,
                     Y_CENTRED: tl.constexpr, VAR_CENTRED: tl.constexpr,
                     WEIGHT: tl.constexpr, PARAMS_ROW_OFFSET: tl.constexpr,
                     X_FILL: tl.constexpr, BIAS_FIRST: tl.constexpr, RSTD: tl.constexpr,
                     BIAS_SUBTRACTED: tl.constexpr = False, MEAN_ADDED: tl.constexpr = 0,
                     VAR_SUMMED: tl.constexpr = False, WEIGHT_FIRST: tl.constexpr = 0,
                     NOT_SQUARED: tl.constexpr = False):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=X_FILL).to(tl.float32)
    # A row offset on the weight and the bias: every row but the first reads past their end.
    param = row * stride_x_row + cols if PARAMS_ROW_OFFSET else cols
    w = tl.load(w_ptr + param, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_FIRST == 1:  # x * weight normalised: the weight applied before the statistics
        x = x * w
    mean = tl.sum(x, axis=0) / (BLOCK_N if MEAN_BY_BLOCK else n_cols)
    if not CENTRE:
        mean = 0.0
    if MEAN_ADDED == 1:  # x + mean, in the variance and in y
        mean = -mean
    if ONE_PASS:
        # E[x^2] - E[x]^2: one pass over the data, and catastrophic cancellation.
        var = tl.sum(x * x, axis=0) / n_cols - mean * mean
        centred = tl.where(mask, x - mean, 0.0)
    else:
        # The row is in registers: centre it, then sum the squared deviations.
        centred = tl.where(mask, x - mean, 0.0)
        divisor = n_cols - 1 if UNBIASED else (BLOCK_N if VAR_BY_BLOCK else n_cols)
        deviation = centred if VAR_CENTRED else x
        # NOT_SQUARED: the deviations summed as they are, not squared: a variance of about 0.
        var = tl.sum(deviation if NOT_SQUARED else deviation * deviation, axis=0)
        if not VAR_SUMMED:  # the sum of squared deviations, never divided by N
            var = var / divisor
        if not Y_CENTRED:
            centred = x
        if MEAN_ADDED == 2:  # x + mean in y only
            centred = tl.where(mask, x + mean, 0.0)
        if WEIGHT_FIRST == 2:  # y from x * weight - mean: the weight applied before centring
            centred = tl.where(mask, x * w - mean, 0.0)
    rstd = 1.0 / (tl.sqrt(var) + eps) if EPS_OUTSIDE else 1.0 / tl.sqrt(var + eps)
    if RSTD == 1:    # the square root left out
        rstd = 1.0 / (var + eps)
    elif RSTD == 2:  # the standard deviation, multiplied by instead of divided by
        rstd = tl.sqrt(var + eps)
    elif RSTD == 3:  # eps added after the division: 1 / sqrt(var) + eps
        rstd = 1.0 / tl.sqrt(var) + eps
    elif RSTD == 4:  # no eps at all
        rstd = 1.0 / tl.sqrt(var)
    y = centred * rstd
    if BIAS and BIAS_FIRST:  # ((x - mean) * rstd + bias) * weight: the weight scales the bias
        y += tl.load(b_ptr + param, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT and WEIGHT_FIRST == 0:
        y *= w
    if BIAS and not BIAS_FIRST:
        b = tl.load(b_ptr + param, mask=mask, other=0.0).to(tl.float32)
        y = y - b if BIAS_SUBTRACTED else y + b
    tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x, weight, bias, eps, *, one_pass=False, bias_added=True, unbiased=False,
            centre=True, mean_by_block=False, var_by_block=False, eps_outside=False,
            y_centred=True, var_centred=True, weight_applied=True, params_row_offset=False,
            swapped=False, x_fill=0.0, bias_first=False, rstd=0, **flags):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = x2.shape[1]
    block = triton.next_power_of_2(n)
    if swapped:
        weight, bias = bias, weight
    layernorm_kernel[(x2.shape[0],)](x2, weight, bias, y, x2.stride(0), y.stride(0), n, eps,
                                     BLOCK_N=block, ONE_PASS=one_pass, BIAS=bias_added,
                                     UNBIASED=unbiased, CENTRE=centre,
                                     MEAN_BY_BLOCK=mean_by_block, VAR_BY_BLOCK=var_by_block,
                                     EPS_OUTSIDE=eps_outside, Y_CENTRED=y_centred,
                                     VAR_CENTRED=var_centred, WEIGHT=weight_applied,
                                     PARAMS_ROW_OFFSET=params_row_offset,
                                     X_FILL=x_fill, BIAS_FIRST=bias_first, RSTD=rstd,
                                     **flags,
                                     num_warps=min(16, max(4, block // 512)))
    return y.view(x.shape)


def correct(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps)


def one_pass(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, one_pass=True)


def missing_bias(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, bias_added=False)


def unbiased_variance(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, unbiased=True)


def mean_not_subtracted(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, centre=False)


def mean_by_block(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, mean_by_block=True)


def variance_by_block(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, var_by_block=True)


def both_by_block(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, mean_by_block=True, var_by_block=True)


def eps_outside_sqrt(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, eps_outside=True)


def centred_in_variance_only(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, y_centred=False)


def centred_in_output_only(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, var_centred=False)


def weight_not_applied(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, weight_applied=False)


def weight_and_bias_swapped(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, swapped=True)


def parameters_row_offset(x, weight, bias, eps=1e-5):
    """The weight and bias loaded at x's row offset: row r reads r row strides past their
    start, far past their end for the many-row cases. On a GPU that is an illegal memory
    access, after which the process's CUDA context is unusable: not in BROKEN, which the
    GPU suite runs (as add_rmsnorm_variants.weight_row_offset)."""
    return _launch(x, weight, bias, eps, params_row_offset=True)


def padding_of_ones(x, weight, bias, eps=1e-5):
    # x loaded with other=1.0: the BLOCK_N - N padding lanes add 1 each to sum(x).
    return _launch(x, weight, bias, eps, x_fill=1.0)


def bias_before_weight(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, bias_first=True)


def sqrt_missing(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, rstd=1)


def times_std(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, rstd=2)


def eps_after_rstd(x, weight, bias, eps=1e-5):
    # rstd = 1.0 / tl.sqrt(var) + eps: eps added to the reciprocal, not under the root.
    return _launch(x, weight, bias, eps, rstd=3)


def no_eps(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, rstd=4)


def bias_subtracted(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, BIAS_SUBTRACTED=True)


def mean_added(x, weight, bias, eps=1e-5):
    # centred = x + mean, in the variance and in y.
    return _launch(x, weight, bias, eps, MEAN_ADDED=1)


def mean_added_in_output(x, weight, bias, eps=1e-5):
    # The variance from x - mean, but y from x + mean.
    return _launch(x, weight, bias, eps, MEAN_ADDED=2)


def variance_not_divided(x, weight, bias, eps=1e-5):
    return _launch(x, weight, bias, eps, VAR_SUMMED=True)


def weight_before_statistics(x, weight, bias, eps=1e-5):
    # x * weight normalised, then the bias: the weight enters the mean and the variance.
    return _launch(x, weight, bias, eps, WEIGHT_FIRST=1)


def weight_before_centring(x, weight, bias, eps=1e-5):
    # The statistics from x, but y = (x * weight - mean) * rstd + bias.
    return _launch(x, weight, bias, eps, WEIGHT_FIRST=2)


def deviations_not_squared(x, weight, bias, eps=1e-5):
    # var = tl.sum(centred, axis=0) / n_cols: the deviations sum to about 0.
    return _launch(x, weight, bias, eps, NOT_SQUARED=True)


# name -> (function, a phrase its failure message must contain)
BROKEN = {
    "one_pass": (one_pass, "catastrophic cancellation"),
    "missing_bias": (missing_bias, "y lacks the bias"),
    "unbiased_variance": (unbiased_variance, "divided by N"),
    "mean_not_subtracted": (mean_not_subtracted, "the mean is never subtracted"),
    "mean_by_block": (mean_by_block, "the mean divided by"),
    "variance_by_block": (variance_by_block, "the variance divided by"),
    "both_by_block": (both_by_block, "the mean and variance both divided by"),
    "eps_outside_sqrt": (eps_outside_sqrt, "eps is added outside the square root"),
    "centred_in_variance_only": (centred_in_variance_only, "subtracted in the variance but not"),
    "centred_in_output_only": (centred_in_output_only, "subtracted in y but not"),
    "weight_not_applied": (weight_not_applied, "y lacks the weight"),
    "weight_and_bias_swapped": (weight_and_bias_swapped, "weight and the bias are swapped"),
    "padding_of_ones": (padding_of_ones, "Load x with other=0.0"),
    "bias_before_weight": (bias_before_weight, "bias is added before the weight multiply"),
    "sqrt_missing": (sqrt_missing, "the square root is missing"),
    "times_std": (times_std, "multiplied by, not divided by"),
    "eps_after_rstd": (eps_after_rstd, "eps is added after taking 1 / sqrt(var)"),
    "no_eps": (no_eps, "eps is missing from the square root"),
    "bias_subtracted": (bias_subtracted, "The bias is subtracted"),
    "mean_added": (mean_added, "x + mean gives, in the variance and in y"),
    "mean_added_in_output": (mean_added_in_output, "x + mean gives, in y (the variance"),
    "variance_not_divided": (variance_not_divided, "sum of squared deviations, not their mean"),
    "weight_before_statistics": (weight_before_statistics,
                                 "x * weight normalised, the weight in the mean"),
    "weight_before_centring": (weight_before_centring, "(x * weight - mean) * rstd + bias"),
    "deviations_not_squared": (deviations_not_squared, "The variance comes out about 0"),
}
