"""How each reference kernel is launched for a given shape: which path, block sizes, warps.

The numbers are the result of sweeps on an H100 (`scripts/tune_kernels.py`; the figures are
in docs/benchmarks.md). Three forward paths:

- rows:  each program holds BLOCK_M whole rows in registers (BLOCK_M > 1 when rows are
         short, so a program still moves enough bytes to hide memory latency);
- split: a row too long for one program's registers is split over SPLIT programs that
         exchange their partial sums through global memory (GPU only: the interpreter runs
         programs one after another, so a program waiting for its siblings would wait forever);
- loop:  one program per row, looping over column blocks twice; the second read of the row
         mostly hits L2. The interpreter's path for long rows, and the backward's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
from triton import next_power_of_2

from solutions.kernels.sibling_sync import next_power_of_2_split

# Columns one forward program keeps in float32 registers (32 warps at the top end).
MAX_REGISTER_BLOCK = 32768
# Columns per program when a forward row is split over several programs.
SPLIT_BLOCK = 8192
# The backward holds x, dy and the dW sums in registers: half the forward's budget.
BACKWARD_REGISTER_BLOCK = 16384
BACKWARD_SPLIT_BLOCK = 4096


@dataclass(frozen=True)
class ForwardPlan:
    path: str           # "rows", "split" or "loop"
    block_m: int        # rows per tile (rows path)
    block_n: int        # columns per block
    num_warps: int
    split: int = 1      # programs per row (split path)
    programs: int = 0   # rows path: programs walking over the tiles (0: one per tile);
                        # split path: row groups (0: one per row)
    prefetch: bool = False  # rows path: load the next tile before computing this one

    def grid(self, M: int, N: int) -> tuple[int]:
        if self.path == "rows":
            tiles = math.ceil(M / self.block_m)
            return (min(tiles, self.programs) if self.programs else tiles,)
        if self.path == "split":
            return (math.ceil(M / self.rows_per_group(M)) * self.split,)
        return (M,)

    def rows_per_group(self, M: int) -> int:
        return math.ceil(M / self.programs) if self.programs else 1


@dataclass(frozen=True)
class BackwardPlan:
    path: str           # "rows", "split" or "loop"
    block_m: int        # rows per tile inside a program
    block_n: int
    num_warps: int
    programs: int       # P: programs (row groups for "split") of kernel 1, each writing
                        # one float32 row of dW partial sums
    split: int = 1      # programs per row group (split path)
    num_stages: int = 1

    def rows_per_program(self, M: int) -> int:
        return math.ceil(M / self.programs)


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # the interpreter runs programs one by one; few programs, less overhead
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _warps_for(elements: int, per_thread: int = 16, lo: int = 1, hi: int = 16) -> int:
    """Enough warps that each thread holds about `per_thread` elements."""
    warps = max(lo, min(hi, elements // (32 * per_thread)))
    return 1 << (warps.bit_length() - 1)  # a power of two


# Rows path, by BLOCK_N = next_power_of_2(N): (rows per tile, warps). From the sweeps in
# docs/benchmarks.md: short rows want several rows per program so that each program moves
# a few KB; long rows want enough warps that a thread holds 16 to 32 values.
ROWS_PATH = {512: (4, 4), 1024: (2, 4), 2048: (2, 8), 4096: (1, 8), 8192: (1, 8),
             16384: (2, 16), 32768: (1, 32)}
# At N <= 256 a tile is too small to hide latency on its own: fewer, persistent programs
# (PERSISTENT_PER_SM per SM) walk over the tiles, loading the next while computing this one.
PERSISTENT_PER_SM = 8


def forward_plan(M: int, N: int, device: torch.device, *, element_size: int = 2,
                 residual: bool = False) -> ForwardPlan:
    """`element_size` is x's in bytes; `residual` says the residual is added too. Rows of
    32768 fit one program's registers only when they arrive as 16-bit values and alone:
    float32 rows, or a second input, spill there, and take the split path instead."""
    block_n = next_power_of_2(N)
    register_limit = MAX_REGISTER_BLOCK if element_size <= 2 and not residual else 16384
    if block_n <= 256:
        block_m = max(1, min(16, 2048 // block_n, next_power_of_2(M)))
        programs = PERSISTENT_PER_SM * _multiprocessors(device)
        return ForwardPlan("rows", block_m, block_n, 4, programs=programs, prefetch=True)
    if block_n <= register_limit:
        block_m, warps = ROWS_PATH[block_n]
        return ForwardPlan("rows", min(block_m, next_power_of_2(M)), block_n, warps)
    if device.type == "cuda":
        split = next_power_of_2_split(N, SPLIT_BLOCK)
        return ForwardPlan("split", 1, SPLIT_BLOCK, 8, split=split)
    return ForwardPlan("loop", 1, 4096, 8)


def backward_plan(M: int, N: int, device: torch.device, *, layernorm: bool = False
                  ) -> BackwardPlan:
    """The split size (programs P) trades parallelism against the P*N*4 bytes of partial
    sums written and read again: enough programs to fill the GPU once or twice, no more.
    LayerNorm's backward carries two more float32 sums per column, so it leaves the
    registers-only path earlier and prefers fewer warps at N = 8192."""
    sms = _multiprocessors(device)
    block_n = next_power_of_2(N)
    register_limit = BACKWARD_REGISTER_BLOCK // (2 if layernorm else 1)
    if block_n <= register_limit:  # x, dy and the dW sums all live in registers
        block_m = max(1, min(16, 4096 // block_n))
        warps = 16 if block_n >= 4096 else 8
        if layernorm and block_n == 8192:
            warps = 8
        programs = min(M, (2 if N <= 4096 else 1) * sms)
        return BackwardPlan("rows", block_m, block_n, warps, programs)
    if device.type == "cuda":
        split = next_power_of_2_split(N, BACKWARD_SPLIT_BLOCK)
        warps = 4 if layernorm else 8
        groups = max(1, min(M, 2 * sms // split))  # two programs per SM
        return BackwardPlan("split", 1, BACKWARD_SPLIT_BLOCK, warps, groups, split=split)
    return BackwardPlan("loop", 1, 4096, 8, min(M, sms))
