"""How each reference kernel is launched for a given shape: which path, block sizes, warps.

The paths (rmsnorm.py's module docstring names the kernel each one runs):

- rows:   a program holds BLOCK_M whole rows in registers;
- loop:   pass 1 sums a row BLOCK_N columns at a time and keeps nothing; pass 2 reads the
          row again, from L2 (pass 1 asked it to stay there);
- split:  SPLIT programs on different SMs share a row and exchange their partial sums
          (sibling_sync.py; GPU only: the interpreter runs programs one after another);
- pieces: (backward) a 16-bit row between two powers of two, held as half its block and
          the power of two that covers the rest;
- columns: (backward, a few rows) a program owns some columns of every row and sums each
          whole row itself, so dW is written in one launch, without column sums.

Reading guide. A plan is data, built by keyword: `ForwardPlan`, `BackwardPlan`, and
`Variant`, the one thing a forward plan may do beyond its path's plain kernel; a rule is asked
about `Rows` and answers with a plan or None (launch_plans.py, with `stated_multiple_of`, the
MULTIPLE every kernel takes). For each op, `FORWARD_RULES` and `BACKWARD_RULES` below list the
rules in the order they are tried; the first that gives a plan wins. A backward of a few
rows takes the columns path on every GPU (`few_rows`, derived). Then come the rules measured
on this GPU (`measured`, plan_tables.py: the table in plans/<gpu>.json, one record per rule,
in order), then rules derived from the GPU's properties (derived_rules.py, from
`GpuProperties` in gpus.py), which are all that a GPU without a table gets. Each rule says in
one line why it is what it is; docs/launch-rules.md has the measurements.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
from triton import next_power_of_2

from solutions.kernels.derived_rules import (
    backward_loop,
    backward_rows,
    backward_split,
    few_rows,
    fused_add_long_rows,
    long_rows,
    persistent_short_rows,
    pieces,
    rows_in_registers,
)
from solutions.kernels.gpus import (  # noqa: F401  (KNOWN_GPUS, H100: plans for them)
    H100,
    INTERPRETER,
    KNOWN_GPUS,
    GpuProperties,
    gpu_properties,
)
from solutions.kernels.launch_plans import BackwardPlan, ForwardPlan, Rows, Rule
from solutions.kernels.plan_tables import measured

FORWARD_RULES: dict[str, tuple[Rule, ...]] = {
    "rmsnorm": (measured, persistent_short_rows, rows_in_registers, long_rows),
    "add_rmsnorm": (measured, persistent_short_rows, rows_in_registers, fused_add_long_rows),
    "layernorm": (measured, persistent_short_rows, rows_in_registers, long_rows),
}
BACKWARD_RULES: dict[str, tuple[Rule, ...]] = {
    "rmsnorm_backward": (few_rows, measured, pieces, backward_rows, backward_split,
                         backward_loop),
    "layernorm_backward": (few_rows, measured, pieces, backward_rows, backward_split,
                           backward_loop),
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


@functools.lru_cache(maxsize=4096)  # asked again where a wrapper keeps no launch, and by sweeps
def _plan(rows: Rows) -> ForwardPlan | BackwardPlan:
    """The first plan the op's rules give, a forward's tiles no taller than M needs."""
    rules = BACKWARD_RULES.get(rows.op) or FORWARD_RULES[rows.op]
    plan = next(plan for rule in rules if (plan := rule(rows)) is not None)
    if isinstance(plan, ForwardPlan):
        plan = replace(plan, block_m=min(plan.block_m, next_power_of_2(rows.M)))
    return plan
