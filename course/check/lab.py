"""Checker for chapter 08's performance lab: a tuned RMSNorm against torch.compile.

`beats_torch_compile(rmsnorm)` checks the learner's kernel for correctness at every shape,
then times it and `torch.compile` of the eager reference (`course.baselines.eager_rmsnorm`)
with `course.bench` (warm-up, median of many repetitions, inputs rotated through more
memory than L2 holds). The learner's calls are held to what the correctness checks allow,
as in every speed check (`course.check.bandwidth`): one call at each shape runs watched
before timing and one after (one launch, no PyTorch compute), every output kept from the
timed calls is compared with the reference for its inputs, and a time faster than a copy
of the bytes is refused. It passes when the kernel is at least as fast on every shape, within
`tolerance` (the spread between runs of one kernel: near the copy bandwidth both kernels
tie, and a tie should not fail by chance); a shape that loses is timed again, up to
`retries` times, before the check fails. GPU only.

The default shapes move 256 to 512 MB per call. Each call is timed on its own, so the
Python cost of calling a compiled function (about 90 us on an H100 with torch 2.11,
measured: torch.compile's time stayed near 90 us for every shape below 128 MB) would
otherwise be what is compared, not the kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from course import baselines, bench, reference, runtime, traffic
from course.check.bandwidth import CallSpec, check_watched_call, measure_checked, resolve_on_cpu
from course.check.learner_facing import learner_facing
from course.check.rmsnorm import RMSNORM_FORWARD
from course.hardware import NeedsGPU

import torch

# Narrow, medium and wide rows, each 256 MB of bfloat16 input: where a tuned kernel can
# match the compiler, and where a naive one (one row per program at small N, spills at
# large N) falls behind.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((131072, 1024), (32768, 4096), (8192, 16384))


@dataclass(frozen=True)
class ShapeTiming:
    shape: tuple[int, int]
    yours: bench.Measurement
    compiled: bench.Measurement
    attempts: int
    tolerance: float = 0.0

    @property
    def speedup(self) -> float:
        """torch.compile's time over yours: 1.0 or more is at least as fast."""
        return self.compiled.seconds / self.yours.seconds

    @property
    def passed(self) -> bool:
        return self.yours.seconds <= self.compiled.seconds * (1.0 + self.tolerance)


@dataclass(frozen=True)
class CompileComparison:
    """One row per shape: your time, torch.compile's, the speedup and the verdict."""

    dtype: torch.dtype
    rows: tuple[ShapeTiming, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def table(self) -> list[tuple[str, str, str, str, str, str]]:
        out = []
        for r in self.rows:
            m, n = r.shape
            out.append((f"{m}x{n}", f"{r.yours.seconds * 1e6:.1f}",
                        f"{100 * (r.yours.fraction_of_copy or 0):.0f} %",
                        f"{r.compiled.seconds * 1e6:.1f}", f"{r.speedup:.2f}x",
                        ("ok" if r.passed else "SLOWER") + f" ({r.attempts} attempt"
                        + ("s)" if r.attempts != 1 else ")")))
        return out

    def __str__(self) -> str:
        head = ("shape", "yours us", "of copy", "compile us", "speedup", "verdict")
        rows = [head, *self.table()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        tolerance = self.rows[0].tolerance if self.rows else 0.0
        lines = [f"rmsnorm vs torch.compile ({str(self.dtype).replace('torch.', '')}, median "
                 "times; speedup = compile's time / yours; passes at "
                 f"{1 / (1 + tolerance):.2f}x or more)"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                  for row in rows]
        return "\n".join(lines)

    def __repr__(self) -> str:
        # One line under a cell that ends with the check, which has printed the table.
        verdict = "as fast or faster" if self.passed else "slower"
        speedups = ", ".join(f"{r.shape[0]}x{r.shape[1]} {r.speedup:.2f}x" for r in self.rows)
        return (f"<rmsnorm vs torch.compile ({str(self.dtype).replace('torch.', '')}): "
                f"{verdict}; speedup {speedups}>")


def _needs_gpu(on_cpu: str) -> None:
    on_cpu = resolve_on_cpu(on_cpu)
    message = ("beats_torch_compile needs a GPU: kernels here run in Triton's interpreter on "
               "the CPU, and timing them against torch.compile would say nothing. Run this "
               "cell on a machine with a CUDA GPU (for example Colab with a GPU runtime).")
    if on_cpu == "skip":
        print(message + " Skipped.")
        return
    raise NeedsGPU(message)


@learner_facing
def beats_torch_compile(fn: Callable, *, shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
                        dtype: torch.dtype = torch.bfloat16, retries: int = 3, reps: int = 50,
                        tolerance: float = 0.02, on_cpu: str = "skip", quiet: bool = False
                        ) -> CompileComparison | None:
    """On a GPU: for each (M, N) in `shapes`, check `fn(x, weight, eps)` against the float64
    reference and chapter 04's rules (one launch, no PyTorch compute), then time it and
    torch.compile of the eager reference, checking every output kept from your timed calls
    and refusing a time faster than a copy of the bytes. Pass when `fn` is at
    least as fast on every shape, within `tolerance` (0.02: up to 2 % slower counts as a
    tie); a losing shape is timed again, up to `retries` times. Raise AssertionError with
    the table otherwise; return the table.

    Without a GPU: on_cpu="skip" prints why and returns None, on_cpu="fail" raises NeedsGPU.
    """
    if on_cpu not in ("skip", "fail"):
        raise ValueError(f"on_cpu must be 'skip' or 'fail', not {on_cpu!r}")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be a fraction in [0, 1), got {tolerance!r}")
    if not callable(fn):
        raise TypeError(f"pass your function itself, not {type(fn).__name__}")
    shapes = [tuple(s) for s in shapes]
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise ValueError(f"shapes must be a non-empty list of (M, N) pairs, got {shapes!r}")
    if not runtime.on_gpu():
        _needs_gpu(on_cpu)
        return None
    # A fresh compiler state: earlier calls with other shapes would make it compile for
    # dynamic shapes, which is slower than what it generates for a fixed one.
    torch._dynamo.reset()
    compiled = torch.compile(baselines.eager_rmsnorm, dynamic=False)
    result = compare_with_compiled(fn, compiled, shapes, dtype=dtype, retries=retries, reps=reps,
                                   tolerance=tolerance)
    if not result.passed:
        slower = ", ".join(f"{r.shape[0]}x{r.shape[1]}" for r in result.rows if not r.passed)
        raise AssertionError(
            f"{result}\n\nYour kernel is slower than torch.compile on {slower}. Small N: "
            "several rows per program and fewer warps; large N: more warps (8 to 16) so that "
            "each thread holds few elements, or a loop over column blocks when the row no "
            "longer fits in registers; try num_stages for software pipelining.")
    if not quiet:
        print(result)
    return result


def rmsnorm_spec(dtype: torch.dtype) -> CallSpec:
    """What a call `fn(x, weight, eps)` must return and may do: chapter 04's rules."""
    return CallSpec(("y",), lambda x, w, eps: reference.rmsnorm(x, w, eps=eps), (dtype,),
                    max_launches=RMSNORM_FORWARD.max_launches, arg_names=("x", "weight", "eps"))


def compare_with_compiled(fn: Callable, compiled: Callable, shapes: Sequence[tuple[int, int]],
                          *, dtype: torch.dtype, retries: int, reps: int, tolerance: float
                          ) -> CompileComparison:
    """The table of `beats_torch_compile`, once a GPU is known to be there (tests run it
    with a fake timer): for each shape, a watched call checked against the reference, the
    timed attempts (each output kept from your calls checked, impossible speeds refused), a
    watched call again. Raises AssertionError when your calls break the rules."""
    spec = rmsnorm_spec(dtype)
    rows = []
    for m, n in shapes:
        label = f"{m}x{n}"
        gen = torch.Generator().manual_seed(m * 31 + n)
        x = torch.randn((m, n), generator=gen).to(dtype).to(runtime.DEVICE)
        w = (torch.rand(n, generator=gen) + 0.5).to(dtype).to(runtime.DEVICE)
        check_watched_call(f"rmsnorm {label}", fn, (x, w, 1e-6), spec, when="before")
        del x, w

        def make_args(m=m, n=n):
            return (torch.randn((m, n), dtype=dtype, device=runtime.DEVICE),
                    torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5, 1e-6)

        nbytes = traffic.fused_rmsnorm(m, n, dtype).bytes
        best = None
        for attempt in range(1, max(1, retries) + 1):
            yours = measure_checked(f"yours {label}", fn, make_args, nbytes, spec, reps=reps)
            theirs = bench.measure(f"torch.compile {label}", compiled, make_args, nbytes,
                                   reps=reps, hide_launch=True)
            timing = ShapeTiming((m, n), yours, theirs, attempt, tolerance)
            if best is None or timing.speedup > best.speedup:
                best = timing
            if timing.passed:
                break
        check_watched_call(f"rmsnorm {label}", fn, make_args(), spec, when="after",
                           refill=make_args)
        rows.append(replace(best, attempts=attempt))  # the best attempt, and how many ran
    return CompileComparison(dtype, tuple(rows))
