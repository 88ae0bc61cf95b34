"""What a launch rule is asked and what it answers (the rules: launch.py).

A rule is asked about `Rows`: the op, the shape, the dtype and the GPU. It answers with a
plan, which is data, built by keyword: `ForwardPlan`, `BackwardPlan`, and `Variant`, the one
thing a forward plan may do beyond its path's plain kernel. The wrappers (rmsnorm.py,
layernorm.py) read their kernels' grid, flags and launch options from the plan.
`stated_multiple_of` is the MULTIPLE every kernel takes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

from triton import next_power_of_2

from solutions.kernels.gpus import GpuProperties

MAX_ROW_BLOCKS = 16  # a ONE_ROW plan unrolls at most this many blocks, so the code stays small


class Variant(str, enum.Enum):
    """What a forward plan does beyond its path's plain kernel: one of these at most."""

    PLAIN = "plain"
    PREFETCH = "prefetch"  # rows: programs walk over the tiles, loading the next one first
    STREAM = "stream"  # rows: evict-first loads, streaming stores, the weight after the sum
    WEIGHT_AFTER = "weight_after"  # rows: the weight (and bias) loaded after the sum
    KEEP_MASKS = "keep_masks"  # rows: masked accesses even where the rows fill the tiles
    ONE_ROW = "one_row"  # loop, a program a row: the row's blocks unrolled, no loops


def _launch_options(plan) -> dict:
    """Keyword arguments for the kernel launch: warps, and the register cap if one is set."""
    return {"num_warps": plan.num_warps} | ({"maxnreg": plan.max_registers}
                                           if plan.max_registers else {})


@dataclass(frozen=True, kw_only=True)
class ForwardPlan:
    path: str  # "rows", "loop" or "split"
    block_n: int  # columns per block (loop: pass 1's loads; split: a program's columns)
    num_warps: int
    block_m: int = 1  # rows per tile (rows path)
    split: int = 1  # programs per row (split path)
    programs: int = 0  # programs walking over the rows (loop) or tiles (PREFETCH); 0: one each
    out_block: int = 0  # columns per block when the row is read again (0: block_n)
    reload: bool = True  # split path: read the columns again after the exchange
    max_registers: int = 0  # per thread, passed to the compiler as maxnreg (0: its choice)
    variant: Variant = Variant.PLAIN
    launch_options = _launch_options

    def __post_init__(self):
        object.__setattr__(self, "variant", Variant(self.variant))
        object.__setattr__(self, "out_block", self.out_block or self.block_n)
        path = "loop" if self.variant is Variant.ONE_ROW else "rows"
        if self.variant is not Variant.PLAIN and (self.path != path or (
                self.variant is Variant.ONE_ROW and self.programs)):
            raise ValueError(f"the {self.variant.value} variant is for the {path} path"
                             f"{' with a program per row' if path == 'loop' else ''}: {self}")

    # The names the wrappers read (rmsnorm.py, layernorm.py).
    prefetch = property(lambda self: self.variant is Variant.PREFETCH)
    stream = property(lambda self: self.variant is Variant.STREAM)
    weight_after = property(lambda self: self.variant is Variant.WEIGHT_AFTER)
    keep_masks = property(lambda self: self.variant is Variant.KEEP_MASKS)
    one_row = property(lambda self: self.variant is Variant.ONE_ROW)
    weight_after_sum = property(lambda self: self.stream or self.weight_after,
                                doc="The rows kernels' WEIGHT_AFTER (streamed rows too).")

    def grid(self, M: int, N: int) -> tuple[int]:
        if self.path == "rows":  # a program a tile, unless they prefetch
            tiles = math.ceil(M / self.block_m)
            return (min(tiles, self.programs) if self.prefetch and self.programs else tiles,)
        if self.path == "split":
            return (M * self.split,)
        return (min(M, self.programs) if self.programs else M,)

    def rows_even(self, M: int, N: int) -> dict:
        """The rows kernels' EVEN: the rows fill the block and the tiles hold M exactly, so
        the kernel needs no masks (a run-time bound costs more than it looks)."""
        return {"EVEN": not self.keep_masks and N == self.block_n and M % self.block_m == 0}

    def split_even(self, N: int) -> bool:
        """The split kernels' EVEN: the row is exactly its programs' blocks, so no access
        needs a mask (docs/launch-rules.md#layernorm-split-even)."""
        return self.path == "split" and N == self.split * self.block_n

    def row_blocks(self, N: int) -> dict:
        """The loop kernels' ROW_BLOCKS (a ONE_ROW row's cdiv(N, block_n) unrolled blocks; 0:
        they loop) and EVEN (a row of several blocks fills every block of both passes)."""
        if not self.one_row:
            return {"ROW_BLOCKS": 0, "EVEN": False}
        blocks = -(-N // self.block_n)
        if blocks > MAX_ROW_BLOCKS:
            raise ValueError(f"a one_row plan unrolls at most {MAX_ROW_BLOCKS} blocks of "
                             f"block_n = {self.block_n} columns; got N = {N}: {self}")
        even = blocks > 1 and N % self.block_n == 0 and N % self.out_block == 0
        return {"ROW_BLOCKS": blocks, "EVEN": even}


@dataclass(frozen=True, kw_only=True)
class BackwardPlan:
    path: str  # "rows", "pieces", "split", "loop" or "columns"
    block_n: int  # columns per block (pieces: the first piece's; columns: the row's sums')
    num_warps: int
    programs: int  # kernel 1's programs (split: row groups), each writing a row of dW sums
    # (columns: 1, the one row of dW sums that its programs write a part each of)
    block_m: int = 1  # rows per step inside a program
    split: int = 1  # programs per row group (split path)
    num_stages: int = 1
    reload: bool = False  # rows: read x and dy again for dx instead of keeping them
    sum_each_step: bool = False  # rows: add dW up over each step's rows as it goes
    prefetch: bool = False  # rows: load the next step's x and dy before this step's math
    max_registers: int = 0  # per thread, passed to the compiler as maxnreg (0: its choice)
    columns: int = 0  # columns path: the columns a program owns, of every row (its grid)
    launch_options = _launch_options

    def __post_init__(self):
        if (self.path == "columns") != (self.columns > 0) or (
                self.path == "columns" and self.programs != 1):
            raise ValueError(f"the columns path, and no other, takes columns > 0 and "
                             f"programs = 1 (one row of dW sums): {self}")

    def column_grid(self, M: int, N: int) -> tuple[int]:
        """The columns path's grid: a program per `columns` columns of every row, each
        holding all M rows at once (block_m of them)."""
        if self.block_m < M:
            raise ValueError(f"a columns plan holds every row at once: block_m = "
                             f"{self.block_m} is under M = {M}: {self}")
        return (-(-N // self.columns),)

    @property
    def replayable(self) -> bool:
        """Whether a later call of the same layouts can launch it again as it was made: not
        a split (its exchange slots change every call), nor the loop path (its partial sums
        start from zeros)."""
        return self.path not in ("split", "loop")

    def rows_per_program(self, M: int) -> int:
        return math.ceil(M / self.programs)

    def tail_for(self, N: int) -> int:
        """Pieces path: the second piece's columns, the power of two that covers what the
        first piece (block_n columns) leaves of a row of N."""
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


# ---------------------------------------------------------------------- what a rule is asked


@dataclass(frozen=True)
class Rows:
    """What a rule is asked about: op, shape, dtype ("16-bit" where the forward knows only
    the element size), and the GPU."""

    op: str
    M: int
    N: int
    dtype: str
    element_size: int
    gpu: GpuProperties

    @property
    def block_n(self) -> int:
        return next_power_of_2(self.N)


Rule = Callable[[Rows], "ForwardPlan | BackwardPlan | None"]
