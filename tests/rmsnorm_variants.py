"""A correct RMSNorm forward and a gallery of broken or dishonest ones, each with the bug
a learner really writes. The checker tests (and the GPU suite) run all of them.

Every wrapper has the exercise's signature: rmsnorm(x, weight, eps=1e-6) -> y.
"""

from __future__ import annotations

import course  # noqa: F401  (sets the execution mode before any kernel is defined)

import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                   BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    # Leading dimensions become rows; a view whenever the rows are evenly strided.
    return x.reshape(-1, x.shape[-1])


def _launch(kernel, x, weight, eps, block=None, y=None):
    x2 = _rows(x)
    y2 = torch.empty_like(x2) if y is None else y
    n = x2.shape[1]
    block = block or triton.next_power_of_2(n)
    # More warps for longer rows keeps each thread's share of the row small.
    kernel[(x2.shape[0],)](x2, weight, y2, x2.stride(0), y2.stride(0), n, eps,
                           BLOCK_N=block, num_warps=min(16, max(4, block // 512)))
    return y2


def correct(x, weight, eps=1e-6):
    return _launch(rmsnorm_kernel, x, weight, eps).view(x.shape)


@triton.jit
def two_pass_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                     BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=cols < n_cols, other=0.0)
        acc += x.to(tl.float32) * x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
                 mask=mask)


def two_pass_slow(x, weight, eps=1e-6):
    """Correct, but reads every row twice in small blocks with one warp: slow on purpose."""
    x2 = _rows(x)
    y = torch.empty_like(x2)
    n = x2.shape[1]
    two_pass_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                     BLOCK_N=128, num_warps=1)
    return y.view(x.shape)



@triton.jit
def _divides_by_block_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                             BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols  # the masks are right ...
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / BLOCK_N + eps)  # ... the mean is not
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def divides_by_block(x, weight, eps=1e-6):
    """The mean of squares over the padded block, not the row: wrong unless N is a power
    of two, like a missing mask, but every row off by the same factor sqrt(BLOCK_N / N)."""
    return _launch(_divides_by_block_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _sqrt_missing_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                         BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / (tl.sum(x * x, axis=0) / n_cols + eps)  # the square root left out
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def sqrt_missing(x, weight, eps=1e-6):
    """rstd = 1 / (mean(x^2) + eps): the message had been 'Compare your formula'."""
    return _launch(_sqrt_missing_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _times_rms_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                      BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rms * w).to(y_ptr.dtype.element_ty),
             mask=mask)  # multiplied by the RMS, not divided by it


def times_rms(x, weight, eps=1e-6):
    """y = x * sqrt(mean(x^2) + eps) * weight: the message had been 'Compare your formula'."""
    return _launch(_times_rms_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _no_weight_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                      BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd).to(y_ptr.dtype.element_ty),
             mask=mask)


def no_weight(x, weight, eps=1e-6):
    """Normalised, never scaled by the weight."""
    return _launch(_no_weight_kernel, x, weight, eps).view(x.shape)

@triton.jit
def _no_mask_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                    BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride_x_row + cols).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty))


def missing_mask(x, weight, eps=1e-6):
    return _launch(_no_mask_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _padding_of_ones_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                            BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    # The bug: the lanes past the row load 1.0, and each adds 1.0 to the sum of squares.
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=1.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def padding_of_ones(x, weight, eps=1e-6):
    """Masks right, but x's load fills the masked lanes with other=1.0: BLOCK_N - N ones in
    every row's sum of squares, so rows whose N is not a power of two fail, as they do
    without a mask (and had been told so)."""
    return _launch(_padding_of_ones_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _no_row_offset_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                          BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # forgot the row
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def wrong_row_offset(x, weight, eps=1e-6):
    return _launch(_no_row_offset_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _weight_row_offset_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                              BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    # Copied from x's load: the weight gets the row offset too.
    w = tl.load(w_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def weight_row_offset(x, weight, eps=1e-6):
    """Row 0 right; every later row reads its weight past the weight's end, up to M row
    strides past it: not in BROKEN, which the GPU suite runs, where a read that far may fault
    and end the process's use of the GPU (tests/test_accesses.py checks it)."""
    return _launch(_weight_row_offset_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _centred_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                    BLOCK_N: tl.constexpr, CENTRE_Y: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)  # the variance
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (centred if CENTRE_Y else x) * rstd * w
    tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_centred(x, weight, eps, centre_y: bool):
    x2 = _rows(x)
    y = torch.empty_like(x2)
    n = x2.shape[1]
    _centred_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                    BLOCK_N=triton.next_power_of_2(n), CENTRE_Y=centre_y)
    return y.view(x.shape)


def variance_not_mean_square(x, weight, eps=1e-6):
    """rstd from the variance, as chapter 01's LayerNorm has it: where a row's mean is near
    0 (the M = 1 case, on some seeds) it passes, and the probe's new values then failed,
    which was called state kept between calls."""
    return _launch_centred(x, weight, eps, centre_y=False)


def layernorm_without_bias(x, weight, eps=1e-6):
    return _launch_centred(x, weight, eps, centre_y=True)


@triton.jit
def _weight_shifted_by_row_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols,
                                  eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)  # row, not stride
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def weight_shifted_by_row(x, weight, eps=1e-6):
    """The weight loaded at w_ptr + row + cols: row r reads it r entries along, and r
    entries past its end (the guard margin holds them)."""
    return _launch(_weight_shifted_by_row_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _weight_without_mask_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                                BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols).to(tl.float32)  # reads past the weight's end when BLOCK_N > N
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def weight_without_mask(x, weight, eps=1e-6):
    """Every value right: the masked store leaves out the lanes past the weight's end. Only
    Triton's interpreter can record the load (tests/test_accesses.py): not in BROKEN."""
    return _launch(_weight_without_mask_kernel, x, weight, eps).view(x.shape)


def grid_of_columns(x, weight, eps=1e-6):
    """One program per column, grid (N,), instead of one per row: programs M to N - 1 load
    and store rows past the end of x and y, far past them when N is much larger than M. In
    Triton's interpreter those stores land in Python's own memory (the process aborted
    before the checkers' fence); on a GPU they fault: not in BROKEN, which the GPU suite
    runs (tests/test_check_diagnoses.py runs it in a process of its own)."""
    x2 = _rows(x)
    y = torch.empty_like(x2)
    n = x2.shape[1]
    rmsnorm_kernel[(n,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                         BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


def stride_of_the_3d_input(x, weight, eps=1e-6):
    """x.stride(0) of a 3-D x as the row stride: it steps over a whole block of rows."""
    y = torch.empty_like(_rows(x))
    n = x.shape[-1]
    rmsnorm_kernel[(y.shape[0],)](x, weight, y, x.stride(0), y.stride(0), n, eps,
                                  BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


@triton.jit
def _low_precision_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                          BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0)  # stays 16-bit
    mean_sq = tl.sum(x * x, axis=0).to(tl.float32) / n_cols
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols,
             (x.to(tl.float32) * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def low_precision_accumulation(x, weight, eps=1e-6):
    return _launch(_low_precision_kernel, x, weight, eps).view(x.shape)


@triton.jit
def _does_nothing_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                         BLOCK_N: tl.constexpr):
    pass


def stale_memory(x, weight, eps=1e-6):
    # Looks right when the allocator recycles the block of an earlier correct answer.
    return _launch(_does_nothing_kernel, x, weight, eps).view(x.shape)


def torch_ops_in_wrapper(x, weight, eps=1e-6):
    # Launches a kernel for show; the answer comes from PyTorch.
    _launch(rmsnorm_kernel, x, weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def no_triton(x, weight, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


@triton.jit
def _sum_squares_kernel(x_ptr, out_ptr, stride_x_row, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps))


@triton.jit
def _scale_kernel(x_ptr, w_ptr, rstd_ptr, y_ptr, stride_x_row, stride_y_row, n_cols,
                  BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def two_launches(x, weight, eps=1e-6):
    x2 = _rows(x)
    n = x2.shape[1]
    block = triton.next_power_of_2(n)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    y = torch.empty_like(x2)
    _sum_squares_kernel[(x2.shape[0],)](x2, rstd, x2.stride(0), n, eps, BLOCK_N=block)
    _scale_kernel[(x2.shape[0],)](x2, weight, rstd, y, x2.stride(0), y.stride(0), n,
                                  BLOCK_N=block)
    return y.view(x.shape)


def writes_into_input(x, weight, eps=1e-6):
    x2 = _rows(x)
    _launch(rmsnorm_kernel, x, weight, eps, y=x2)  # "saves memory" by overwriting x
    return x2.view(x.shape)


def ignores_row_stride(x, weight, eps=1e-6):
    x2 = _rows(x)
    y = torch.empty_like(x2)
    n = x2.shape[1]
    rmsnorm_kernel[(x2.shape[0],)](x2, weight, y, n, n, n, eps,
                                   BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


@triton.jit
def _two_rows_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                     BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for i in range(2):
        row = tl.program_id(0) * 2 + i
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
                 mask=mask)


def rows_left_over(x, weight, eps=1e-6):
    # Two rows a program, and the programs counted rounding down: an odd M's last row gets none
    x2 = _rows(x)
    y = torch.empty_like(x2)
    n = x2.shape[1]
    _two_rows_kernel[(x2.shape[0] // 2,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                          BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


_cache: dict = {}


def caches_results(x, weight, eps=1e-6):
    key = (tuple(x.shape), x.dtype)
    if key not in _cache:
        _cache[key] = correct(x, weight, eps)
    return _cache[key]


def fixed_block(x, weight, eps=1e-6):
    # BLOCK_N hard-coded: rows longer than 1024 are only partly normalised.
    x2 = _rows(x)
    return _launch(rmsnorm_kernel, x, weight, eps, block=1024 if x2.shape[1] > 1 else 1
                   ).view(x.shape)


def block_of_8192(x, weight, eps=1e-6):
    """BLOCK_N hard-coded to 8192, masks right: the widest rows of the checks without a GPU
    were 8192 long, so it passed them all there (tests/test_check_diagnoses.py)."""
    return _launch(rmsnorm_kernel, x, weight, eps, block=8192).view(x.shape)


def ignores_eps(x, weight, eps=1e-6):
    return _launch(rmsnorm_kernel, x, weight, 1e-6).view(x.shape)


def eps_of_its_own(x, weight, eps=1e-6):
    # 1e-5, another common default: the N = 1 rows show it as well as the custom eps case,
    # and the message had been 'Values are wrong ... Compare your formula'.
    return _launch(rmsnorm_kernel, x, weight, 1e-5).view(x.shape)


def numpy_behind_a_dummy_launch(x, weight, eps=1e-6):
    # Launches a kernel that does nothing useful; the answer is computed with NumPy, which
    # no torch op interception sees.
    scratch = torch.empty_like(x)
    _launch(_does_nothing_kernel, x, weight, eps, y=scratch.reshape(-1, x.shape[-1]))
    xs = x.detach().cpu().float().numpy()
    ws = weight.detach().cpu().float().numpy()
    ys = xs / ((xs * xs).mean(-1, keepdims=True) + eps) ** 0.5 * ws
    return torch.from_numpy(ys).to(device=x.device, dtype=x.dtype)


# name -> (function, a phrase its failure message must contain)
BROKEN = {
    "missing_mask": (missing_mask, "not masked"),
    "padding_of_ones": (padding_of_ones, "The masked lanes' fill value enters the sum"),
    "wrong_row_offset": (wrong_row_offset, "Row 0 is right"),
    "low_precision_accumulation": (low_precision_accumulation, "statistics are computed in"),
    "stale_memory": (stale_memory, "never stores"),
    "torch_ops_in_wrapper": (torch_ops_in_wrapper, "computes with PyTorch"),
    "no_triton": (no_triton, "launched no Triton kernel"),
    "two_launches": (two_launches, "more kernels than the exercise allows"),
    "writes_into_input": (writes_into_input, "writes into an input"),
    "ignores_row_stride": (ignores_row_stride, "rows are not contiguous"),
    "caches_results": (caches_results, "returned the first call's result"),
    "fixed_block": (fixed_block, "never written"),
    "rows_left_over": (rows_left_over, "The last rows were left unwritten"),
    "ignores_eps": (ignores_eps, "non-default eps"),
    "weight_shifted_by_row": (weight_shifted_by_row, "times the weight shifted r entries"),
    "variance_not_mean_square": (variance_not_mean_square, "rstd comes from the row's variance"),
    "layernorm_without_bias": (layernorm_without_bias, "y is LayerNorm's (x - mean)"),
    "numpy_behind_a_dummy_launch": (numpy_behind_a_dummy_launch, "never passed to your kernel"),
    "sqrt_missing": (sqrt_missing,
                     "y is x / (mean(x^2) + eps) * weight: the square root is missing"),
    "times_rms": (times_rms, "y is x * sqrt(mean(x^2) + eps) * weight: the RMS multiplied by"),
}
