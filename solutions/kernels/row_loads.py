"""Triton helpers that both ops' kernels load their rows and parameters with, store rows
with, and pick a loop-path program's rows with."""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import triton
import triton.language as tl


@triton.jit
def stated_multiple(value, MULTIPLE: tl.constexpr):
    """`value`, which the launch checked is a multiple of MULTIPLE, in a form whose
    divisibility the compiler can see (a product with a constant). Triton notes by itself
    only which integer arguments are multiples of 16; without the rest, rows of 4104
    columns would be loaded two bytes at a time instead of sixteen."""
    return value // MULTIPLE * MULTIPLE


@triton.jit
def stated_multiples(n, stride_a, stride_b, stride_c, stride_d, MULTIPLE: tl.constexpr):
    """A row length and up to four row strides (0 for those a kernel has not), each
    through `stated_multiple`."""
    return (stated_multiple(n, MULTIPLE), stated_multiple(stride_a, MULTIPLE),
            stated_multiple(stride_b, MULTIPLE), stated_multiple(stride_c, MULTIPLE),
            stated_multiple(stride_d, MULTIPLE))


@triton.jit
def rows_of_program(M, ONE_ROW: tl.constexpr):
    """(first, end, step) of the rows a loop-path program takes, for `range`: every
    num_programs-th row from its own, or, ONE_ROW (Variant.ONE_ROW), its own row only,
    with bounds the compiler sees make one trip."""
    first = tl.program_id(0).to(tl.int64)
    if ONE_ROW:
        end, step = first + 1, 1
    else:
        end, step = M, tl.num_programs(0)
    return first, end, step


@triton.jit
def columns_in_row(cols, N, EVEN: tl.constexpr):
    """cols < N; or, EVEN (the launch checked that N is a multiple of the block), a mask
    the compiler sees is all true, so loads and stores carry none. LayerNorm at 8192 x
    10240 in five unrolled blocks of 2048 measured 96.7 % of copy unmasked, 90.9 % masked."""
    if EVEN:
        return tl.full(cols.shape, 1, tl.int1)
    return cols < N


@triton.jit
def rows_in_tile(rows, M, EVEN: tl.constexpr):
    """rows < M; or, EVEN (the launch checked that M is a multiple of the tile's rows), a
    mask the compiler sees is all true (see columns_in_row)."""
    if EVEN:
        return tl.full(rows.shape, 1, tl.int1)
    return rows < M


@triton.jit
def weights_or_ones(w_ptr, cols, col_mask, HAS_WEIGHT: tl.constexpr):
    """The weight's columns in float32, or ones (zeros past N) when there is no weight.
    Every program reads the same weights while the rows stream through L2, so L2 is asked
    to keep them (`evict_last`): LayerNorm at 32768 x 512, each call on its own rotating
    inputs, measured 1 to 2 points of copy faster for it (with the loads moved first).
    Weights read again beside a row's second read take plain loads (layernorm._affine)."""
    if HAS_WEIGHT:
        return tl.load(w_ptr + cols, mask=col_mask, other=0.0,
                       eviction_policy="evict_last").to(tl.float32)
    return tl.where(col_mask, 1.0, 0.0)


@triton.jit
def bias_or_zeros(b_ptr, cols, col_mask, HAS_BIAS: tl.constexpr):
    """The bias's columns in float32 (kept in L2 as the weights are), or zeros."""
    if HAS_BIAS:
        return tl.load(b_ptr + cols, mask=col_mask, other=0.0,
                       eviction_policy="evict_last").to(tl.float32)
    return tl.zeros(cols.shape, tl.float32)


@triton.jit
def load_rows(at, mask, STREAM: tl.constexpr):
    """Load a tile of rows as stored (0 where masked off). STREAM: read once, so the caches
    may drop its lines first (`evict_first`)."""
    if STREAM:
        return tl.load(at, mask=mask, other=0.0, eviction_policy="evict_first")
    return tl.load(at, mask=mask, other=0.0)


@triton.jit
def store_rows(at, values, mask, STREAM: tl.constexpr):
    """Store a tile of rows. STREAM: written once and not read again here, so it is
    streamed out (`.cs`: the caches may drop its lines first)."""
    if STREAM:
        tl.store(at, values, mask=mask, cache_modifier=".cs")
    else:
        tl.store(at, values, mask=mask)


@triton.jit
def load_x_dy(x_ptr, dy_ptr, start, last, cols, col_mask, stride_x_row, stride_dy_row,
              BLOCK_M: tl.constexpr):
    """x and dy of rows start .. start + BLOCK_M - 1 (those before `last`), as stored."""
    rows = start + tl.arange(0, BLOCK_M)
    mask = (rows < last)[:, None] & col_mask[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x_row + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(dy_ptr + r64 * stride_dy_row + cols[None, :], mask=mask, other=0.0)
    return x, dy


@triton.jit
def take_prefetched(x_ptr, dy_ptr, x_next, dy_next, start, last, cols, col_mask,
                    stride_x_row, stride_dy_row, BLOCK_M: tl.constexpr):
    """A step that loads ahead: this step's x and dy (loaded by the step before) in float32,
    and the next step's, whose loads are issued first so they fly during this step's math."""
    x_after, dy_after = load_x_dy(x_ptr, dy_ptr, start + BLOCK_M, last, cols, col_mask,
                                  stride_x_row, stride_dy_row, BLOCK_M)
    return x_next.to(tl.float32), dy_next.to(tl.float32), x_after, dy_after


@triton.jit
def load_row_piece(x_ptr, dy_ptr, row, last, cols, col_mask, stride_x_row, stride_dy_row):
    """x and dy of one row's columns `cols` (nothing when the row is `last` or beyond), as
    stored: the pieces path's loads, issued a row ahead."""
    # the row test as a tensor: the interpreter takes no scalar in a mask
    mask = col_mask & ((row + cols * 0) < last)
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=mask, other=0.0)
    return x, dy
