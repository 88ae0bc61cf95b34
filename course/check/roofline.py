"""Checker for chapter 02's exercise: the byte and FLOP counts of the roofline model.

The learner writes four small functions:

    fused_rmsnorm_bytes(M, N, elem_bytes) -> int    read x once, the weight once, write y once
    rmsnorm_flops(M, N) -> int                      the count course.traffic uses
    arithmetic_intensity(flops, nbytes) -> float    FLOP per byte
    time_floor_us(nbytes, bytes_per_s) -> float     microseconds to move nbytes

Each is graded on its own against `course.traffic` (the last two are fed the true counts,
so a mistake in the first two does not spill over), on several shapes and dtypes, odd
ones among them. A wrong answer is compared with the mistakes learners make (x counted
twice, elements instead of bytes, an inverted ratio, seconds for microseconds, ...) and
the message names the one that fits every case.

The exercise asks for plain arithmetic, so a function that calls into `course.traffic`
(the model the check compares against) fails whatever it returns: every call is made under
a profile hook that notes any function of that module running inside it.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Real

from course import traffic
from course.check import guards
from course.check.cases import Case
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import CaseResult, Finding, fresh_seed

import torch

_FIXED = ((4096, 4096, torch.bfloat16), (16384, 8192, torch.float32), (1, 1, torch.float16),
          (7, 12289, torch.bfloat16), (12345, 257, torch.float32))
_BANDWIDTHS = (3.35e12, 2.9e12, 1.555e12, 3.2e11)  # bytes/s: H100 SXM, a copy, A100, T4


@dataclass(frozen=True)
class _Mistake:
    why: str
    value: Callable[[int, int, int], float]  # (M, N, elem_bytes) or (a, b, unused)


def _bytes_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake("you counted x twice: 3*M*N*e + N*e is the two-pass kernel's traffic, which "
                 "reads each row a second time. The fused kernel keeps the row in registers "
                 "and reads it once: 2*M*N*e + N*e",
                 lambda m, n, e: 3 * m * n * e + n * e),
        _Mistake("you counted the weight once per row (M*N*e): every program reads the same "
                 "weight, and after the first one fetches it the others hit in L2, so it "
                 "costs N*e once", lambda m, n, e: 3 * m * n * e),
        _Mistake("you left out the weight: it is small (N*e bytes) but read once all the same",
                 lambda m, n, e: 2 * m * n * e),
        _Mistake("you left out the write of y (M*N*e bytes): a kernel's traffic is its reads "
                 "plus its writes", lambda m, n, e: m * n * e + n * e),
        _Mistake("you counted elements, not bytes: multiply by elem_bytes",
                 lambda m, n, e: 2 * m * n + n),
        _Mistake("you counted bits, not bytes: a byte is what the bandwidth is quoted in",
                 lambda m, n, e: 8 * (2 * m * n * e + n * e)),
    )


def _flops_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake("you left out the 4 FLOPs per row (divide by N, add eps, square root, "
                 "reciprocal): course.traffic counts them too", lambda m, n, _: 4 * m * n),
        _Mistake("you counted 5 FLOPs per element (a reference text rounds the four "
                 "operations up to 5): course.traffic counts the four there are, square, "
                 "accumulate, multiply by rstd, multiply by the weight",
                 lambda m, n, _: 5 * m * n + 4 * m),
        _Mistake("you counted 3 FLOPs per element (a fused multiply-add as one?): "
                 "course.traffic counts every operation, square, accumulate, multiply by "
                 "rstd, multiply by the weight", lambda m, n, _: 3 * m * n + 4 * m),
        _Mistake("you counted the operations of one row only: multiply by the M rows",
                 lambda m, n, _: 4 * n + 4),
    )


def _intensity_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake("your ratio is inverted: arithmetic intensity is FLOPs per byte, "
                 "flops / nbytes", lambda f, b, _: b / f),
        _Mistake("you returned the product: arithmetic intensity is flops / nbytes",
                 lambda f, b, _: f * b),
        _Mistake("you used integer division (//), which rounds the intensity down to a whole "
                 "number: use /", lambda f, b, _: f // b),
    )


def _time_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake("you returned seconds: the function returns microseconds, so multiply by "
                 "1e6", lambda b, bw, _: b / bw),
        _Mistake("you returned milliseconds: a microsecond is 1e-6 s, so multiply the seconds "
                 "by 1e6, not 1e3", lambda b, bw, _: b / bw * 1e3),
        _Mistake("you returned nanoseconds: multiply the seconds by 1e6, not 1e9",
                 lambda b, bw, _: b / bw * 1e9),
        _Mistake("your ratio is inverted: the time is bytes divided by bytes per second",
                 lambda b, bw, _: bw / b * 1e6),
        _Mistake("you treated bytes_per_s as GB/s: it is already in bytes per second",
                 lambda b, bw, _: b / (bw * 1e9) * 1e6),
        # A kernel moves far fewer bytes than a GPU moves in a second: // gives 0 seconds.
        _Mistake("you used integer division (//), which truncates the seconds to a whole "
                 "number, here 0: use /, nbytes / bytes_per_s * 1e6",
                 lambda b, bw, _: b // bw * 1e6),
        _Mistake("you used integer division (//), which truncates the time to whole "
                 "microseconds: use /, nbytes / bytes_per_s * 1e6",
                 lambda b, bw, _: b * 1e6 // bw),
    )


@dataclass(frozen=True)
class _Function:
    name: str
    must_be_int: bool
    mistakes: Callable[[], tuple[_Mistake, ...]]


_FUNCTIONS = (
    _Function("fused_rmsnorm_bytes", True, _bytes_mistakes),
    _Function("rmsnorm_flops", True, _flops_mistakes),
    _Function("arithmetic_intensity", False, _intensity_mistakes),
    _Function("time_floor_us", False, _time_mistakes),
)


def _same(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=0.0)


@dataclass
class _Call:
    args: tuple
    mistake_args: tuple[float, float, float]
    want: float
    got: object = None
    error: str | None = None
    traffic_used: tuple[str, ...] = field(default=())  # course.traffic functions it ran


ExtraCase = tuple[int, int, traffic.DTypeLike, float]  # M, N, dtype, bytes per second


def _cases(seed: int, extra: Sequence[ExtraCase] = ()) -> list[tuple[int, int, torch.dtype,
                                                                     float]]:
    rng = random.Random(seed)
    cases = [(m, n, d, _BANDWIDTHS[i % len(_BANDWIDTHS)]) for i, (m, n, d) in enumerate(_FIXED)]
    for _ in range(2):  # fresh odd sizes every run, so no table of answers passes
        cases.append((rng.randrange(1, 40000) | 1, rng.randrange(1, 20000) | 1,
                      rng.choice((torch.float32, torch.float16, torch.bfloat16)),
                      rng.uniform(2e11, 5e12)))
    for m, n, dtype, bandwidth in extra:
        traffic.fused_rmsnorm(m, n, dtype)  # raises a clear ValueError for a bad shape
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, Real) or not bandwidth > 0:
            raise ValueError(f"an extra case's bandwidth must be a positive number of bytes "
                             f"per second, got {bandwidth!r}")
        cases.append((m, n, traffic.as_torch_dtype(dtype), float(bandwidth)))
    return cases


@contextlib.contextmanager
def _traffic_calls() -> Iterator[list[str]]:
    """The course.traffic functions that the body calls (not those they call in turn)."""
    called: list[str] = []
    previous = sys.getprofile()

    def in_traffic(frame) -> bool:
        return frame is not None and frame.f_globals.get("__name__") == traffic.__name__

    def profile(frame, event, arg):
        if event == "call" and in_traffic(frame) and not in_traffic(frame.f_back):
            called.append(frame.f_code.co_name)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile)
    try:
        with guards.guarded(guards.TRAFFIC_CALLS, called):
            yield called
    finally:
        sys.setprofile(previous)


def _calls(m: int, n: int, dtype: torch.dtype, bandwidth: float) -> dict[str, _Call]:
    model = traffic.fused_rmsnorm(m, n, dtype)
    e = traffic.dtype_bytes(dtype)
    return {
        "fused_rmsnorm_bytes": _Call((m, n, e), (m, n, e), model.bytes),
        "rmsnorm_flops": _Call((m, n), (m, n, 0), model.flops),
        "arithmetic_intensity": _Call((model.flops, model.bytes), (model.flops, model.bytes, 0),
                                      model.intensity),
        "time_floor_us": _Call((model.bytes, bandwidth), (model.bytes, bandwidth, 0),
                               model.time_floor(bandwidth) * 1e6),
    }


def _run(fn: Callable, call: _Call, function: _Function) -> str | None:
    """What is wrong with one call, or None when it is right."""
    try:
        with _traffic_calls() as called:
            got = fn(*call.args)
    except Exception as exc:  # the learner's code: reported, not raised
        call.error = f"{type(exc).__name__}: {exc}"
        return f"raised {call.error}"
    call.got = got
    call.traffic_used = tuple(dict.fromkeys(called))
    if call.traffic_used:
        return f"called course.traffic ({', '.join(call.traffic_used)})"
    if isinstance(got, bool) or not isinstance(got, Real):
        return f"returned {got!r} ({type(got).__name__}), not a number"
    if not math.isfinite(float(got)):
        return f"returned {got!r}"
    if not _same(float(got), float(call.want)):
        return f"returned {got!r}, expected {call.want!r}"
    return None


def _diagnose(function: _Function, calls: list[_Call]) -> str:
    used = list(dict.fromkeys(name for c in calls for name in c.traffic_used))
    if used:
        return (f"it calls course.traffic ({', '.join(used)}), the model this check compares "
                "against. Write the arithmetic yourself, in plain Python, from the counts in "
                "the text")
    answered = [c for c in calls if c.error is None and isinstance(c.got, Real)
                and not isinstance(c.got, bool) and math.isfinite(float(c.got))]
    if not answered:
        first = next((c.error for c in calls if c.error), None)
        return (f"it raised {first}" if first else "it did not return a number")
    wrong = [c for c in answered if not _same(float(c.got), float(c.want))]
    for mistake in function.mistakes():
        if all(_same(float(c.got), float(mistake.value(*c.mistake_args))) for c in answered):
            return mistake.why
    ratios = [float(c.got) / float(c.want) for c in wrong if c.want]
    if ratios and all(math.isclose(r, ratios[0], rel_tol=1e-6) for r in ratios):
        return (f"every answer is {ratios[0]:.6g} times the right one: a constant factor is "
                "off (a unit, or a count per element)")
    example = wrong[0] if wrong else answered[0]
    args = ", ".join(map(repr, example.args))
    spread = (f" (your answers are {min(ratios):.3g} to {max(ratios):.3g} times the right "
              "ones)" if ratios else "")
    return f"for ({args}) it returned {example.got!r}, expected {example.want!r}{spread}"


@learner_facing
def roofline_functions(fused_rmsnorm_bytes: Callable[[int, int, int], int],
                       rmsnorm_flops: Callable[[int, int], int],
                       arithmetic_intensity: Callable[[float, float], float],
                       time_floor_us: Callable[[float, float], float], *,
                       seed: int | None = None, quiet: bool = False,
                       extra_cases: Sequence[ExtraCase] = ()) -> Report:
    """Check chapter 02's four roofline functions against `course.traffic`; raise
    AssertionError naming each wrong function and its likely mistake (or its use of
    course.traffic), return the report (printed unless quiet) when all four are right.

    `extra_cases` adds (M, N, dtype, bytes per second) cases to the fixed and random ones.
    """
    fns = dict(zip([f.name for f in _FUNCTIONS],
                   (fused_rmsnorm_bytes, rmsnorm_flops, arithmetic_intensity, time_floor_us),
                   strict=True))
    for name, fn in fns.items():
        if not callable(fn):
            raise TypeError(f"pass your function {name} itself, not {type(fn).__name__}")
    seed = fresh_seed() if seed is None else int(seed)
    results: list[CaseResult] = []
    calls: dict[str, list[_Call]] = {f.name: [] for f in _FUNCTIONS}
    notes: list[str] = []
    for index, (m, n, dtype, bandwidth) in enumerate(_cases(seed, extra_cases)):
        case = Case(f"case {index + 1}", (m, n), dtype)
        findings = []
        for function, call in zip(_FUNCTIONS, _calls(m, n, dtype, bandwidth).values(),
                                  strict=True):
            calls[function.name].append(call)
            problem = _run(fns[function.name], call, function)
            if problem is not None:
                args = ", ".join(map(repr, call.args))
                findings.append(Finding(function.name, f"{function.name}({args}) {problem}"))
            elif function.must_be_int and not isinstance(call.got, int):
                note = f"{function.name} returns {type(call.got).__name__}: an int is expected"
                if note not in notes:
                    notes.append(note)
        results.append(CaseResult(case, findings=tuple(findings)))
    advice = []
    for function in _FUNCTIONS:
        failing = [r for r in results if r.finding(function.name)]
        if failing:
            first = failing[0].finding(function.name)
            advice.append(f"{function.name} is off: {_diagnose(function, calls[function.name])}."
                          f"\n  Wrong on {len(failing)} of {len(results)} cases, e.g. "
                          f"{first.message}.")
    report = Report("roofline_functions", seed, results, advice, notes)
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report
