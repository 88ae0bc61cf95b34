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

from course import baselines, bench, lab_sweeps, reference, runtime, traffic
from course.check import guards
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


def checked_before_timing(label: str, fn: Callable, n_rows: int, n_cols: int,
                          dtype: torch.dtype, spec: CallSpec
                          ) -> tuple[Callable, Callable[[], tuple]]:
    """Hold one watched call of `fn` at the timing shape to the rules (seeded inputs), then
    return what to time (`check_watched_call` says what) and the maker of fresh
    (x, weight, eps) that the timing rotates through."""
    # Drawn on the device: on the CPU, hundreds of MB of normal values take a second a shape.
    gen = torch.Generator(runtime.DEVICE).manual_seed(n_rows * 31 + n_cols)
    x = torch.randn((n_rows, n_cols), generator=gen, device=runtime.DEVICE).to(dtype)
    w = (torch.rand(n_cols, generator=gen, device=runtime.DEVICE) + 0.5).to(dtype)
    timed = check_watched_call(label, fn, (x, w, 1e-6), spec, when="before")
    del x, w

    def make_args():
        return (torch.randn((n_rows, n_cols), dtype=dtype, device=runtime.DEVICE),
                torch.rand(n_cols, dtype=dtype, device=runtime.DEVICE) + 0.5, 1e-6)

    return timed, make_args


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
        timed, make_args = checked_before_timing(f"rmsnorm {label}", fn, m, n, dtype, spec)
        nbytes = traffic.fused_rmsnorm(m, n, dtype).bytes
        best = None
        for attempt in range(1, max(1, retries) + 1):
            yours = measure_checked(f"yours {label}", timed, make_args, nbytes, spec,
                                    reps=reps)
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


# ------------------------------------------------------------------------ the launch rule

# A launch rule is graded at row lengths the chapter's sweeps recorded (course.lab_sweeps),
# each at the sweep's row count, as (dtype, n_rows, n_cols). These are the visible ones; the
# hidden test cell passes others.
DEFAULT_RULE_SHAPES: tuple[tuple[str, int, int], ...] = tuple(
    (dtype, lab_sweeps.rows_for(n), n)
    for dtype, n in (("bfloat16", 512), ("bfloat16", 4096), ("bfloat16", 65536),
                     ("float32", 1536)))
# Without a GPU: the launch's recorded time against the best recorded launch at that shape,
# on every GPU recorded. With one: the measured bandwidth against the best recorded on the
# course's GPUs (the lower of them). The chapter's model rule lies at 0.92 to 1.00 of the
# best at every recorded shape on both the H100 and the H200, and a rule tuned for one row
# length falls to 0.1 to 0.5 somewhere (tests/test_launch_rule.py holds such rules).
OF_BEST_RECORDED = 0.85
OF_RECORDED_COPY = 0.85
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class RuleShape:
    """How a launch rule did at one shape."""

    dtype: str
    n_rows: int
    n_cols: int
    launch: dict | None         # what the rule chose (None: not asked, on a GPU)
    score: float                # recorded: the lowest of best / chosen over the GPUs;
                                # measured: fraction of copy bandwidth
    target: float
    detail: str                 # the per-GPU figures, or the measurement
    problem: str = ""           # why a shape could not be judged (then it fails)

    @property
    def passed(self) -> bool:
        return not self.problem and self.score >= self.target


@dataclass(frozen=True)
class RuleReport:
    how: str                    # "recorded" or "measured"
    rows: tuple[RuleShape, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def __str__(self) -> str:
        if self.how == "recorded":
            head = (f"launch rule against the recorded sweeps ({', '.join(lab_sweeps.GPUS)}): "
                    "speed of your launch / the best recorded launch, passes at "
                    f"{OF_BEST_RECORDED:.2f} or more on each GPU")
        else:
            head = (f"launch rule measured on {torch.cuda.get_device_name()}: % of copy "
                    "bandwidth, passes at the target (0.85 of the best recorded on "
                    f"{', '.join(lab_sweeps.GPUS)})")
        lines = [head]
        for r in self.rows:
            verdict = "ok" if r.passed else "FAILS"
            shape = f"{r.dtype} {r.n_rows} x {r.n_cols}"
            chose = f" {lab_sweeps.describe(r.launch)}:" if r.launch is not None else ""
            lines.append(f"  {shape:<24}{chose} {r.detail}  {verdict}")
            if r.problem:
                lines.append(f"    {r.problem}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        failed = [f"{r.dtype} N={r.n_cols}" for r in self.rows if not r.passed]
        return (f"<launch rule, {self.how}: "
                + ("passes>" if not failed else f"fails at {', '.join(failed)}>"))


def _rule_shapes(shapes) -> list[tuple[str, int, int]]:
    out = []
    for shape in shapes:
        if not (isinstance(shape, (tuple, list)) and len(shape) == 3):
            raise ValueError(f"each shape is (dtype, n_rows, n_cols), got {shape!r}")
        dtype, n_rows, n_cols = shape
        recorded = {"bfloat16": lab_sweeps.BF16_COLS, "float32": lab_sweeps.FP32_COLS}
        if n_cols not in recorded.get(dtype, ()):
            raise ValueError(f"{dtype} rows of {n_cols} were not recorded: a launch rule is "
                             "graded at recorded row lengths only (course.lab_sweeps)")
        if not (isinstance(n_rows, int) and n_rows >= 1):
            raise ValueError(f"n_rows must be an int >= 1, got {n_rows!r}")
        out.append((dtype, n_rows, n_cols))
    if not out:
        raise ValueError("shapes must not be empty")
    return out


def _why_not_recorded(fields: dict, n_cols: int) -> str:
    block_n = lab_sweeps.next_power_of_2(n_cols)
    if fields["chunk_n"]:
        if (fields["chunk_n"] not in lab_sweeps.CHUNK_N or n_cols < lab_sweeps.CHUNKED_FROM
                or fields["num_warps"] not in lab_sweeps.CHUNK_WARPS):
            return (f"the sweeps timed the chunked kernel from N = {lab_sweeps.CHUNKED_FROM}, "
                    f"with chunk_n in {lab_sweeps.CHUNK_N} and num_warps in "
                    f"{lab_sweeps.CHUNK_WARPS}")
        return "the sweeps did not time this chunked launch"
    values = lab_sweeps.values_per_thread(n_cols, fields["rows_per_tile"], fields["num_warps"])
    if fields["rows_per_tile"] * block_n > lab_sweeps.MAX_TILE_ELEMENTS:
        return f"a tile of {fields['rows_per_tile']} x {block_n} is more than Triton allows"
    if values > lab_sweeps.MAX_VALUES_PER_THREAD:
        return (f"{values:g} values a thread: far past a thread's 255 registers, so the sweeps "
                "did not time it (it spills); more warps, or chunk_n")
    if fields["programs_per_sm"]:
        return ("persistent programs were timed only at rows of up to "
                f"{lab_sweeps.PERSISTENT_UP_TO} columns, around the best one-program-per-tile "
                "launch there")
    return (f"the sweeps timed rows_per_tile in {lab_sweeps.ROWS_PER_TILE} and num_warps in "
            f"{lab_sweeps.WARPS}")


# What a rule that reads the records is told (they are what it would be judged on).
READS_RECORDS_ADVICE = (
    "Without a GPU the rule is judged on those very records, so a choose_launch that looks "
    "its launch up in them would pass without having learned anything from them: when it is "
    "called, it must not read them. Read them as much as you like in cells of your own while "
    "you build the rule (lab_sweeps.best, lab_sweeps.sweep_at, the plots), then write down "
    "what they taught as the rule itself: several rows a tile for short rows, warps that "
    "give each thread 8 to 64 values, the chunked kernel once a row no longer fits a "
    "program's registers.")


def _reads(read: list[str]) -> str:
    """The reads lab_sweeps.reads_watched noted, in a sentence."""
    named = [r for r in read if not r.startswith("SweepPoint.")]
    fields = [r.removeprefix("SweepPoint") for r in read if r.startswith("SweepPoint.")]
    parts = named[:4] + ([f"{len(named) - 4} more of lab_sweeps"] if len(named) > 4 else [])
    if fields:
        parts.append("the recorded points' " + ", ".join(fields[:5])
                     + (f" (and {len(fields) - 5} more fields)" if len(fields) > 5 else ""))
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _ask_rule(choose_launch: Callable, dtype: str, n_rows: int, n_cols: int
              ) -> tuple[object, str]:
    """What `choose_launch` returned at one shape, or why it returned nothing (it raised).
    The call is watched for reads of the recorded sweeps, here and, for a function that
    runs in the learner's process (course.verify), there (guards.READS_RECORDS): a rule
    that reads them fails the whole check."""
    element_size = _TORCH_DTYPES[dtype].itemsize
    call = f"choose_launch({n_rows}, {n_cols}, {element_size})"
    there: list[str] = []
    chosen, raised = None, ""
    with lab_sweeps.reads_watched() as here, guards.guarded(guards.READS_RECORDS, there):
        try:
            chosen = choose_launch(n_rows, n_cols, element_size)
        except Exception as error:  # the learner's code: a line of the report
            raised = (f"{call} raised {type(error).__name__}: {error}. A rule must return "
                      "a valid Launch at every shape, whatever the row length.")
    read = list(dict.fromkeys([*here, *there]))
    if read:
        raise AssertionError(f"Your choose_launch reads the recorded sweeps: {call} "
                             f"({dtype}) read {_reads(read)}. {READS_RECORDS_ADVICE}")
    return chosen, raised


def _failed_call(dtype: str, n_rows: int, n_cols: int, raised: str) -> RuleShape:
    return RuleShape(dtype, n_rows, n_cols, None, 0.0, 0.0, "-", raised)


def _recorded_row(choose_launch: Callable, dtype: str, n_rows: int, n_cols: int,
                  recorded: dict) -> RuleShape:
    chosen, raised = _ask_rule(choose_launch, dtype, n_rows, n_cols)
    if raised:
        return _failed_call(dtype, n_rows, n_cols, raised)
    try:
        fields = lab_sweeps.normalized(lab_sweeps.launch_fields(chosen))
    except TypeError as error:
        raise AssertionError(f"choose_launch({n_rows}, {n_cols}, "
                             f"{_TORCH_DTYPES[dtype].itemsize}) returned {chosen!r}, not a "
                             f"Launch ({error})") from None
    scores, details, problem = [], [], ""
    for gpu, points in recorded.items():
        best = lab_sweeps.best(points, n_cols, dtype)
        point = lab_sweeps.find(points, n_cols, dtype, fields)
        if point is None:
            problem = (f"not among the recorded launches: {_why_not_recorded(fields, n_cols)}. "
                       "Without a GPU such a launch cannot be judged, so this shape fails.")
            scores.append(0.0)
            continue
        if not point.ok:
            problem = f"on the {gpu} this launch {point.status.removeprefix('failed: ')}"
            scores.append(0.0)
            continue
        scores.append(best.seconds / point.seconds)
        details.append(f"{gpu} {100 * point.fraction_of_copy:.0f} % of copy = "
                       f"{scores[-1]:.2f} of the best ({100 * best.fraction_of_copy:.0f} %)")
    return RuleShape(dtype, n_rows, n_cols, fields, min(scores), OF_BEST_RECORDED,
                     "; ".join(details) or "-", problem)


def _measured_row(rmsnorm: Callable, dtype: str, n_rows: int, n_cols: int, recorded: dict,
                  *, retries: int, reps: int) -> RuleShape:
    torch_dtype = _TORCH_DTYPES[dtype]
    if torch_dtype == torch.bfloat16 and not runtime.supports_bf16():
        torch_dtype = torch.float16  # a T4 has no bfloat16: the same bytes, the same target
    target = OF_RECORDED_COPY * min(lab_sweeps.best(points, n_cols, dtype).fraction_of_copy
                                    for points in recorded.values())
    spec = rmsnorm_spec(torch_dtype)
    label = f"rmsnorm {dtype} {n_rows}x{n_cols}"
    timed, make_args = checked_before_timing(label, rmsnorm, n_rows, n_cols, torch_dtype, spec)
    nbytes = traffic.fused_rmsnorm(n_rows, n_cols, torch_dtype).bytes
    best, attempts = 0.0, 0
    while attempts < max(1, retries) and best < target:
        attempts += 1
        measured = measure_checked(label, timed, make_args, nbytes, spec, reps=reps)
        best = max(best, measured.fraction_of_copy or 0.0)
    check_watched_call(label, rmsnorm, make_args(), spec, when="after", refill=make_args)
    detail = (f"{100 * best:.1f} % of copy (target {100 * target:.1f} %, best of {attempts} "
              f"attempt{'s' if attempts != 1 else ''})")
    return RuleShape(dtype, n_rows, n_cols, None, best, target, detail)


@learner_facing
def launch_rule(choose_launch: Callable, rmsnorm: Callable, *,
                shapes: Sequence[tuple[str, int, int]] = DEFAULT_RULE_SHAPES, retries: int = 3,
                reps: int = 30, quiet: bool = False) -> RuleReport:
    """Grade chapter 08's launch rule at shapes (dtype, n_rows, n_cols) of recorded row
    lengths. On a GPU: time `rmsnorm` at each (checked against the reference and the
    chapter's rules, as every speed check) and require its bandwidth to reach
    OF_RECORDED_COPY of the best the course's GPUs recorded there; a shape below is timed
    again, up to `retries` times. Without a GPU: ask `choose_launch(n_rows, n_cols,
    element_size)` for its launch and look it up in the recorded sweeps: on every recorded
    GPU it must be at least OF_BEST_RECORDED as fast as the best launch recorded there.
    Either way `choose_launch` is asked at each shape first, watched: a rule that reads the
    recorded sweeps while it is called is refused at once (without a GPU it would be judged
    on what it read), and a shape where it raises fails with what it raised.
    Raise AssertionError with the table when a shape fails; return the table."""
    for name, fn in (("choose_launch", choose_launch), ("rmsnorm", rmsnorm)):
        if not callable(fn):
            raise TypeError(f"pass your {name} function itself, not {type(fn).__name__}")
    checked = _rule_shapes(shapes)
    recorded = {gpu: lab_sweeps.load(gpu) for gpu in lab_sweeps.GPUS}
    if runtime.on_gpu():
        # The rule is asked first, as it is without a GPU: one that reads the records, or
        # raises, gets the same verdict on either (the timing then runs rmsnorm).
        asked = [_ask_rule(choose_launch, *shape)[1] for shape in checked]
        rows = [_failed_call(*shape, raised) if raised else
                _measured_row(rmsnorm, *shape, recorded, retries=retries, reps=reps)
                for shape, raised in zip(checked, asked, strict=True)]
        report = RuleReport("measured", tuple(rows))
    else:
        rows = [_recorded_row(choose_launch, *shape, recorded) for shape in checked]
        report = RuleReport("recorded", tuple(rows))
    if not report.passed:
        failed = ", ".join(f"{r.dtype} N = {r.n_cols}" for r in report.rows if not r.passed)
        raised = ", ".join(f"{r.dtype} N = {r.n_cols}" for r in report.rows
                           if r.launch is None and r.problem)  # (only _failed_call's rows)
        raised = (f" At {raised} your choose_launch raised instead of returning a Launch "
                  "(the table says what it raised)." if raised else "")
        raise AssertionError(
            f"{report}\n\nYour launch rule falls short at {failed}.{raised} The sweeps (the "
            "chapter's experiments, course.lab_sweeps) show what wins at each row length: "
            "several rows a tile for short rows, warps that give each thread 8 to 64 values, "
            "the chunked kernel once a row no longer fits a program's registers.")
    if not quiet:
        print(report)
    return report
