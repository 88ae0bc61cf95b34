"""Checkers for chapter 07's two steps towards the backward kernels: the rows of a matrix
split over P programs (the warm-up), and the rule that picks P (the split size).

    row_dots(x, weight, rstd, dy, programs) -> c      one launch of `programs` programs
    split_programs(M, N, sms) -> P                     plain Python

`row_dots` returns, for every row r, c[r] = mean over the row of x_hat * g, with
x_hat = x * rstd and g = weight * dy: the one number per row that RMSNorm's dX needs. Its
kernel runs P programs, each over a block of rows_per_program = cdiv(M, P) consecutive
rows, with a loop whose bounds are known only at run time; the last block may be short.
The checker passes P itself, case by case (one program for every row, more programs than
rows, blocks that do not divide M), so the loop and its bounds are what it tests.

`split_programs` is graded against the split-size model of `course.traffic` (`split_time`):
the backward's bytes (the ideal plus the float32 workspace, 8 * P * N) over the share of
the bandwidth P programs can draw (each SM needs a program, and about 8192 elements of a
row in flight). A P within SPLIT_TOLERANCE of the best P's time passes, at shapes the
learner did not pick. As in chapter 02, a rule that calls into `course.traffic` (its
`best_split` is the answer) fails whatever it returns (`roofline._traffic_calls`, the guard
TRAFFIC_CALLS in the learner's process); reading its constants is fine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course import reference, traffic
from course.check import sandbox
from course.check.backward import dw_sum_atol, dy_like
from course.check.cases import Case
from course.check.inputs import guarded
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.roofline import _traffic_calls, calls_said, refused_calls
from course.check.runner import Exercise, Inputs, Suspect, Tensors, explain_error
from course.check.suite import check_and_raise

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
F64 = torch.float64


def _case(name: str, shape: tuple[int, ...], dtype: torch.dtype, tags: set[str],
          programs: int, **kw) -> tuple[Case, int]:
    return Case(name, shape, dtype, frozenset(tags), **kw), programs


# (case, programs P the checker asks for). Blocks of cdiv(M, P) rows: 37 rows over 8
# programs are blocks of 5, the last one of 2; 1 row over 4 programs is one program.
_CASES_AND_PROGRAMS = (
    _case("8 programs of 8 rows", (64, 128), f32, {"pow2"}, 8),
    _case("odd N, a short last block", (37, 100), f32, {"odd_n"}, 8),
    _case("one program for every row", (37, 100), f32, {"odd_n"}, 1),
    _case("one row a program", (12, 64), f32, {"pow2"}, 12),
    _case("N = 1", (5, 1), f32, {"edge"}, 2),
    _case("M = 1, more programs than rows", (1, 257), f32, {"edge", "odd_n"}, 4),
    _case("wide rows", (6, 3000), f32, {"wide", "odd_n"}, 4),
    _case("strided rows", (16, 128), f32, {"strided"}, 3, row_padding=40),
    _case("3-D input", (2, 8, 64), f32, {"nd", "pow2"}, 5),
    _case("rows of zeros", (8, 64), f32, {"zeros", "pow2"}, 3, zero_rows=(1, 4)),
    _case("float16", (32, 256), f16, {"half", "pow2"}, 6),
    _case("bfloat16, float32 weight", (32, 256), bf16, {"half", "bf16", "pow2"}, 7,
          param_dtype=f32),
)
PROGRAMS = {case.name: programs for case, programs in _CASES_AND_PROGRAMS}


def blocks(m: int, programs: int) -> tuple[int, int]:
    """(rows per program, programs that have rows) for M rows asked to split over
    `programs`: cdiv(M, P) rows each, and as many programs as that takes."""
    rows = math.ceil(m / min(m, programs))
    return rows, math.ceil(m / rows)


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    x = case.make_input(gen)
    rstd = reference.rmsnorm_rstd(x.tensor, case.eps).to(f32)
    return {"x": x, "weight": case.make_vector(gen), "rstd": guarded(rstd),
            "dy": dy_like(case, gen)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["weight"], t["rstd"], t["dy"], PROGRAMS[case.name])


def _terms(t: Tensors, *, weight: bool = True, rstd: bool = True) -> torch.Tensor:
    """x_hat * g per element, in float64 (x_hat from the float32 rstd the kernel reads)."""
    x_hat = t["x"].to(F64) * (t["rstd"].to(F64).unsqueeze(-1) if rstd else 1.0)
    g = t["dy"].to(F64) * (t["weight"].to(F64) if weight else 1.0)
    return x_hat * g


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor]:
    return (_terms(t).mean(dim=-1),)


def _extra_atol(name: str, t: Tensors, case: Case) -> torch.Tensor:
    """A row's mean of N float32 products may collect the rounding of a sum of N terms."""
    terms = _terms(t).reshape(-1, case.n)
    return dw_sum_atol(terms.T).reshape(t["x"].shape[:-1]) / case.n


def _rows(got: torch.Tensor) -> torch.Tensor:
    return got.detach().reshape(-1)


def _first_of_each_block(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """Only the first row of each block written (the rest still NaN): the loop body ran
    once per program."""
    per, _ = blocks(case.rows, PROGRAMS[case.name])
    if per < 2:
        return None
    nan = torch.isnan(_rows(got))
    firsts = torch.zeros_like(nan)
    firsts[::per] = True
    if bool((nan == ~firsts).all()):
        return f"only rows 0, {per}, {2 * per}, ... (the first of each block of {per}) were written"
    return None


def _row_values(t: Tensors) -> torch.Tensor:
    """The right c of every row, in float64, one after another."""
    return _terms(t).mean(dim=-1).reshape(-1)


def _like(got: torch.Tensor, want: torch.Tensor) -> bool:
    """got holds want's values, loosely: a row's c against another row's differs far more."""
    scale = float(want.abs().max()) if want.numel() else 0.0
    return bool(((got.double() - want).abs() <= 1e-3 * scale + 1e-2 * want.abs() + 1e-6).all())


def _stored_at_pid(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """c[0..programs-1] hold one row of each block (the last stored wins), the rest still
    NaN: every row's c was stored at c_ptr + pid."""
    per, programs = blocks(case.rows, PROGRAMS[case.name])
    if per < 2:
        return None
    c = _rows(got)
    nan = torch.isnan(c)
    if not bool(nan[programs:].all()) or bool(nan[:programs].any()):
        return None
    want = _row_values(t)
    held = []  # for each program, the row of its block whose c it left at c[pid]
    for pid in range(programs):
        rows = range(pid * per, min((pid + 1) * per, case.rows))
        row = next((r for r in rows if _like(c[pid:pid + 1], want[r:r + 1])), None)
        if row is None:
            return None
        held.append(row)
    return (f"only rows 0..{programs - 1} were written, one per program, and row 0 holds "
            f"the c of row {held[0]}, in program 0's block of rows 0..{per - 1}")


def _tail_never_written(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """Rows k..M-1 never written and the rows before right: the blocks do not reach the
    last row (rows per program rounded down, or too few programs launched)."""
    nan = torch.isnan(_rows(got))
    if not bool(nan.any()) or not bool(nan[-1]):
        return None
    k = int((~nan).nonzero().max()) + 1 if bool((~nan).any()) else 0
    if k == 0 or not bool(nan[k:].all()):
        return None
    if not _like(_rows(got)[:k], _row_values(t)[:k]):
        return None  # wrong rows before the NaN: something else (dy read past its end)
    return f"rows {k}..{case.rows - 1} of 0..{case.rows - 1} were never written"


SUSPECTS = (
    Suspect("c_stored_at_pid", "c",
            "Each program stored every row's c in one place, at c_ptr + pid: row pid of c "
            "holds the last row of its block, written over the others, and the rows past "
            "the number of programs were never written. c has one value per row: store it "
            "at c_ptr + row, with row the loop variable.",
            matches=_stored_at_pid),
    Suspect("c_first_row_only", "c",
            "Each program handled only the first row of its block: the loop over the rows "
            "runs once. Program pid owns rows first = pid * rows_per_program up to "
            "last = min(first + rows_per_program, n_rows): loop over all of them, "
            "for row in range(first, last), computing and storing c for each.",
            matches=_first_of_each_block),
    Suspect("c_tail_rows", "c",
            "The last rows were never computed: the programs' blocks stop short of row M - 1. "
            "Round the rows per program up, rows_per_program = triton.cdiv(M, P) (M // P "
            "rounds down and leaves the remainder to nobody), and launch "
            "triton.cdiv(M, rows_per_program) programs, so that every row has a program.",
            matches=_tail_never_written),
    Suspect("c_sum_not_mean", "c",
            "c is the row's sum of x_hat * g where its mean belongs: divide by N (n_cols), "
            "c = sum(x_hat * g) / N.",
            expected=lambda t, c: _terms(t).sum(dim=-1)),
    Suspect("c_without_weight", "c",
            "c leaves out the weight: g = weight * dy, so c = mean(x_hat * weight * dy).",
            expected=lambda t, c: _terms(t, weight=False).mean(dim=-1)),
    Suspect("c_without_rstd", "c",
            "c uses x where x_hat = x * rstd belongs: load the row's rstd (rstd_ptr + row) "
            "and multiply, c = mean(x * rstd * g).",
            expected=lambda t, c: _terms(t, rstd=False).mean(dim=-1)),
)

ROW_DOTS = Exercise(
    name="row_dots",
    signature="row_dots(x, weight, rstd, dy, programs) -> c",
    cases=tuple(case for case, _ in _CASES_AND_PROGRAMS),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("c",),
    max_launches=1,
    dtypes=lambda case: (f32,),
    extra_atol=_extra_atol,
    suspects=SUSPECTS,
    dtype_reasons={"c": "float32 always: c is a statistic, like rstd"},
    advice={
        "output_margin_written": (
            "Your kernel writes past the last row of c: the last program's block runs past "
            "row M - 1. A block is rows first = pid * rows_per_program up to, not including, "
            "last = tl.minimum(first + rows_per_program, n_rows): the last block is short "
            "when rows_per_program does not divide M, and a program whose first row is past "
            "the end has none."),
        "extra_launches": ("This exercise is one launch: P programs, each looping over its "
                           "own block of rows."),
        "input_written:rstd": "Your kernel writes into rstd: it is an input here. Only read it.",
        "strided": (
            "Only the case with padded rows fails. There the inputs' rows are not N elements "
            "apart, and not the same distance apart either: x's rows are N + 40 elements "
            "apart, dy's N + 20. Each tensor needs its own row stride: pass x2.stride(0) and "
            "dy2.stride(0) (backward_inputs returns the 2-D views) and offset each by its "
            "own, x_ptr + row * stride_x_row, dy_ptr + row * stride_dy_row."),
        "row_offset": ("Row 0 is right but the other rows are wrong: each row's loads must "
                       "start at x_ptr + row * stride_x_row (and dy's with its own stride), "
                       "with row the loop variable, and c must be stored at c_ptr + row."),
    },
)


@learner_facing
def row_dots(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's `row_dots(x, weight, rstd, dy, programs) -> c` (c float32 with
    x.shape[:-1], c = mean over each row of x * rstd * weight * dy) for several P,
    blocks that do not divide M included; raise AssertionError with advice on failure."""
    return check_and_raise(ROW_DOTS, fn, seed=seed, quiet=quiet)


# --------------------------------------------------------------------------- the split size

SPLIT_TOLERANCE = 1.25  # a split within 25 % of the best split's time in the model passes

# Shapes every check tries: the torch.compile study's 1152000 x 384 (short rows: many
# programs), the chapter's 16384 x 4096, few long rows, rows longer than an SM's share of
# elements in flight (one program per SM binds: a rule without it gives half the SMs
# none), fewer rows than SMs.
SPLIT_SHAPES = ((1152000, 384, 132), (16384, 4096, 132), (512, 8192, 132),
                (8192, 16384, 132), (64, 1024, 132))
# SM counts of GPUs a learner may meet (T4 40, L4 58, A10 72, A100 108, H100 132, ...).
_SM_COUNTS = (1, 4, 20, 40, 58, 72, 80, 108, 114, 132, 144, 170)


@dataclass(frozen=True)
class SplitVerdict:
    M: int
    N: int
    sms: int
    programs: object          # what the rule returned
    best: int
    ratio: float | None       # its time in the model over the best's; None if not a P
    problem: str = ""

    @property
    def passed(self) -> bool:
        return not self.problem

    def line(self) -> str:
        head = f"{self.M:>8} x {self.N:<6} {self.sms:>4} SMs: P = {self.programs!s:<8}"
        if self.ratio is None:
            return f"{head} FAIL  {self.problem}"
        verdict = "ok  " if self.passed else "FAIL"
        return (f"{head} {verdict}  time {self.ratio:.2f}x the best split's "
                f"(P = {self.best})")


@dataclass(frozen=True)
class SplitReport:
    seed: int
    verdicts: tuple[SplitVerdict, ...]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def summary(self) -> str:
        n = sum(v.passed for v in self.verdicts)
        lines = [f"split_rule: {n}/{len(self.verdicts)} shapes pass (within "
                 f"{SPLIT_TOLERANCE:.2f}x of the best split's time in the model, seed "
                 f"{self.seed})"]
        return "\n".join(lines + ["  " + v.line() for v in self.verdicts])

    def message(self) -> str:
        wrong = [v for v in self.verdicts if not v.passed]
        advice = "\n\n".join(dict.fromkeys(v.problem for v in wrong[:3]))
        return f"split_rule check failed.\n\n{advice}\n\n{self.summary()}"

    def show(self) -> None:
        print(self.summary())

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:  # one line under a test cell (Report's repr says why)
        passed = sum(v.passed for v in self.verdicts)
        return f"<split_rule report: {passed}/{len(self.verdicts)} shapes pass, seed {self.seed}>"


def _random_shapes(seed: int, count: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        m = max(1, round(2 ** rng.uniform(0, 21)))
        n = max(1, round(2 ** rng.uniform(0, 15)))
        shapes.append((m, n, rng.choice(_SM_COUNTS)))
    return shapes


def _judge(m: int, n: int, sms: int, got: object) -> SplitVerdict:
    best = traffic.best_split(m, n, sms)
    if isinstance(got, bool) or not isinstance(got, int):
        return SplitVerdict(m, n, sms, got, best, None, (
            f"split_programs({m}, {n}, {sms}) returned {got!r} ({type(got).__name__}): return "
            "the number of programs as a Python int (math.ceil, //, triton.cdiv, min and max "
            "of ints give ints)"))
    if not 1 <= got <= m:
        return SplitVerdict(m, n, sms, got, best, None, (
            f"split_programs({m}, {n}, {sms}) returned {got}: P must be between 1 and M = {m} "
            "(a program without rows does nothing, and with P > M some would have none)"))
    ratio = traffic.split_time(m, n, got, sms) / traffic.split_time(m, n, best, sms)
    if ratio <= SPLIT_TOLERANCE:
        return SplitVerdict(m, n, sms, got, best, ratio)
    in_flight = got * n
    needed = traffic.ELEMENTS_IN_FLIGHT_PER_SM * sms
    if got < best:
        programs = f"{got} program" + ("s" if got != 1 else "")
        why = (f"too few programs. {programs} of one row at a time keep {in_flight} "
               f"elements in flight, and {sms} SMs need about {needed} "
               f"({traffic.ELEMENTS_IN_FLIGHT_PER_SM} each) and at least one program each: "
               f"the model gives them {100 * min(1.0, got / sms, in_flight / needed):.0f} % "
               "of the bandwidth. ")
        if best == m:
            why += f"With only {m} rows, every row can have a program of its own (P = M)."
        elif best == sms:
            idle = sms - got
            why += (f"A row of {n} elements is enough in flight for an SM, so one program "
                    f"per SM would fill the GPU, but {idle} of the {sms} SMs "
                    + ("has" if idle == 1 else "have") + " no program at all: long rows "
                    "need at least one program per SM, P >= sms.")
        else:
            per_sm = math.ceil(traffic.ELEMENTS_IN_FLIGHT_PER_SM / n)
            why += (f"Short rows need many programs per SM: rows of {n} elements need "
                    f"{per_sm} programs on each SM to keep "
                    f"{traffic.ELEMENTS_IN_FLIGHT_PER_SM} elements in flight there.")
    else:
        workspace = 8 * got * n
        ideal = traffic.ideal_backward_bytes(m, n, "bf16")
        why = (f"too many programs. The float32 workspace, written by kernel 1 and read by "
               f"kernel 2 (8 * P * N bytes = {workspace / 1e6:.3g} MB), adds "
               f"{100 * workspace / ideal:.0f} % to the {ideal / 1e6:.3g} MB the backward "
               "must move, and the GPU was already full with fewer programs.")
    return SplitVerdict(m, n, sms, got, best, ratio, (
        f"At M = {m}, N = {n} with {sms} SMs your rule gives P = {got}, whose time in the "
        f"split-size model is {ratio:.2f}x the best split's (P = {best}): {why}"))


@learner_facing
def split_rule(fn: Callable[[int, int, int], int], *,
               shapes: Sequence[tuple[int, int, int]] | None = None, random_shapes: int = 8,
               seed: int | None = None, quiet: bool = False) -> SplitReport:
    """Check a learner's `split_programs(M, N, sms) -> P` at `shapes` (the defaults, then
    `random_shapes` more drawn from the seed): each P must be an int in 1..M whose time in
    the split-size model (`course.traffic.split_time`) is within SPLIT_TOLERANCE of the best
    split's. Raise AssertionError with the reason on failure; return the report."""
    if not callable(fn):
        raise TypeError(f"pass your function itself, split_rule(split_programs), not "
                        f"{type(fn).__name__}")
    seed = random.randrange(1_000_000) if seed is None else int(seed)
    todo = list(SPLIT_SHAPES if shapes is None else shapes) + _random_shapes(seed,
                                                                             random_shapes)
    verdicts = []
    for m, n, sms in todo:
        try:
            with _traffic_calls() as called, sandbox.watch() as record:
                got = fn(m, n, sms)
        except Exception as exc:  # the learner's code: a line of the report
            verdicts.append(SplitVerdict(m, n, sms, "error", traffic.best_split(m, n, sms),
                                         None, f"split_programs({m}, {n}, {sms}) raised "
                                         f"{explain_error(exc)[0]}"))
            continue
        refused = refused_calls(called)
        if refused:
            verdicts.append(SplitVerdict(
                m, n, sms, got, traffic.best_split(m, n, sms), None,
                f"split_programs {calls_said(refused)}, the model this check compares "
                "against: the rule must work P out itself, in plain Python on M, N and sms, "
                "from what the chapter says about the split (one program per SM at least, "
                "about traffic.ELEMENTS_IN_FLIGHT_PER_SM elements of a row in flight per SM, "
                "at most M)"))
            continue
        if record.launches:
            verdicts.append(SplitVerdict(m, n, sms, got, traffic.best_split(m, n, sms), None,
                                         "split_programs launched a Triton kernel: it is "
                                         "plain Python arithmetic on M, N and sms"))
            continue
        verdicts.append(_judge(m, n, sms, got))
    report = SplitReport(seed, tuple(verdicts))
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report
