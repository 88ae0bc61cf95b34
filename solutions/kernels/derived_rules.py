"""The launch rules derived from the GPU's properties (`GpuProperties`, gpus.py): all that a
GPU without a table of measured rules (plan_tables.py) gets, and what a shape that no measured
rule matches gets on one with a table. launch.py lists them in the order they are tried.
Each figure and each rule says in one line why it is what it is; docs/launch-rules.md has the
measurements (#derived-rules, and each rule's own section).
"""

from __future__ import annotations

import math

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

from triton import next_power_of_2

from solutions.kernels.gpus import GpuProperties
from solutions.kernels.launch_plans import BackwardPlan, ForwardPlan, Rows, Variant
from solutions.kernels.sibling_sync import next_power_of_2_split

VALUES_A_THREAD = 16  # rows path: enough warps that a thread holds about this many values
LATENCY_S = 600e-9  # a load's round trip to HBM: bytes in flight = bandwidth x latency
PROGRAMS_AN_SM = 4  # a rows program moves its SM's share of the bytes in flight over this
PERSISTENT_PER_SM = 8  # short rows: programs an SM, walking over the tiles
SPLIT_BLOCK, SPLIT_WARPS, SECOND_BLOCK = 16384, 16, 8192  # the split path's programs
RESIDUAL_SPLIT, RESIDUAL_SPLIT_BLOCKS = 32, (4096, 16384)  # the fused add's programs a row
# The columns path (backward of a few rows): the rows it takes and the values (M x N) every
# one of its programs reads, the columns a program owns, the values of the tile (every
# row, some columns) its per-row sums are loaded in, and its warps (swept on an H200:
# docs/sweeps/2026-11-29-few-rows)
FEW_ROWS, FEW_ROWS_VALUES = 8, 32768
COLUMNS, COLUMNS_TILE, COLUMNS_WARPS = 128, 8192, 8


def _power_of_2_in(value: float, lo: int, hi: int) -> int:
    """The largest power of two up to `value`, kept within lo..hi."""
    return max(lo, min(hi, 1 << max(0, int(value).bit_length() - 1)))


def register_block(gpu: GpuProperties, op: str) -> int:
    """Values a program may hold in registers: half an SM's file (the rest holds addresses,
    sums, and a second program); the fused add's two inputs, and the backward's x and dy with
    their dW sums, take half that; LayerNorm's backward, with its dB sums, half again."""
    per_op = {"add_rmsnorm": 2, "rmsnorm_backward": 2, "layernorm_backward": 4}
    return gpu.registers_per_sm // 2 // per_op.get(op, 1)


def persistent_short_rows(rows: Rows) -> ForwardPlan | None:
    """Rows of 256 or fewer: a tile is too little to hide latency, so a few persistent
    programs an SM walk over the tiles, loading the next first
    (docs/launch-rules.md#persistent-short-rows)."""
    if rows.block_n > 256:
        return None
    programs = min(PERSISTENT_PER_SM, rows.gpu.max_warps_per_sm // 4) * rows.gpu.sms
    return ForwardPlan(path="rows", block_m=min(16, 2048 // rows.block_n), block_n=rows.block_n,
                       num_warps=4, programs=programs, variant=Variant.PREFETCH)


def rows_in_registers(rows: Rows) -> ForwardPlan | None:
    """Rows that fit registers: enough rows a program that it moves its share of the bytes in
    flight, enough warps for VALUES_A_THREAD values a thread
    (docs/launch-rules.md#rows-in-registers)."""
    if rows.block_n > register_block(rows.gpu, rows.op):
        return None
    in_flight = rows.gpu.bandwidth_gbps * 1e9 / rows.gpu.sms * LATENCY_S / PROGRAMS_AN_SM
    program_bytes = 1 << round(math.log2(in_flight))
    block_m = max(1, min(16, program_bytes // (rows.block_n * rows.element_size)))
    warps = _power_of_2_in(block_m * rows.block_n / (32 * VALUES_A_THREAD), 1,
                           min(32, rows.gpu.max_warps_per_sm))
    return ForwardPlan(path="rows", block_m=block_m, block_n=rows.block_n, num_warps=warps)


def long_rows(rows: Rows) -> ForwardPlan:
    """Rows too long for registers: the loop path while a program's loads (half an SM's
    register file) cover the row and the rows being worked on fit half of L2; split beyond,
    where its programs can all run at once (docs/launch-rules.md#long-rows)."""
    gpu, layernorm = rows.gpu, rows.op == "layernorm"
    loop_block = gpu.registers_per_sm * 4 // 2 // max(2, rows.element_size)
    if layernorm:
        loop_block = min(loop_block, register_block(gpu, rows.op))
    split = next_power_of_2_split(rows.N, SPLIT_BLOCK)
    fits_l2 = gpu.sms * rows.N * rows.element_size <= gpu.l2_bytes // 2
    if (rows.block_n <= loop_block and fits_l2) or not gpu.runs_split(split):
        return ForwardPlan(path="loop", block_n=min(rows.block_n, loop_block), num_warps=32,
                           programs=gpu.sms, out_block=min(rows.block_n, SECOND_BLOCK))
    two_an_sm = gpu.registers_per_sm // (2 * 32 * SPLIT_WARPS)  # registers a thread
    return ForwardPlan(path="split", block_n=SPLIT_BLOCK, num_warps=SPLIT_WARPS, split=split,
                       out_block=SECOND_BLOCK, max_registers=0 if layernorm else two_an_sm)


def residual_split_plan(N: int) -> ForwardPlan:
    """The fused add's split path for rows of N columns: about RESIDUAL_SPLIT programs a row
    (more once a program holds the most columns), warps enough for 16 columns a thread, the
    row kept in registers (docs/launch-rules.md#fused-add-long-rows)."""
    least, most = RESIDUAL_SPLIT_BLOCKS
    block = max(least, min(most, next_power_of_2(N) // RESIDUAL_SPLIT))
    return ForwardPlan(path="split", block_n=block, num_warps=block // (32 * 16),
                       split=next_power_of_2_split(N, block), reload=False)


def fused_add_long_rows(rows: Rows) -> ForwardPlan:
    """The fused add's rows too long for registers: split, or the loop path where the split
    cannot run (docs/launch-rules.md#fused-add-long-rows)."""
    plan = residual_split_plan(rows.N)
    if rows.gpu.runs_split(plan.split):
        return plan
    return ForwardPlan(path="loop", block_n=4096, num_warps=8, programs=rows.gpu.sms)


def few_rows(rows: Rows) -> BackwardPlan | None:
    """2 to FEW_ROWS rows (decode), FEW_ROWS_VALUES values at most: one launch whose programs
    own COLUMNS columns of every row and sum each whole row themselves (from L2), so dW
    needs no second launch. On an H200 that saved about 5 us of host time a backward; in a
    CUDA graph it was faster up to 4 rows and 0.5 to 3 us slower at 8, each program's reads
    growing with M x N (docs/sweeps/2026-11-29-few-rows). One row keeps the rows path: its
    one program already writes dW itself."""
    if not 2 <= rows.M <= FEW_ROWS or rows.M * rows.N > FEW_ROWS_VALUES:
        return None
    block_m = next_power_of_2(rows.M)  # every row at once
    return BackwardPlan(path="columns", block_m=block_m,
                        block_n=min(rows.block_n, COLUMNS_TILE // block_m),
                        num_warps=COLUMNS_WARPS, programs=1, columns=min(rows.block_n, COLUMNS))


def pieces(rows: Rows) -> BackwardPlan | None:
    """16-bit rows between two powers of two, N > 512, in two pieces holding at most three
    quarters of the rows path's columns: about VALUES_A_THREAD values a thread, 16 warps an
    SM (docs/launch-rules.md#backward-pieces)."""
    head = rows.block_n // 2
    held = head + next_power_of_2(max(1, rows.N - head))
    if (rows.element_size != 2 or rows.N == rows.block_n or rows.N <= 512
            or held > register_block(rows.gpu, rows.op) * 3 // 4):
        return None
    warps = _power_of_2_in(held / (32 * VALUES_A_THREAD), 2, 16)
    return BackwardPlan(path="pieces", block_n=head, num_warps=warps,
                        programs=min(rows.M, 16 // warps * rows.gpu.sms))


def backward_rows(rows: Rows) -> BackwardPlan | None:
    """Rows whose x, dy and dW sums fit registers: up to 4096 values a step, two programs an
    SM up to rows of 4096 (docs/launch-rules.md#backward-rows)."""
    block_n = rows.block_n
    if block_n > register_block(rows.gpu, rows.op):
        return None
    programs = min(rows.M, (2 if rows.N <= 4096 else 1) * rows.gpu.sms)
    return BackwardPlan(path="rows", block_m=max(1, min(16, 4096 // block_n)), block_n=block_n,
                        num_warps=16 if block_n >= 4096 else 8, programs=programs)


def backward_split(rows: Rows) -> BackwardPlan | None:
    """Longer rows: programs of 4096 columns on 4 warps share a row, two programs an SM,
    where they can all run at once (docs/launch-rules.md#backward-split)."""
    split = next_power_of_2_split(rows.N, 4096)
    if not rows.gpu.runs_split(split):
        return None
    return BackwardPlan(path="split", block_n=4096, num_warps=4, split=split,
                        programs=max(1, min(rows.M, 2 * rows.gpu.sms // split)))


def backward_loop(rows: Rows) -> BackwardPlan:
    """Where no split can run: a program an SM walks over rows, two passes each."""
    return BackwardPlan(path="loop", block_n=4096, num_warps=8, programs=min(rows.M,
                                                                               rows.gpu.sms))
