"""RMSNorm, the readable reference: one program per row, forward and backward.

    y = x * rstd * w,   rstd = 1 / sqrt(mean(x**2) + eps)        (per row, in float32)
    dx = rstd * (g - x_hat * mean(x_hat * g)),   dw = sum over rows of dy * x_hat
    with x_hat = x * rstd and g = dy * w

Read this file first. It is the readable version, not the fast one: one path, the whole
row in one program's registers (rows up to MAX_N columns), and dw summed by torch from one
float32 row per input row. `rmsnorm.py` is the tuned version of the same arithmetic.
"""

from __future__ import annotations

from course import runtime, validation  # noqa: F401  (runtime: GPU or interpreter, first)

import torch
import triton
import triton.language as tl

MAX_N = 32768  # the longest row one program holds in registers (rmsnorm.py goes further)


@triton.jit
def plain_rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, stride_x_row, stride_y_row, N,
                             eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2**31 elements
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N  # BLOCK_N is a power of two, N need not be
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=in_row, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(rstd_ptr + row, rstd)  # 4 bytes a row, saved for the backward
    w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    y = (x * rstd) * w
    tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def plain_rmsnorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_rows_ptr,
                             stride_x_row, stride_dy_row, stride_dx_row, N,
                             BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N
    rstd = tl.load(rstd_ptr + row)
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=in_row, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=in_row, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    x_hat = x * rstd
    g = dy * w  # the gradient that reaches x_hat
    dx = (g - x_hat * (tl.sum(x_hat * g, axis=0) / N)) * rstd
    tl.store(dx_ptr + row * stride_dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=in_row)
    # This row's terms of dw, in a row of its own; the wrapper adds up the M rows with torch
    # (an M x N float32 workspace, where the tuned kernels keep one row per program)
    tl.store(dw_rows_ptr + row * N + cols, dy * x_hat, mask=in_row)


def block_and_warps(N: int) -> tuple[int, int]:
    """BLOCK_N covers the row; warps as chapter 04's rule: about 16 values a thread, 4 to 32."""
    if N > MAX_N:
        raise ValueError(f"rows of {N} columns do not fit one program's registers (at most "
                         f"{MAX_N} here): use solutions.kernels.rmsnorm, which loops over them")
    block_n = triton.next_power_of_2(N)
    return block_n, min(32, max(4, block_n // 512))


def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y like x, rstd float32 with one value per row (shape x.shape[:-1])."""
    if weight is None:
        raise TypeError("weight is None: pass a 1-D weight, one entry per column of x")
    x2 = validation.as_rows(x)
    validation.check_param(x, weight, "weight")
    eps = validation.check_eps(eps)
    M, N = x2.shape
    block_n, warps = block_and_warps(N)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    plain_rmsnorm_fwd_kernel[(M,)](x2, weight, y, rstd, x2.stride(0), y.stride(0), N, eps,
                                   BLOCK_N=block_n, num_warps=warps)
    return y.view(x.shape), rstd.view(x.shape[:-1])


def rmsnorm_backward(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                     dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of y = rmsnorm(x, weight), from the rstd the forward saved."""
    x2 = validation.as_rows(x)
    dy2 = validation.check_same_rows(x, dy, "dy")
    validation.check_param(x, weight, "weight")
    M, N = x2.shape
    rstd = validation.row_statistic(rstd, M, "rstd")
    block_n, warps = block_and_warps(N)
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    dw_rows = torch.empty((M, N), dtype=torch.float32, device=x.device)
    plain_rmsnorm_bwd_kernel[(M,)](x2, weight, dy2, rstd, dx, dw_rows, x2.stride(0),
                                   dy2.stride(0), dx.stride(0), N, BLOCK_N=block_n,
                                   num_warps=warps)
    return dx.view(x.shape), dw_rows.sum(dim=0).to(weight.dtype)


class RMSNormFunction(torch.autograd.Function):
    """rmsnorm(x, weight, eps) with its backward: the forward saves x, the weight and rstd."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = rmsnorm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        # contiguous: the dy of y.sum() has stride 0, and the kernel steps along a row by 1
        dx, dw = rmsnorm_backward(x, weight, rstd, dy.contiguous())
        return dx, dw, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of x, differentiable in x and weight."""
    return RMSNormFunction.apply(x, weight, eps)
