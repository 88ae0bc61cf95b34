"""RMSNorm, forward and backward, and the fused residual add + RMSNorm forward: the tuned
kernels.

    y = x * rstd * w,   rstd = 1 / sqrt(mean(x**2) + eps)   per row of the last dimension

Statistics are accumulated in float32 whatever the input dtype; outputs take x's dtype.

Backward (per row, x_hat = x * rstd, g = dy * w):

    dx = rstd * (g - x_hat * mean(x_hat * g))        dw = sum over rows of dy * x_hat

dw is summed deterministically: each program of the first kernel adds up its own rows into
one float32 row of partial sums, and `column_sums` adds those rows in a fixed order (a lone
program writes dw itself, in the weight's dtype: `column_sums.partial_rows`; so do the
columns path's programs, each its own columns of every row).

Reading guide. Read `plain_rmsnorm.py` first: the same arithmetic, one row a program, one
path. Everything here is that, specialised per shape. Eight kernels; the launch plan that
`launch.py` makes for a shape picks one by its `path` and sets most of its flags:

    kernel                     plan.path         what it is for
    rmsnorm_fwd_rows_kernel    Forward "rows"    BLOCK_M whole rows held in registers
    rmsnorm_fwd_loop_kernel    Forward "loop"    rows too long for registers: pass 1 sums
                                                 squares, pass 2 reads the row again (L2)
    rmsnorm_fwd_split_kernel   Forward "split"   longer still: SPLIT programs share a row
                                                 and exchange their sums (sibling_sync.py)
    rmsnorm_bwd_rows_kernel    Backward "rows"   BLOCK_M rows a step, the dW sums in registers
    rmsnorm_bwd_pieces_kernel  Backward "pieces" 16-bit rows between two powers of two, held
                                                 as HEAD + TAIL columns (no idle lanes)
    rmsnorm_bwd_split_kernel   Backward "split"  long rows, SPLIT programs a row (GPU only)
    rmsnorm_bwd_loop_kernel    Backward "loop"   long rows where split cannot run
    rmsnorm_bwd_columns_kernel Backward "columns" a few rows (decode): a program owns
                                                 COLUMNS columns of every row and writes
                                                 dW itself (no column sums)

The flags, and the plan fields that set them (ForwardPlan, BackwardPlan, and Variant, the
one thing a forward plan does beyond its path's plain kernel: launch_plans.py):

    BLOCK_M, BLOCK_N, SPLIT   plan.block_m, plan.block_n, plan.split (and plan.num_warps)
    PREFETCH                  plan.prefetch: the next tile's loads issued before this
                              tile's arithmetic
    STREAM                    plan.stream: evict-first loads, streaming stores
    WEIGHT_AFTER              plan.weight_after_sum: the weight loaded after the sum
    EVEN                      plan.rows_even(M, N), plan.row_blocks(N): no masks where the
                              rows fill their blocks
    ROW_BLOCKS                plan.row_blocks(N): a Variant.ONE_ROW loop-path row, blocks
                              unrolled
    OUT_BLOCK                 plan.out_block: columns a pass-2 step writes
    RELOAD                    plan.reload: read the row again rather than keep it
    SUM_EACH_STEP             plan.sum_each_step: dW added over each step's rows at once
    HEAD, TAIL                plan.block_n, plan.tail_for(N)
    COLUMNS                   plan.columns: the columns a columns-path program owns
    from the call             HAS_RESIDUAL (add_rmsnorm), HAS_WEIGHT, STORE_RSTD (the
                              autograd forward), MULTIPLE (launch_plans.stated_multiple_of: what
                              N and the strides are multiples of, for 16-byte loads)

Then, in order: `rmsnorm_fwd_rows_kernel` with every flag off (the plain kernel, BLOCK_M rows
at a time), `_forward` (how a plan becomes a launch), `rmsnorm_bwd_rows_kernel` and
`rmsnorm_backward` with `column_sums.py`, and the other paths as the rules of
`launch.FORWARD_RULES` and `launch.BACKWARD_RULES` (the measured ones in plans/h100.json
first) send shapes to them. `row_loads.py` holds the load and store helpers every kernel
calls; `ready_launch.py` how a second call with the same layouts skips straight to the
launch.
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
from solutions.kernels.sibling_sync import exchange_slots, publish, wait_for_partials
from solutions.kernels.validation import (
    as_rows,
    check_eps,
    check_param,
    check_path_runs_here,
    check_same_rows,
    row_statistic,
)

# --------------------------------------------------------------------------- forward kernels


@triton.jit
def _load_row_block(x_ptr, res_ptr, res_out_ptr, offsets_x, offsets_res, offsets_res_out, mask,
                    HAS_RESIDUAL: tl.constexpr, READ_AGAIN: tl.constexpr = False,
                    STREAM: tl.constexpr = False):
    """x (plus the residual, rounded to the stored dtype and written back) in float32.
    READ_AGAIN: x will be read a second time, so L1 and L2 are asked to keep it.
    STREAM: read once and written once, so the caches may drop every line first."""
    if READ_AGAIN:
        x = tl.load(x_ptr + offsets_x, mask=mask, other=0.0, eviction_policy="evict_last")
    else:
        x = load_rows(x_ptr + offsets_x, mask, STREAM=STREAM)
    r = x
    if HAS_RESIDUAL:
        r = load_rows(res_ptr + offsets_res, mask, STREAM=STREAM)
    return _add_residual(x, r, res_out_ptr, offsets_res_out, mask, HAS_RESIDUAL=HAS_RESIDUAL,
                         STREAM=STREAM)


@triton.jit
def _row_block_to_read_again(x_ptr, res_ptr, res_out_ptr, r64, cols, mask, stride_x_row,
                             stride_res_row, stride_res_out_row, HAS_RESIDUAL: tl.constexpr):
    """_load_row_block for columns `cols` of row r64, which pass 2 reads again (the loop
    and split paths)."""
    return _load_row_block(x_ptr, res_ptr, res_out_ptr, r64 * stride_x_row + cols,
                           r64 * stride_res_row + cols, r64 * stride_res_out_row + cols, mask,
                           HAS_RESIDUAL=HAS_RESIDUAL, READ_AGAIN=True)


@triton.jit
def _add_residual(x, r, res_out_ptr, offsets_res_out, mask, HAS_RESIDUAL: tl.constexpr,
                  STREAM: tl.constexpr = False):
    x = x.to(tl.float32)
    if HAS_RESIDUAL:
        # Round the sum once, store it, and normalise what was stored: the next layer
        # reads the rounded residual, so y must be the norm of that same value.
        h = (x + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        store_rows(res_out_ptr + offsets_res_out, h, mask, STREAM=STREAM)
        x = h.to(tl.float32)
    return x


@triton.jit
def _store_normalised_rows(x, rows, r64, mask, w, cols, y_ptr, rstd_ptr, row_mask, N,
                           stride_y_row, eps, w_ptr, col_mask, HAS_WEIGHT: tl.constexpr,
                           STORE_RSTD: tl.constexpr, STREAM: tl.constexpr,
                           WEIGHT_HERE: tl.constexpr):
    """Normalise a float32 tile of whole rows and store it (and rstd). WEIGHT_HERE: the
    weight is loaded here, after the sum (`w` is unused). STREAM: y is streamed out."""
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    if STORE_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    y = x * rstd[:, None]
    if WEIGHT_HERE:
        w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    if HAS_WEIGHT:
        y = y * w[None, :]
    store_rows(y_ptr + r64 * stride_y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask,
               STREAM=STREAM)


@triton.jit
def rmsnorm_fwd_rows_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, rstd_ptr,
                            M, N, stride_x_row, stride_res_row, stride_y_row,
                            stride_res_out_row, eps,
                            HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                            STORE_RSTD: tl.constexpr, PREFETCH: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr,
                            STREAM: tl.constexpr = False, EVEN: tl.constexpr = False,
                            WEIGHT_AFTER: tl.constexpr = False):
    # Without PREFETCH, program p handles row tile p, in straight-line code: a loop around
    # it, even of one turn, measured 1 to 4 points slower on short rows. With PREFETCH,
    # P programs walk over tiles p, p + P, ... and issue the next tile's loads before this
    # tile's arithmetic, so that few programs still keep memory requests in flight.
    # STREAM (one tile a program only): the rows are read and written with evict-first
    # hints (Variant.STREAM; docs/launch-rules.md#streamed-rows says where). WEIGHT_AFTER
    # (one tile a program only, ForwardPlan.weight_after_sum): the weight is loaded after
    # the sum.
    # EVEN (ForwardPlan.rows_even): the rows fill the block and M the tiles, so no masks.
    N, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row = stated_multiples(
        N, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = columns_in_row(cols, N, EVEN=EVEN)
    weight_here: tl.constexpr = WEIGHT_AFTER and not PREFETCH
    w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT and not weight_here)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    r64 = rows.to(tl.int64)[:, None]  # row * stride can pass 2**31 elements
    row_mask = rows_in_tile(rows, M, EVEN=EVEN)
    mask = row_mask[:, None] & col_mask[None, :]
    if not PREFETCH:
        x = _load_row_block(x_ptr, res_ptr, res_out_ptr, r64 * stride_x_row + cols[None, :],
                            r64 * stride_res_row + cols[None, :],
                            r64 * stride_res_out_row + cols[None, :], mask,
                            HAS_RESIDUAL=HAS_RESIDUAL,
                            STREAM=STREAM)
        _store_normalised_rows(x, rows, r64, mask, w, cols, y_ptr, rstd_ptr, row_mask, N,
                               stride_y_row, eps, w_ptr, col_mask, HAS_WEIGHT=HAS_WEIGHT,
                               STORE_RSTD=STORE_RSTD, STREAM=STREAM, WEIGHT_HERE=weight_here)
    else:
        n_programs = tl.num_programs(0)
        x_next = tl.load(x_ptr + r64 * stride_x_row + cols[None, :], mask=mask, other=0.0)
        res_next = x_next
        if HAS_RESIDUAL:
            res_next = tl.load(res_ptr + r64 * stride_res_row + cols[None, :], mask=mask,
                               other=0.0)
        for tile in range(pid, tl.cdiv(M, BLOCK_M), n_programs):
            rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            r64 = rows.to(tl.int64)[:, None]
            row_mask = rows_in_tile(rows, M, EVEN=EVEN)
            mask = row_mask[:, None] & col_mask[None, :]
            x_raw = x_next
            res_raw = res_next
            ahead = (tile + n_programs) * BLOCK_M + tl.arange(0, BLOCK_M)
            a64 = ahead.to(tl.int64)[:, None]
            ahead_mask = (ahead < M)[:, None] & col_mask[None, :]
            x_next = tl.load(x_ptr + a64 * stride_x_row + cols[None, :], mask=ahead_mask,
                             other=0.0)
            if HAS_RESIDUAL:
                res_next = tl.load(res_ptr + a64 * stride_res_row + cols[None, :],
                                   mask=ahead_mask, other=0.0)
            x = _add_residual(x_raw, res_raw, res_out_ptr,
                              r64 * stride_res_out_row + cols[None, :], mask,
                              HAS_RESIDUAL=HAS_RESIDUAL)
            _store_normalised_rows(x, rows, r64, mask, w, cols, y_ptr, rstd_ptr, row_mask, N,
                                   stride_y_row, eps, w_ptr, col_mask, HAS_WEIGHT=HAS_WEIGHT,
                                   STORE_RSTD=STORE_RSTD, STREAM=False, WEIGHT_HERE=False)


@triton.jit
def _normalise_again(src_ptr, w_ptr, y_ptr, cols, mask, rstd, HAS_WEIGHT: tl.constexpr):
    """Pass 2 of the loop and split paths: read a block of the row again (from L1 or L2,
    and for the last time) and store its normalised values."""
    x = tl.load(src_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    y = x.to(tl.float32) * rstd
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rmsnorm_fwd_loop_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, rstd_ptr,
                            M, N, stride_x_row, stride_res_row, stride_y_row,
                            stride_res_out_row, eps,
                            HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                            STORE_RSTD: tl.constexpr, BLOCK_N: tl.constexpr,
                            OUT_BLOCK: tl.constexpr, ROW_BLOCKS: tl.constexpr,
                            EVEN: tl.constexpr, MULTIPLE: tl.constexpr):
    # Programs walk over rows (one per SM on a GPU), or take one row each. Pass 1 loads
    # BLOCK_N columns at once, the whole row when it fits, and keeps nothing but the sum of
    # squares: the loads are all in flight together, which is what keeps HBM busy. Pass 2
    # reads the row again, mostly from L1 or L2, where pass 1 asked it to stay.
    # ROW_BLOCKS > 0 (Variant.ONE_ROW): a program has one row, in ROW_BLOCKS blocks of
    # BLOCK_N columns. Both passes are then unrolled, so the compiler can issue their loads
    # together, and pass 1 sums squares lane by lane, across threads once (0.1 to 0.5 point
    # of copy faster at most lengths; docs/launch-rules.md#one-row-loop says where). EVEN:
    # no masks.
    N, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row = stated_multiples(
        N, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, MULTIPLE=MULTIPLE)
    ONE_ROW: tl.constexpr = ROW_BLOCKS > 0
    first_row, end, step = rows_of_program(M, ONE_ROW=ONE_ROW)
    for r64 in range(first_row, end, step):
        if ONE_ROW:
            cols = tl.arange(0, BLOCK_N)
            x = _row_block_to_read_again(x_ptr, res_ptr, res_out_ptr, r64, cols,
                                         columns_in_row(cols, N, EVEN=EVEN), stride_x_row,
                                         stride_res_row, stride_res_out_row,
                                         HAS_RESIDUAL=HAS_RESIDUAL)
            squares = x * x
            for start in tl.static_range(BLOCK_N, ROW_BLOCKS * BLOCK_N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                x = _row_block_to_read_again(x_ptr, res_ptr, res_out_ptr, r64, cols,
                                             columns_in_row(cols, N, EVEN=EVEN), stride_x_row,
                                             stride_res_row, stride_res_out_row,
                                             HAS_RESIDUAL=HAS_RESIDUAL)
                squares += x * x
            sum_sq = tl.sum(squares, axis=0)
        else:
            sum_sq = 0.0
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                x = _row_block_to_read_again(x_ptr, res_ptr, res_out_ptr, r64, cols, cols < N,
                                             stride_x_row, stride_res_row, stride_res_out_row,
                                             HAS_RESIDUAL=HAS_RESIDUAL)
                sum_sq += tl.sum(x * x, axis=0)
        rstd = tl.rsqrt(sum_sq / N + eps)
        if STORE_RSTD:
            tl.store(rstd_ptr + r64, rstd)
        if HAS_RESIDUAL:
            src_ptr = res_out_ptr + r64 * stride_res_out_row
            tl.debug_barrier()  # pass 2's threads read sums that other threads stored
        else:
            src_ptr = x_ptr + r64 * stride_x_row
        y_row_ptr = y_ptr + r64 * stride_y_row
        if ONE_ROW:
            for start in tl.static_range(0, ROW_BLOCKS * BLOCK_N, OUT_BLOCK):
                cols = start + tl.arange(0, OUT_BLOCK)
                _normalise_again(src_ptr, w_ptr, y_row_ptr, cols,
                                 columns_in_row(cols, N, EVEN=EVEN), rstd,
                                 HAS_WEIGHT=HAS_WEIGHT)
        else:
            for start in range(0, N, OUT_BLOCK):
                cols = start + tl.arange(0, OUT_BLOCK)
                _normalise_again(src_ptr, w_ptr, y_row_ptr, cols, cols < N, rstd,
                                 HAS_WEIGHT=HAS_WEIGHT)


@triton.jit(do_not_specialize=["epoch"])
def rmsnorm_fwd_split_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, rstd_ptr,
                             slots_ptr, epoch,
                             M, N, stride_x_row, stride_res_row, stride_y_row,
                             stride_res_out_row, eps,
                             HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                             STORE_RSTD: tl.constexpr, RELOAD: tl.constexpr,
                             SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                             OUT_BLOCK: tl.constexpr, EVEN: tl.constexpr,
                             MULTIPLE: tl.constexpr):
    # Program p owns BLOCK_N columns of row p // SPLIT, loaded at once. The SPLIT programs of
    # a row exchange their sums of squares (sibling_sync.py says why this cannot deadlock),
    # then each reads its columns again (RELOAD) or normalises what it kept in registers.
    # EVEN: the row is SPLIT * BLOCK_N columns exactly, so no access needs a mask.
    N, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row = stated_multiples(
        N, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    row = (pid // SPLIT).to(tl.int64)
    part = pid % SPLIT
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = columns_in_row(cols, N, EVEN=EVEN)
    x = _row_block_to_read_again(x_ptr, res_ptr, res_out_ptr, row, cols, mask, stride_x_row,
                                 stride_res_row, stride_res_out_row, HAS_RESIDUAL=HAS_RESIDUAL)
    publish(slots_ptr + row * SPLIT + part, tl.sum(x * x, axis=0), epoch)
    partials = wait_for_partials(slots_ptr + row * SPLIT, epoch, COUNT=SPLIT)
    rstd = tl.rsqrt(tl.sum(partials, axis=0) / N + eps)
    if STORE_RSTD:
        if part == 0:
            tl.store(rstd_ptr + row, rstd)
    if RELOAD:
        if HAS_RESIDUAL:
            src_ptr = res_out_ptr + row * stride_res_out_row
            tl.debug_barrier()  # the reads below cross threads' stores above
        else:
            src_ptr = x_ptr + row * stride_x_row
        for start in range(0, BLOCK_N, OUT_BLOCK):
            out_cols = part * BLOCK_N + start + tl.arange(0, OUT_BLOCK)
            _normalise_again(src_ptr, w_ptr, y_ptr + row * stride_y_row, out_cols,
                             columns_in_row(out_cols, N, EVEN=EVEN), rstd,
                             HAS_WEIGHT=HAS_WEIGHT)
    else:
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


# Launches kept by the layouts of (x, weight, residual) and store_rstd (ready_launch.py),
# and the kernels' arguments that each call fills in.
_READY_FORWARDS: dict = {}
_FORWARD_PER_CALL = ("x_ptr", "res_ptr", "w_ptr", "y_ptr", "res_out_ptr", "rstd_ptr", "eps")


def _forward(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             residual: torch.Tensor | None, store_rstd: bool, plan: ForwardPlan | None):
    """Launch the forward; returns (y, residual_out or None, rstd or None), shaped like x."""
    key = launch_key(x, weight, residual, store_rstd) if plan is None else None
    ready = _READY_FORWARDS.get(key)
    if ready is not None:  # these layouts were checked, planned and compiled before
        y = torch.empty_like(x)  # contiguous: x's rows are either contiguous or spaced apart
        res_out = torch.empty_like(y) if residual is not None else None
        rstd = (torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
                if store_rstd else None)
        ready.run(x, y if residual is None else residual, y if weight is None else weight, y,
                  y if res_out is None else res_out, y if rstd is None else rstd,
                  check_eps(eps))
        return y, res_out, rstd
    x2 = as_rows(x)
    check_param(x, weight, "weight")
    eps = check_eps(eps)
    M, N = x2.shape
    res2 = check_same_rows(x, residual, "residual") if residual is not None else None
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    res_out = torch.empty_like(y) if residual is not None else None
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if store_rstd else None
    if M > 0:
        plan = plan or forward_plan(M, N, x.device, element_size=x.element_size(),
                                    residual=residual is not None)
        dummy = y  # stands in for pointers a constexpr flag switches off
        args = (x2, res2 if res2 is not None else dummy,
                weight if weight is not None else dummy, y,
                res_out if res_out is not None else dummy, rstd if rstd is not None else dummy)
        strides = (x2.stride(0), res2.stride(0) if res2 is not None else 0, y.stride(0),
                   res_out.stride(0) if res_out is not None else 0)
        flags = dict(HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
                     STORE_RSTD=store_rstd, MULTIPLE=stated_multiple_of(N, *strides),
                     **plan.launch_options())
        grid = plan.grid(M, N)
        if plan.path == "rows":
            kernel, args = rmsnorm_fwd_rows_kernel, (*args, M, N, *strides, eps)
            flags |= dict(PREFETCH=plan.prefetch, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                          STREAM=plan.stream, WEIGHT_AFTER=plan.weight_after_sum,
                          **plan.rows_even(M, N))
        elif plan.path == "split":
            check_path_runs_here(plan.path, x.device, plan.split)
            slots, epoch = exchange_slots(M * plan.split, x.device)
            kernel, args = rmsnorm_fwd_split_kernel, (*args, slots, epoch, M, N, *strides, eps)
            flags |= dict(RELOAD=plan.reload, SPLIT=plan.split, BLOCK_N=plan.block_n,
                          OUT_BLOCK=plan.out_block, EVEN=plan.split_even(N))
        else:
            kernel, args = rmsnorm_fwd_loop_kernel, (*args, M, N, *strides, eps)
            flags |= dict(BLOCK_N=plan.block_n, OUT_BLOCK=plan.out_block,
                          **plan.row_blocks(N))
        compiled = kernel[grid](*args, **flags)
        # kept where a later call can launch the same way: not a split (its exchange slots
        # change every call), and x and the residual viewed as rows, not copied
        if (key is not None and plan.path != "split" and x2.data_ptr() == x.data_ptr()
                and (res2 is None or res2.data_ptr() == residual.data_ptr())):
            _READY_FORWARDS[key] = ready_launch(compiled, kernel, grid, args, flags,
                                                _FORWARD_PER_CALL)
    shape = x.shape
    return (y.view(shape), res_out.view(shape) if res_out is not None else None,
            rstd.view(shape[:-1]) if rstd is not None else None)


# --------------------------------------------------------------------------- backward kernels


@triton.jit
def rmsnorm_bwd_rows_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
                            M, N, stride_x_row, stride_dy_row, stride_dx_row, rows_per_program,
                            HAS_WEIGHT: tl.constexpr, RELOAD: tl.constexpr,
                            SUM_EACH_STEP: tl.constexpr, PREFETCH: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr):
    # With RELOAD (long rows, one program per SM), x, dy and w are read again for dx rather
    # than kept across the row's reduction: only the dW sums stay in registers, and the
    # first loads of a row can all be in flight at once. With PREFETCH, the next step's x
    # and dy are loaded before this step's arithmetic, so a program's loads stay in flight
    # while it reduces.
    N, stride_x_row, stride_dy_row, stride_dx_row, _ = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, 0, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if not RELOAD:
        w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    if SUM_EACH_STEP:  # add each tile's rows up at once: BLOCK_N sums, not BLOCK_M x BLOCK_N
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    else:
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
        x_at = x_ptr + r64 * stride_x_row + cols[None, :]
        dy_at = dy_ptr + r64 * stride_dy_row + cols[None, :]
        if RELOAD:
            w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
            x = tl.load(x_at, mask=mask, other=0.0, eviction_policy="evict_last")
            dy = tl.load(dy_at, mask=mask, other=0.0, eviction_policy="evict_last")
        elif PREFETCH:
            x, dy, x_next, dy_next = take_prefetched(x_ptr, dy_ptr, x_next, dy_next, start,
                                                     last, cols, col_mask, stride_x_row,
                                                     stride_dy_row, BLOCK_M=BLOCK_M)
        else:
            x = tl.load(x_at, mask=mask, other=0.0)
            dy = tl.load(dy_at, mask=mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x_hat = x * rstd[:, None]
        g = dy * w[None, :]
        c = tl.sum(x_hat * g, axis=1) / N
        if RELOAD:
            w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
            x = tl.load(x_at, mask=mask, other=0.0, eviction_policy="evict_first")
            dy = tl.load(dy_at, mask=mask, other=0.0, eviction_policy="evict_first")
            dy = dy.to(tl.float32)
            x_hat = x.to(tl.float32) * rstd[:, None]
            g = dy * w[None, :]
        dx = (g - x_hat * c[:, None]) * rstd[:, None]
        tl.store(dx_ptr + r64 * stride_dx_row + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
                 mask=mask)
        if SUM_EACH_STEP:
            dw_acc += tl.sum(dy * x_hat, axis=0)
        else:
            dw_acc += dy * x_hat
    if not SUM_EACH_STEP:
        dw_acc = tl.sum(dw_acc, axis=0)
    tl.store(dw_partial_ptr + pid.to(tl.int64) * N + cols,
             dw_acc.to(dw_partial_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def rmsnorm_bwd_pieces_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
                              M, N, stride_x_row, stride_dy_row, stride_dx_row,
                              rows_per_program, HAS_WEIGHT: tl.constexpr, HEAD: tl.constexpr,
                              TAIL: tl.constexpr, MULTIPLE: tl.constexpr):
    # Rows between two powers of two, held as two pieces: HEAD columns (a power of two,
    # at most N) and TAIL more (the power of two that covers the rest). A row of 5120 in
    # one block of 8192 leaves 37 % of the lanes loading, multiplying and summing nothing;
    # as 4096 + 1024 none do. One row a step, the next row's loads issued before this
    # row's arithmetic.
    N, stride_x_row, stride_dy_row, stride_dx_row, _ = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, 0, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    head = tl.arange(0, HEAD)
    tail = HEAD + tl.arange(0, TAIL)
    head_mask = head < N  # all true; a mask of the tail's form, for the row test
    tail_mask = tail < N
    w_head = weights_or_ones(w_ptr, head, head_mask, HAS_WEIGHT=HAS_WEIGHT)
    w_tail = weights_or_ones(w_ptr, tail, tail_mask, HAS_WEIGHT=HAS_WEIGHT)
    dw_head = tl.zeros([HEAD], dtype=tl.float32)
    dw_tail = tl.zeros([TAIL], dtype=tl.float32)
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
        rstd = tl.load(rstd_ptr + row)
        x_hat_head = x_head * rstd
        x_hat_tail = x_tail * rstd
        g_head = dy_head * w_head
        g_tail = dy_tail * w_tail
        c = (tl.sum(x_hat_head * g_head, axis=0) + tl.sum(x_hat_tail * g_tail, axis=0)) / N
        dx_row = dx_ptr + row * stride_dx_row
        tl.store(dx_row + head, ((g_head - x_hat_head * c) * rstd).to(dx_ptr.dtype.element_ty))
        tl.store(dx_row + tail, ((g_tail - x_hat_tail * c) * rstd).to(dx_ptr.dtype.element_ty),
                 mask=tail_mask)
        dw_head += dy_head * x_hat_head
        dw_tail += dy_tail * x_hat_tail
    partial = dw_partial_ptr + pid.to(tl.int64) * N
    tl.store(partial + head, dw_head.to(dw_partial_ptr.dtype.element_ty))
    tl.store(partial + tail, dw_tail.to(dw_partial_ptr.dtype.element_ty), mask=tail_mask)


@triton.jit
def rmsnorm_bwd_loop_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
                            M, N, stride_x_row, stride_dy_row, stride_dx_row, rows_per_program,
                            HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
                            MULTIPLE: tl.constexpr):
    # Rows too long for registers: per row, one pass for mean(x_hat * g) and a second (from
    # L2, mostly) for dx. The program's dW partial row lives in its own slice of the
    # workspace (zeroed by the caller), so no other program ever touches it.
    N, stride_x_row, stride_dy_row, stride_dx_row, _ = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, 0, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    partial = dw_partial_ptr + pid.to(tl.int64) * N
    first = pid.to(tl.int64) * rows_per_program  # the loop's row is then 64-bit too
    last = tl.minimum(first + rows_per_program, M)
    for row in range(first, last):
        r64 = row
        rstd = tl.load(rstd_ptr + row)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_ptr + r64 * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + r64 * stride_dy_row + cols, mask=mask,
                         other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                dy = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            acc += x * dy
        c = tl.sum(acc, axis=0) * rstd / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            x_hat = tl.load(x_ptr + r64 * stride_x_row + cols, mask=mask,
                            other=0.0).to(tl.float32) * rstd
            dy = tl.load(dy_ptr + r64 * stride_dy_row + cols, mask=mask,
                         other=0.0).to(tl.float32)
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            dx = (g - x_hat * c) * rstd
            tl.store(dx_ptr + r64 * stride_dx_row + cols, dx.to(dx_ptr.dtype.element_ty),
                     mask=mask)
            dw = tl.load(partial + cols, mask=mask, other=0.0)
            tl.store(partial + cols, dw + dy * x_hat, mask=mask)


@triton.jit(do_not_specialize=["epoch"])
def rmsnorm_bwd_split_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
                             slots_ptr, epoch,
                             M, N, stride_x_row, stride_dy_row, stride_dx_row,
                             HAS_WEIGHT: tl.constexpr, SPLIT: tl.constexpr,
                             BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr):
    # Long rows: G groups of SPLIT programs; group g takes rows g, g + G, g + 2G, ... and
    # each of its programs owns BLOCK_N columns (its dW sums stay in registers). Step i
    # loads row i, publishes its part of sum(x_hat * g), and only then finishes row i - 1:
    # waits for that row's sums, which have had a whole row's loads to arrive, reads x and
    # dy again (from L1 or L2) and stores dx.
    N, stride_x_row, stride_dy_row, stride_dx_row, _ = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, 0, MULTIPLE=MULTIPLE)
    pid = tl.program_id(0)
    groups = tl.num_programs(0) // SPLIT
    group = pid // SPLIT
    part = pid % SPLIT
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    my_rows = tl.cdiv(M - group, groups)
    for i in range(0, my_rows + 1):
        row = (group + i * groups).to(tl.int64)
        if i < my_rows:
            x = tl.load(x_ptr + row * stride_x_row + cols, mask=col_mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=col_mask, other=0.0,
                         eviction_policy="evict_last").to(tl.float32)
            publish(slots_ptr + row * SPLIT + part, tl.sum(x * dy * w, axis=0), epoch)
        if i > 0:
            prev = row - groups
            rstd = tl.load(rstd_ptr + prev)
            # sum(x_hat * g) / N, with x_hat = x * rstd
            c = tl.sum(wait_for_partials(slots_ptr + prev * SPLIT, epoch, COUNT=SPLIT),
                       axis=0) * rstd / N
            x_hat = tl.load(x_ptr + prev * stride_x_row + cols, mask=col_mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32) * rstd
            dy = tl.load(dy_ptr + prev * stride_dy_row + cols, mask=col_mask, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)
            tl.store(dx_ptr + prev * stride_dx_row + cols,
                     ((dy * w - x_hat * c) * rstd).to(dx_ptr.dtype.element_ty), mask=col_mask)
            dw_acc += dy * x_hat
    tl.store(dw_partial_ptr + group.to(tl.int64) * N + cols,
             dw_acc.to(dw_partial_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def rmsnorm_bwd_columns_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
                               M, N, stride_x_row, stride_dy_row, stride_dx_row,
                               HAS_WEIGHT: tl.constexpr, COLUMNS: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               MULTIPLE: tl.constexpr):
    # A few rows (decode), all BLOCK_M of them at once: program p owns columns p * COLUMNS
    # ... of every row. It sums x_hat * g over the whole of every row itself, BLOCK_N
    # columns at a time from L2, in the same order as every other program (so all get the
    # same bits, with nothing exchanged), then stores its columns of dx, and of dW in the
    # weight's dtype: one launch, no column sums.
    N, stride_x_row, stride_dy_row, stride_dx_row, _ = stated_multiples(
        N, stride_x_row, stride_dy_row, stride_dx_row, 0, MULTIPLE=MULTIPLE)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        block = start + tl.arange(0, BLOCK_N)
        x, dy = load_x_dy(x_ptr, dy_ptr, 0, M, block, block < N, stride_x_row, stride_dy_row,
                          BLOCK_M=BLOCK_M)
        w = weights_or_ones(w_ptr, block, block < N, HAS_WEIGHT=HAS_WEIGHT)
        acc += x.to(tl.float32) * dy.to(tl.float32) * w[None, :]
    rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    c = tl.sum(acc, axis=1) * rstd / N  # mean(x_hat * g), a row each
    cols = tl.program_id(0) * COLUMNS + tl.arange(0, COLUMNS)
    col_mask = cols < N
    x, dy = load_x_dy(x_ptr, dy_ptr, 0, M, cols, col_mask, stride_x_row, stride_dy_row,
                      BLOCK_M=BLOCK_M)
    x_hat = x.to(tl.float32) * rstd[:, None]
    dy = dy.to(tl.float32)
    w = weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT=HAS_WEIGHT)
    dx = (dy * w[None, :] - x_hat * c[:, None]) * rstd[:, None]
    tl.store(dx_ptr + rows.to(tl.int64)[:, None] * stride_dx_row + cols[None, :],
             dx.to(dx_ptr.dtype.element_ty), mask=(rows < M)[:, None] & col_mask[None, :])
    tl.store(dw_partial_ptr + cols, tl.sum(dy * x_hat, axis=0).to(dw_partial_ptr.dtype.element_ty),
             mask=col_mask)


# Launches kept by the layouts of (x, weight, rstd, dy) (ready_launch.py), with the shape and
# dtype of their partial sums and what adds those up (column_sums.summer); the first
# kernel's arguments that each call fills in.
_READY_BACKWARDS: dict = {}
_BACKWARD_PER_CALL = ("x_ptr", "w_ptr", "dy_ptr", "rstd_ptr", "dx_ptr", "dw_partial_ptr")


def rmsnorm_backward(x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                     dy: torch.Tensor, plan: BackwardPlan | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, dw) for y = rmsnorm(x, weight) given the forward's saved float32 `rstd`."""
    key = launch_key(x, weight, rstd, dy) if plan is None else None
    kept = _READY_BACKWARDS.get(key)
    if kept is not None:  # these layouts were checked, planned and compiled before
        ready, partials_shape, partials_dtype, sums = kept
        dx = torch.empty_like(x)  # contiguous, as in _forward
        partials = torch.empty(partials_shape, dtype=partials_dtype, device=x.device)
        ready.run(x, dx if weight is None else weight, dy, rstd, dx, partials)
        return dx, sums(partials)[0] if weight is not None else None
    x2 = as_rows(x)
    dy2 = check_same_rows(x, dy, "dy")
    check_param(x, weight, "weight")
    M, N = x2.shape
    rstd2 = row_statistic(rstd, M, "rstd")
    dx = torch.empty_like(x2, memory_format=torch.contiguous_format)
    if M == 0:
        dw = torch.zeros_like(weight) if weight is not None else None
        return dx.view(x.shape), dw
    plan = plan or backward_plan(M, N, x.device, dtype=x.dtype)
    check_path_runs_here(plan.path, x.device, plan.split)
    rows_per_program = plan.rows_per_program(M)
    programs = triton.cdiv(M, rows_per_program)
    if plan.path == "split":  # groups take rows in turn: every group has at least one row
        programs = min(M, plan.programs)
    # (the columns path: one row of dW sums, which its programs write a part each of)
    partials = partial_rows(1, programs, N, x.dtype if weight is None else weight.dtype,
                            x.device, zeros=plan.path == "loop")
    w_arg = weight if weight is not None else dx
    common = (x2, w_arg, dy2, rstd2, dx, partials, M, N, x2.stride(0), dy2.stride(0),
              dx.stride(0), rows_per_program)
    flags = dict(HAS_WEIGHT=weight is not None,
                 MULTIPLE=stated_multiple_of(N, x2.stride(0), dy2.stride(0), dx.stride(0)))
    grid = (programs,)
    if plan.path == "rows":
        kernel, args = rmsnorm_bwd_rows_kernel, common
        flags |= dict(RELOAD=plan.reload, SUM_EACH_STEP=plan.sum_each_step,
                      PREFETCH=plan.prefetch, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                      num_warps=plan.num_warps, num_stages=plan.num_stages)
    elif plan.path == "pieces":
        kernel, args = rmsnorm_bwd_pieces_kernel, common
        flags |= dict(HEAD=plan.block_n, TAIL=plan.tail_for(N), num_warps=plan.num_warps)
    elif plan.path == "columns":
        kernel, args = rmsnorm_bwd_columns_kernel, common[:-1]
        grid = plan.column_grid(M, N)
        flags |= dict(COLUMNS=plan.columns, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                      num_warps=plan.num_warps)
    elif plan.path == "split":
        slots, epoch = exchange_slots(M * plan.split, x.device)
        kernel, args = rmsnorm_bwd_split_kernel, (*common[:6], slots, epoch, *common[6:-1])
        grid = (programs * plan.split,)
        flags |= dict(SPLIT=plan.split, BLOCK_N=plan.block_n, **plan.launch_options())
    else:
        kernel, args = rmsnorm_bwd_loop_kernel, common
        flags |= dict(BLOCK_N=plan.block_n, num_warps=plan.num_warps)
    compiled = kernel[grid](*args, **flags)
    dw = summed(partials, weight.dtype)[0] if weight is not None else None
    # kept where a later call can launch the same way (plan.replayable), with x, dy and rstd
    # viewed as rows, not copied; with the column sums' launch (kept by `summed` above)
    if (key is not None and plan.replayable
            and x2.data_ptr() == x.data_ptr() and dy2.data_ptr() == dy.data_ptr()
            and rstd2.data_ptr() == rstd.data_ptr()):
        _READY_BACKWARDS[key] = (ready_launch(compiled, kernel, grid, args, flags,
                                              _BACKWARD_PER_CALL),
                                 partials.shape, partials.dtype,
                                 summer(partials, weight.dtype) if weight is not None else None)
    return dx.view(x.shape), dw


# --------------------------------------------------------------------------- public API


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6
            ) -> torch.Tensor:
    """RMSNorm over the last dimension; differentiable (see RMSNormFunction)."""
    if torch.is_grad_enabled() and (x.requires_grad or
                                    (weight is not None and weight.requires_grad)):
        # y's grad_fn a C++ node, where a plan is kept for these layouts
        y = _KEPT_PLANS.forward(x, weight, None, check_eps(eps)) if kept_paths_usable() else None
        return y if y is not None else RMSNormFunction.apply(x, weight, eps)
    return _forward(x, weight, eps, None, False, None)[0]


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm, one launch: returns (rmsnorm(x + residual), x + residual),
    the sum rounded once to x's dtype. Forward only (inference)."""
    y, res_out, _ = _forward(x, weight, eps, residual, False, None)
    return y, res_out


class RMSNormFunction(torch.autograd.Function):
    """y = rmsnorm(x, weight, eps); the forward saves rstd (4 bytes a row) for the backward."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        y, _, rstd = _forward(x, weight, eps, None, True, None)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        dx, dw = rmsnorm_backward(x, weight, rstd, dy)
        # Keyed by x as it was saved (a saved-tensor hook may give back a copy laid out
        # otherwise), as are the launches the plan takes
        if not _KEPT_PLANS.has(x, weight, None):  # (once kept, nothing to look up)
            keep_node(_KEPT_PLANS, inputs=(x, weight),
                      forward=_READY_FORWARDS.get(launch_key(x, weight, None, True)),
                      backward=_READY_BACKWARDS.get(launch_key(x, weight, rstd, dy)),
                      saved=(x, weight, rstd), dy=dy, sources=_NODE_SOURCES,
                      sums_dtype=weight.dtype if weight is not None else x.dtype,
                      fallback=_python_backward, name="RMSNormBackward (kept_backward.cpp)")
        if weight is None or not ctx.needs_input_grad[1]:
            dw = None
        return dx, dw, None


# Plans of the forward with grads on and its backward node, in C++ (kept_backward.py), by
# the layouts of x and the weight: what rmsnorm runs once a layout's backward has kept its
# launches.
# Where the per-call arguments of the forward (_FORWARD_PER_CALL) and the backward
# (_BACKWARD_PER_CALL) come from: x, the weight (or the launch's stand-in), y, the row's
# rstd, eps; the gradient, dx, the partial rows. Another gradient's layout goes to Python.
_KEPT_PLANS = KeptPlans()
_NODE_SOURCES = ((Source.X, Source.Y, Source.WEIGHT, Source.Y, Source.Y, Source.STAT0, Source.EPS),
                 (Source.X, Source.WEIGHT, Source.GRAD, Source.STAT0, Source.DX, Source.PARTIALS))


def _python_backward(x, weight, rstd, dy):
    return rmsnorm_backward(x, weight, rstd, dy.contiguous())
