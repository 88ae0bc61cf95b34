"""A correct RMSNorm backward (chapter 07), an autograd.Function built on it, and the bugs
a learner writes (several of them straight from a published RMSNorm backward).

    rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)
    RMSNormFunction.apply(x, weight, eps) -> y

Kernel 1 runs P programs, each over a block of rows: it writes dx for its rows and the sum
of dy * x_hat over them as one float32 partial row. Kernel 2 adds the P partial rows up,
one block of columns per program. The kernels compute in float64 when given float64, so
the Function can be gradchecked.
"""

from __future__ import annotations

import course  # noqa: F401  (sets the execution mode before any kernel is defined)
from course import runtime

import torch
import triton
import triton.language as tl


def _acc_dtype(t: torch.Tensor):
    return tl.float64 if t.dtype == torch.float64 else tl.float32


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, stride_x_row, stride_y_row, n_cols, eps,
                       BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def rmsnorm_bwd_kernel(x_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, partial_ptr, stride_x_row,
                       stride_dy_row, stride_dx_row, n_rows, n_cols, rows_per_program,
                       BLOCK_N: tl.constexpr, ACC: tl.constexpr,
                       PROJECTION: tl.constexpr, ATOMIC: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    dw_acc = tl.zeros([BLOCK_N], dtype=ACC)
    first = pid * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=mask, other=0.0).to(ACC)
        rstd = tl.load(rstd_ptr + row).to(ACC)
        x_hat = x * rstd
        g = dy * w
        if PROJECTION:
            c = tl.sum(x_hat * g, axis=0) / n_cols
            dx = (g - x_hat * c) * rstd
        else:
            dx = g * rstd  # the bug: the term through rstd is missing
        tl.store(dx_ptr + row * stride_dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * x_hat
    if ATOMIC:
        tl.atomic_add(partial_ptr + cols, dw_acc, mask=mask)
    else:
        tl.store(partial_ptr + pid * n_cols + cols, dw_acc, mask=mask)


@triton.jit
def dw_reduce_kernel(partial_ptr, dw_ptr, n_partials, n_cols, BLOCK_P: tl.constexpr,
                     BLOCK_C: tl.constexpr, ACC: tl.constexpr, ALL_ROWS: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_C], dtype=ACC)
    end = n_partials if ALL_ROWS else 1  # the bug: only the first program's partial row
    for start in range(0, end, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows[:, None] < end) & col_mask[None, :]
        tile = tl.load(partial_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask,
                       other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(dw_ptr + cols, acc.to(dw_ptr.dtype.element_ty), mask=col_mask)


def _programs(m: int) -> int:
    if runtime.on_gpu():
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return min(m, 2 * sms)
    return min(m, 16)  # the interpreter runs programs one after another: few is enough


def _backward(x, weight, rstd, dy, *, projection=True, all_partials=True, atomic=False,
              dx_into_dy=False, reduce_with_torch=False):
    n = x.shape[-1]
    x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)
    m = x2.shape[0]
    acc = _acc_dtype(x)
    acc_torch = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows_per_program = triton.cdiv(m, _programs(m))
    programs = triton.cdiv(m, rows_per_program)
    dx = dy2 if dx_into_dy else torch.empty((m, n), dtype=x.dtype, device=x.device)
    partial_rows = 1 if atomic else programs
    partial = torch.zeros((partial_rows, n), dtype=acc_torch, device=x.device)
    block = triton.next_power_of_2(n)
    rmsnorm_bwd_kernel[(programs,)](
        x2, weight, rstd.reshape(-1), dy2, dx, partial, x2.stride(0), dy2.stride(0),
        dx.stride(0), m, n, rows_per_program, BLOCK_N=block, ACC=acc,
        PROJECTION=projection, ATOMIC=atomic, num_warps=min(16, max(4, block // 512)))
    if reduce_with_torch:
        return dx.view(x.shape), partial.sum(0).to(weight.dtype)
    dw = torch.empty(n, dtype=weight.dtype, device=x.device)
    block_c = min(128, triton.next_power_of_2(n))
    dw_reduce_kernel[(triton.cdiv(n, block_c),)](partial, dw, partial_rows, n, BLOCK_P=32,
                                                 BLOCK_C=block_c, ACC=acc,
                                                 ALL_ROWS=all_partials)
    return dx.view(x.shape), dw


def correct(x, weight, rstd, dy):
    return _backward(x, weight, rstd, dy)


def no_dw(x, weight, rstd, dy):
    # As in the published kernel: dX only, and a dW that nothing computes.
    dx, _ = _backward(x, weight, rstd, dy)
    return dx, torch.empty_like(weight)


def dx_written_over_dy(x, weight, rstd, dy):
    return _backward(x, weight, rstd, dy, dx_into_dy=True)


def first_partial_only(x, weight, rstd, dy):
    return _backward(x, weight, rstd, dy, all_partials=False)


def dx_without_projection(x, weight, rstd, dy):
    return _backward(x, weight, rstd, dy, projection=False)


def atomic_dw(x, weight, rstd, dy):
    return _backward(x, weight, rstd, dy, atomic=True)


def torch_reduction(x, weight, rstd, dy):
    return _backward(x, weight, rstd, dy, reduce_with_torch=True)


# name -> (function, a phrase its failure message must contain)
BROKEN = {
    "no_dw": (no_dw, "dW is never computed"),
    "dx_written_over_dy": (dx_written_over_dy, "writes dX over dY"),
    "first_partial_only": (first_partial_only, "dW holds the sum of only some rows"),
    "dx_without_projection": (dx_without_projection, "misses the term that flows through rstd"),
    "atomic_dw": (atomic_dw, "use atomics"),
    "torch_reduction": (torch_reduction, "partial.sum(0) for dW counts too"),
}


# --------------------------------------------------------------------------- autograd

def rmsnorm_forward_with_rstd(x, weight, eps):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    rstd = torch.empty(x2.shape[0], dtype=stat_dtype, device=x.device)
    block = triton.next_power_of_2(n)
    rmsnorm_fwd_kernel[(x2.shape[0],)](x2, weight, y, rstd, x2.stride(0), y.stride(0), n, eps,
                                       BLOCK_N=block, ACC=_acc_dtype(x))
    return y.view(x.shape), rstd.view(x.shape[:-1])


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = rmsnorm_forward_with_rstd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = correct(x, weight, rstd, dy.contiguous())  # y.sum()'s dy has strides 0
        return dx, dw, None


class StridedDy(RMSNormFunction):
    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = correct(x, weight, rstd, dy)  # kernels that read dy's rows as contiguous
        return dx, dw, None


class FourGradients(RMSNormFunction):
    @staticmethod
    def backward(ctx, dy):
        dx, dw, _ = RMSNormFunction.backward(ctx, dy)
        return dx, dw, None, None  # one per input plus one: PyTorch drops the extra None


class TwoGradients(RMSNormFunction):
    @staticmethod
    def backward(ctx, dy):
        dx, dw, _ = RMSNormFunction.backward(ctx, dy)
        return dx, dw  # eps gets nothing


class SwappedGradients(RMSNormFunction):
    @staticmethod
    def backward(ctx, dy):
        dx, dw, _ = RMSNormFunction.backward(ctx, dy)
        return dw, dx, None  # in the wrong order: PyTorch refuses dw's shape for x


class TorchBackward(RMSNormFunction):
    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.float() * rstd.unsqueeze(-1)
        g = dy.float() * weight.float()
        dx = rstd.unsqueeze(-1) * (g - x_hat * (x_hat * g).mean(-1, keepdim=True))
        dw = (dy.float() * x_hat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class Float32Kernels(torch.autograd.Function):
    """Correct, but always computes in float32: gradcheck cannot run on it."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        if x.dtype == torch.float64:
            y, rstd = rmsnorm_forward_with_rstd(x.float(), weight.float(), eps)
            y, rstd = y.double(), rstd.double()
        else:
            y, rstd = rmsnorm_forward_with_rstd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    backward = staticmethod(RMSNormFunction.backward)


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, ZERO: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(src_ptr + i, mask=i < n)
    tl.store(dst_ptr + i, v * 0.0 if ZERO else v, mask=i < n)


def _copied(t, zero=False):
    out = torch.empty_like(t)
    _copy_kernel[(1,)](t, out, t.numel(), ZERO=zero, BLOCK=triton.next_power_of_2(t.numel()))
    return out


class IdentityFunction(torch.autograd.Function):
    """Not RMSNorm: y = x, dx = dy, dw = 0, through kernels; its backward matches its own
    forward."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(weight)
        return _copied(x)

    @staticmethod
    def backward(ctx, dy):
        (weight,) = ctx.saved_tensors
        return _copied(dy), _copied(weight, zero=True), None


# name -> (Function, a phrase its failure message must contain)
BROKEN_FUNCTIONS = {
    "four_gradients": (FourGradients, "returned 4 values for 3 inputs"),
    "two_gradients": (TwoGradients, "returned 2 value(s) for 3 inputs"),
    "torch_backward": (TorchBackward, "backward launched no Triton kernel"),
    "swapped_gradients": (SwappedGradients, "Are dx and dw swapped?"),
    "strided_dy": (StridedDy, "Call dy = dy.contiguous() in backward"),
}
