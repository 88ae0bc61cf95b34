"""How each reference kernel is launched for a given shape: which path, block sizes, warps.

The paths (rmsnorm.py's module docstring names the kernel each one runs):

- rows:   a program holds BLOCK_M whole rows in registers;
- loop:   pass 1 sums a row BLOCK_N columns at a time and keeps nothing; pass 2 reads the
          row again, from L2 (pass 1 asked it to stay there);
- split:  SPLIT programs on different SMs share a row and exchange their partial sums
          (sibling_sync.py; GPU only: the interpreter runs programs one after another);
- pieces: (backward) a 16-bit row between two powers of two, held as half its block and
          the power of two that covers the rest.

Reading guide. A plan is data, built by keyword: `ForwardPlan`, `BackwardPlan`, and
`Variant`, the one thing a forward plan may do beyond its path's plain kernel. For each op,
`FORWARD_RULES` and `BACKWARD_RULES` list the rules in the order they are tried; the first
that gives a plan wins. First come the rules measured on this GPU (`measured`: the table in
plans/<gpu>.json, one record per rule, in order), then rules derived from the GPU's
properties (`GpuProperties`, gpus.py), which are all that a GPU without a table gets. Each
rule says in one line why it is what it is; docs/launch-rules.md has the measurements.
`stated_multiple_of` is the MULTIPLE every kernel takes.
"""

from __future__ import annotations

import enum
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
from triton import next_power_of_2

from solutions.kernels.gpus import (  # noqa: F401  (KNOWN_GPUS, H100: plans for them)
    H100,
    INTERPRETER,
    KNOWN_GPUS,
    GpuProperties,
    gpu_properties,
    multiprocessors,
)
from solutions.kernels.sibling_sync import next_power_of_2_split, split_fits

PLANS = Path(__file__).with_name("plans")  # the measured tables, one file per GPU
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
    path: str  # "rows", "pieces", "split" or "loop"
    block_n: int  # columns per block (pieces: the first piece's)
    num_warps: int
    programs: int  # kernel 1's programs (split: row groups), each writing a row of dW sums
    block_m: int = 1  # rows per step inside a program
    split: int = 1  # programs per row group (split path)
    num_stages: int = 1
    reload: bool = False  # rows: read x and dy again for dx instead of keeping them
    sum_each_step: bool = False  # rows: add dW up over each step's rows as it goes
    prefetch: bool = False  # rows: load the next step's x and dy before this step's math
    max_registers: int = 0  # per thread, passed to the compiler as maxnreg (0: its choice)
    launch_options = _launch_options

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


# ----------------------------------------------------------------------------------- the rules


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


@dataclass(frozen=True, kw_only=True)
class Measured:
    """A measured rule: the plan (its fields) for the rows it matches. A backward plan's
    programs are `programs_per_sm` an SM, at most M (a split's row groups: per SM, shared
    by the row's programs); a pieces plan's block_n is half the row's block."""

    why: str  # one line, and where docs/launch-rules.md says more
    plan: dict
    block_n: int = 0  # the row's power-of-two block (0: any)
    fills: bool | None = None  # whether N fills that block (None: either)
    dtype: str = "any"  # "16-bit", "float32", "float16", "bfloat16" or "any"
    n_above: int = 0
    n_at_most: int = 1 << 62
    programs_per_sm: int = 0

    def __call__(self, rows: Rows) -> ForwardPlan | BackwardPlan | None:
        dtypes = ("any", rows.dtype) + (("16-bit",) if rows.element_size == 2 else ())
        if (self.block_n not in (0, rows.block_n) or self.dtype not in dtypes
                or self.fills not in (None, rows.N == rows.block_n)
                or not self.n_above < rows.N <= self.n_at_most):
            return None
        if "backward" not in rows.op:
            return ForwardPlan(**self.plan)
        sms, path = rows.gpu.sms, self.plan["path"]
        fields = {"block_n": rows.block_n // 2} if path == "pieces" else {}
        split = next_power_of_2_split(rows.N, self.plan["block_n"]) if path == "split" else 1
        if path == "split" and not (rows.gpu.concurrent and split_fits(split, sms)):
            return None
        programs = max(1, min(rows.M, self.programs_per_sm * sms // split))
        return BackwardPlan(**self.plan | fields, split=split, programs=programs)


@functools.cache
def measured_rules(gpu_name: str) -> dict[str, tuple[Measured, ...]]:
    """The measured rules for a GPU of this name, by op: from the first table in plans/
    whose `matches` names it; none where no table does."""
    for path in sorted(PLANS.glob("*.json")):
        table = json.loads(path.read_text())
        if any(name in gpu_name for name in table["matches"]):
            return {op: tuple(Measured(**rule) for rule in rules)
                    for op, rules in table["rules"].items()}
    return {}


def measured(rows: Rows) -> ForwardPlan | BackwardPlan | None:
    """The first of this GPU's measured rules for the op that matches (plans/*.json)."""
    rules = measured_rules(rows.gpu.name).get(rows.op, ())
    return next((plan for rule in rules if (plan := rule(rows)) is not None), None)


# Derived rules: each figure from the GPU's properties (docs/launch-rules.md#derived-rules).
VALUES_A_THREAD = 16  # rows path: enough warps that a thread holds about this many values
LATENCY_S = 600e-9  # a load's round trip to HBM: bytes in flight = bandwidth x latency
PROGRAMS_AN_SM = 4  # a rows program moves its SM's share of the bytes in flight over this
PERSISTENT_PER_SM = 8  # short rows: programs an SM, walking over the tiles
SPLIT_BLOCK, SPLIT_WARPS, SECOND_BLOCK = 16384, 16, 8192  # the split path's programs
RESIDUAL_SPLIT, RESIDUAL_SPLIT_BLOCKS = 32, (4096, 16384)  # the fused add's programs a row


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
    if (rows.block_n <= loop_block and fits_l2) or not gpu.concurrent or not split_fits(
            split, gpu.sms):
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
    if rows.gpu.concurrent and split_fits(plan.split, rows.gpu.sms):
        return plan
    return ForwardPlan(path="loop", block_n=4096, num_warps=8, programs=rows.gpu.sms)


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
    if not (rows.gpu.concurrent and split_fits(split, rows.gpu.sms)):
        return None
    return BackwardPlan(path="split", block_n=4096, num_warps=4, split=split,
                        programs=max(1, min(rows.M, 2 * rows.gpu.sms // split)))


def backward_loop(rows: Rows) -> BackwardPlan:
    """Where no split can run: a program an SM walks over rows, two passes each."""
    return BackwardPlan(path="loop", block_n=4096, num_warps=8, programs=min(rows.M,
                                                                               rows.gpu.sms))


FORWARD_RULES: dict[str, tuple[Rule, ...]] = {
    "rmsnorm": (measured, persistent_short_rows, rows_in_registers, long_rows),
    "add_rmsnorm": (measured, persistent_short_rows, rows_in_registers, fused_add_long_rows),
    "layernorm": (measured, persistent_short_rows, rows_in_registers, long_rows),
}
BACKWARD_RULES: dict[str, tuple[Rule, ...]] = {
    "rmsnorm_backward": (measured, pieces, backward_rows, backward_split, backward_loop),
    "layernorm_backward": (measured, pieces, backward_rows, backward_split, backward_loop),
}


def forward_plan(M: int, N: int, device: torch.device, *, element_size: int = 2,
                 residual: bool = False, layernorm: bool = False,
                 gpu: GpuProperties | None = None) -> ForwardPlan:
    """The forward's plan for M rows of N columns of `element_size`-byte values on `device`
    (or planned for `gpu`); `residual`: the fused add."""
    op = "layernorm" if layernorm else "add_rmsnorm" if residual else "rmsnorm"
    dtype = "float32" if element_size == 4 else "16-bit"
    return _plan(Rows(op, M, N, dtype, element_size, gpu or gpu_properties(device)))


def backward_plan(M: int, N: int, device: torch.device, *, dtype: torch.dtype = torch.bfloat16,
                  layernorm: bool = False, gpu: GpuProperties | None = None) -> BackwardPlan:
    """The backward's plan for M rows of N columns of `dtype` on `device` (or for `gpu`)."""
    op = "layernorm_backward" if layernorm else "rmsnorm_backward"
    return _plan(Rows(op, M, N, str(dtype).removeprefix("torch."), dtype.itemsize,
                      gpu or gpu_properties(device)))


@functools.lru_cache(maxsize=4096)  # the wrappers ask on every call
def _plan(rows: Rows) -> ForwardPlan | BackwardPlan:
    """The first plan the op's rules give, a forward's tiles no taller than M needs."""
    rules = BACKWARD_RULES.get(rows.op) or FORWARD_RULES[rows.op]
    plan = next(plan for rule in rules if (plan := rule(rows)) is not None)
    if isinstance(plan, ForwardPlan):
        plan = replace(plan, block_m=min(plan.block_m, next_power_of_2(rows.M)))
    return plan
