"""What every launch plan launches, pinned: the kernel's path, grid, constexprs and launch
options that rmsnorm.py's and layernorm.py's wrappers derive from `forward_plan` and
`backward_plan`, over a broad grid of shapes, dtypes and devices (issue #32).

The snapshot (tests/data/launch_plans.json.gz) was recorded from the tables as measured on
an H100; a change to solutions/kernels/launch.py that moves any launch there shows here,
with the first differences. After a deliberate change of rule:

    python tests/test_launch_plans.py --write
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import course  # noqa: E402,F401  (picks the mode before anything imports Triton)

import torch  # noqa: E402
from triton import cdiv  # noqa: E402

from solutions.kernels import launch  # noqa: E402
from solutions.kernels.validation import check_path_runs_here  # noqa: E402

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


def _error(exc: Exception) -> str:
    """An error as the snapshot keeps it: its type and message, without the plan's repr."""
    message = str(exc)
    for cut in (": ForwardPlan(", ": BackwardPlan("):
        message = message.split(cut)[0]
    return f"{type(exc).__name__}: {message}"


def _options(plan) -> dict:
    return {f"opt_{k}": v for k, v in plan.launch_options().items()}


def forward_launch(op: str, M: int, N: int, dtype: torch.dtype, device: torch.device) -> dict:
    """What the forward wrappers launch from the plan (rmsnorm._forward, layernorm._forward)."""
    plan = launch.forward_plan(M, N, device, element_size=dtype.itemsize,
                               residual=op == "add_rmsnorm", layernorm=op == "layernorm")
    out = {"path": plan.path, "grid": list(plan.grid(M, N)), **_options(plan)}
    if plan.path == "rows":
        out |= dict(PREFETCH=plan.prefetch, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                    STREAM=plan.stream, WEIGHT_AFTER=plan.weight_after_sum,
                    **plan.rows_even(M, N))
    elif plan.path == "split":
        out |= dict(RELOAD=plan.reload, SPLIT=plan.split, BLOCK_N=plan.block_n,
                    OUT_BLOCK=plan.second_block)
        try:
            check_path_runs_here(plan.path, device, plan.split)
        except ValueError as exc:
            out["refused"] = _error(exc)
    else:
        out |= dict(BLOCK_N=plan.block_n, OUT_BLOCK=plan.second_block)
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
    plan = launch.backward_plan(M, N, device, dtype=dtype, layernorm=layernorm)
    rows_per_program = plan.rows_per_program(M)
    programs = cdiv(M, rows_per_program)
    if plan.path == "split" and not layernorm:
        programs = min(M, plan.programs)
    out = {"path": plan.path, "grid": programs * (plan.split if plan.path == "split" else 1),
           "rows_per_program": rows_per_program}
    try:
        check_path_runs_here(plan.path, device, plan.split)
    except ValueError as exc:
        out["refused"] = _error(exc)
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
        assert {(op, p) for p in ("rows", "pieces", "split", "loop")} <= paths, op


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    SNAPSHOT.parent.mkdir(exist_ok=True)
    text = json.dumps(launches(), sort_keys=True, separators=(",", ":"))
    SNAPSHOT.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"wrote {SNAPSHOT.relative_to(ROOT)} ({SNAPSHOT.stat().st_size} bytes)")
