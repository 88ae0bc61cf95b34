"""What every launch plan launches, pinned: the kernel's path, grid, constexprs and launch
options that rmsnorm.py's and layernorm.py's wrappers derive from `forward_plan` and
`backward_plan`, over a broad grid of shapes, dtypes and devices (issue #32).

The snapshot (tests/data/launch_plans.json.gz) was recorded from the tables as measured on
an H100; a change to solutions/kernels/launch.py or to the rules it tries (plan_tables.py,
derived_rules.py) that moves any launch there shows here, with the first differences. After
a deliberate change of rule:

    python tests/test_launch_plans.py --write
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import course  # noqa: E402,F401  (picks the mode before anything imports Triton)

import pytest  # noqa: E402
import torch  # noqa: E402
from triton import cdiv  # noqa: E402

from solutions.kernels import launch, plan_tables  # noqa: E402
from solutions.kernels.launch_plans import ForwardPlan, Rows, Variant  # noqa: E402
from solutions.kernels.sibling_sync import split_fits  # noqa: E402

SNAPSHOT = ROOT / "tests" / "data" / "launch_plans.json.gz"

FORWARD_OPS = ("rmsnorm", "add_rmsnorm", "layernorm")
BACKWARD_OPS = ("rmsnorm_bwd", "layernorm_bwd")
ROWS = (1, 3, 64, 1000, 32768)
# Powers of two and their neighbours, model widths, and lengths inside the measured tables'
# blocks (partial blocks, pieces), to 2**24 columns.
WIDTHS = (96, 100, 300, 384, 640, 768, 1000, 1152, 1280, 1536, 1600, 2304, 2560, 3000, 3072,
          3584, 4104, 4352, 4608, 5120, 6144, 6400, 7168, 8200, 9216, 10240, 11264, 12288,
          13312, 14336, 15360, 18432, 20480, 24576, 28672, 40000, 49152, 100000, 131080,
          3_000_000)
LENGTHS = sorted({n for k in range(25) for n in (2**k - 1, 2**k, 2**k + 1)} - {0}
                 | set(WIDTHS))
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The interpreter's plans, and a GPU's as planned where none is visible (an H100's).
DEVICES = {"cpu": torch.device("cpu"), "cuda": torch.device("cuda", 0)}
# Other GPUs, planned by the derived rules alone (no table of measured rules is theirs).
DERIVED_FOR = [launch.KNOWN_GPUS[name] for name in ("A100 80GB", "L4", "T4", "B200")]


def _error(exc: Exception) -> str:
    """An error as the snapshot keeps it: its type and message, without the plan's repr."""
    message = str(exc)
    for cut in (": ForwardPlan(", ": BackwardPlan("):
        message = message.split(cut)[0]
    return f"{type(exc).__name__}: {message}"


def _options(plan) -> dict:
    return {f"opt_{k}": v for k, v in plan.launch_options().items()}


def _gpu(device: torch.device):
    """The GPU planned for: the interpreter, or an H100 whatever GPU this machine has."""
    return launch.INTERPRETER if device.type != "cuda" else launch.H100


def _refused(plan, device: torch.device) -> dict:
    """A split plan the wrappers refuse (validation.check_path_runs_here)."""
    if plan.path != "split" or (device.type == "cuda" and split_fits(plan.split,
                                                                     _gpu(device).sms)):
        return {}
    return {"refused": True}


def forward_launch(op: str, M: int, N: int, dtype: torch.dtype, device: torch.device) -> dict:
    """What the forward wrappers launch from the plan (rmsnorm._forward, layernorm._forward)."""
    plan = launch.forward_plan(M, N, device, element_size=dtype.itemsize,
                               residual=op == "add_rmsnorm", layernorm=op == "layernorm",
                               gpu=_gpu(device))
    out = {"path": plan.path, "grid": list(plan.grid(M, N)), **_options(plan)}
    if plan.path == "rows":
        out |= dict(PREFETCH=plan.prefetch, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                    STREAM=plan.stream, WEIGHT_AFTER=plan.weight_after_sum,
                    **plan.rows_even(M, N))
    elif plan.path == "split":
        out |= dict(RELOAD=plan.reload, SPLIT=plan.split, BLOCK_N=plan.block_n,
                    OUT_BLOCK=plan.out_block, **_refused(plan, device))
    else:
        out |= dict(BLOCK_N=plan.block_n, OUT_BLOCK=plan.out_block)
        try:
            out |= plan.row_blocks(N)
        except ValueError as exc:
            out["row_blocks"] = _error(exc)
    return out


def backward_launch(op: str, M: int, N: int, dtype: torch.dtype, device: torch.device
                    ) -> dict:
    """What the backward wrappers launch from the plan (rmsnorm_backward,
    layernorm_backward): both grids, since they count a split plan's programs apart."""
    layernorm = op == "layernorm_bwd"
    plan = launch.backward_plan(M, N, device, dtype=dtype, layernorm=layernorm,
                                gpu=_gpu(device))
    rows_per_program = plan.rows_per_program(M)
    programs = cdiv(M, rows_per_program)
    if plan.path == "split" and not layernorm:
        programs = min(M, plan.programs)
    grid = (plan.column_grid(M, N)[0] if plan.path == "columns"
            else programs * (plan.split if plan.path == "split" else 1))
    out = {"path": plan.path, "grid": grid, "rows_per_program": rows_per_program,
           **_refused(plan, device)}
    if plan.path == "rows":
        out |= dict(SUM_EACH_STEP=plan.sum_each_step, PREFETCH=plan.prefetch,
                    BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=plan.num_warps,
                    num_stages=plan.num_stages)
        if not layernorm:
            out["RELOAD"] = plan.reload
    elif plan.path == "pieces":
        out |= dict(HEAD=plan.block_n, num_warps=plan.num_warps)
        try:
            out["TAIL"] = plan.tail_for(N)
        except ValueError as exc:
            out["TAIL"] = _error(exc)
    elif plan.path == "split":
        out |= dict(SPLIT=plan.split, BLOCK_N=plan.block_n, **_options(plan))
    elif plan.path == "columns":
        out |= dict(COLUMNS=plan.columns, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                    num_warps=plan.num_warps)
    else:
        out |= dict(BLOCK_N=plan.block_n, num_warps=plan.num_warps)
    return out


def launches() -> dict[str, dict]:
    """Every launch on the grid, by "op M N dtype device"."""
    out = {}
    for device_name, device in DEVICES.items():
        for dtype_name, dtype in DTYPES.items():
            for op in FORWARD_OPS + BACKWARD_OPS:
                describe = backward_launch if op in BACKWARD_OPS else forward_launch
                for M in ROWS:
                    for N in LENGTHS:
                        try:
                            found = describe(op, M, N, dtype, device)
                        except Exception as exc:  # a plan that raises is part of the record
                            found = {"error": _error(exc)}
                        out[f"{op} {M} {N} {dtype_name} {device_name}"] = found
    return out


def recorded() -> dict[str, dict]:
    return json.loads(gzip.decompress(SNAPSHOT.read_bytes()))


def differences(want: dict[str, dict], got: dict[str, dict], limit: int = 20) -> list[str]:
    """The first `limit` keys whose launch differs, each with both launches."""
    out = [f"{key}: {want.get(key)} -> {got.get(key)}"
           for key in sorted(want.keys() | got.keys()) if want.get(key) != got.get(key)]
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def test_every_launch_is_the_one_recorded():
    got = launches()
    diffs = differences(recorded(), got)
    assert not diffs, (f"{len(diffs)} launches differ from {SNAPSHOT.name} (after a deliberate "
                       "change: python tests/test_launch_plans.py --write):\n  "
                       + "\n  ".join(diffs))


def test_the_snapshot_covers_every_path_of_every_op():
    found = recorded()
    assert len(found) == (len(DEVICES) * len(DTYPES) * (len(FORWARD_OPS) + len(BACKWARD_OPS))
                          * len(ROWS) * len(LENGTHS))
    paths = {(key.split()[0], launch.get("path")) for key, launch in found.items()}
    for op in FORWARD_OPS:
        assert {(op, p) for p in ("rows", "loop", "split")} <= paths, op
    for op in BACKWARD_OPS:
        assert {(op, p) for p in ("rows", "pieces", "split", "loop", "columns")} <= paths, op


def plan_problems(op: str, M: int, N: int, plan, gpu) -> list[str]:
    """What makes a plan unfit for M rows of N columns on `gpu`: rows it does not cover,
    more values a thread than registers hold, a split over more programs than can run at
    once (or at all, in the interpreter), more warps, registers or shared memory than an SM
    has."""
    out = []
    values = plan.block_m * plan.block_n  # a step's values, spread over the program's threads
    if plan.path == "pieces":
        if not N & (N - 1) or not plan.block_n < N <= plan.block_n + plan.tail_for(N):
            out.append("the pieces do not hold the row")
        values = plan.block_n + plan.tail_for(N)
    elif plan.path == "rows" and plan.block_n < N:
        out.append("a tile's rows are shorter than N")
    elif plan.path == "loop" and getattr(plan, "one_row", False):
        if plan.row_blocks(N)["ROW_BLOCKS"] * plan.block_n < N or plan.programs:
            out.append("a one_row plan does not cover its row")
    elif plan.path == "split" and plan.block_n * plan.split < N:
        out.append("the row's programs do not cover it")  # (the loop path loops over it)
    if plan.path == "split" and not (gpu.concurrent and plan.split <= gpu.sms):
        out.append(f"a split of {plan.split} programs cannot all run at once")
    if plan.path == "rows" and values > 64 * 32 * plan.num_warps:
        out.append(f"{values // (32 * plan.num_warps)} values a thread")
    if plan.num_warps > min(32, gpu.max_warps_per_sm):
        out.append(f"{plan.num_warps} warps")
    if plan.max_registers * 32 * plan.num_warps > gpu.registers_per_sm:
        out.append(f"{plan.max_registers} registers a thread on {plan.num_warps} warps")
    if 4 * plan.block_m * plan.num_warps * 2 > gpu.shared_memory_per_sm:  # reduction scratch
        out.append("more shared memory than an SM has")
    if plan.programs > M and op.endswith("_bwd"):
        out.append("more programs than rows")
    return out


def _plans_for(gpu, measured: bool = True):
    """Every plan on the grid for `gpu`, with its op and shape: (op, M, N, dtype, plan);
    without the measured tables where not `measured` (plan_tables.measured looks them up
    in its own module, so that is where they are taken away)."""
    saved = plan_tables.measured_rules
    if not measured:
        plan_tables.measured_rules = lambda name: {}
    launch._plan.cache_clear()
    try:
        for dtype in DTYPES.values():
            for M in ROWS:
                for N in LENGTHS:
                    for op in FORWARD_OPS:
                        yield op, M, N, dtype, launch.forward_plan(
                            M, N, torch.device("cuda"), element_size=dtype.itemsize,
                            residual=op == "add_rmsnorm", layernorm=op == "layernorm", gpu=gpu)
                    for op in BACKWARD_OPS:
                        yield op, M, N, dtype, launch.backward_plan(
                            M, N, torch.device("cuda"), dtype=dtype,
                            layernorm=op == "layernorm_bwd", gpu=gpu)
    finally:
        plan_tables.measured_rules = saved
        launch._plan.cache_clear()


@pytest.mark.parametrize("gpu", DERIVED_FOR + [launch.H100, launch.INTERPRETER],
                         ids=lambda gpu: gpu.name.split(",")[0])
def test_the_derived_rules_plan_every_shape_within_the_gpus_means(gpu):
    # The GPUs without a table get the derived rules alone; so would an H100 without its.
    assert not plan_tables.measured_rules(gpu.name) or gpu.name.startswith(("H100", "Triton"))
    paths, problems = set(), []
    for op, M, N, dtype, plan in _plans_for(gpu, measured=False):
        paths.add((op, plan.path))
        problems += [f"{op} {M} x {N} {dtype}: {p}: {plan}"
                     for p in plan_problems(op, M, N, plan, gpu)]
    assert not problems, f"{len(problems)} unfit plans, the first: " + "\n".join(problems[:10])
    if gpu.concurrent:
        assert {(op, "split") for op in FORWARD_OPS + BACKWARD_OPS} <= paths
    assert {(op, p) for op in BACKWARD_OPS for p in ("pieces", "columns")} <= paths


def test_planning_without_the_tables_leaves_them_out():
    # The derived rules' tests above must not plan from a table: without it an H100 plans
    # otherwise somewhere, and the table is back afterwards.
    with_table = [plan for *_, plan in _plans_for(launch.H100)]
    without = [plan for *_, plan in _plans_for(launch.H100, measured=False)]
    assert len(without) == len(with_table) and without != with_table
    assert [plan for *_, plan in _plans_for(launch.H100)] == with_table


def test_the_measured_tables_plan_within_the_h100s_means():
    for gpu in (launch.H100, launch.KNOWN_GPUS["H200"], launch.INTERPRETER):
        problems = [f"{op} {M} x {N} {dtype}: {p}: {plan}"
                    for op, M, N, dtype, plan in _plans_for(gpu)
                    for p in plan_problems(op, M, N, plan, gpu)]
        assert not problems, problems[:10]


def test_each_gpu_reads_its_own_table_and_others_none():
    h100 = plan_tables.measured_rules("NVIDIA H100 80GB HBM3")
    assert h100 and h100 == plan_tables.measured_rules(launch.H100.name)
    assert set(h100) == set(launch.FORWARD_RULES) | set(launch.BACKWARD_RULES)
    # The H200's table is the H100's but for the rules a sweep there replaced or added
    # (docs/launch-rules.md#h200), each saying so; LayerNorm's backward is the H100's.
    h200 = plan_tables.measured_rules("NVIDIA H200")
    assert set(h200) == set(h100)
    assert h200["layernorm_backward"] == h100["layernorm_backward"]
    swept = {op: [rule for rule in h200[op] if rule not in h100[op]] for op in h200}
    assert {op: len(rules) for op, rules in swept.items()} == {
        "rmsnorm": 11, "add_rmsnorm": 6, "layernorm": 10, "rmsnorm_backward": 3,
        "layernorm_backward": 0}
    assert all(rule.why.startswith("swept on an H200") and rule.dtype in ("16-bit", "float32")
               for rules in swept.values() for rule in rules)
    assert [rule for rule in h200["rmsnorm_backward"] if rule not in swept[
        "rmsnorm_backward"]] == list(h100["rmsnorm_backward"])
    h200_gpu = launch.KNOWN_GPUS["H200"]
    plan = functools.partial(launch.forward_plan, device=None, gpu=h200_gpu)
    assert plan(4096, 32768) == ForwardPlan(path="loop", block_n=8192, num_warps=32,
                                            variant="one_row")
    assert plan(32768, 512, layernorm=True) == ForwardPlan(
        path="rows", block_n=512, num_warps=2, block_m=2)
    assert plan(32768, 12288, layernorm=True) == ForwardPlan(  # 8 warps to 12288 (2026-11-28)
        path="loop", block_n=4096, num_warps=8, variant="one_row")
    assert plan(32768, 12289, layernorm=True).num_warps == 16
    # the split without masks, read again 4096 at a time (2026-11-28): 89.0 against 85.9
    assert plan(2048, 65536, layernorm=True) == ForwardPlan(
        path="split", block_n=16384, num_warps=8, split=4, out_block=4096)
    assert plan(1024, 131072, layernorm=True).out_block == 4096
    assert plan(1024, 131072, layernorm=True).num_warps == 8
    assert plan(512, 262144, residual=True) == ForwardPlan(  # 96.6 against 94.1 (2026-11-28)
        path="split", block_n=8192, num_warps=16, split=32, out_block=8192, reload=False)
    assert plan(1024, 100000, layernorm=True).num_warps == 16  # swept on full blocks only
    assert plan(1024, 131072, residual=True) == ForwardPlan(
        path="split", block_n=8192, num_warps=16, split=16, out_block=8192, reload=False)
    assert plan(1024, 131072) == ForwardPlan(  # second-pass blocks of 4096 (2026-11-28)
        path="split", block_n=16384, num_warps=16, split=8, out_block=4096)
    assert plan(1024, 100000, residual=True).split == 32  # measured on full blocks only
    assert plan(4096, 32768, element_size=4) == launch.forward_plan(
        4096, 32768, None, element_size=4, gpu=launch.H100)  # float32 keeps the H100's
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA L4", "Tesla T4", "NVIDIA B200"):
        assert plan_tables.measured_rules(name) == {}, name
    assert launch.gpu_properties(torch.device("cpu")) == launch.INTERPRETER
    # A measured split whose programs could not all run at once on a smaller part of the
    # same name (8 SMs) is passed over, as the derived rules pass over theirs.
    small = dataclasses.replace(h200_gpu, sms=8)
    assert launch.forward_plan(1024, 131072, None, residual=True, gpu=small).split <= 8


def test_every_measured_rule_is_the_first_to_match_somewhere():
    # A rule that an earlier one always shadows is dead data: none may be, in any table.
    # The H100's table is asked for the interpreter's plans too (a table is read by name).
    for table, gpus in ((launch.H100.name, (launch.INTERPRETER, launch.H100)),
                        ("H200", (launch.KNOWN_GPUS["H200"],))):
        _assert_every_rule_is_first_somewhere(plan_tables.measured_rules(table), gpus)


def _assert_every_rule_is_first_somewhere(rules: dict, gpus) -> None:
    assert rules
    used = set()
    for gpu in gpus:
        for dtype in DTYPES.values():
            for M in ROWS:
                for N in LENGTHS:
                    for op in rules:
                        size = dtype.itemsize
                        name = (str(dtype).removeprefix("torch.") if "backward" in op else
                                "float32" if size == 4 else "16-bit")
                        rows = Rows(op, M, N, name, size, gpu)
                        used.add(next((op, i) for i, rule in enumerate(rules[op])
                                      if rule(rows) is not None) if any(
                            rule(rows) is not None for rule in rules[op]) else None)
    dead = [(op, i, rule.why) for op in rules for i, rule in enumerate(rules[op])
            if (op, i) not in used]
    assert not dead, dead


def test_plans_are_built_by_keyword_with_one_variant():
    with pytest.raises(TypeError):
        ForwardPlan("rows", 512, 4)
    plan = ForwardPlan(path="rows", block_n=512, num_warps=4, variant="stream")
    assert plan.stream and plan.weight_after_sum and not plan.prefetch
    assert plan.out_block == 512 and plan.launch_options() == {"num_warps": 4}
    with pytest.raises(ValueError, match="the one_row variant is for the loop path with a "
                                         "program per row"):
        ForwardPlan(path="loop", block_n=512, num_warps=4, programs=3,
                    variant=Variant.ONE_ROW)
    with pytest.raises(ValueError, match="the keep_masks variant is for the rows path"):
        ForwardPlan(path="loop", block_n=512, num_warps=4, variant="keep_masks")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    SNAPSHOT.parent.mkdir(exist_ok=True)
    text = json.dumps(launches(), sort_keys=True, separators=(",", ":"))
    SNAPSHOT.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"wrote {SNAPSHOT.relative_to(ROOT)} ({SNAPSHOT.stat().st_size} bytes)")
