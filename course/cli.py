"""The `course` command (also `python -m course`).

    course doctor    what is installed, where kernels will run, and a tiny Triton kernel
                     run end to end; exit status 0 when everything works, 1 otherwise.
    course bench     the reference kernels against PyTorch eager, torch.compile, Liger and
                     Quack (where installed), on the GPU in hand: table, CSV, JSON, plot.
    course grade NOTEBOOK [--verbose]
                     a chapter notebook graded as the autograder grades it (hidden tests
                     included): a score per exercise, then the whole message of each failed
                     cell (a screenful of each; --verbose: all of it, and where an
                     unexpected error came from). Without a GPU, the cells that measure
                     speed are listed as needing one, their points apart. Exit status 0
                     when every point gradable here was earned, 1 when points were lost or
                     the integrity scan flagged code for review, 2 when the file is not a
                     chapter of the course.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from collections.abc import Sequence

import course

# Import failures are reported by `doctor`, not raised here: a broken install is exactly
# what it diagnoses. `course` (imported above) has already chosen the execution mode, so
# TRITON_INTERPRET is set before the kernel below is decorated.
try:
    import torch
except Exception as exc:  # any failure to import is the diagnosis
    torch = None
    _TORCH_ERROR: Exception | None = exc
else:
    _TORCH_ERROR = None

try:
    import triton
    import triton.language as tl
except Exception as exc:
    triton = None
    _TRITON_ERROR: Exception | None = exc
else:
    _TRITON_ERROR = None

    @triton.jit
    def _row_sum_kernel(x_ptr, out_ptr, stride_x_row, n_cols, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols                  # 33 columns in a block of 64: the tail is masked
        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row, tl.sum(x.to(tl.float32), axis=0))


FIX_HINT = ("try reinstalling the environment: `make clean && make test` "
            "(or `pip install -e .` in your own environment)")

# Reported by version; torch and triton are reported from the imported modules instead.
OTHER_PACKAGES = ("numpy", "ipywidgets", "nbgrader")


class DoctorFailure(Exception):
    """A problem that makes the course unusable; its message is the one-line reason."""


def _installed_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _line(key: str, value: str) -> None:
    print(f"  {key:<14} {value}")


def run_tiny_kernel() -> None:
    """Sum each row of a 4x33 tensor with Triton and compare with torch; raise on mismatch."""
    from course import runtime

    x = torch.arange(4 * 33, dtype=torch.float32, device=runtime.DEVICE).reshape(4, 33) / 7
    out = torch.empty(4, dtype=torch.float32, device=runtime.DEVICE)
    _row_sum_kernel[(4,)](x, out, x.stride(0), 33, BLOCK_N=64)
    runtime.synchronize()
    expected = x.sum(dim=1)
    if not torch.allclose(out, expected, rtol=1e-5, atol=1e-4):
        raise DoctorFailure(f"the test kernel gave wrong results: row sums {out.tolist()}, "
                            f"expected {expected.tolist()}")


def _report_gpu() -> None:
    from course import hardware, runtime

    if not runtime.on_gpu():
        _line("GPU", "none visible (only bandwidth checks and timings need one)")
        return
    _line("GPU", torch.cuda.get_device_name())
    spec = hardware.current()
    if spec is None:
        _line("spec", "not in course.hardware's table (bandwidth is still measured)")
    else:
        bf16 = f"{spec.bf16_tflops:g} TFLOP/s" if spec.bf16_tflops is not None else "no bf16"
        _line("spec", f"{spec.name}: peak HBM {spec.hbm_gbps:g} GB/s, bf16 {bf16}, "
                      f"L2 {spec.l2_mb:g} MB")
    copy = hardware.copy_bandwidth() / 1e9
    share = f" ({100 * copy / spec.hbm_gbps:.0f} % of the spec's peak)" if spec else ""
    _line("copy", f"{copy:.0f} GB/s measured{share}")


def doctor() -> int:
    """Print the environment report; return the exit status."""
    print("Norm Kernels environment")
    _line("course", course.__version__)
    _line("Python", f"{platform.python_version()} ({sys.executable})")
    _line("torch", torch.__version__ if torch is not None else f"BROKEN ({_TORCH_ERROR})")
    _line("triton", triton.__version__ if triton is not None else f"BROKEN ({_TRITON_ERROR})")
    for dist in OTHER_PACKAGES:
        _line(dist, _installed_version(dist))

    try:
        if torch is None:
            raise DoctorFailure(f"torch cannot be imported: {_TORCH_ERROR}")
        _line("mode", course.banner())
        if triton is None:
            raise DoctorFailure(f"triton cannot be imported: {_TRITON_ERROR}")
        _report_gpu()
        run_tiny_kernel()
    except DoctorFailure as failure:
        print(f"FAILED: {failure}; {FIX_HINT}")
        return 1
    except Exception as exc:  # a crash is a finding, reported in one line
        print(f"FAILED: {type(exc).__name__}: {exc}; {FIX_HINT}")
        return 1
    _line("test kernel", "a Triton row sum on a 4x33 tensor matches torch")
    print("OK: the course is ready.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="course", description="Norm Kernels: helpers for the course's learners.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("doctor", help="report the environment and run a tiny Triton kernel",
                        description="Report versions and where kernels run, then run a tiny "
                                    "Triton kernel; exit status 1 if anything is broken.")
    from course import peers
    from course.bench import TIMERS

    bench = commands.add_parser(
        "bench", help="measure the reference kernels against the peers (needs a GPU)",
        description="Check every implementation against the float64 reference, then time it "
                    "and report GB/s and %% of the copy bandwidth measured in the same run.")
    bench.add_argument("--ops", default=",".join(peers.OPS),
                       help="comma-separated, from: " + ", ".join(peers.OPS))
    bench.add_argument("--dtypes", default="bfloat16,float16,float32",
                       help="bfloat16 runs every shape; float16 and float32 a subset")
    bench.add_argument("--impls", default="", help="only these implementations (names as "
                                                   "in the table), comma-separated")
    bench.add_argument("--shapes", default="", metavar="MxN,...",
                       help="measure these shapes (or \"decode\": M = 1, 8, 64 at N = 4096 and "
                            "8192), in every dtype asked for (default: the "
                            "benchmark's shapes in bfloat16, a subset of them otherwise)")
    bench.add_argument("--reps", type=int, default=50)
    bench.add_argument("--timer", default="call", choices=TIMERS,
                       help="call: each call alone between two events, GPU time (default); "
                            "graph: calls back to back in a CUDA graph, as a model runs them; "
                            "eager: each call alone, host overhead included; host: calls back "
                            "to back from Python, wall clock (the wrappers' cost per call)")
    bench.add_argument("--out", default="bench-results", help="folder for CSV, JSON and plot")
    grade = commands.add_parser(
        "grade", help="grade a chapter notebook as the autograder does (hidden tests too)",
        description="Run a chapter notebook with the course's own test cells, hidden tests "
                    "included, in a fresh kernel with the autograder's time limit per cell, "
                    "and print the points of each exercise.")
    grade.add_argument("notebook", help="your notebook, e.g. notebooks/ch04_fused/ch04_fused.ipynb")
    grade.add_argument("--timeout", type=int, default=None, metavar="SECONDS",
                       help="time limit per cell (default: the autograder's, from "
                            "grader/nbgrader_config.py)")
    grade.add_argument("--course", default=None, metavar="ROOT",
                       help="the course checkout holding solutions/ and grader/ (default: the "
                            "one this `course` package is installed from)")
    grade.add_argument("--verbose", action="store_true",
                       help="print every line of each failed cell's message (without it, the "
                            "first screenful), and the traceback of an unexpected error")
    return parser


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from course import hardware, peers, shootout

    ops = _split(args.ops)
    unknown = [op for op in ops if op not in peers.OPS]
    bad_dtypes = [d for d in _split(args.dtypes) if d not in shootout.DTYPES]
    if unknown or bad_dtypes:
        print(f"unknown op(s) {unknown} or dtype(s) {bad_dtypes}; ops: {', '.join(peers.OPS)};"
              f" dtypes: {', '.join(shootout.DTYPES)}")
        return 2
    try:
        shapes = shootout.parse_shapes(args.shapes)
    except ValueError as exc:
        print(f"course bench: {exc}")
        return 2
    chosen = {"shapes": shapes, "subset": shapes} if shapes else {}
    try:
        shootout.run(ops, _split(args.dtypes), Path(args.out), impls=_split(args.impls) or None,
                     reps=args.reps, timer=args.timer, **chosen)
    except hardware.NeedsGPU as exc:
        print(f"course bench: {exc}")
        return 1
    print(f"wrote {args.out}/bench.csv, bench.json and bench.png")
    return 0


def grade(args: argparse.Namespace) -> int:
    from pathlib import Path

    from course import grade as grading

    try:
        report = grading.grade_notebook(args.notebook, cell_timeout_s=args.timeout,
                                        course_root=Path(args.course) if args.course else None)
    except (grading.NotAChapterError, ValueError) as exc:
        print(f"course grade: {exc}", file=sys.stderr)
        return 2
    print(report.table(verbose=args.verbose))
    # Without a GPU the speed cells cannot be graded: every other point earned is success.
    # Flagged code fails the command even with full marks: an instructor will review it.
    return 0 if report.complete_here and not report.integrity else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        return doctor()
    if args.command == "bench":
        return bench(args)
    if args.command == "grade":
        return grade(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse refuses others
