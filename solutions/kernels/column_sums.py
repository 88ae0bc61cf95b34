"""The second, small reduction of every backward: dW (and dB) as column sums of the float32
partial rows that the first kernel's programs wrote. A fixed order of additions, no atomics:
the same inputs give the same bits on every run.

Where the first kernel runs one program (a single row, as in decode), that program's row is
already the sum: `partial_rows` then asks it to write dW (and dB) in the parameters' dtype,
and no second launch is needed (one launch is most of a short backward's host cost)."""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
import triton
import triton.language as tl

from solutions.kernels.launch_plans import stated_multiple_of
from solutions.kernels.ready_launch import launch_key, ready_launch
from solutions.kernels.row_loads import stated_multiples

# Columns and partial rows one program sums per step.
SUM_COLUMNS = 16
SUM_ROWS = 1024


@triton.jit
def column_sums_kernel(partial_ptr, out_ptr, P, N, stride_partial_set, stride_out_set,
                       BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr):
    # axis 1 picks the set of partials (dW, or dB for LayerNorm): one launch for both
    N, stride_partial_set, stride_out_set, _, _ = stated_multiples(
        N, stride_partial_set, stride_out_set, 0, 0, MULTIPLE)
    which = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    base = partial_ptr + which * stride_partial_set
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(base + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask,
                       other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + which * stride_out_set + cols,
             total.to(out_ptr.dtype.element_ty), mask=col_mask)


def partial_rows(sets: int, programs: int, n: int, dtype: torch.dtype, device, *,
                 zeros: bool = False) -> torch.Tensor:
    """Where the first kernel's programs write their partial rows: (sets, programs, n) float32,
    or, for one program, (sets, n) in `dtype`: the sums themselves (`summed`). `zeros` for
    kernels that add into their row (the loop paths), which always get float32 rows."""
    if programs == 1 and not zeros:
        return torch.empty((sets, n), dtype=dtype, device=device)
    alloc = torch.zeros if zeros else torch.empty
    return alloc((sets, programs, n), dtype=torch.float32, device=device)


def summed(partials: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(sets, n) sums of what `partial_rows` gave: its rows as they are where one program
    wrote them, else their column sums."""
    return partials if partials.dim() == 2 else column_sums(partials, out_dtype)


def summer(partials: torch.Tensor, out_dtype: torch.dtype):
    """`summed` for partials of this one layout, its launch looked up once: for a wrapper
    that keeps its own launch, after a first `summed` of such partials (a lookup by layout
    costs host time every call)."""
    ready = _READY.get(launch_key(partials, out_dtype)) if partials.dim() == 3 else None
    if ready is None:
        return lambda p: summed(p, out_dtype)
    sets, _, n = partials.shape

    def sums(p: torch.Tensor) -> torch.Tensor:
        out = torch.empty((sets, n), dtype=out_dtype, device=p.device)
        ready.run(p, out)
        return out
    sums.ready = ready  # for kept_backward.cpp, which launches it from C++
    return sums


# Launches kept by launch_key(partials, out_dtype) (ready_launch.py).
_READY: dict = {}


def column_sums(partials: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(S, P, N) float32 partials -> (S, N) sums over P, in `out_dtype`."""
    sets, programs, n = partials.shape
    out = torch.empty((sets, n), dtype=out_dtype, device=partials.device)
    key = launch_key(partials, out_dtype)
    ready = _READY.get(key)
    if ready is not None:
        ready.run(partials, out)
        return out
    # Narrow and tall: many programs even for short rows, each loading its whole column
    # strip at once. With one 256-column program walking 32 partial rows at a time, a
    # quarter of a short-row backward's time was in here (9.6 us of 33 at 32768 x 256 on an
    # H100, against under 5 us like this).
    block_n = min(SUM_COLUMNS, triton.next_power_of_2(n))
    block_p = min(SUM_ROWS, max(32, triton.next_power_of_2(programs)))
    warps = max(1, min(8, block_p * block_n // 2048))  # 64 values a thread at most
    grid = (triton.cdiv(n, block_n), sets)
    args = (partials, out, programs, n, partials.stride(0), out.stride(0))
    flags = dict(BLOCK_P=block_p, BLOCK_N=block_n,
                 MULTIPLE=stated_multiple_of(n, partials.stride(0), out.stride(0)),
                 num_warps=warps)
    compiled = column_sums_kernel[grid](*args, **flags)
    if key is not None:
        _READY[key] = ready_launch(compiled, column_sums_kernel, grid, args, flags,
                                   ("partial_ptr", "out_ptr"))
    return out
