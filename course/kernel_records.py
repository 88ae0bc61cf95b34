"""What the learner's package knows of the course's reference kernels without shipping them.

The reference kernels live in the repository (`solutions/kernels/`), not in the package
that learners install (`make dist`). Two records of them ship instead, in `course/data/`,
both written from the kernels by `scripts/reference_records.py` (a test fails when they
are out of date):

- `kernel_fingerprints.json`: a fingerprint of every `@triton.jit` function there. The
  checkers refuse a launch whose kernel has one of them (`copied_from`): a reference kernel
  pasted into a notebook is still the course's, renamed, re-indented, with its comments,
  docstring and decorators changed or not.
- `reference_plans.json`: the launch plans the reference kernels choose at the shapes the
  chapters discuss, planned for an H100 (132 SMs), so that a chapter can show them.

A fingerprint is the SHA-256 of the function's syntax tree, written out field by field,
without its name, its decorators or any string standing alone as a statement (docstrings):
what Python runs, not how the text is laid out. Renaming variables or reordering code
changes it; the checkers' other rules, and the grader's scan, still apply to such a copy.

A third record is measured, not written from the source: `ncu-h200-split.json` holds the
counters Nsight Compute reported for two reference kernels on an H200 (`ncu_counters`),
copied from the raw reports in `docs/sweeps/2026-11-28-split-even/`, which it names, so that
chapter 08 can read a profile on a machine without the GPU or the profiler.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import textwrap
import weakref
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DATA = Path(__file__).parent / "data"
FINGERPRINTS = DATA / "kernel_fingerprints.json"
PLANS = DATA / "reference_plans.json"
NCU_COUNTERS = DATA / "ncu-h200-split.json"
# Changes whenever the way a fingerprint is computed changes (the records say which).
SCHEME = "ast-sha256-v1"
# Fields that differ between Python versions without changing what the code does.
_VERSION_FIELDS = frozenset({"type_comment", "type_params", "kind"})


def _written_out(node: Any) -> str:
    """A syntax tree as text, the same on every Python from 3.10 on (ast.dump's layout
    changed in 3.13): fields by name, empty ones left out."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if name in _VERSION_FIELDS or value is None or value == []:
                continue
            fields.append(f"{name}={_written_out(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_written_out(item) for item in node) + "]"
    return repr(node)


class _Plain(ast.NodeTransformer):
    """Drops what does not change what a function computes: strings standing alone as
    statements (docstrings)."""

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None
        return self.generic_visit(node)


def fingerprint(source: str) -> str | None:
    """The fingerprint of the first function defined in `source` (None: no function, or
    source Python cannot parse)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except (SyntaxError, ValueError):
        return None
    function = next((n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if function is None:
        return None
    function.name, function.decorator_list = "", []
    function = _Plain().visit(function)
    if not function.body:  # a function that was only a docstring
        function.body = [ast.Pass()]
    text = f"{SCHEME}\n{_written_out(function)}"
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def shipped_fingerprints() -> dict[str, str]:
    """fingerprint -> the reference kernel it belongs to (`solutions.kernels.rmsnorm.
    rmsnorm_fwd_kernel`), from the shipped record."""
    record = json.loads(FINGERPRINTS.read_text())
    if record.get("scheme") != SCHEME:
        raise RuntimeError(f"{FINGERPRINTS} holds fingerprints of scheme "
                           f"{record.get('scheme')!r}, this course computes {SCHEME!r}: run "
                           "scripts/reference_records.py in a checkout of the course")
    return {entry["fingerprint"]: entry["kernel"] for entry in record["kernels"]}


# function -> (its code object when fingerprinted, the reference kernel it copies or None)
_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def copied_from(function: Any) -> str | None:
    """The reference kernel that the Python function behind a kernel is a copy of, or None
    (its own, or a function whose source cannot be read)."""
    code = getattr(function, "__code__", None)
    try:
        known = _seen.get(function)
    except TypeError:  # not weak-referenceable: never cached
        known = None
    if known is not None and known[0] is code:
        return known[1]
    readable, found = looked_up(function)
    if not readable:
        return None
    try:
        _seen[function] = (code, found)
    except TypeError:
        pass
    return found


def looked_up(function: Any) -> tuple[bool, str | None]:
    """`copied_from` without its cache: whether the function's source can be read, and the
    reference kernel it copies (None for its own)."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False, None
    return True, shipped_fingerprints().get(fingerprint(source) or "")


@functools.cache
def _plans() -> dict[str, Any]:
    return json.loads(PLANS.read_text())


def reference_plan(op: str, M: int, N: int, *, element_size: int = 2,
                   backward: bool = False) -> SimpleNamespace:
    """The launch plan the reference kernels chose for `op` ("rmsnorm", "add_rmsnorm",
    "layernorm") at M x N, planned for an H100, as recorded: its fields as attributes
    (`plan.num_warps`). Only the shapes the chapters show are recorded."""
    kind = "backward" if backward else "forward"
    for entry in _plans()[kind]:
        if (entry["op"], entry["M"], entry["N"], entry["element_size"]) == (op, M, N,
                                                                           element_size):
            return SimpleNamespace(**entry["plan"])
    raise KeyError(f"no recorded {kind} plan for {op} at {M} x {N}, {element_size}-byte "
                   f"elements; {PLANS.name} holds the shapes the chapters show "
                   "(scripts/reference_records.py lists them)")


def planned_for() -> str:
    """The GPU the recorded plans were made for, in words."""
    return _plans()["planned_for"]


@dataclass(frozen=True)
class KernelCounters:
    """What Nsight Compute reported for one launch of a kernel (percentages are of the GPU's
    peak; the duration is ncu's, clocks locked and caches flushed, not a user's time)."""
    kernel: str
    grid_size: int
    block_size: int
    registers_per_thread: int
    duration_us: float
    dram_throughput_pct: float
    dram_tbyte_per_s: float
    sm_throughput_pct: float
    warp_cycles_per_issued_instruction: float
    local_memory_spilling_requests: int
    block_limit_registers: int
    block_limit_warps: int
    theoretical_warps_per_sm: int
    theoretical_occupancy_pct: float
    achieved_occupancy_pct: float
    ncu_says: str


@dataclass(frozen=True)
class NcuRecord:
    """Recorded counters of several kernels, with where and how they were measured."""
    gpu: str
    driver: str
    ncu: str
    torch: str
    triton: str
    date: str
    kernels_at: str                     # the commit whose kernels were profiled
    shape: tuple[int, int]
    dtype: str
    sources: dict[str, str]             # op -> the raw ncu report, from the repository root
    kernels: dict[str, KernelCounters]  # op ("layernorm", "rmsnorm") -> its counters

    def recorded_with(self) -> str:
        """The GPU, versions and date, in words."""
        return (f"{self.gpu} (driver {self.driver}), {self.ncu}, torch {self.torch}, "
                f"triton {self.triton}, {self.date}; kernels at commit {self.kernels_at}")


def ncu_counters(path: Path = NCU_COUNTERS) -> NcuRecord:
    """The recorded Nsight Compute counters (`ncu-h200-split.json`)."""
    record = json.loads(Path(path).read_text())
    # The file also says what it is ("what", "command"): only the fields above are read.
    about = {f.name: record[f.name] for f in fields(NcuRecord) if f.name != "kernels"}
    about["shape"] = tuple(about["shape"])
    return NcuRecord(**about, kernels={op: KernelCounters(**counters)
                                       for op, counters in record["kernels"].items()})


__all__ = ["FINGERPRINTS", "NCU_COUNTERS", "PLANS", "SCHEME", "KernelCounters", "NcuRecord",
           "copied_from", "fingerprint", "ncu_counters", "planned_for", "reference_plan",
           "shipped_fingerprints"]
