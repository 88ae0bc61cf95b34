"""LayerNorm, forward and backward: the tuned kernels.

    y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps),   var biased (divided by N)

The variance is never computed as E[x^2] - E[x]^2: for rows whose mean is large next to their
spread that difference cancels catastrophically in float32. With the row in registers the
kernel subtracts the mean first (two passes over registers, one over memory). Rows too long
for registers are summed in one pass that keeps nothing, so they are summed about a shift K:
var = E[(x-K)^2] - E[x-K]^2. That subtraction loses about log2(1 + (mean-K)^2/var) bits.
K is the mean of the row's first H values, and since those values are part of the row,
(mean-K)^2 <= (N/H) * var: at most log2(1 + N/H) bits cancel, however large the mean.
The split path takes H = HEAD = 256, which every program of the row reads: at most 10 of
float32's 24 bits at N = 262144. The loop path takes its first block for float32 rows
(H = BLOCK_N, no extra load; when that block is the whole row, K is the mean itself and
nothing cancels), and the first LOOP_HEAD = 32 values for 16-bit rows: one warp's worth,
summed without waiting on the other warps, so the row's loads all go out at once (the
first block's mean held them back), and at most 13 bits cancel at N = 262144, leaving the
11 a float16 keeps. Short 16-bit rows, in registers, are summed about their first value
(H = 1) for speed: at most log2(1 + 512) = 9 bits cancel, and the 15 left are more than
a 16-bit output keeps (rows kernel, below).

Backward (per row, x_hat = (x - mean) * rstd, g = dy * w):

    dx = rstd * (g - mean(g) - x_hat * mean(x_hat * g)),   dw = sum dy * x_hat,   db = sum dy

dw and db are summed as RMSNorm's dw is: a float32 partial row each per program, then
`column_sums` (one launch for both), or written in the parameters' dtype by a lone program
(or by the columns path's programs, each its own columns).

Reading guide. Read `plain_layernorm.py` first: the same arithmetic, one row a program, the
variance from the centred row. The kernels here mirror rmsnorm.py's, path for path, and its
module docstring says which plan field sets which flag; read that one first. Eight kernels:

    kernel                       plan.path         what it adds to rmsnorm.py's
    layernorm_fwd_rows_kernel    Forward "rows"    mean first, then the centred sum of
                                                   squares (_normalise_tile); short 16-bit
                                                   rows summed about x[0] (SHIFTED_MAX_N)
    layernorm_fwd_loop_kernel    Forward "loop"    both sums about the first block's mean
                                                   (16-bit rows: the first LOOP_HEAD values')
    layernorm_fwd_split_kernel   Forward "split"   both sums about the first HEAD values'
                                                   mean, exchanged in pairs
    layernorm_bwd_rows_kernel    Backward "rows"   mean(g) beside mean(x_hat * g); dB's
                                                   partial row beside dW's
    layernorm_bwd_pieces_kernel  Backward "pieces" the same, in HEAD + TAIL columns
    layernorm_bwd_split_kernel   Backward "split"  both sums exchanged
    layernorm_bwd_loop_kernel    Backward "loop"   both sums, two passes over the row
    layernorm_bwd_columns_kernel Backward "columns" both sums, over every row in every
                                                   program; dB's columns beside dW's

Flags of their own: HAS_BIAS, and STORE_STATS (the autograd forward saves mean and rstd)
where RMSNorm has STORE_RSTD; two choices are made inside the rows kernel from BLOCK_N and
x's dtype, not by the plan (PARAMS_FIRST_MAX_N, SHIFTED_MAX_N, below). Read the shifted
sums' argument above before `_stats_from_shifted`, then the forward kernels in the order
rows, loop, split.
"""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
import triton
import triton.language as tl

from solutions.kernels.column_sums import partial_rows, summed, summer
from solutions.kernels.kept_backward import KeptPlans, Source, keep_node
from solutions.kernels.kept_backward import usable as kept_paths_usable
from solutions.kernels.launch import backward_plan, forward_plan
from solutions.kernels.launch_plans import BackwardPlan, ForwardPlan, stated_multiple_of
from solutions.kernels.ready_launch import launch_key, ready_launch
from solutions.kernels.row_loads import (
    bias_or_zeros,
    columns_in_row,
    load_row_piece,
    load_rows,
    load_x_dy,
    rows_in_tile,
    rows_of_program,
    stated_multiples,
    store_rows,
    take_prefetched,
    weights_or_ones,
)
from solutions.kernels.sibling_sync import exchange_slots, publish, wait_for_pairs
from solutions.kernels.validation import (
    as_rows,
    check_eps,
    check_param,
    check_path_runs_here,
    check_same_rows,
    row_statistic,
)


@triton.jit
def _affine(y, w_ptr, b_ptr, cols, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    # Plain loads: asked to keep them (evict_last), the long rows of the loop and split
    # paths, which read the row a second time here, ran slower (float32 at 4096 x 32768:
    # 87.7 % of copy against 95.1 %; not profiled further)
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _normalise_tile(x, mask, N, eps):
    """(x - mean) * rstd per row of a float32 tile, with mean and rstd."""
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)  # centred before squaring: no cancellation
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    return xc * rstd[:, None], mean, rstd


@triton.jit
def _normalise_tile_about(x, shift, mask, N, eps):
    """_normalise_tile in one pass: the sums of d = x - shift and of d^2 are independent,
    so a warp's two trees of shuffles overlap instead of the second waiting on the mean."""
    d = _deviations(x, mask, shift[:, None])
    mean, rstd = _stats_from_shifted(tl.sum(d, axis=1), tl.sum(d * d, axis=1), shift, N, eps)
    return (d - (mean - shift)[:, None]) * rstd[:, None], mean, rstd


@triton.jit
def _store_layernorm_rows(x_hat, mean, rstd, rows, r64, mask, cols, w, b, y_ptr, mean_ptr,
                          rstd_ptr, row_mask, stride_y_row, STORE_STATS: tl.constexpr,
                          STREAM: tl.constexpr = False):
    """Apply w and b (float32) to a normalised tile of whole rows and store it (and the
    statistics); STREAM: y streamed out."""
    if STORE_STATS:
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    y = x_hat * w[None, :] + b[None, :]
    store_rows(y_ptr + r64 * stride_y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask,
               STREAM=STREAM)


# Rows kernel: the longest rows whose weight and bias are loaded before x (see below).
PARAMS_FIRST_MAX_N = tl.constexpr(4096)
# Rows kernel: the longest 16-bit rows summed in one pass about the row's first value (see
# below).
SHIFTED_MAX_N = tl.constexpr(512)


@triton.jit
def layernorm_fwd_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
                              M, N, stride_x_row, stride_y_row, eps,
                              HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                              STORE_STATS: tl.constexpr, PREFETCH: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr,
                              STREAM: tl.constexpr = False, EVEN: tl.constexpr = False,
                              WEIGHT_AFTER: tl.constexpr = False):
    # As rmsnorm_fwd_rows_kernel: without PREFETCH program p normalises row tile p in
    # straight-line code; with it, P programs take tiles p, p + P, ... and load the next
    # tile before normalising this one. STREAM (one tile a program only), as there: x
    # loaded evict-first, y streamed out. WEIGHT_AFTER (w and b loaded after the
    # reduction) and EVEN, as there.
    N, stride_x_row, stride_y_row, _, _ = stated_multiples(
        N, stride_x_row, stride_y_row, 0, 0, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = columns_in_row(cols, N, EVEN=EVEN)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    r64 = rows.to(tl.int64)[:, None]
    row_mask = rows_in_tile(rows, M, EVEN=EVEN)
    mask = row_mask[:, None] & col_mask[None, :]
    # Short rows load w and b first, kept in L2, so their loads fly beside x's (32768 x
    # 512: 83.7 and 84.0 % of copy in two runs, against 82.7 and 82.6 % loading them after
    # the reduction without evict_last). Long rows load them after the reduction: held
    # through it, rows of 32768 on 32 warps spilled more (65.6 % against 96.3 %).
    params_first: tl.constexpr = BLOCK_N <= PARAMS_FIRST_MAX_N and not PREFETCH and not WEIGHT_AFTER
    if params_first:
        w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
        b = bias_or_zeros(b_ptr, cols, col_mask, HAS_BIAS=HAS_BIAS)
    # Short 16-bit rows are summed about their first value, K = x[row, 0] (module
    # docstring): (mean - K)^2 <= N * var, so at most log2(1 + 512) = 9 of float32's 24
    # bits cancel, and 15 remain for an output that keeps 8 or 11. The two sums no longer
    # wait on each other: on the rule's plans, against the mean first, bf16 32768 x 256
    # gained 1.1 and 0.4 points of copy each call alone and 1.3 and 0.9 back to back (two
    # trials of eight rounds); 512, 0.7 and 0.1, and 0.4 and 0.5. Rows of 1024 and 2048,
    # reduced across warps, measured level or slower.
    shifted: tl.constexpr = (BLOCK_N <= SHIFTED_MAX_N
                             and x_ptr.dtype.element_ty.primitive_bitwidth == 16)
    if not PREFETCH:
        x = load_rows(x_ptr + r64 * stride_x_row + cols[None, :], mask, STREAM=STREAM)
        if shifted:
            first = tl.load(x_ptr + rows.to(tl.int64) * stride_x_row, mask=row_mask,
                            other=0.0)
            x_hat, mean, rstd = _normalise_tile_about(x.to(tl.float32), first.to(tl.float32),
                                                      mask, N, eps)
        else:
            x_hat, mean, rstd = _normalise_tile(x.to(tl.float32), mask, N, eps)
        if not params_first:
            w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
            b = bias_or_zeros(b_ptr, cols, col_mask, HAS_BIAS=HAS_BIAS)
        _store_layernorm_rows(x_hat, mean, rstd, rows, r64, mask, cols, w, b, y_ptr,
                              mean_ptr, rstd_ptr, row_mask, stride_y_row,
                              STORE_STATS=STORE_STATS, STREAM=STREAM)
    else:
        n_programs = tl.num_programs(0)
        x_next = tl.load(x_ptr + r64 * stride_x_row + cols[None, :], mask=mask, other=0.0)
        for tile in range(pid, tl.cdiv(M, BLOCK_M), n_programs):
            rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            r64 = rows.to(tl.int64)[:, None]
            row_mask = rows_in_tile(rows, M, EVEN=EVEN)
            mask = row_mask[:, None] & col_mask[None, :]
            x = x_next.to(tl.float32)
            ahead = (tile + n_programs) * BLOCK_M + tl.arange(0, BLOCK_M)
            x_next = tl.load(x_ptr + ahead.to(tl.int64)[:, None] * stride_x_row
                             + cols[None, :], mask=(ahead < M)[:, None] & col_mask[None, :],
                             other=0.0)
            x_hat, mean, rstd = _normalise_tile(x, mask, N, eps)
            # A tile at a time: held across the loop they measured 68.2 and 68.9 % of copy
            # at 32768 x 256; a tile at a time 70.3 and 71.6 % (plain loads), 70.9 and 71.1 %
            # (evict_last, before the reduction)
            w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
            b = bias_or_zeros(b_ptr, cols, col_mask, HAS_BIAS=HAS_BIAS)
            _store_layernorm_rows(x_hat, mean, rstd, rows, r64, mask, cols, w, b, y_ptr,
                                  mean_ptr, rstd_ptr, row_mask, stride_y_row,
                                  STORE_STATS=STORE_STATS)


# The split path's shift: the mean of a row's first HEAD values; the loop path's, for 16-bit
# rows, of its first LOOP_HEAD, one warp's loads (module docstring;
# docs/launch-rules.md#layernorm-loop-shift).
HEAD = 256
LOOP_HEAD = tl.constexpr(32)


@triton.jit
def _row_shift(x_row_ptr, N, HEAD: tl.constexpr, EVEN: tl.constexpr = False):
    """The mean of a row's first min(N, HEAD) values (EVEN: HEAD <= N, no mask)."""
    head = tl.arange(0, HEAD)
    values = tl.load(x_row_ptr + head, mask=columns_in_row(head, N, EVEN=EVEN),
                     other=0.0).to(tl.float32)
    return tl.sum(values, axis=0) / tl.minimum(N, HEAD)


@triton.jit
def _load_to_read_again(x_ptr, cols, mask):
    """A block pass 2 will read again (L1 and L2 are asked to keep it), in float32."""
    return tl.load(x_ptr + cols, mask=mask, other=0.0,
                   eviction_policy="evict_last").to(tl.float32)


@triton.jit
def _deviations(x, mask, shift):
    """x - shift over a float32 block, 0 where masked off."""
    return tl.where(mask, x - shift, 0.0)


@triton.jit
def _sums_about(x, mask, shift):
    """sum(x - shift) and sum((x - shift)^2) over a float32 block."""
    d = _deviations(x, mask, shift)
    return tl.sum(d, axis=0), tl.sum(d * d, axis=0)


@triton.jit
def _add_pairs(a, a2, b, b2):
    return a + b, a2 + b2


@triton.jit
def _sums_about_at_once(x, mask, shift):
    """_sums_about in one reduction across warps instead of two; the split path's, measured
    faster there (docs/launch-rules.md#layernorm-split-even). GPU only: the interpreter adds
    a reduction of its own up value by value in float32, less precisely than tl.sum."""
    d = _deviations(x, mask, shift)
    return tl.reduce((d, d * d), 0, _add_pairs)


@triton.jit
def _shifted_sums(x_ptr, cols, mask, shift):
    """_sums_about a block, loaded to be read again."""
    return _sums_about(_load_to_read_again(x_ptr, cols, mask), mask, shift)


@triton.jit
def _stats_from_shifted(sum_d, sum_d2, shift, N, eps):
    mean_d = sum_d / N
    var = tl.maximum(sum_d2 / N - mean_d * mean_d, 0.0)
    return shift + mean_d, tl.rsqrt(var + eps)


@triton.jit
def _normalise_again(x_row_ptr, w_ptr, b_ptr, y_row_ptr, cols, mask, mean, rstd,
                     HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Pass 2 of the loop and split paths: read a block again (from L1 or L2, for the last
    time) and store it normalised."""
    x = tl.load(x_row_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    y = _affine((x.to(tl.float32) - mean) * rstd, w_ptr, b_ptr, cols, mask, HAS_WEIGHT=HAS_WEIGHT,
                HAS_BIAS=HAS_BIAS)
    tl.store(y_row_ptr + cols, y.to(y_row_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["epoch"])
def layernorm_fwd_split_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
                               slots_ptr, epoch, M, N, stride_x_row, stride_y_row, eps,
                               HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                               STORE_STATS: tl.constexpr, HEAD: tl.constexpr,
                               RELOAD: tl.constexpr, SPLIT: tl.constexpr,
                               BLOCK_N: tl.constexpr, OUT_BLOCK: tl.constexpr,
                               EVEN: tl.constexpr, MULTIPLE: tl.constexpr):
    # As rmsnorm_fwd_split_kernel: program p owns BLOCK_N columns of row p // SPLIT. Every
    # program of a row computes the same shift, publishes its two shifted sums, and once the
    # row's sums are in reads its columns again (RELOAD) or normalises what it kept in
    # registers (pass 2 then reads only the weight and bias from L2). EVEN: the row is
    # SPLIT * BLOCK_N columns exactly, so no access needs a mask.
    N, stride_x_row, stride_y_row, _, _ = stated_multiples(
        N, stride_x_row, stride_y_row, 0, 0, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    row = (pid // SPLIT).to(tl.int64)
    part = pid % SPLIT
    x_row = x_ptr + row * stride_x_row
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = columns_in_row(cols, N, EVEN=EVEN)
    if RELOAD:
        x = _load_to_read_again(x_row, cols, mask)
    else:
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    # after x's load is issued: the shift's sum waits for its own load
    shift = _row_shift(x_row, N, HEAD=HEAD)
    sum_d, sum_d2 = _sums_about_at_once(x, mask, shift)
    slots = slots_ptr + row * (2 * SPLIT)
    publish(slots + 2 * part, sum_d, epoch)
    publish(slots + 2 * part + 1, sum_d2, epoch)
    total_d, total_d2 = wait_for_pairs(slots, epoch, SPLIT=SPLIT)
    mean, rstd = _stats_from_shifted(total_d, total_d2, shift, N, eps)
    if STORE_STATS:
        if part == 0:
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, rstd)
    if RELOAD:
        for start in range(0, BLOCK_N, OUT_BLOCK):
            out_cols = part * BLOCK_N + start + tl.arange(0, OUT_BLOCK)
            _normalise_again(x_row, w_ptr, b_ptr, y_ptr + row * stride_y_row, out_cols,
                             columns_in_row(out_cols, N, EVEN=EVEN), mean, rstd,
                             HAS_WEIGHT=HAS_WEIGHT,
                             HAS_BIAS=HAS_BIAS)
    else:
        y = _affine((x - mean) * rstd, w_ptr, b_ptr, cols, mask, HAS_WEIGHT=HAS_WEIGHT,
                    HAS_BIAS=HAS_BIAS)
        tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_fwd_loop_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
                              M, N, stride_x_row, stride_y_row, eps,
                              HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                              STORE_STATS: tl.constexpr,
                              BLOCK_N: tl.constexpr, OUT_BLOCK: tl.constexpr,
                              ROW_BLOCKS: tl.constexpr, EVEN: tl.constexpr,
                              MULTIPLE: tl.constexpr):
    # As rmsnorm_fwd_loop_kernel: programs walk over rows (or, ROW_BLOCKS > 0, take one row
    # in that many blocks, unrolled, summed lane by lane; EVEN: no masks); pass 1 sums
    # BLOCK_N columns at once, keeping nothing, about a shift (the mean of the first block,
    # or of the first LOOP_HEAD values for 16-bit rows); pass 2 reads the row again.
    N, stride_x_row, stride_y_row, _, _ = stated_multiples(
        N, stride_x_row, stride_y_row, 0, 0, MULTIPLE=MULTIPLE)
    ONE_ROW: tl.constexpr = ROW_BLOCKS > 0
    HEAD_N: tl.constexpr = LOOP_HEAD if LOOP_HEAD < BLOCK_N else BLOCK_N
    first_row, end, step = rows_of_program(M, ONE_ROW=ONE_ROW)
    for row in range(first_row, end, step):
        x_row = x_ptr + row * stride_x_row
        first = tl.arange(0, BLOCK_N)
        in_row = columns_in_row(first, N, EVEN=EVEN)
        x = _load_to_read_again(x_row, first, in_row)
        if x_ptr.dtype.element_ty.primitive_bitwidth == 16:  # within the first block
            shift = _row_shift(x_row, N, HEAD=HEAD_N, EVEN=EVEN)
        else:
            shift = tl.sum(x, axis=0) / tl.minimum(N, BLOCK_N)
        if ROW_BLOCKS > 1:
            d = _deviations(x, in_row, shift)
            lanes_d, lanes_d2 = d, d * d
            for start in tl.static_range(BLOCK_N, ROW_BLOCKS * BLOCK_N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                in_row = columns_in_row(cols, N, EVEN=EVEN)
                d = _deviations(_load_to_read_again(x_row, cols, in_row), in_row, shift)
                lanes_d += d
                lanes_d2 += d * d
            sum_d, sum_d2 = tl.sum(lanes_d, axis=0), tl.sum(lanes_d2, axis=0)
        else:
            sum_d, sum_d2 = _sums_about(x, in_row, shift)
            if not ONE_ROW:
                for start in range(BLOCK_N, N, BLOCK_N):
                    cols = start + tl.arange(0, BLOCK_N)
                    block_d, block_d2 = _shifted_sums(x_row, cols, cols < N, shift)
                    sum_d += block_d
                    sum_d2 += block_d2
        mean, rstd = _stats_from_shifted(sum_d, sum_d2, shift, N, eps)
        if STORE_STATS:
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, rstd)
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


# Launches kept by the layouts of (x, weight, bias) and store_stats (ready_launch.py), and the
# kernels' arguments that each call fills in.
_READY_FORWARDS: dict = {}
_FORWARD_PER_CALL = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "mean_ptr", "rstd_ptr", "eps")


def _forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
             eps: float, store_stats: bool, plan: ForwardPlan | None):
    """Launch the forward; returns (y, mean or None, rstd or None)."""
    key = launch_key(x, weight, bias, store_stats) if plan is None else None
    ready = _READY_FORWARDS.get(key)
    if ready is not None:  # these layouts were checked, planned and compiled before
        y = torch.empty_like(x)  # contiguous: x's rows are either contiguous or spaced apart
        mean, rstd = (torch.empty((2, *x.shape[:-1]), dtype=torch.float32, device=x.device)
                      if store_stats else (None, None))
        ready.run(x, y if weight is None else weight, y if bias is None else bias, y,
                  y if mean is None else mean, y if rstd is None else rstd, check_eps(eps))
        return y, mean, rstd
    x2 = as_rows(x)
    check_param(x, weight, "weight")
    check_param(x, bias, "bias")
    eps = check_eps(eps)
    M, N = x2.shape
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    stats = (torch.empty((2, M), dtype=torch.float32, device=x.device) if store_stats
             else None)
    if M > 0:
        plan = plan or forward_plan(M, N, x.device, element_size=x.element_size(),
                                    layernorm=True)
        mean_arg = stats[0] if stats is not None else y
        rstd_arg = stats[1] if stats is not None else y
        args = (x2, weight if weight is not None else y, bias if bias is not None else y, y,
                mean_arg, rstd_arg, M, N, x2.stride(0), y.stride(0), eps)
        flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                     STORE_STATS=store_stats,
                     MULTIPLE=stated_multiple_of(N, x2.stride(0), y.stride(0)),
                     **plan.launch_options())
        grid = plan.grid(M, N)
        if plan.path == "rows":
            kernel = layernorm_fwd_rows_kernel
            flags |= dict(PREFETCH=plan.prefetch, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                          STREAM=plan.stream, WEIGHT_AFTER=plan.weight_after_sum,
                          **plan.rows_even(M, N))
        elif plan.path == "split":
            check_path_runs_here(plan.path, x.device, plan.split)
            slots, epoch = exchange_slots(2 * M * plan.split, x.device)
            kernel, args = layernorm_fwd_split_kernel, (*args[:6], slots, epoch, *args[6:])
            flags |= dict(HEAD=HEAD, RELOAD=plan.reload, SPLIT=plan.split,
                          BLOCK_N=plan.block_n, OUT_BLOCK=plan.out_block,
                          EVEN=plan.split_even(N))
        else:
            kernel = layernorm_fwd_loop_kernel
            flags |= dict(BLOCK_N=plan.block_n, OUT_BLOCK=plan.out_block,
                          **plan.row_blocks(N))
        compiled = kernel[grid](*args, **flags)
        # kept where a later call can launch the same way: not a split (its exchange slots
        # change every call), and x viewed as rows, not copied
        if key is not None and plan.path != "split" and x2.data_ptr() == x.data_ptr():
            _READY_FORWARDS[key] = ready_launch(compiled, kernel, grid, args, flags,
                                                _FORWARD_PER_CALL)
    lead = x.shape[:-1]
    if stats is None:
        return y.view(x.shape), None, None
    return y.view(x.shape), stats[0].view(lead), stats[1].view(lead)


@triton.jit
def layernorm_bwd_rows_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                              M, N, stride_x_row, stride_dy_row, stride_dx_row,
                              rows_per_program, stride_partial_set,
                              HAS_WEIGHT: tl.constexpr, SUM_EACH_STEP: tl.constexpr,
                              PREFETCH: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr):
    # As rmsnorm_bwd_rows_kernel (SUM_EACH_STEP, PREFETCH likewise), with the two sums
    # LayerNorm's dx needs and dB's partial row beside dW's.
    N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    if SUM_EACH_STEP:
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    else:
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, M)
    if PREFETCH:
        x_next, dy_next = load_x_dy(x_ptr, dy_ptr, first, last, cols, col_mask,
                                    stride_x_row, stride_dy_row, BLOCK_M=BLOCK_M)
    for start in range(first, last, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < last
        mask = row_mask[:, None] & col_mask[None, :]
        r64 = rows.to(tl.int64)[:, None]
        if PREFETCH:
            x, dy, x_next, dy_next = take_prefetched(x_ptr, dy_ptr, x_next, dy_next, start,
                                                     last, cols, col_mask, stride_x_row,
                                                     stride_dy_row, BLOCK_M=BLOCK_M)
        else:
            x, dy = load_x_dy(x_ptr, dy_ptr, start, last, cols, col_mask, stride_x_row,
                              stride_dy_row, BLOCK_M=BLOCK_M)
            x = x.to(tl.float32)
            dy = dy.to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        mean_g = tl.sum(g, axis=1) / N
        mean_xg = tl.sum(x_hat * g, axis=1) / N
        dx = (g - mean_g[:, None] - x_hat * mean_xg[:, None]) * rstd[:, None]
        tl.store(dx_ptr + r64 * stride_dx_row + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
                 mask=mask)
        if SUM_EACH_STEP:
            dw_acc += tl.sum(dy * x_hat, axis=0)
            db_acc += tl.sum(dy, axis=0)
        else:
            dw_acc += dy * x_hat
            db_acc += dy
    out = partial_ptr + pid.to(tl.int64) * N + cols
    partial_type = partial_ptr.dtype.element_ty  # float32, or the parameters' for one program
    tl.store(out, _over_rows(dw_acc, SUMMED=SUM_EACH_STEP).to(partial_type), mask=col_mask)
    tl.store(out + stride_partial_set, _over_rows(db_acc, SUMMED=SUM_EACH_STEP).to(partial_type),
             mask=col_mask)


@triton.jit
def layernorm_bwd_pieces_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                                M, N, stride_x_row, stride_dy_row, stride_dx_row,
                                rows_per_program, stride_partial_set,
                                HAS_WEIGHT: tl.constexpr, HEAD: tl.constexpr,
                                TAIL: tl.constexpr, MULTIPLE: tl.constexpr):
    # As rmsnorm_bwd_pieces_kernel: each row as HEAD columns and TAIL more, one row a step,
    # the next row's loads first; with LayerNorm's two sums, and dB's sums beside dW's.
    N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    head = tl.arange(0, HEAD)
    tail = HEAD + tl.arange(0, TAIL)
    head_mask = head < N  # all true; a mask of the tail's form, for the row test
    tail_mask = tail < N
    w_head = weights_or_ones(w_ptr, head, head_mask, HAS_WEIGHT=HAS_WEIGHT)
    w_tail = weights_or_ones(w_ptr, tail, tail_mask, HAS_WEIGHT=HAS_WEIGHT)
    dw_head = tl.zeros([HEAD], dtype=tl.float32)
    dw_tail = tl.zeros([TAIL], dtype=tl.float32)
    db_head = tl.zeros([HEAD], dtype=tl.float32)
    db_tail = tl.zeros([TAIL], dtype=tl.float32)
    first = pid.to(tl.int64) * rows_per_program  # the loop's row is then 64-bit too
    last = tl.minimum(first + rows_per_program, M)
    x_head_next, dy_head_next = load_row_piece(x_ptr, dy_ptr, first, last, head, head_mask,
                                               stride_x_row, stride_dy_row)
    x_tail_next, dy_tail_next = load_row_piece(x_ptr, dy_ptr, first, last, tail, tail_mask,
                                               stride_x_row, stride_dy_row)
    for row in range(first, last):
        x_head = x_head_next.to(tl.float32)
        dy_head = dy_head_next.to(tl.float32)
        x_tail = x_tail_next.to(tl.float32)
        dy_tail = dy_tail_next.to(tl.float32)
        x_head_next, dy_head_next = load_row_piece(x_ptr, dy_ptr, row + 1, last, head,
                                                   head_mask, stride_x_row, stride_dy_row)
        x_tail_next, dy_tail_next = load_row_piece(x_ptr, dy_ptr, row + 1, last, tail,
                                                   tail_mask, stride_x_row, stride_dy_row)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        # Past N, x_hat is -mean * rstd, not 0; dy and so g are 0 there, so nothing of it
        # reaches the sums, and its dx is not stored.
        x_hat_head = (x_head - mean) * rstd
        x_hat_tail = (x_tail - mean) * rstd
        g_head = dy_head * w_head
        g_tail = dy_tail * w_tail
        mean_g = (tl.sum(g_head, axis=0) + tl.sum(g_tail, axis=0)) / N
        mean_xg = (tl.sum(x_hat_head * g_head, axis=0) + tl.sum(x_hat_tail * g_tail, axis=0)) / N
        dx_row = dx_ptr + row * stride_dx_row
        tl.store(dx_row + head, ((g_head - mean_g - x_hat_head * mean_xg) * rstd).to(
            dx_ptr.dtype.element_ty))
        tl.store(dx_row + tail, ((g_tail - mean_g - x_hat_tail * mean_xg) * rstd).to(
            dx_ptr.dtype.element_ty), mask=tail_mask)
        dw_head += dy_head * x_hat_head
        dw_tail += dy_tail * x_hat_tail
        db_head += dy_head
        db_tail += dy_tail
    out = partial_ptr + pid.to(tl.int64) * N
    partial_type = partial_ptr.dtype.element_ty  # float32, or the parameters' for one program
    tl.store(out + head, dw_head.to(partial_type))
    tl.store(out + tail, dw_tail.to(partial_type), mask=tail_mask)
    tl.store(out + stride_partial_set + head, db_head.to(partial_type))
    tl.store(out + stride_partial_set + tail, db_tail.to(partial_type), mask=tail_mask)


@triton.jit
def _over_rows(acc, SUMMED: tl.constexpr):
    """A program's partial row: its per-row accumulators added up, unless already summed."""
    # One return: Triton 3.9 compiles a return inside a constexpr branch beside another
    # return as two return types and refuses the kernel (3.6 accepted it).
    if SUMMED:
        row = acc
    else:
        row = tl.sum(acc, axis=0)
    return row


@triton.jit
def layernorm_bwd_loop_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                              M, N, stride_x_row, stride_dy_row, stride_dx_row,
                              rows_per_program, stride_partial_set,
                              HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
                              MULTIPLE: tl.constexpr):
    # As rmsnorm_bwd_loop_kernel, with the two sums LayerNorm's dx needs.
    N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    dw_partial = partial_ptr + pid.to(tl.int64) * N
    db_partial = dw_partial + stride_partial_set
    first = pid.to(tl.int64) * rows_per_program  # the loop's row is then 64-bit too
    last = tl.minimum(first + rows_per_program, M)
    for row in range(first, last):
        r64 = row
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_xg = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_ptr + r64 * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(dy_ptr + r64 * stride_dy_row + cols, mask=mask,
                        other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            acc_g += g
            acc_xg += tl.where(mask, (x - mean) * rstd, 0.0) * g
        mean_g = tl.sum(acc_g, axis=0) / N
        mean_xg = tl.sum(acc_xg, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_ptr + r64 * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + r64 * stride_dy_row + cols, mask=mask,
                         other=0.0).to(tl.float32)
            x_hat = tl.where(mask, (x - mean) * rstd, 0.0)
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            dx = (g - mean_g - x_hat * mean_xg) * rstd
            tl.store(dx_ptr + r64 * stride_dx_row + cols, dx.to(dx_ptr.dtype.element_ty),
                     mask=mask)
            tl.store(dw_partial + cols, tl.load(dw_partial + cols, mask=mask) + dy * x_hat,
                     mask=mask)
            tl.store(db_partial + cols, tl.load(db_partial + cols, mask=mask) + dy, mask=mask)


@triton.jit(do_not_specialize=["epoch"])
def layernorm_bwd_split_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                               slots_ptr, epoch,
                               M, N, stride_x_row, stride_dy_row, stride_dx_row,
                               rows_per_group, stride_partial_set,
                               HAS_WEIGHT: tl.constexpr, SPLIT: tl.constexpr,
                               BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr):
    # As rmsnorm_bwd_split_kernel, exchanging both sums LayerNorm's dx needs.
    N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    group = pid // SPLIT
    part = pid % SPLIT
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    first = group.to(tl.int64) * rows_per_group
    last = tl.minimum(first + rows_per_group, M)
    x_next = tl.load(x_ptr + first * stride_x_row + cols, mask=col_mask & (first < last),
                     other=0.0)
    dy_next = tl.load(dy_ptr + first * stride_dy_row + cols, mask=col_mask & (first < last),
                      other=0.0)
    for row in range(first, last):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        x_hat = tl.where(col_mask, (x - mean) * rstd, 0.0)
        g = dy * w
        slots = slots_ptr + row * (2 * SPLIT)
        publish(slots + 2 * part, tl.sum(g, axis=0), epoch)
        publish(slots + 2 * part + 1, tl.sum(x_hat * g, axis=0), epoch)
        following = row + 1
        x_next = tl.load(x_ptr + following * stride_x_row + cols,
                         mask=col_mask & (following < last), other=0.0)
        dy_next = tl.load(dy_ptr + following * stride_dy_row + cols,
                          mask=col_mask & (following < last), other=0.0)
        sum_g, sum_xg = wait_for_pairs(slots, epoch, SPLIT=SPLIT)
        dx = (g - sum_g / N - x_hat * (sum_xg / N)) * rstd
        tl.store(dx_ptr + row * stride_dx_row + cols, dx.to(dx_ptr.dtype.element_ty),
                 mask=col_mask)
        dw_acc += dy * x_hat
        db_acc += dy
    out = partial_ptr + group.to(tl.int64) * N + cols
    partial_type = partial_ptr.dtype.element_ty  # float32, or the parameters' for one group
    tl.store(out, dw_acc.to(partial_type), mask=col_mask)
    tl.store(out + stride_partial_set, db_acc.to(partial_type), mask=col_mask)


@triton.jit
def layernorm_bwd_columns_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                                 M, N, stride_x_row, stride_dy_row, stride_dx_row,
                                 stride_partial_set,
                                 HAS_WEIGHT: tl.constexpr, COLUMNS: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 MULTIPLE: tl.constexpr):
    # As rmsnorm_bwd_columns_kernel: each program sums both of LayerNorm's sums over every
    # whole row itself (the same order in every program), stores its columns of dx, and
    # writes its columns of dW and dB in the parameters' dtype.
    N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, stride_partial_set, MULTIPLE=MULTIPLE)
    rows = tl.arange(0, BLOCK_M)
    mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_xg = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        block = start + tl.arange(0, BLOCK_N)
        x, dy = load_x_dy(x_ptr, dy_ptr, 0, M, block, block < N, stride_x_row, stride_dy_row,
                          BLOCK_M=BLOCK_M)
        w = weights_or_ones(w_ptr, block, block < N, HAS_WEIGHT=HAS_WEIGHT)
        g = dy.to(tl.float32) * w[None, :]  # 0 past N and M, where x_hat is not
        acc_g += g
        acc_xg += (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * g
    mean_g = tl.sum(acc_g, axis=1) / N
    mean_xg = tl.sum(acc_xg, axis=1) / N
    cols = tl.program_id(0) * COLUMNS + tl.arange(0, COLUMNS)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    x, dy = load_x_dy(x_ptr, dy_ptr, 0, M, cols, col_mask, stride_x_row, stride_dy_row,
                      BLOCK_M=BLOCK_M)
    x_hat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
    dy = dy.to(tl.float32)
    w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    dx = (dy * w[None, :] - mean_g[:, None] - x_hat * mean_xg[:, None]) * rstd[:, None]
    tl.store(dx_ptr + rows.to(tl.int64)[:, None] * stride_dx_row + cols[None, :],
             dx.to(dx_ptr.dtype.element_ty), mask=mask)
    out = partial_ptr + cols
    tl.store(out, tl.sum(dy * x_hat, axis=0).to(partial_ptr.dtype.element_ty), mask=col_mask)
    tl.store(out + stride_partial_set, tl.sum(dy, axis=0).to(partial_ptr.dtype.element_ty),
             mask=col_mask)


# Launches kept by the layouts of (x, weight, mean, rstd, dy) and the parameters' dtype
# (ready_launch.py), with the shape and dtype of their partial sums and what adds those up
# (column_sums.summer); the first kernel's arguments that each call fills in.
_READY_BACKWARDS: dict = {}
_BACKWARD_PER_CALL = ("x_ptr", "w_ptr", "dy_ptr", "mean_ptr", "rstd_ptr", "dx_ptr",
                      "partial_ptr")


def layernorm_backward(x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                       rstd: torch.Tensor, dy: torch.Tensor, param_dtype: torch.dtype | None = None,
                       plan: BackwardPlan | None = None):
    """(dx, dw, db) for y = layernorm(x, weight, bias) given the forward's saved statistics.
    dw and db take `param_dtype` (the parameters' dtype; x's when there are none)."""
    key = launch_key(x, weight, mean, rstd, dy, param_dtype) if plan is None else None
    kept = _READY_BACKWARDS.get(key)
    if kept is not None:  # these layouts were checked, planned and compiled before
        ready, partials_shape, partials_dtype, sum_up = kept
        dx = torch.empty_like(x)  # contiguous, as in _forward
        partials = torch.empty(partials_shape, dtype=partials_dtype, device=x.device)
        ready.run(x, dx if weight is None else weight, dy, mean, rstd, dx, partials)
        sums = sum_up(partials)
        return dx, sums[0], sums[1]
    x2 = as_rows(x)
    dy2 = check_same_rows(x, dy, "dy")
    check_param(x, weight, "weight")
    M, N = x2.shape
    mean2 = row_statistic(mean, M, "mean")
    rstd2 = row_statistic(rstd, M, "rstd")
    param_dtype = param_dtype or (weight.dtype if weight is not None else x.dtype)
    dx = torch.empty_like(x2, memory_format=torch.contiguous_format)
    if M == 0:
        zeros = torch.zeros(2, N, dtype=param_dtype, device=x.device)
        return dx.view(x.shape), zeros[0], zeros[1]
    plan = plan or backward_plan(M, N, x.device, dtype=x.dtype, layernorm=True)
    check_path_runs_here(plan.path, x.device, plan.split)
    rows_per_program = plan.rows_per_program(M)
    programs = triton.cdiv(M, rows_per_program)  # row groups, for the split path
    partials = partial_rows(2, programs, N, param_dtype, x.device, zeros=plan.path == "loop")
    args = (x2, weight if weight is not None else dx, dy2, mean2, rstd2, dx, partials, M, N,
            x2.stride(0), dy2.stride(0), dx.stride(0), rows_per_program, partials.stride(0))
    flags = dict(HAS_WEIGHT=weight is not None,
                 MULTIPLE=stated_multiple_of(N, x2.stride(0), dy2.stride(0), dx.stride(0),
                                             partials.stride(0)))
    grid = (programs,)
    if plan.path == "rows":
        kernel = layernorm_bwd_rows_kernel
        flags |= dict(SUM_EACH_STEP=plan.sum_each_step, PREFETCH=plan.prefetch,
                      BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=plan.num_warps,
                      num_stages=plan.num_stages)
    elif plan.path == "pieces":
        kernel = layernorm_bwd_pieces_kernel
        flags |= dict(HEAD=plan.block_n, TAIL=plan.tail_for(N), num_warps=plan.num_warps)
    elif plan.path == "columns":  # one row of sums (rows_per_program is M), a part each
        kernel, args = layernorm_bwd_columns_kernel, (*args[:12], args[13])
        grid = plan.column_grid(M, N)
        flags |= dict(COLUMNS=plan.columns, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                      num_warps=plan.num_warps)
    elif plan.path == "split":
        slots, epoch = exchange_slots(2 * M * plan.split, x.device)
        kernel, args = layernorm_bwd_split_kernel, (*args[:7], slots, epoch, *args[7:])
        grid = (programs * plan.split,)
        flags |= dict(SPLIT=plan.split, BLOCK_N=plan.block_n, **plan.launch_options())
    else:
        kernel = layernorm_bwd_loop_kernel
        flags |= dict(BLOCK_N=plan.block_n, num_warps=plan.num_warps)
    compiled = kernel[grid](*args, **flags)
    sums = summed(partials, param_dtype)
    # kept where a later call can launch the same way (plan.replayable), with x, dy and the
    # statistics viewed as rows, not copied; with the column sums' launch (kept by `summed`)
    if (key is not None and plan.replayable
            and all(a.data_ptr() == b.data_ptr()
                    for a, b in ((x2, x), (dy2, dy), (mean2, mean), (rstd2, rstd)))):
        _READY_BACKWARDS[key] = (ready_launch(compiled, kernel, grid, args, flags,
                                              _BACKWARD_PER_CALL),
                                 partials.shape, partials.dtype, summer(partials, param_dtype))
    return dx.view(x.shape), sums[0], sums[1]


def layernorm(x: torch.Tensor, weight: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension; differentiable (see LayerNormFunction)."""
    if torch.is_grad_enabled() and (x.requires_grad  # (no generator: this runs every call)
                                    or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        # y's grad_fn a C++ node, where a plan is kept for these layouts
        y = _KEPT_PLANS.forward(x, weight, bias, check_eps(eps)) if kept_paths_usable() else None
        return y if y is not None else LayerNormFunction.apply(x, weight, bias, eps)
    return _forward(x, weight, bias, eps, False, None)[0]


class LayerNormFunction(torch.autograd.Function):
    """y = layernorm(x, weight, bias, eps); saves mean and rstd (8 bytes a row)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = _forward(x, weight, bias, eps, True, None)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.param_dtype = (weight.dtype if weight is not None
                           else bias.dtype if bias is not None else x.dtype)
        ctx.bias = bias  # its layout is part of a plan's key (kept for a second backward too)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        dx, dw, db = layernorm_backward(x, weight, mean, rstd, dy, ctx.param_dtype)
        # Keyed by x as it was saved (a saved-tensor hook may give back a copy laid out
        # otherwise), as are the launches the plan takes
        bias = ctx.bias
        if not _KEPT_PLANS.has(x, weight, bias):  # (once kept, nothing to look up)
            keep_node(_KEPT_PLANS, inputs=(x, weight, bias),
                      forward=_READY_FORWARDS.get(launch_key(x, weight, bias, True)),
                      backward=_READY_BACKWARDS.get(
                          launch_key(x, weight, mean, rstd, dy, ctx.param_dtype)),
                      saved=(x, weight, mean, rstd), dy=dy, sources=_NODE_SOURCES,
                      sums_dtype=ctx.param_dtype, fallback=_python_backward(ctx.param_dtype),
                      name="LayerNormBackward (kept_backward.cpp)")
        dw = dw if weight is not None and ctx.needs_input_grad[1] else None
        db = db if bias is not None and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


# Plans of the forward with grads on and its backward node, in C++ (kept_backward.py), by
# the layouts of x, the weight and the bias: what layernorm runs once a layout's backward
# has kept its launches. Where the per-call arguments of the forward (_FORWARD_PER_CALL)
# and the backward (_BACKWARD_PER_CALL) come from: x, the parameters (or the launch's
# stand-in), y, the row's mean and rstd, eps; the gradient, dx, the partial rows. Another
# gradient's layout goes to Python.
_KEPT_PLANS = KeptPlans()
_NODE_SOURCES = ((Source.X, Source.WEIGHT, Source.BIAS, Source.Y, Source.STAT0, Source.STAT1,
                  Source.EPS),
                 (Source.X, Source.WEIGHT, Source.GRAD, Source.STAT0, Source.STAT1, Source.DX,
                  Source.PARTIALS))


def _python_backward(param_dtype: torch.dtype):
    def backward(x, weight, mean, rstd, dy):
        return layernorm_backward(x, weight, mean, rstd, dy.contiguous(), param_dtype)
    return backward
