"""The launch rules measured on a GPU: a table in plans/, one file per GPU, whose `matches`
names it; one record per rule (`Measured`), tried in file order. `measured` is the rule that
launch.py tries first, before the rules derived from the GPU's properties (derived_rules.py);
a GPU without a table gets none. Adding a table: docs/launch-rules.md#adding-a-gpu.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from solutions.kernels.launch_plans import BackwardPlan, ForwardPlan, Rows
from solutions.kernels.sibling_sync import next_power_of_2_split

PLANS = Path(__file__).with_name("plans")  # the measured tables, one file per GPU


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
        sms, path = rows.gpu.sms, self.plan["path"]
        split = (self.plan.get("split") or next_power_of_2_split(rows.N, self.plan["block_n"])
                 if path == "split" else 1)
        if path == "split" and not rows.gpu.runs_split(split):
            return None  # its programs could not all run at once here (a smaller part)
        if "backward" not in rows.op:
            return ForwardPlan(**self.plan)
        fields = {"block_n": rows.block_n // 2} if path == "pieces" else {}
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
