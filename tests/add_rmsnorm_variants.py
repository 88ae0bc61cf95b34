"""A correct fused residual add + RMSNorm (chapter 05) and the bugs a learner writes.

Every wrapper has the exercise's signature:
add_rmsnorm(x, residual, weight, eps=1e-6) -> (y, residual_out).
"""

from __future__ import annotations

import course  # noqa: F401  (sets the execution mode before any kernel is defined)

import rmsnorm_variants
import torch
import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, stride_x_row, stride_r_row,
                       stride_y_row, stride_h_row, n_cols, eps, BLOCK_N: tl.constexpr,
                       NORM_OF_X: tl.constexpr, STORE_SUM: tl.constexpr,
                       WEIGHTED: tl.constexpr, RSTD: tl.constexpr = "right",
                       WEIGHT_ROW_OFFSET: tl.constexpr = False,
                       WEIGHT_MASKED: tl.constexpr = True,
                       SUM_LOADED_BACK: tl.constexpr = False, X_FILL: tl.constexpr = 0.0):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    # X_FILL, when not 0: the bug, masked lanes of h hold it and enter the sum of squares
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=X_FILL).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r_row + cols, mask=mask, other=0.0).to(tl.float32)
    # Round the sum to the storage dtype first: y then normalises exactly what is stored.
    h = (x + r).to(h_ptr.dtype.element_ty)
    if STORE_SUM:
        tl.store(h_ptr + row * stride_h_row + cols, h, mask=mask)
    if SUM_LOADED_BACK:  # the bug: the sum it holds, loaded again from residual_out
        h = tl.load(h_ptr + row * stride_h_row + cols, mask=mask, other=0.0)
    v = x if NORM_OF_X else h.to(tl.float32)
    if RSTD == "eps outside":  # the bug: 1 / (sqrt(mean) + eps)
        rstd = 1.0 / (tl.sqrt(tl.sum(v * v, axis=0) / n_cols) + eps)
    elif RSTD == "sum":  # the bug: the sum of squares, not their mean
        rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) + eps)
    elif RSTD == "no sqrt":  # the bug: 1 / (mean + eps), the square root left out
        rstd = 1.0 / (tl.sum(v * v, axis=0) / n_cols + eps)
    elif RSTD == "times rms":  # the bug: sqrt(mean + eps), multiplied by, not divided by
        rstd = tl.sqrt(tl.sum(v * v, axis=0) / n_cols + eps)
    elif RSTD == "variance":  # the bug: LayerNorm's statistic, about the mean
        d = tl.where(mask, v - tl.sum(v, axis=0) / n_cols, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    else:
        rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / n_cols + eps)
    y = v * rstd
    if WEIGHTED:  # the bug, when not: the weight is never applied
        w_row = row * stride_x_row if WEIGHT_ROW_OFFSET else 0  # the bug: x's row offset
        if WEIGHT_MASKED:
            w = tl.load(w_ptr + w_row + cols, mask=mask, other=0.0)
        else:  # the bug: lanes past the weight's end read memory (the store leaves them out)
            w = tl.load(w_ptr + w_row + cols)
        y = y * w.to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps, *, h=None, norm_of_x=False, store_sum=True,
            residual_stride=None, weighted=True, grid=None, block=None, rstd="right",
            weight_row_offset=False, weight_masked=True, sum_loaded_back=False, x_fill=0.0):
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n), residual.reshape(-1, n)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if h is None else h
    stride_r = r2.stride(0) if residual_stride is None else residual_stride
    add_rmsnorm_kernel[grid or (x2.shape[0],)](
        x2, r2, weight, y, h, x2.stride(0), stride_r, y.stride(0), h.stride(0), n, eps,
        BLOCK_N=block or triton.next_power_of_2(n), NORM_OF_X=norm_of_x, STORE_SUM=store_sum,
        WEIGHTED=weighted, RSTD=rstd, WEIGHT_ROW_OFFSET=weight_row_offset,
        WEIGHT_MASKED=weight_masked, SUM_LOADED_BACK=sum_loaded_back, X_FILL=x_fill)
    return y.view(x.shape), h.view(x.shape)


def correct(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, eps)


def padding_of_ones(x, residual, weight, eps=1e-6):
    """x loaded with other=1.0: each lane past the end of a row adds 1 to the sum of squares."""
    return _launch(x, residual, weight, eps, x_fill=1.0)


def missing_residual_output(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, eps, store_sum=False)


def returns_input_residual(x, residual, weight, eps=1e-6):
    y, _ = _launch(x, residual, weight, eps)
    return y, residual


def residual_in_place(x, residual, weight, eps=1e-6):
    # vLLM style: the sum goes back into the residual's memory.
    y, _ = _launch(x, residual, weight, eps, h=residual.reshape(-1, x.shape[-1]))
    return y, residual


def norm_of_x(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, eps, norm_of_x=True)


def missing_eps(x, residual, weight, eps=1e-6):
    # rstd = 1 / sqrt(mean(h^2)), eps left out: a sum of zeros computes 0 / 0.
    return _launch(x, residual, weight, 0.0)


def no_weight(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, eps, weighted=False)


def eps_of_its_own(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, 1e-5)


def eps_outside_sqrt(x, residual, weight, eps=1e-6):
    # rstd = 1 / (sqrt(mean(h^2)) + eps): it had been told to pass the eps argument, which
    # it did.
    return _launch(x, residual, weight, eps, rstd="eps outside")


def sum_not_mean(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, eps, rstd="sum")


def variance_not_mean_square(x, residual, weight, eps=1e-6):
    return _launch(x, residual, weight, eps, rstd="variance")


def sqrt_missing(x, residual, weight, eps=1e-6):
    # rstd = 1 / (mean(h^2) + eps): the message had been 'Compare your formula'.
    return _launch(x, residual, weight, eps, rstd="no sqrt")


def times_rms(x, residual, weight, eps=1e-6):
    # y = h * sqrt(mean(h^2) + eps) * weight: the RMS multiplied by, not divided by.
    return _launch(x, residual, weight, eps, rstd="times rms")


def weight_row_offset(x, residual, weight, eps=1e-6):
    """The weight loaded at x's row offset, as x is: it had been told to give each tensor
    its own row stride. Row r reads r row strides past the weight's start, far past its end
    for the many-row cases: not in BROKEN, which the GPU suite runs."""
    return _launch(x, residual, weight, eps, weight_row_offset=True)


def returns_outputs_swapped(x, residual, weight, eps=1e-6):
    y, residual_out = _launch(x, residual, weight, eps)
    return residual_out, y


def residual_with_x_stride(x, residual, weight, eps=1e-6):
    # One stride for both inputs: right whenever they happen to share a layout.
    return _launch(x, residual, weight, eps, residual_stride=x.reshape(-1, x.shape[-1]).stride(0))


def weight_without_mask(x, residual, weight, eps=1e-6):
    """Every value right: the masked store leaves out the lanes past the weight's end. Only
    Triton's interpreter can record the load: not in BROKEN."""
    return _launch(x, residual, weight, eps, weight_masked=False)


def sum_loaded_back(x, residual, weight, eps=1e-6):
    """Every value right, one launch: the sum is stored into residual_out, then loaded back
    from it for the norm instead of kept in registers (a second pass over M*N elements). The
    correctness checks cannot see it, only the bandwidth check's count of loads: not in
    BROKEN."""
    return _launch(x, residual, weight, eps, sum_loaded_back=True)


@triton.jit
def _scratch_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, s_ptr, stride_row, n_cols, eps,
                    BLOCK_N: tl.constexpr):
    # x, the residual and both outputs share one row stride (the wrapper makes them so)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * stride_row + cols, h, mask=mask)
    # the bug: the sum stored a second time, into scratch, and loaded back from there
    tl.store(s_ptr + row * stride_row + cols, h, mask=mask)
    v = tl.load(s_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_row + cols, (v * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def scratch_read_back(x, residual, weight, eps=1e-6):
    """Every value right, one launch, x and the residual read once, neither output loaded:
    the sum goes through a scratch buffer the wrapper allocates and does not return (stored,
    then loaded back for the norm), one more write and read of M*N elements. Counted by no
    one until the bandwidth check counted the loads of the call's own memory: not in
    BROKEN."""
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    y, h = torch.empty_like(x2), torch.empty_like(x2)
    scratch = torch.empty_like(x2)
    _scratch_kernel[(x2.shape[0],)](x2, r2, weight, y, h, scratch, n, n, eps,
                                    BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape), h.view(x.shape)


def block_of_4096(x, residual, weight, eps=1e-6):
    # BLOCK_N hard-coded to 4096, a model's width, masks right: the widest rows of the
    # checks without a GPU were 4096 long, so it passed them all there.
    return _launch(x, residual, weight, eps, block=4096)


def grid_of_columns(x, residual, weight, eps=1e-6):
    # grid = (N,): one program per column. Programs past the last row reach far past the
    # tensors (see rmsnorm_variants.grid_of_columns): not in BROKEN.
    return _launch(x, residual, weight, eps, grid=(x.shape[-1],))


@triton.jit
def _add_kernel(x_ptr, r_ptr, h_ptr, stride_x_row, stride_r_row, stride_h_row, n_cols,
                BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r_row + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * stride_h_row + cols, (x + r).to(h_ptr.dtype.element_ty), mask=mask)


def add_then_norm(x, residual, weight, eps=1e-6):
    # Correct values, but the sum makes a round trip through memory between two launches.
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n), residual.reshape(-1, n)
    h = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _add_kernel[(x2.shape[0],)](x2, r2, h, x2.stride(0), r2.stride(0), h.stride(0), n,
                                BLOCK_N=triton.next_power_of_2(n))
    return rmsnorm_variants.correct(h, weight, eps).view(x.shape), h.view(x.shape)


# name -> (function, a phrase its failure message must contain)
BROKEN = {
    "missing_residual_output": (missing_residual_output, "residual_out is never written"),
    "returns_input_residual": (returns_input_residual, "holds the residual you were given"),
    "residual_in_place": (residual_in_place, "in place"),
    "norm_of_x": (norm_of_x, "RMSNorm of x alone"),
    "add_then_norm": (add_then_norm, "The point of the fusion is one launch"),
    "residual_with_x_stride": (residual_with_x_stride, "each tensor by its own row stride"),
    "missing_eps": (missing_eps, "eps is missing from the square root"),
    "no_weight": (no_weight, "y lacks the weight"),
    "returns_outputs_swapped": (returns_outputs_swapped, "The two outputs are swapped"),
    "eps_outside_sqrt": (eps_outside_sqrt, "eps is added outside the square root"),
    "sum_not_mean": (sum_not_mean, "about sqrt(N) times too small"),
    "variance_not_mean_square": (variance_not_mean_square, "rstd comes from the variance of h"),
    "padding_of_ones": (padding_of_ones, "The masked lanes' fill value enters the sum"),
    "sqrt_missing": (sqrt_missing,
                     "y is h / (mean(h^2) + eps) * weight: the square root is missing"),
    "times_rms": (times_rms, "y is h * sqrt(mean(h^2) + eps) * weight: the RMS multiplied by"),
}
