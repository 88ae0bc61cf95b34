"""How each reference kernel is launched for a given shape: which path, block sizes, warps.

The numbers are the result of sweeps on an H100 (`scripts/tune_kernels.py`; the figures are
in docs/benchmarks.md). Three forward paths:

- rows:  each program holds BLOCK_M whole rows in registers (BLOCK_M > 1 when rows are
         short, so a program still moves enough bytes to hide memory latency);
- loop:  pass 1 loads up to BLOCK_N columns of a row at once and only sums their squares,
         so nothing is kept; pass 2 reads the row again, from L1 or L2, which pass 1 asked
         to keep it (`evict_last`). For 16-bit rows of 8192 to 65536 columns, one program
         per row (up to 32768 with few enough registers that two share an SM; at 65536 a
         whole row's loads, 128 KB, are in flight on its SM, and the 132 rows being worked
         on fit in L2). For other rows too long for registers, one program per SM walks
         over rows;
- split: rows longer still, where one row per SM no longer fits L2: SPLIT programs on
         different SMs share a row, each loading its BLOCK_N columns at once, and exchange
         their partial sums through global memory before reading their columns again (GPU
         only: the interpreter runs programs one after another, so a program waiting for
         its siblings would wait forever; there the loop path runs instead).

The backward has the same three and a fourth, pieces (16-bit rows between two powers of
two, held as half the block and the power of two that covers the rest).

Reading guide. A plan is data: `ForwardPlan` and `BackwardPlan` below (read their fields
first; rmsnorm.py's module docstring lists the kernel flag each one sets). Two functions
make them, each a chain of rules tried in order, the first that applies winning:

    forward_plan(M, N, device, element_size, residual, layernorm)
      1. rows shorter than their power-of-two block       PARTIAL_BLOCK(_FLOAT32)
      2. rows measured faster a program each, loop path   ONE_ROW_LOOP(_FLOAT32)
      3. rows of 256 columns or fewer, no rule of their own   persistent programs,
                                                          PERSISTENT_PER_SM an SM, prefetch
      4. rows that fit registers (MAX_REGISTER_BLOCK)     ROWS_PATH, STREAMED_ROWS,
                                                          WEIGHT_AFTER_ROWS, *_FLOAT32
      5. the fused add's long rows                        residual_split_plan, else loop
      6. longer rows                                      loop, or split where it pays
    backward_plan(M, N, device, dtype, layernorm)
      1. 16-bit rows between two powers of two            pieces_plan (*_BACKWARD_PIECES)
      2. RMSNorm's rows in a block of 16384               rows, one program an SM, reload
      3. swept short and middle rows                      RMS_BACKWARD_ROWS, LN_BACKWARD_ROWS
      4. other rows that fit registers                    a general rows rule
      5. longer rows                                      split (RMS_BACKWARD_SPLIT), else loop

Read the two functions top to bottom, and a table only when a rule sends you to it: each
table's comment holds the measurements that chose it (docs/benchmarks.md has the sweeps).
`multiprocessors` is where a plan learns the GPU (PLANNING_SMS where there is none), and
`stated_multiple_of` the MULTIPLE every kernel takes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
from triton import next_power_of_2

from solutions.kernels.sibling_sync import next_power_of_2_split, split_fits

# Columns one forward program keeps in float32 registers (32 warps at the top end).
MAX_REGISTER_BLOCK = 32768
# Loop path: columns pass 1 loads at once (16-bit; float32 loads half as many), columns
# pass 2 handles at a time, and warps (32: the most registers to hold loads in flight).
LOOP_BLOCK = 65536
LOOP_OUT_BLOCK = 8192
LOOP_WARPS = 32
# Split path: columns per program, loaded at once, then read again OUT_BLOCK at a time, by
# 16 warps. RMSNorm's programs are held to 64 registers a thread, so that two fit on an SM
# and one's wait for its siblings overlaps the other's loads; LayerNorm's need more.
SPLIT_BLOCK = 16384
SPLIT_OUT_BLOCK = 8192
SPLIT_WARPS = 16
SPLIT_MAX_REGISTERS = 64
# Fused add + RMSNorm keeps its split rows in registers (the residual it reads again would
# be the one it has just written): smaller blocks that fit. About RESIDUAL_SPLIT programs a
# row, each holding 16 columns a thread (`residual_split_plan`).
RESIDUAL_SPLIT = 32
RESIDUAL_SPLIT_BLOCKS = (4096, 16384)  # columns a program, at least and at most
RESIDUAL_SPLIT_PER_THREAD = 16
# The backward holds x, dy and the dW sums in registers: half the forward's budget.
BACKWARD_REGISTER_BLOCK = 16384
# RMSNorm's split backward, two programs per SM, by input dtype: (columns a program, warps,
# registers a thread or 0). Swept at 4096 x 32768 (docs/benchmarks.md). For bfloat16 the
# compiler's choice at 8 warps, 206 registers, lets one program onto an SM, which then idles
# while it waits for its siblings; held to 128, two fit: 93.2 % of copy against 69.6 %.
# Float16 measured best on 4 warps without a cap (92.3 %; the bfloat16 rule 83.5 %), float32
# on 4096 columns and 16 warps (98.2 %; the bfloat16 rule 60.7 %).
RMS_BACKWARD_SPLIT = {torch.bfloat16: (8192, 8, 128), torch.float16: (8192, 4, 0),
                      torch.float32: (4096, 16, 0)}


# A one_row plan unrolls its row's blocks: at most this many, so the code stays small.
MAX_ROW_BLOCKS = 16


class _LaunchOptions:
    """Keyword arguments for the kernel launch: warps, and the register cap if one is set."""

    num_warps: int
    max_registers: int

    def launch_options(self) -> dict:
        options = {"num_warps": self.num_warps}
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


@dataclass(frozen=True)
class ForwardPlan(_LaunchOptions):
    path: str           # "rows", "loop" or "split"
    block_m: int        # rows per tile (rows path)
    block_n: int        # columns per block (loop: pass 1's loads; split: per program)
    num_warps: int
    split: int = 1      # programs per row (split path)
    programs: int = 0   # loop path, and rows path with prefetch: programs walking over
                        # the rows or tiles (0: one per row, or one per tile)
    prefetch: bool = False  # rows path: load the next tile before computing this one
    out_block: int = 0  # loop and split paths: columns per block when the row is read
                        # again (0: block_n)
    reload: bool = True  # split path: read the columns again after the exchange (False:
                         # keep them in registers)
    max_registers: int = 0  # per thread, passed to the compiler as maxnreg (0: its choice)
    stream: bool = False  # rows path, one tile a program: rows loaded and stored with
                          # evict-first hints, the weight (and bias) loaded after the sum
    one_row: bool = False  # loop path, a program per row: no loops, the row's blocks of
                           # block_n columns unrolled (ForwardPlan.row_blocks)
    keep_masks: bool = False  # rows path: masked loads and stores even where the rows fill
                              # the tiles (ForwardPlan.rows_even)
    weight_after: bool = False  # rows path, one tile a program: the weight (and bias) loaded
                                # after the sum, the rows with plain accesses (stream does
                                # both: ForwardPlan.weight_after_sum)

    def __post_init__(self):
        if self.stream and (self.path != "rows" or self.prefetch):
            raise ValueError(f"stream=True is for the rows path without prefetch: {self}")
        if self.weight_after and (self.path != "rows" or self.prefetch):
            raise ValueError(f"weight_after=True is for the rows path without prefetch: {self}")
        if self.keep_masks and self.path != "rows":
            raise ValueError(f"keep_masks=True is for the rows path: {self}")
        if self.one_row and (self.path != "loop" or self.programs):
            raise ValueError(f"one_row=True is for the loop path with a program per row: "
                             f"{self}")

    def grid(self, M: int, N: int) -> tuple[int]:
        if self.path == "rows":  # one program a tile, unless they prefetch
            tiles = math.ceil(M / self.block_m)
            return (min(tiles, self.programs) if self.prefetch and self.programs else tiles,)
        if self.path == "split":
            return (M * self.split,)
        return (min(M, self.programs) if self.programs else M,)

    @property
    def second_block(self) -> int:
        return self.out_block or self.block_n

    @property
    def weight_after_sum(self) -> bool:
        """The rows kernels' WEIGHT_AFTER: streamed rows load their weight after the sum too."""
        return self.stream or self.weight_after

    def rows_even(self, M: int, N: int) -> dict:
        """The rows kernels' EVEN for M rows of N columns: the rows fill the block and the
        tiles hold M exactly, so the kernel needs no masks (a run-time bound costs more than
        it looks: row_loads.columns_in_row)."""
        return {"EVEN": not self.keep_masks and N == self.block_n and M % self.block_m == 0}

    def row_blocks(self, N: int) -> dict:
        """The loop kernels' ROW_BLOCKS and EVEN for rows of N columns. A one_row plan holds
        a row in ROW_BLOCKS = cdiv(N, block_n) blocks, unrolled (at most MAX_ROW_BLOCKS);
        other plans loop (0). EVEN: a row of several blocks fills every block of both
        passes, so the kernel needs no masks."""
        if not self.one_row:
            return {"ROW_BLOCKS": 0, "EVEN": False}
        blocks = -(-N // self.block_n)
        if blocks > MAX_ROW_BLOCKS:
            raise ValueError(f"a one_row plan unrolls at most {MAX_ROW_BLOCKS} blocks of "
                             f"block_n = {self.block_n} columns; got N = {N}: {self}")
        even = blocks > 1 and N % self.block_n == 0 and N % self.second_block == 0
        return {"ROW_BLOCKS": blocks, "EVEN": even}


@dataclass(frozen=True)
class BackwardPlan(_LaunchOptions):
    path: str           # "rows", "pieces", "split" or "loop"
    block_m: int        # rows per tile inside a program
    block_n: int        # pieces path: the first piece's columns
    num_warps: int
    programs: int       # P: programs (row groups for "split") of kernel 1, each writing
                        # one float32 row of dW partial sums
    split: int = 1      # programs per row group (split path)
    num_stages: int = 1
    reload: bool = False  # rows path: read x and dy again for dx instead of keeping them
    sum_each_step: bool = False  # rows path: add up dW over each tile's rows as it goes
    prefetch: bool = False  # rows path: load the next step's x and dy before this step's math
    max_registers: int = 0  # per thread, passed to the compiler as maxnreg (0: its choice)

    def rows_per_program(self, M: int) -> int:
        return math.ceil(M / self.programs)

    def tail_for(self, N: int) -> int:
        """Pieces path: columns of a row's second piece, the power of two that covers what
        the first piece (block_n columns) leaves of a row of N."""
        if not self.block_n < N <= 2 * self.block_n:
            raise ValueError(f"the pieces path holds rows of {self.block_n + 1} to "
                             f"{2 * self.block_n} columns in pieces of {self.block_n} and "
                             f"the rest; got N = {N}")
        return next_power_of_2(N - self.block_n)


def stated_multiple_of(*values: int) -> int:
    """The MULTIPLE a launch tells its kernel (`row_loads.stated_multiple`) that the row
    length and row strides it passes are all multiples of: the largest power of two up to 8
    dividing every one of them, so that 16-bit rows of 4104 columns load 16 bytes at a time.
    1 when they are all multiples of 16, which Triton sees by itself (and the kernels tuned
    on such shapes then compile exactly as they did)."""
    common = math.gcd(*values)  # 0 only when every value is 0
    largest = common & -common  # the largest power of two dividing every value
    return 1 if common == 0 or largest >= 16 else largest


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# SMs assumed when a plan for a GPU is made where there is none (chapter 04 prints plans
# anywhere): an H100 SXM's.
PLANNING_SMS = 132


def multiprocessors(device: torch.device) -> int:
    """SMs the plans for `device` count on (PLANNING_SMS for a GPU that is not here)."""
    if device.type != "cuda":
        return 8  # the interpreter runs programs one by one; few programs, less overhead
    if not torch.cuda.is_available():
        return PLANNING_SMS
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _warps_for(elements: int, per_thread: int = 16, lo: int = 1, hi: int = 16) -> int:
    """Enough warps that each thread holds about `per_thread` elements."""
    warps = max(lo, min(hi, elements // (32 * per_thread)))
    return 1 << (warps.bit_length() - 1)  # a power of two


# Rows path, by BLOCK_N = next_power_of_2(N): (rows per tile, warps), per op. From the
# sweeps in docs/benchmarks.md: short rows want several rows per program, each reduced
# within one warp or two (a program moves a few KB); long rows want enough warps that a
# thread holds 16 to 32 values. RMSNorm's rows of 256: a row per warp, 32 to a program
# (73 % of copy, level with torch.compile, against 71 % for 4 rows on one warp, the winner
# while the timer let each call reuse the last call's output memory). LayerNorm's rows of
# 256: a row per warp, 16 to a program (71.7 and 72.0 % in two trials, against 70.6 and
# 70.4 % for the persistent programs below); of 512: a row a program on one warp (84.2 and
# 84.3 % each call alone, 90.3 and 90.8 back to back, against 83.7 and 84.3, 90.2 and 90.1
# for 2 rows on 2 warps, two trials of six rounds). RMSNorm's 16-bit rows of 512 take
# WEIGHT_AFTER_ROWS below, its float32 ones ROWS_PATH_FLOAT32. 16-bit rows in STREAMED_ROWS
# or WEIGHT_AFTER_ROWS below take their plans instead; float32 rows keep these.
_LONG_ROWS = {4096: (1, 8), 8192: (1, 8), 16384: (2, 16), 32768: (1, 32)}
ROWS_PATH = {
    "rmsnorm": {256: (32, 32), 1024: (2, 8), 2048: (1, 8)} | _LONG_ROWS,
    "add_rmsnorm": _LONG_ROWS | {256: (4, 1), 512: (2, 1), 1024: (1, 8), 2048: (1, 8),
                                 4096: (1, 16), 8192: (1, 32)},
    "layernorm": {256: (16, 16), 512: (1, 1), 1024: (1, 4), 2048: (2, 8)} | _LONG_ROWS,
}
# 16-bit rows loaded evict-first and stored streaming (`.cs`), the weight (and bias) loaded
# after the sum (ForwardPlan.stream), over ROWS_PATH (LayerNorm's rows of 8192 left the loop
# path for it). Each plan against the rule it replaced, each on its own inputs as `course
# bench` times them (docs/benchmarks.md), % of copy each call alone / back to back in a CUDA
# graph: the fused add, which writes two rows, gained at every length or was level (256:
# 84.5 -> 84.4 / 91.5 -> 92.7; 8192: 100.0 -> 100.3 / 100.4 -> 100.9); LayerNorm only at
# 8192 (99.4 -> 100.0 / 99.8 -> 100.6); RMSNorm at 256 and 512 only back to back (84.8 ->
# 85.7 and 91.1 -> 91.8; alone 72.4 -> 71.7 and 84.7 -> 83.8, inside the spread of the runs
# that chose them). Elsewhere the hints cost up to 1.6 points. Sweeps whose candidates
# shared their inputs had shown gains nearly everywhere (tune_kernels.py says why it no
# longer shares them). Later, in two trials of six rounds: RMSNorm at 256 on 16 rows and 8
# warps (71.4 and 73.0 % each call alone, 86.1 and 86.2 back to back, against 71.0 and 72.9,
# 85.6 and 85.9 for 8 rows); at 512 streaming lost each call alone (ROWS_PATH above). Then
# RMSNorm moved to WEIGHT_AFTER_ROWS below.
# The fused add kept its streamed plans from 256 to 8192 until they were timed against
# plain ones again, each on its own inputs, three trials of six to eight rounds, bfloat16
# and float16 (docs/benchmarks.md, 2026-11-24, "The fused add's launch rules"): from 1024
# on, the same plans without the hints were 0.2 to 1.3 points of copy faster on both
# timers (1024: 95.9 -> 97.0 each call alone, 97.4 -> 98.1 back to back, level with
# torch.compile); at 512, 2 rows on one warp without them gained 0.7 to 1.3 each call
# alone and lost up to 0.3 back to back; at 256, 16 rows on 4 warps streamed gained 0.0 to
# 0.8 over 8 rows on 2. The plain plans are ROWS_PATH's, which float32 rows share: they
# measured 0.0 to 1.2 points ahead of the float32 plans they replaced.
STREAMED_ROWS = {
    "add_rmsnorm": {256: (16, 4)},
    "layernorm": {8192: (1, 16)},
}
# 16-bit rows whose weight is loaded after the sum, with plain loads and stores of the rows
# (ForwardPlan.weight_after), over ROWS_PATH and STREAMED_ROWS. A stripped RMSNorm kernel at
# 32768 x 256 lost 1.5 to 2 points of copy loading its weight first (as ROWS_PATH's plans
# do); the evict-first hints of STREAMED_ROWS gained back to back but not each call alone.
# Two trials of six rounds (docs/benchmarks.md), each call alone / back to back: RMSNorm at
# 256, 8 rows on 8 warps, 71.9 and 73.5 / 85.5 and 85.7 % of copy, against 71.4 and 71.9 /
# 85.9 and 86.0 streamed (16 rows) and torch.compile's 71.8 and 73.0 / 85.1 and 85.3; at 512,
# 84.9 and 85.2 / 92.3 and 91.9 against 84.4 and 84.9 / 91.9 and 91.9 for the plan plain.
# (Plain, that plan had beaten the streamed one each call alone: medians of six rounds 84.4
# and 84.8 % against 83.2 and 83.6; back to back 91.6 and 91.6 against 91.5 and 91.6.)
WEIGHT_AFTER_ROWS = {"rmsnorm": {256: (8, 8), 512: (4, 8)}}
# Shorter rows than the table holds: a tile is too small to hide latency on its own, so
# fewer, persistent programs (PERSISTENT_PER_SM per SM) walk over the tiles, loading the
# next while computing this one.
PERSISTENT_PER_SM = 8
# 16-bit rows that fit registers, but measured faster on the loop path with one program
# per row: (op, BLOCK_N) -> plan. A program loads the whole row at once and reads it again;
# held to 32 or 40 registers, two share an SM, so that one's reduction overlaps the other's
# loads (100 % of copy at 16384 and 32768 for RMSNorm, against 98 and 93 % with the row
# kept in registers).
# RMSNorm's rows of 65536 too: one program per row, alone on its SM, loading the whole
# row at once, measured 98.8 % against 92.5 % for one program per SM walking over rows (the
# loop between rows is what cost); the register cap must be given (85.7 % without it).
# RMSNorm's rows of 8192 too, on 16 warps held to 40 registers: 100.4 and 100.5 % in two
# sweeps, against 99.1 and 99.3 % for the row in registers (one row, 8 warps).
# one_row (ForwardPlan.one_row): the kernel without its loops, pass 2 unrolled. Against the
# same plan with loops, each on its own inputs, four rounds, each call alone / back to back
# (docs/benchmarks.md): RMSNorm 16384 99.8 -> 100.0 / 100.4 -> 100.7 (torch.compile 100.1
# / 100.7), LayerNorm 16384 99.1 -> 99.4 / 99.4 -> 99.8; at the others, and in a second
# trial, 0.0 to 0.5 faster, but for the fused add at 32768 back to back once (100.1 -> 99.8).
# RMSNorm at 8192 measured slower without loops (100.3 -> 99.9 / 100.7 -> 100.4; likely
# because the compiler then gives it 32 registers, not 40, and four programs share an SM).
ONE_ROW_LOOP = {
    ("rmsnorm", 8192): ForwardPlan("loop", 1, 8192, 16, out_block=8192, max_registers=40),
    ("rmsnorm", 16384): ForwardPlan("loop", 1, 16384, 32, out_block=8192, max_registers=40,
                                    one_row=True),
    ("rmsnorm", 32768): ForwardPlan("loop", 1, 32768, 32, out_block=32768, one_row=True),
    ("rmsnorm", 65536): ForwardPlan("loop", 1, 65536, 32, out_block=16384, max_registers=64,
                                    one_row=True),
    ("add_rmsnorm", 16384): ForwardPlan("loop", 1, 16384, 32, out_block=8192, max_registers=40,
                                        one_row=True),
    ("add_rmsnorm", 32768): ForwardPlan("loop", 1, 32768, 32, out_block=32768, one_row=True),
    ("layernorm", 16384): ForwardPlan("loop", 1, 16384, 16, out_block=8192, one_row=True),
    # LayerNorm's rows of 32768 in four unrolled blocks of 8192, unmasked (EVEN): 97.9 and
    # 98.0 % of copy each call alone, 98.4 and 98.5 back to back, against 96.2 and 96.3, 96.6
    # and 96.6 for the row in 32 warps' registers (torch.compile 93.1 and 93.1, 93.9 and
    # 93.7; two trials of three rounds, docs/benchmarks.md)
    ("layernorm", 32768): ForwardPlan("loop", 1, 8192, 32, out_block=8192, one_row=True),
}
# RMSNorm's float32 rows of 32768 too, the whole row (128 KB) loaded at once by 32 warps:
# 100.8 and 100.9 % against 95.5 and 95.4 % for one program per SM walking over rows
# (torch.compile 100.3 and 100.2 %, launching the same shape of program).
# And its float32 rows of 4096 as Inductor launches them: a program per row of 16 warps, the
# row in two unrolled blocks of 2048, read again: 101.2 and 101.3 % of copy each call alone,
# 101.4 and 101.4 back to back, against 100.5 and 100.5, 100.8 and 100.9 for the row in 8
# warps' registers (torch.compile 101.1 and 101.1, 101.4 and 101.4; two trials of six rounds);
# rows of 3072 and 2560 in the same block, 0.8 to 1.0 faster than on the rule before.
ONE_ROW_LOOP_FLOAT32 = {
    ("rmsnorm", 4096): ForwardPlan("loop", 1, 2048, 16, out_block=2048, one_row=True),
    ("rmsnorm", 32768): ForwardPlan("loop", 1, 32768, 32, out_block=32768, one_row=True)}
# Float32 rows where the 16-bit rule measured slower (`tune_kernels.py --dtype float32`,
# then two trials on own inputs), over ROWS_PATH's 16-bit rules. Fused add at
# 512: 97.0 % against 93.9 % on the 16-bit rule's single warp; RMSNorm at 512: 94.3 and
# 94.1 against 93.2 and 93.3; LayerNorm at 512: 93.6 against 92.9 and 93.3; at 4096:
# 100.0 and 100.1 against 99.2 and 99.5.
ROWS_PATH_FLOAT32 = {"rmsnorm": {512: (2, 8)}, "add_rmsnorm": {512: (4, 16)},
                     "layernorm": {512: (2, 1), 4096: (1, 16)}}
# Float32 rows that measured slower without masks (ForwardPlan.keep_masks), by op: BLOCK_N.
# LayerNorm at 32768 x 512, % of copy each call alone / back to back, two trials of three
# rounds: masked 93.0 and 93.3 / 95.7 and 95.8, unmasked 91.6 and 91.9 / 94.2 and 94.1; at
# 256 masked 84.5 and 84.4 / 90.4 and 90.1, unmasked 83.3 and 84.2 / 90.1 and 90.1. From
# 1024 columns on, and for RMSNorm and the fused add, within 0.7, in no steady direction.
MASKED_ROWS_FLOAT32 = {"layernorm": (256, 512)}
_ROWS_PATH_WITH_FLOAT32 = {op: rules | ROWS_PATH_FLOAT32.get(op, {})
                           for op, rules in ROWS_PATH.items()}
# 16-bit rows shorter than their block (N not a power of two), by block: the rules above
# were swept on rows that fill their block, and a row of 5120 in a block of 8192 measured
# as much as 22 points of copy slower on them (RMSNorm 5120: 84.5 % on the loop path,
# 99.3 % kept in 4 warps' registers). Swept at 3 to 5 row lengths per block, 1152 to 28672
# columns (`tune_kernels.py`, docs/benchmarks.md); each rule is within 3 % of the best plan
# at every length swept in its block. The fused add's rules were already within 1.4 points.
PARTIAL_BLOCK = {
    "rmsnorm": {2048: ForwardPlan("rows", 2, 2048, 8), 4096: ForwardPlan("rows", 1, 4096, 2),
                8192: ForwardPlan("rows", 1, 8192, 4),
                16384: ForwardPlan("loop", 1, 16384, 16, out_block=4096, max_registers=40,
                                   one_row=True),
                32768: ForwardPlan("loop", 1, 32768, 32, out_block=8192, max_registers=40,
                                   one_row=True)},
    # Rows of 8193 to 32767: one program per row, the row in unrolled blocks of 2048 or 4096
    # columns (one_row), as many as it takes. Against the rules before (the row in 16 warps'
    # registers to 16383, passes of 16384 columns beyond), each on its own inputs, % of copy
    # each call alone (docs/benchmarks.md): 9216 81.8 -> 95.6, 10240 85.6 -> 96.1, 11264
    # 90.1 -> 94.5, 12288 92.8 -> 96.6, 13312 95.0 -> 95.2, 15360 97.8 -> 98.4, 20480 81.9
    # -> 92.9, 24576 89.9 -> 95.4, 28672 91.5 -> 96.3. A block whose rule depends on the
    # row's length holds (most columns, plan) pairs, taken in order.
    "layernorm": {2048: ForwardPlan("rows", 2, 2048, 4), 4096: ForwardPlan("rows", 2, 4096, 8),
                  8192: ForwardPlan("rows", 1, 8192, 8),
                  16384: ((11264, ForwardPlan("loop", 1, 2048, 8, out_block=2048, one_row=True)),
                          (16383, ForwardPlan("loop", 1, 4096, 16, out_block=4096,
                                              one_row=True))),
                  32768: ForwardPlan("loop", 1, 4096, 32, out_block=4096, one_row=True)},
}
# The same for float32 rows, where the rules above were 1.7 to 6.7 points behind the best
# plan (`tune-float32-partial-blocks.json`: 2560 and 3072 columns in the block of 4096,
# 5120 to 7168 in the block of 8192); elsewhere they were within 1.1 of it, or one length
# was swept.
PARTIAL_BLOCK_FLOAT32 = {
    "rmsnorm": {8192: ForwardPlan("loop", 1, 8192, 16, out_block=4096, max_registers=40,
                                  one_row=True)},
    "layernorm": {4096: ForwardPlan("rows", 1, 4096, 4),
                  8192: ForwardPlan("loop", 1, 8192, 16, out_block=4096)},
}


def partial_block_rule(op: str, N: int, element_size: int) -> ForwardPlan | None:
    """The plan for rows of N columns, shorter than their block, where one was swept: 16-bit
    rows (PARTIAL_BLOCK) or float32 ones (PARTIAL_BLOCK_FLOAT32). None where N fills it."""
    block_n = next_power_of_2(N)
    table = PARTIAL_BLOCK_FLOAT32 if element_size == 4 else PARTIAL_BLOCK
    rule = table.get(op, {}).get(block_n)
    if N == block_n:
        return None
    if isinstance(rule, tuple):  # by the row's length
        return next(plan for most, plan in rule if N <= most)
    return rule


def residual_split_plan(N: int) -> ForwardPlan:
    """The fused add's split path for rows of N columns: about RESIDUAL_SPLIT programs a row
    (more once a program holds the most columns), on warps enough for 16 columns a thread.
    Against the rule before (8192 columns a program on 8 warps), each on its own inputs,
    bfloat16, % of copy each call alone (docs/benchmarks.md): 65536 100.2 -> 100.9 (4096
    columns, 8 warps), 131072 99.7 -> 100.9, 262144 98.5 -> 100.0 (8192, 16 warps), 524288
    97.3 -> 97.8 (16384, 32 warps); float32 at 32768 and 131072 gained 0.4 and 0.6. The
    same block on 32 warps, or 16384 columns on 16, measured 0.7 to 4.8 points slower."""
    least, most = RESIDUAL_SPLIT_BLOCKS
    block = max(least, min(most, next_power_of_2(N) // RESIDUAL_SPLIT))
    warps = block // (32 * RESIDUAL_SPLIT_PER_THREAD)
    return ForwardPlan("split", 1, block, warps, split=next_power_of_2_split(N, block),
                       reload=False)


def forward_plan(M: int, N: int, device: torch.device, *, element_size: int = 2,
                 residual: bool = False, layernorm: bool = False) -> ForwardPlan:
    """`element_size` is x's in bytes; `residual` says the residual is added too. Rows of
    32768 stay in one program's registers when they arrive alone: as 16-bit values, or,
    for LayerNorm, as float32 (RMSNorm's float32 rows measured faster a program per row on
    the loop path). A second input spills there, and takes a longer-row path instead.
    LayerNorm's loop path measured slower than its split path from 65536 columns on."""
    op = "layernorm" if layernorm else "add_rmsnorm" if residual else "rmsnorm"
    block_n = next_power_of_2(N)
    sms = multiprocessors(device)
    float32 = element_size == 4  # the kernels take float32, float16 and bfloat16
    # LayerNorm's float32 rows of 32768 in 32 warps' registers: 97.7 and 98.0 % of copy
    # against 94.9 and 95.0 on the loop path (torch.compile 97.6 and 97.4).
    register_limit = MAX_REGISTER_BLOCK if (layernorm or not float32) and not residual else 16384
    partial = partial_block_rule(op, N, element_size)
    if partial is not None:
        return replace(partial, block_m=min(partial.block_m, next_power_of_2(M)))
    one_row_loop = ONE_ROW_LOOP_FLOAT32 if float32 else ONE_ROW_LOOP
    if (op, block_n) in one_row_loop:
        return one_row_loop[op, block_n]
    rows_path = (_ROWS_PATH_WITH_FLOAT32 if float32 else ROWS_PATH)[op]
    if block_n <= 256 and block_n not in rows_path:
        block_m = max(1, min(16, 2048 // block_n, next_power_of_2(M)))
        programs = PERSISTENT_PER_SM * sms
        return ForwardPlan("rows", block_m, block_n, 4, programs=programs, prefetch=True)
    if block_n <= register_limit:
        stream = not float32 and block_n in STREAMED_ROWS.get(op, {})
        weight_after = not float32 and block_n in WEIGHT_AFTER_ROWS.get(op, {})
        rules = (STREAMED_ROWS[op] if stream else WEIGHT_AFTER_ROWS[op] if weight_after
                 else rows_path)
        block_m, warps = rules[block_n]
        keep_masks = float32 and block_n in MASKED_ROWS_FLOAT32.get(op, ())
        return ForwardPlan("rows", min(block_m, next_power_of_2(M)), block_n, warps,
                           stream=stream, weight_after=weight_after, keep_masks=keep_masks)
    on_gpu = device.type == "cuda"
    if residual:
        split_plan = residual_split_plan(N) if on_gpu else None
        if split_plan is not None and split_fits(split_plan.split, sms):
            return split_plan
        return ForwardPlan("loop", 1, 4096, 8, programs=sms)
    # 128 KB of loads in flight per SM: 65536 16-bit values or 32768 float32 ones
    loop_block = LOOP_BLOCK * 2 // max(2, element_size)
    if layernorm:
        loop_block = min(loop_block, MAX_REGISTER_BLOCK)
    split = next_power_of_2_split(N, SPLIT_BLOCK)
    if block_n <= loop_block or not on_gpu or not split_fits(split, sms):
        return ForwardPlan("loop", 1, min(block_n, loop_block), LOOP_WARPS, programs=sms,
                           out_block=min(block_n, LOOP_OUT_BLOCK))
    return ForwardPlan("split", 1, SPLIT_BLOCK, SPLIT_WARPS, split=split,
                       out_block=SPLIT_OUT_BLOCK,
                       max_registers=0 if layernorm else SPLIT_MAX_REGISTERS)


# RMSNorm's backward, rows of 256 to 8192: BLOCK_N -> (rows per step, warps, programs per
# SM, whether dW is added up over each step's rows as it goes, whether the next step's x and
# dy are loaded before this step's arithmetic). From the sweeps in docs/benchmarks.md:
# loading ahead took 2048, 4096 and 8192 from 83.5, 87.4 and 85.0 % of copy to 88.1, 93.9
# and 92.9 %. Short rows want many small programs (4 to 8 an SM, as Inductor launches its
# backward), once the column sums of their partial rows are cheap: 256, 512 and 1024 went
# from 45.1, 63.2 and 76.6 % to 64.6, 76.2 and 85.4 %.
RMS_BACKWARD_ROWS = {256: (8, 1, 8, True, True), 512: (4, 2, 4, False, True),
                     1024: (8, 4, 4, True, False),
                     2048: (4, 8, 1, False, True), 4096: (2, 16, 1, False, True),
                     8192: (1, 16, 1, False, True)}
# RMSNorm's backward, 16-bit rows of 513 to 12288 columns that are shorter than their block
# (N not a power of two): the pieces path, each row held as half the block and the power of
# two that covers the rest. By the columns the two pieces hold, up to: (warps, programs per
# SM). From `tune_kernels.py` in bfloat16 at 46 lengths from 384 to 14336 columns, in three
# sweeps (the third at 16 lengths the first two had not measured), and in float16 at 19
# (docs/benchmarks.md): at every length from 640 to 12288 the plan below was within 2
# points of copy of the best pieces plan. At model widths the rows path's rules measured
# level with it to 12 points behind (4104), except at 6144, 1.5 points ahead. There 16
# warps measured 1.7 points better in bfloat16, but 6 points worse in float16.
# Two kinds of plan win: about 16 values a thread on 16 warps an SM, or 36 to 48 a thread
# on 8 warps an SM (as many as their registers let on); either way the next rows' loads in
# flight come to 32 to 40 KB an SM. Between them, 20 to 24 values a thread on 16 warps lost
# up to 8 points. Rows of 512 or fewer want several rows a step; two pieces of 8192 need
# more registers than a thread can have (5 % of copy at 14336, spilling); float32 rows
# measured at most 1.6 points faster as pieces than on the rows path's rules.
RMS_BACKWARD_PIECES = ((1152, 2, 8), (2048, 8, 4), (2560, 2, 4), (4352, 8, 2),
                       (6144, 4, 2), (8192, 16, 1), (12288, 8, 1))


# LayerNorm's backward, the same for its 16-bit rows of 513 to 10240 columns
# (`tune_kernels.py --ops layernorm_bwd --paths pieces`, bfloat16 at 22 lengths from 768 to
# 12288 columns, float16 at 8; docs/benchmarks.md). The plan below was the best pieces
# plan at each length swept, and from 1152 columns on 9 to 32 points of copy ahead of the
# rows and split paths' rules (4104: 86.1 % against 57.9; 9216: 88.9 against 56.9; at 768,
# 1.9). With dB's sums and the two row sums beside RMSNorm's, its registers run out
# sooner: pieces holding 12288 columns measured 58 to 65 %, below the split path's 64 to
# 68, and those rows keep it.
LN_BACKWARD_PIECES = ((1024, 2, 8), (2048, 4, 4), (2560, 2, 4), (3072, 8, 2), (5120, 4, 2),
                      (8192, 16, 1), (10240, 8, 1))


def pieces_plan(M: int, N: int, element_size: int, sms: int, *, layernorm: bool = False
                ) -> BackwardPlan | None:
    """The pieces path's plan for RMSNorm's or LayerNorm's backward, or None where it is
    not used."""
    block_n = next_power_of_2(N)
    if element_size != 2 or N == block_n or N <= 512:
        return None
    head = block_n // 2
    held = head + next_power_of_2(N - head)
    for most_held, warps, per_sm in LN_BACKWARD_PIECES if layernorm else RMS_BACKWARD_PIECES:
        if held <= most_held:
            return BackwardPlan("pieces", 1, head, warps, min(M, per_sm * sms))
    return None


# LayerNorm's backward, short rows, the same fields: 4 programs per SM of 2 to 4 warps, as
# for RMSNorm. The sweep took 256, 512 and 1024 from 48.1, 53.7 and 65.8 % of copy (the
# general rule below) to 58.2, 75.7 and 84.0 %.
LN_BACKWARD_ROWS = {256: (8, 2, 4, False, False), 512: (4, 2, 4, False, True),
                    1024: (2, 4, 4, False, True)}


def backward_plan(M: int, N: int, device: torch.device, *,
                  dtype: torch.dtype = torch.bfloat16, layernorm: bool = False) -> BackwardPlan:
    """The split size (programs P) trades parallelism against the P*N*4 bytes of partial
    sums written and read again: enough programs to fill the GPU once or twice, no more.
    LayerNorm's backward carries two more float32 sums per column, so it leaves the
    registers-only path earlier and prefers fewer warps at N = 8192.

    RMSNorm at N = 16384: one program per SM of 16 warps loads a whole row of x and dy at
    once, sums, and reads them again for dx (`reload`), so only the dW sums stay in
    registers. Longer rows are split: SPLIT programs share a row, and each publishes row
    i's partial sum before finishing row i - 1, so the exchange's wait overlaps loads.
    16-bit rows below a power of two take the pieces path (`pieces_plan`)."""
    sms = multiprocessors(device)
    block_n = next_power_of_2(N)
    register_limit = BACKWARD_REGISTER_BLOCK // (2 if layernorm else 1)
    pieces = pieces_plan(M, N, dtype.itemsize, sms, layernorm=layernorm)
    if pieces is not None:
        return pieces
    if not layernorm and block_n == BACKWARD_REGISTER_BLOCK:
        return BackwardPlan("rows", 1, block_n, 16, min(M, sms), reload=True)
    rows_rules = LN_BACKWARD_ROWS if layernorm else RMS_BACKWARD_ROWS
    if block_n in rows_rules:
        block_m, warps, per_sm, sum_each_step, prefetch = rows_rules[block_n]
        return BackwardPlan("rows", block_m, block_n, warps, min(M, per_sm * sms),
                            sum_each_step=sum_each_step, prefetch=prefetch)
    if block_n <= register_limit:  # x, dy and the dW sums all live in registers
        block_m = max(1, min(16, 4096 // block_n))
        warps = 16 if block_n >= 4096 else 8
        if layernorm and block_n == 8192:
            warps = 8
        programs = min(M, (2 if N <= 4096 else 1) * sms)
        return BackwardPlan("rows", block_m, block_n, warps, programs)
    block, warps, registers = (4096, 4, 0) if layernorm else RMS_BACKWARD_SPLIT[dtype]
    split = next_power_of_2_split(N, block)
    if device.type == "cuda" and split_fits(split, sms):
        groups = max(1, min(M, 2 * sms // split))  # two programs per SM
        return BackwardPlan("split", 1, block, warps, groups, split=split,
                            max_registers=registers)
    return BackwardPlan("loop", 1, 4096, 8, min(M, sms))
