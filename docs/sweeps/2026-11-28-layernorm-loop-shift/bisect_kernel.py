# ruff: noqa: E501  (kept as it ran: a record, not course code)
"""Scratch: our LayerNorm loop kernel with switches, to find what the minimal kernel does
that ours does not."""
import triton
import triton.language as tl

from solutions.kernels.layernorm import (
    _deviations,
    _load_to_read_again,
    _normalise_again,
    _stats_from_shifted,
)
from solutions.kernels.row_loads import columns_in_row, rows_of_program, stated_multiples


@triton.jit
def ln_exp(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, stride_x_row, stride_y_row,
           eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
           OUT_BLOCK: tl.constexpr, ROW_BLOCKS: tl.constexpr, EVEN: tl.constexpr,
           MULTIPLE: tl.constexpr, FIXED_N: tl.constexpr, LANES: tl.constexpr,
           SHIFT_ONE: tl.constexpr, FIXED_STRIDE: tl.constexpr, HEADN: tl.constexpr = 256):
    N, stride_x_row, stride_y_row, _, _ = stated_multiples(
        N, stride_x_row, stride_y_row, 0, 0, MULTIPLE=MULTIPLE)
    if FIXED_N:
        N = FIXED_N
    if FIXED_STRIDE:
        stride_x_row = FIXED_STRIDE
        stride_y_row = FIXED_STRIDE
    ONE_ROW: tl.constexpr = ROW_BLOCKS > 0
    first_row, end, step = rows_of_program(M, ONE_ROW=ONE_ROW)
    for row in range(first_row, end, step):
        x_row = x_ptr + row * stride_x_row
        first = tl.arange(0, BLOCK_N)
        in_row = columns_in_row(first, N, EVEN=EVEN)
        x = _load_to_read_again(x_row, first, in_row)
        if SHIFT_ONE == 1:
            shift = tl.load(x_row).to(tl.float32)
        elif SHIFT_ONE == 2:
            head = tl.arange(0, HEADN)
            shift = tl.sum(tl.load(x_row + head, mask=head < N, other=0.0).to(tl.float32),
                           axis=0) / tl.minimum(N, HEADN)
        elif SHIFT_ONE == 3:
            shift = 0.0
        else:
            shift = tl.sum(x, axis=0) / tl.minimum(N, BLOCK_N)
        if SHIFT_ONE == 3:
            k = tl.where(in_row, x, 0.0)
            counts = in_row.to(tl.float32)
            lanes_d = tl.zeros_like(x)
            lanes_d2 = tl.zeros_like(x)
        else:
            k = x
            counts = in_row.to(tl.float32)
            d = _deviations(x, in_row, shift)
            lanes_d, lanes_d2 = d, d * d
        sum_d = tl.sum(lanes_d, axis=0)
        sum_d2 = tl.sum(lanes_d2, axis=0)
        if ONE_ROW:
            for start in tl.static_range(BLOCK_N, ROW_BLOCKS * BLOCK_N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                in_row = columns_in_row(cols, N, EVEN=EVEN)
                if SHIFT_ONE == 3:
                    d = tl.where(in_row, _load_to_read_again(x_row, cols, in_row) - k, 0.0)
                    counts += in_row.to(tl.float32)
                else:
                    d = _deviations(_load_to_read_again(x_row, cols, in_row), in_row, shift)
                lanes_d += d
                lanes_d2 += d * d
        else:
            for start in range(BLOCK_N, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                d = _deviations(_load_to_read_again(x_row, cols, cols < N), cols < N, shift)
                if LANES:
                    lanes_d += d
                    lanes_d2 += d * d
                else:
                    sum_d += tl.sum(d, axis=0)
                    sum_d2 += tl.sum(d * d, axis=0)
        if LANES or ONE_ROW:
            sum_d, sum_d2 = tl.sum(lanes_d, axis=0), tl.sum(lanes_d2, axis=0)
        if SHIFT_ONE == 3 and ONE_ROW:
            mean = tl.sum(counts * k + lanes_d, axis=0) / N
            n_l = tl.maximum(counts, 1.0)
            lane_mean = k + lanes_d / n_l
            m2 = lanes_d2 - lanes_d * lanes_d / n_l + counts * (lane_mean - mean) * (lane_mean - mean)
            rstd = tl.rsqrt(tl.sum(m2, axis=0) / N + eps)
        else:
            mean, rstd = _stats_from_shifted(sum_d, sum_d2, shift, N, eps)
        y_row = y_ptr + row * stride_y_row
        if ONE_ROW:
            for start in tl.static_range(0, ROW_BLOCKS * BLOCK_N, OUT_BLOCK):
                cols = start + tl.arange(0, OUT_BLOCK)
                _normalise_again(x_row, w_ptr, b_ptr, y_row, cols,
                                 columns_in_row(cols, N, EVEN=EVEN), mean, rstd,
                                 HAS_WEIGHT=HAS_WEIGHT, HAS_BIAS=HAS_BIAS)
        else:
            for start in range(0, N, OUT_BLOCK):
                cols = start + tl.arange(0, OUT_BLOCK)
                _normalise_again(x_row, w_ptr, b_ptr, y_row, cols, cols < N, mean, rstd,
                                 HAS_WEIGHT=HAS_WEIGHT, HAS_BIAS=HAS_BIAS)
