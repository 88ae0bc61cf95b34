"""LayerNorm, the readable reference: one program per row, forward and backward.

    y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps),   var biased (over N)
    dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)),   dw = sum dy * x_hat,   db = sum dy
    with x_hat = (x - mean) * rstd and g = dy * w, per row

Read this file first. It is the readable version, not the fast one: one path, the whole
row in one program's registers (plain_rmsnorm.MAX_N columns at most), the variance from
the centred row (no cancellation: chapter 06), and dw summed by torch from one float32 row
per input row. `layernorm.py` is the tuned version of the same arithmetic.
"""

from __future__ import annotations

from course import runtime, validation  # noqa: F401  (runtime: GPU or interpreter, first)

import torch
import triton
import triton.language as tl

from solutions.kernels.plain_rmsnorm import block_and_warps


@triton.jit
def plain_layernorm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, stride_x_row,
                               stride_y_row, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2**31 elements
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=in_row, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    centred = tl.where(in_row, x - mean, 0.0)  # the padding lanes would hold -mean
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / N + eps)
    tl.store(mean_ptr + row, mean)  # 8 bytes a row, saved for the backward
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    y = (centred * rstd) * w + b
    tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def plain_layernorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_rows_ptr,
                               stride_x_row, stride_dy_row, stride_dx_row, N,
                               BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=in_row, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=in_row, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    x_hat = (x - mean) * rstd
    g = dy * w  # the gradient that reaches x_hat; 0 past N (dy loaded as 0), so the
    # padding lanes add nothing to either sum below
    mean_g = tl.sum(g, axis=0) / N
    mean_xg = tl.sum(x_hat * g, axis=0) / N
    dx = (g - mean_g - x_hat * mean_xg) * rstd
    tl.store(dx_ptr + row * stride_dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=in_row)
    # This row's terms of dw, in a row of its own, as in plain_rmsnorm.py (db = the column
    # sums of dy: the wrapper asks torch)
    tl.store(dw_rows_ptr + row * N + cols, dy * x_hat, mask=in_row)


def layernorm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd): y like x; mean and rstd float32, one value per row."""
    if weight is None or bias is None:
        raise TypeError("weight and bias must both be 1-D tensors, one entry per column of x")
    x2 = validation.as_rows(x)
    validation.check_param(x, weight, "weight")
    validation.check_param(x, bias, "bias")
    eps = validation.check_eps(eps)
    M, N = x2.shape
    block_n, warps = block_and_warps(N)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    mean, rstd = torch.empty((2, M), dtype=torch.float32, device=x.device)
    plain_layernorm_fwd_kernel[(M,)](x2, weight, bias, y, mean, rstd, x2.stride(0),
                                     y.stride(0), N, eps, BLOCK_N=block_n, num_warps=warps)
    return y.view(x.shape), mean.view(x.shape[:-1]), rstd.view(x.shape[:-1])


def layernorm_backward(x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                       rstd: torch.Tensor, dy: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db) of y = layernorm(x, weight, bias), from the forward's mean and rstd;
    dw in the weight's dtype, db in float32 (LayerNormFunction rounds it to the bias's)."""
    x2 = validation.as_rows(x)
    dy2 = validation.check_same_rows(x, dy, "dy")
    validation.check_param(x, weight, "weight")
    M, N = x2.shape
    mean = validation.row_statistic(mean, M, "mean")
    rstd = validation.row_statistic(rstd, M, "rstd")
    block_n, warps = block_and_warps(N)
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    dw_rows = torch.empty((M, N), dtype=torch.float32, device=x.device)
    plain_layernorm_bwd_kernel[(M,)](x2, weight, dy2, mean, rstd, dx, dw_rows, x2.stride(0),
                                     dy2.stride(0), dx.stride(0), N, BLOCK_N=block_n,
                                     num_warps=warps)
    db = dy2.sum(dim=0, dtype=torch.float32)
    return dx.view(x.shape), dw_rows.sum(dim=0).to(weight.dtype), db


class LayerNormFunction(torch.autograd.Function):
    """layernorm(x, weight, bias, eps) with its backward: the forward saves mean and rstd."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layernorm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        # contiguous: the dy of y.sum() has stride 0, and the kernel steps along a row by 1
        dx, dw, db = layernorm_backward(x, weight, mean, rstd, dy.contiguous())
        return dx, dw, db.to(ctx.bias_dtype), None


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension of x, differentiable in x, weight and bias."""
    return LayerNormFunction.apply(x, weight, bias, eps)

