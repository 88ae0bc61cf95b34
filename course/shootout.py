"""`course bench`: the reference kernels against every peer, measured in one run.

For each op and shape: build inputs, check each implementation's result against the float64
reference (`course.reference`), and time only those that pass, as GPU time on rotating
inputs (`course.bench`, launch overhead hidden for everyone alike). Bandwidth counts the
ideal bytes of the op (`course.traffic`), so every implementation is charged the same bytes
and a faster one is simply one that wastes less time.
"""

from __future__ import annotations

import contextlib
import csv
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from course import bench, hardware, peers, reference, runtime, traffic
from course.check.compare import TOLERANCES, compare

import torch

SHAPES = ((32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096),
          (16384, 8192), (8192, 16384), (4096, 32768), (2048, 65536), (1024, 131072),
          (512, 262144))
# Inference decode: a token (or a few sequences' tokens) a call, where the wrapper's cost per
# call is most of the call (`--shapes decode`, with `--timer host` or `eager`)
DECODE_SHAPES = ((1, 4096), (8, 4096), (64, 4096), (1, 8192), (8, 8192), (64, 8192))
# float16 and float32 on a subset: short, medium and long rows
SUBSET = ((32768, 512), (32768, 4096), (4096, 32768))
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# The course's checkers refuse rows scaled by a common factor above 1e-3 (bf16): that is
# what accumulating the statistics in bf16 does (3 to 7e-3 measured on an H100). Code that
# rounds x * rstd to 16 bits before multiplying by the weight (Hugging Face's eager Llama
# RMSNorm, and Liger, which copies it) also shifts some rows by up to 2**-9, since every
# element of a row is multiplied by the same rstd before that rounding. It is still a
# standard, accepted RMSNorm, so the benchmark accepts up to 1.25 times that shift.
BENCH_ROW_SCALE = {torch.bfloat16: 1.25 * 2.0**-9, torch.float16: 1.25 * 2.0**-12}


@dataclass
class Row:
    op: str
    impl: str
    dtype: str
    M: int
    N: int
    ideal_bytes: int
    status: str                  # "ok", "wrong: ...", "unavailable: ...", "error: ..."
    seconds: float | None = None
    gbps: float | None = None
    fraction_of_copy: float | None = None
    wall_s: float | None = None  # this cell's wall time: compiling, checking and timing


# How `course bench` timed the calls (bench.TIMERS), as the plot's legend says it.
TIMER_TITLES = {"call": "each call timed alone", "graph": "calls back to back in a CUDA graph",
                "eager": "each call timed alone, host overhead included",
                "host": "calls back to back from Python (wall clock)"}
# Runs docs/benchmarks.md reports, one a GPU, shipped with the package so that a
# pip-installed course (on Colab, say) can show them too: (the CSV, where and when). One
# process each: every comparison in a run shares its copy bandwidth. The H200's ran on the
# kernels and launch rules of 2026-11-28 (docs/sweeps/2026-11-28-h200-head/).
DATA = Path(__file__).parent / "data"
RECORDED_RUNS = {
    "H100": (DATA / "bench-h100-2026-11-24.csv",
             "NVIDIA H100 80GB HBM3, torch 2.11.0, triton 3.6.0, 2026-11-24"),
    "H200": (DATA / "bench-h200-2026-11-28.csv",
             "NVIDIA H200, torch 2.11.0, triton 3.6.0, 2026-11-28"),
}
RECORDED_RUN, RECORDED_ON = RECORDED_RUNS["H100"]  # what the chapters show first


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'8192x5120,4096x7168' -> [(8192, 5120), (4096, 7168)], as `--shapes` takes them;
    'decode' stands for DECODE_SHAPES."""
    shapes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "decode":
            shapes.extend(DECODE_SHAPES)
            continue
        dims = part.lower().split("x")
        if len(dims) != 2 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"--shapes wants rows x columns such as 8192x5120, not {part!r}")
        shapes.append((int(dims[0]), int(dims[1])))
    return shapes


def load_rows(path: Path = RECORDED_RUN) -> list[Row]:
    """The rows of a CSV written by `course bench` (by default the recorded H100 run)."""
    def number(text: str) -> float | None:
        return float(text) if text else None

    with open(path, newline="") as f:
        return [Row(r["op"], r["impl"], r["dtype"], int(r["M"]), int(r["N"]),
                    int(r["ideal_bytes"]), r["status"], number(r["seconds"]), number(r["gbps"]),
                    number(r["fraction_of_copy"]), number(r.get("wall_s", "")))
                for r in csv.DictReader(f)]


def as_measurements(rows: Sequence[Row], op: str, dtype: str) -> list[bench.Measurement]:
    """The timed rows of one op and dtype as `course.bench` measurements keyed by N (for
    `bench.plot_fraction_of_copy`)."""
    return [bench.Measurement(r.impl, r.seconds, r.ideal_bytes,
                              r.gbps * 1e9 / r.fraction_of_copy, extra={"N": r.N})
            for r in rows if r.op == op and r.dtype == dtype and r.status == "ok"]


def ideal_bytes(op: str, M: int, N: int, dtype: torch.dtype) -> int:
    if op == "rmsnorm_fwd":
        return traffic.fused_rmsnorm(M, N, dtype).bytes
    if op == "layernorm_fwd":
        return traffic.layernorm(M, N, dtype, save_stats=False).bytes
    if op == "add_rmsnorm_fwd":
        return traffic.fused_add_rmsnorm(M, N, dtype).bytes
    if op == "rmsnorm_bwd":
        return traffic.ideal_backward_bytes(M, N, dtype)
    if op == "layernorm_bwd":
        return traffic.ideal_backward_bytes(M, N, dtype, with_bias=True)
    raise ValueError(f"unknown op {op!r}")


def make_inputs(op: str, M: int, N: int, dtype: torch.dtype, seed: int = 0) -> peers.Inputs:
    gen = torch.Generator(device=runtime.DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=runtime.DEVICE).to(dtype)

    t = {"x": randn(M, N), "weight": (torch.rand(N, generator=gen, device=runtime.DEVICE)
                                      + 0.5).to(dtype)}
    if op.startswith("layernorm"):
        t["x"] = t["x"] + 3.0  # a mean well away from zero
        t["bias"] = randn(N)
    if op == "add_rmsnorm_fwd":
        t["residual"] = randn(M, N)
    if op.endswith("_bwd"):
        t["dy"] = randn(M, N)
    return t


def expected(op: str, t: peers.Inputs, eps: float) -> tuple[torch.Tensor, ...]:
    x, w = t["x"], t["weight"]
    if op == "rmsnorm_fwd":
        return (reference.rmsnorm(x, w, eps),)
    if op == "layernorm_fwd":
        return (reference.layernorm(x, w, t["bias"], eps),)
    if op == "add_rmsnorm_fwd":
        return reference.add_rmsnorm(x, t["residual"], w, eps)
    if op == "rmsnorm_bwd":
        return reference.rmsnorm_backward(x, w, t["dy"], eps)
    return reference.layernorm_backward(x, w, t["bias"], t["dy"], eps)


def _first_mismatch(op: str, got, want: Sequence[torch.Tensor], dtype: torch.dtype) -> str | None:
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    if len(got) != len(want):
        return f"returned {len(got)} tensors, expected {len(want)}"
    names = {"rmsnorm_bwd": ("dx", "dw"), "layernorm_bwd": ("dx", "dw", "db"),
             "add_rmsnorm_fwd": ("y", "residual")}.get(op, ("y",))
    for name, g, w in zip(names, got, want, strict=True):
        if name in ("dw", "db"):
            problem = column_sum_error(name, g, w, g.dtype)
            if problem:
                return problem
            continue
        out_dtype = dtype if g.dtype == dtype else g.dtype
        mismatch = compare(name, g, w, out_dtype,
                           row_scale_tolerance=BENCH_ROW_SCALE.get(out_dtype))
        if mismatch is not None:
            return mismatch.describe().splitlines()[0]
    return None


def column_sum_error(name: str, got: torch.Tensor, want: torch.Tensor,
                     dtype: torch.dtype) -> str | None:
    """dW and dB are sums over every row: entries near zero come from large terms that
    cancel, so their error is judged against the vector's largest entry, not their own."""
    if got.shape != want.shape:
        return f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    _, rtol = TOLERANCES[dtype]
    err = (got.double() - want).abs().max().item()
    scale = want.abs().max().item()
    if not err <= rtol * scale + 1e-6:  # also catches NaN
        return f"{name}: max error {err:.3g} against a largest entry of {scale:.3g}"
    return None


def run_point(op: str, M: int, N: int, dtype: torch.dtype, *, impls: Sequence[str] | None,
              reps: int, copy: float, eps: float = 1e-6, rounds: int = 2,
              timer: str = "call") -> list[Row]:
    """Check every implementation at one shape, then time those that passed in `rounds`
    rounds, each implementation once a round (in reverse order every other round), keeping
    its fastest median: a transient stall of the machine (seen once, a 15x slower median)
    must not stand as a kernel's speed, and no implementation is always the one timed first,
    right after the inputs and the float64 reference were made. `timer`: `bench.TIMERS`."""
    with bench.graph_stream() if timer == "graph" else contextlib.nullcontext():
        return _run_point(op, M, N, dtype, impls=impls, reps=reps, copy=copy, eps=eps,
                          rounds=rounds, timer=timer)


def _run_point(op: str, M: int, N: int, dtype: torch.dtype, *, impls: Sequence[str] | None,
               reps: int, copy: float, eps: float, rounds: int, timer: str) -> list[Row]:
    nbytes = ideal_bytes(op, M, N, dtype)
    inputs = make_inputs(op, M, N, dtype)
    want = expected(op, inputs, eps)
    dname = str(dtype).replace("torch.", "")
    rows: list[Row] = []
    ready: list[tuple[Row, list]] = []  # (row, its calls on rotating inputs)
    for impl in peers.implementations(op):
        if impls and impl.name not in impls:
            continue
        row = Row(op, impl.name, dname, M, N, nbytes, "ok", wall_s=0.0)
        started = time.perf_counter()
        try:
            call = impl.prepare(inputs, eps)
            problem = _first_mismatch(op, call(), want, dtype)
            if problem:
                row.status = f"wrong: {problem}"
            else:
                ready.append((row, [impl.prepare(make_inputs(op, M, N, dtype, seed=s + 1), eps)
                                    for s in range(bench.copies_needed(nbytes) - 1)] + [call]))
        except peers.Unavailable as exc:
            row.status = f"unavailable: {exc}"
        except Exception as exc:  # a peer that crashes on a shape is a result, not a stop
            row.status = _error(exc)
        row.wall_s += time.perf_counter() - started
        rows.append(row)
    for row, calls in bench.in_alternating_order(ready, rounds):
        if row.status != "ok":
            continue
        started = time.perf_counter()
        try:
            seconds = bench.time_in_turn(calls, warmup=5, reps=reps, hide_launch=True,
                                         timer=timer).median_s
            row.seconds = seconds if row.seconds is None else min(row.seconds, seconds)
        except Exception as exc:
            row.status, row.seconds = _error(exc), None
        row.wall_s += time.perf_counter() - started
    for row, _ in ready:
        if row.status == "ok":
            row.gbps = nbytes / row.seconds / 1e9
            row.fraction_of_copy = nbytes / row.seconds / copy
    del ready
    torch.cuda.empty_cache()
    return rows


def _error(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    import triton

    return {"date": time.strftime("%Y-%m-%d"), "gpu": props.name,
            "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def format_table(rows: Sequence[Row], op: str, dtype: str) -> str:
    sel = [r for r in rows if r.op == op and r.dtype == dtype]
    names = list(dict.fromkeys(r.impl for r in sel))
    shapes = list(dict.fromkeys((r.M, r.N) for r in sel))
    lines = [f"| M x N | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|"]
    for M, N in shapes:
        cells = []
        for name in names:
            r = next((r for r in sel if r.impl == name and (r.M, r.N) == (M, N)), None)
            if r is None:
                cells.append("")
            elif r.status == "ok":  # % of copy, then (GB/s; us a call)
                cells.append(f"{100 * r.fraction_of_copy:.1f} % ({r.gbps:.0f}; "
                             f"{r.seconds * 1e6:.1f} us)")
            else:
                cells.append(r.status.split(":")[0])
        lines.append(f"| {M} x {N} | {' | '.join(cells)} |")
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path, dtype: str = "bfloat16", timer: str = "call"):
    """% of copy bandwidth against N, one panel per op, one colour per implementation
    (the same colour in every panel), ours drawn thickest; the legend in a panel of its
    own, which also says how the calls were timed. Returns the figure."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    ops = [op for op in peers.OPS if any(r.op == op and r.dtype == dtype for r in rows)]
    names = list(dict.fromkeys(r.impl for r in rows if r.dtype == dtype))
    colours = {name: f"C{i}" for i, name in enumerate(names)}
    # One panel more than there are ops, for the legend: a legend below the panels was cut
    # off when the ops filled every panel (one op, or three).
    panels = len(ops) + 1
    cols = min(3, panels)
    # A bare Figure: no pyplot, so a notebook's plotting backend is left alone.
    fig = Figure(figsize=(4.6 * cols, 3.6 * -(-panels // cols)))
    axes = fig.subplots(-(-panels // cols), cols, squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.axis("off")
    for ax, op in zip(axes.flat, ops, strict=False):
        sel = [r for r in rows if r.op == op and r.dtype == dtype and r.status == "ok"]
        for name in names:
            pts = sorted((r.N, 100 * r.fraction_of_copy) for r in sel if r.impl == name)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                        color=colours[name], lw=2.6 if name == "ours" else 1.2, label=name)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 105)
        ax.set_title(f"{op} ({dtype})", fontsize=10)
        ax.set_xlabel("N  (M = 32768 up to N = 4096, then M x N = 2**27)" if all(
            (r.M, r.N) in SHAPES for r in sel) else "N  (M as in the table)", fontsize=8)
        ax.set_ylabel("% of copy bandwidth")
        ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=colours[n], lw=2.6 if n == "ours" else 1.2,
                          marker="o", ms=3) for n in names]
    axes.flat[len(ops)].legend(handles, names, loc="center", fontsize=9, frameon=False,
                               title=TIMER_TITLES[timer], title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def run(ops: Sequence[str], dtypes: Sequence[str], out_dir: Path, *, shapes=SHAPES,
        impls: Sequence[str] | None = None, reps: int = 50, subset=SUBSET,
        timer: str = "call") -> list[Row]:
    if not runtime.on_gpu():
        raise hardware.NeedsGPU("course bench measures bandwidth: it needs a CUDA GPU "
                                "(no GPU is visible here)")
    out_dir.mkdir(parents=True, exist_ok=True)
    copy = hardware.copy_bandwidth()
    env = environment() | {"copy_gbps": copy / 1e9, "timer": timer}
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}: copy bandwidth "
          f"{copy / 1e9:.0f} GB/s; timer: {timer}", flush=True)
    rows: list[Row] = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        for op in ops:
            for M, N in (shapes if dname == "bfloat16" else subset):
                if op.endswith("_bwd") and N > 65536:
                    continue  # the backward table stops at 65536
                point = run_point(op, M, N, dtype, impls=impls, reps=reps, copy=copy,
                                  timer=timer)
                rows.extend(point)
                # Wall times too: a run must fit the GPU machine's call limit, and they say
                # which implementation's compiling or timing takes it.
                print(f"{op} {dname} {M}x{N}: " + ", ".join(
                    (f"{r.impl} {100 * r.fraction_of_copy:.1f}%" if r.status == "ok"
                     else f"{r.impl} {r.status[:60]}") + f" ({r.wall_s:.1f} s)" for r in point),
                    flush=True)
            print(format_table(rows, op, dname), flush=True)
            save(rows, env, out_dir)  # after every op: a run cut short keeps what it measured
    plot(rows, out_dir / "bench.png", timer=timer)
    return rows


def save(rows: Sequence[Row], env: dict, out_dir: Path) -> None:
    (out_dir / "bench.json").write_text(json.dumps(
        {"environment": env, "rows": [asdict(r) for r in rows]}, indent=1))
    with open(out_dir / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fld.name for fld in fields(Row)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
