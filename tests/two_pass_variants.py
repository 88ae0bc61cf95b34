"""A correct two-pass RMSNorm (chapter 03) and the bugs a learner writes into its loops.

Every wrapper has the exercise's signature: rmsnorm_two_pass(x, weight, eps=1e-6) -> y.
"""

from __future__ import annotations

import course  # noqa: F401  (sets the execution mode before any kernel is defined)

import torch
import triton
import triton.language as tl

BLOCK_N = 1024  # several blocks per row for the long-row cases


@triton.jit
def two_pass_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                    BLOCK_N: tl.constexpr, ACCUMULATE: tl.constexpr, LOOP: tl.constexpr,
                    SUM_LOOP: tl.constexpr, MEAN_OVER_BLOCK: tl.constexpr,
                    WEIGHTED: tl.constexpr, MASK_ONE_PAST: tl.constexpr,
                    MASK_BY_BLOCK: tl.constexpr = False,
                    WHOLE_BLOCKS: tl.constexpr = False, SUM_WHOLE_BLOCKS: tl.constexpr = False):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    end = n_cols if LOOP else BLOCK_N
    if WHOLE_BLOCKS:  # the bug: both loops stop before the last, partial block
        end = n_cols - BLOCK_N + 1
    sum_end = end if SUM_LOOP else BLOCK_N
    if SUM_WHOLE_BLOCKS:  # the bug: the sum's loop counts n_cols // BLOCK_N blocks
        sum_end = (n_cols // BLOCK_N) * BLOCK_N
    for start in range(0, sum_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols <= n_cols if MASK_ONE_PAST else cols < n_cols  # the bug: <=
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if ACCUMULATE:
            acc += x * x
        else:
            acc = x * x  # the bug: each block replaces the last one's squares
    if MEAN_OVER_BLOCK:
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / BLOCK_N + eps)  # the bug: not n_cols
    else:
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols <= n_cols if MASK_ONE_PAST else cols < n_cols
        if MASK_BY_BLOCK:  # the bug: true on the first block only, and past its row's end
            mask = cols < BLOCK_N
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd
        if WEIGHTED:  # the bug, when not: the weight is never applied
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x, weight, eps, *, accumulate=True, loop=True, sum_loop=True,
            mean_over_block=False, weighted=True, mask_one_past=False, grid=None,
            block=None, mask_by_block=False, whole_blocks=False, sum_whole_blocks=False):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    n = x2.shape[1]
    block = block or min(BLOCK_N, triton.next_power_of_2(n))
    two_pass_kernel[grid or (x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                    BLOCK_N=block, ACCUMULATE=accumulate, LOOP=loop,
                                    SUM_LOOP=sum_loop, MEAN_OVER_BLOCK=mean_over_block,
                                    WEIGHTED=weighted, MASK_ONE_PAST=mask_one_past,
                                    MASK_BY_BLOCK=mask_by_block, WHOLE_BLOCKS=whole_blocks,
                                    SUM_WHOLE_BLOCKS=sum_whole_blocks)
    return y.view(x.shape)


def correct(x, weight, eps=1e-6):
    return _launch(x, weight, eps)


def overwrites_accumulator(x, weight, eps=1e-6):
    return _launch(x, weight, eps, accumulate=False)


def no_loop(x, weight, eps=1e-6):
    # One block per row and no loop: fine until a row is longer than the block.
    return _launch(x, weight, eps, loop=False)


def sums_first_block_only(x, weight, eps=1e-6):
    # Pass 1 without its loop, pass 2 with it: every row longer than a block is wrong.
    return _launch(x, weight, eps, sum_loop=False)


def mean_over_block(x, weight, eps=1e-6):
    # The sum of squares divided by the block size: wrong wherever N is not the block.
    return _launch(x, weight, eps, mean_over_block=True)


def missing_eps(x, weight, eps=1e-6):
    # rstd = 1 / sqrt(mean(x^2)), eps left out: a row of zeros computes 0 / 0.
    return _launch(x, weight, 0.0)


def no_weight(x, weight, eps=1e-6):
    return _launch(x, weight, eps, weighted=False)


def mask_one_past_the_end(x, weight, eps=1e-6):
    # mask = cols <= n_cols: every row reads (and writes) one column of the next.
    return _launch(x, weight, eps, mask_one_past=True)


def second_mask_by_block(x, weight, eps=1e-6):
    # mask = cols < BLOCK_N in the second loop: its first block runs past short rows, and
    # no later block stores anything. It was told to loop over the row, which it does. Its
    # advice is no_loop's too (columns past the first block never written): not in BROKEN.
    return _launch(x, weight, eps, mask_by_block=True)


def whole_blocks_only(x, weight, eps=1e-6):
    # for start in range(0, n_cols - BLOCK_N + 1, BLOCK_N) in both loops: the columns past
    # the last whole block are never summed nor stored (a row shorter than a block, none).
    # It had been told that its loads were not masked.
    return _launch(x, weight, eps, whole_blocks=True)


def sums_whole_blocks_only(x, weight, eps=1e-6):
    # n_cols // BLOCK_N blocks in the sum's loop, the second loop right: every column is
    # written, but rstd leaves out the squares past the last whole block.
    return _launch(x, weight, eps, sum_whole_blocks=True)


def block_of_n(x, weight, eps=1e-6):
    # min(BLOCK_N, N): tl.zeros([BLOCK_N]) refuses N = 100 ("Shape element 0 must be a power
    # of 2"), the first thing the kernel makes.
    return _launch(x, weight, eps, block=min(BLOCK_N, x.shape[-1]))


def grid_of_columns(x, weight, eps=1e-6):
    # grid = (N,): one program per column. Programs past the last row reach far past x and
    # y (see rmsnorm_variants.grid_of_columns): not in BROKEN.
    return _launch(x, weight, eps, grid=(x.shape[-1],))


# name -> (function, a phrase its failure message must contain)
BROKEN = {
    "overwrites_accumulator": (overwrites_accumulator, "Only rows longer than one block fail"),
    "no_loop": (no_loop, "never written"),
    "missing_eps": (missing_eps, "eps is missing from the square root"),
    "no_weight": (no_weight, "y lacks the weight"),
    "mask_one_past_the_end": (mask_one_past_the_end, "Use cols < n_cols, not cols <= n_cols"),
    "block_of_n": (block_of_n, "tl.arange(0, BLOCK_N) and tl.zeros([BLOCK_N]) need"),
    "whole_blocks_only": (whole_blocks_only, "are never summed nor stored"),
    "sums_whole_blocks_only": (sums_whole_blocks_only, "are stored but never summed"),
}
