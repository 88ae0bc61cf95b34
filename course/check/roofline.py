"""Checkers for chapter 02's exercises: the ridge point, and the byte and FLOP counts of the
roofline model.

Exercise 2a, checked by `ridge_point` (at the end of this module), asks for two functions:

    ridge_point(peak_flops, bytes_per_s) -> float        FLOP per byte where the roof turns
    regime(intensity, peak_flops, bytes_per_s) -> str    "memory" or "compute"

Exercise 2, checked by `roofline_functions`, asks for four:

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
a profile hook that notes any function of that module running inside it (`_traffic_calls`,
in the learner's process too: guards.TRAFFIC_CALLS), and a call that switched that hook off
fails as well.
"""

from __future__ import annotations

import contextlib
import math
import random
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Real

from course import hardware, timing, traffic
from course.check import guards, profiled
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


# In the list `_traffic_calls` gives: course.timing's functions are named with this prefix
# (course.traffic's bare), and SWITCHED_OFF says the body switched the profile hook off.
TIMING = "course.timing."
SWITCHED_OFF = "sys.setprofile"
# What a timer uses of course.timing (chapter 03): a workload, its events, synchronize and
# the host's clock. Any other of its functions (simulated_times, SimParams.kernel_s, ...)
# gives the simulated GPU's true time rather than measuring it.
TIMER_USES = frozenset({"workload", "simulated", "cuda_workload", "parse_sim_spec", "Event",
                        "record", "elapsed_time", "synchronize", "clock", "__init__",
                        "__call__", "__repr__"})


def _codes_of(module: types.ModuleType) -> set[types.CodeType]:
    """Every code object of `module`'s functions and classes' methods (properties, static and
    class methods, dataclasses' generated ones), nested ones (closures, comprehensions)
    included."""
    found: set[types.CodeType] = set()

    def add(code: types.CodeType) -> None:
        found.add(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)

    def visit(value: object, seen: set[int]) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, property):
            for part in (value.fget, value.fset, value.fdel):
                visit(part, seen)
        elif isinstance(value, (staticmethod, classmethod)):
            visit(value.__func__, seen)
        elif isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            add(value.__code__)
            visit(getattr(value, "__wrapped__", None), seen)
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for member in vars(value).values():
                visit(member, seen)

    seen: set[int] = set()
    for value in list(vars(module).values()):
        visit(value, seen)
    return found


# The models, known by their code (a copy of a function made from the same code object, with
# globals of its own, is still the model: a red team's was) and by the file it was compiled
# from (code compiled again from the module's text; the walls refuse any other under that
# name).
_MODEL_CODES = {code: model.__name__ for model in (traffic, timing)
                for code in _codes_of(model)}
_MODEL_FILES = {model.__file__: model.__name__ for model in (traffic, timing)}


def _model_of(frame) -> str | None:
    if frame is None:
        return None
    code = frame.f_code
    return _MODEL_CODES.get(code) or _MODEL_FILES.get(code.co_filename)


@contextlib.contextmanager
def _traffic_calls() -> Iterator[list[str]]:
    """What the body asks of the course's models, the answers the checks compare against:
    the course.traffic functions it calls (not those they call in turn), by name; the
    functions of course.timing beyond what a timer uses, as TIMING + name; and
    SWITCHED_OFF when, at the end, the profile hook that sees them was no longer installed
    (sys.setprofile(None), or another profile function put in its place)."""
    called: list[str] = []

    def hook(frame, event, arg):
        if event != "call":
            return
        model = _model_of(frame)
        if model is None or _model_of(frame.f_back) == model:
            return
        name = frame.f_code.co_name
        if model == traffic.__name__:
            called.append(name)
        elif name not in TIMER_USES:
            called.append(TIMING + name)

    watch = None
    try:
        with profiled.watching(hook) as watch, guards.guarded(guards.TRAFFIC_CALLS, called):
            yield called
    finally:
        if watch is not None and watch.switched_off:  # set as the watch ends
            called.append(SWITCHED_OFF)


def refused_calls(called: Sequence[str]) -> tuple[str, ...]:
    """What a check of plain arithmetic refuses in `_traffic_calls`'s list: the functions of
    course.traffic, and SWITCHED_OFF; each once, in order."""
    return tuple(dict.fromkeys(c for c in called if not c.startswith(TIMING)))


def calls_said(used: Sequence[str], *, past: bool = False) -> str:
    """`refused_calls` in words: 'calls course.traffic (a, b)', 'switches off the check's
    profile hook ...', or both ('called', 'switched' with past=True)."""
    names = [u for u in used if u != SWITCHED_OFF]
    parts = []
    if names:
        parts.append(f"{'called' if past else 'calls'} course.traffic ({', '.join(names)})")
    if SWITCHED_OFF in used:
        parts.append(f"{'switched' if past else 'switches'} off the check's profile hook "
                     "(sys.setprofile or threading.setprofile), which watches for calls "
                     "into course.traffic")
    return " and ".join(parts)


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


def _call_learner(fn: Callable, args: tuple, call: _Call | _RegimeCall) -> str | None:
    """Call fn(*args) watched for course.traffic; note its answer, error and the functions
    of course.traffic it ran in `call`. What is wrong with the call itself (it raised, it
    used course.traffic), or None."""
    try:
        with _traffic_calls() as called:
            got = fn(*args)
    except Exception as exc:  # the learner's code: reported, not raised
        call.error = f"{type(exc).__name__}: {exc}"
        return f"raised {call.error}"
    call.got = got
    call.traffic_used = refused_calls(called)
    if call.traffic_used:
        return calls_said(call.traffic_used, past=True)
    return None


def _run(fn: Callable, call: _Call, function: _Function) -> str | None:
    """What is wrong with one call, or None when it is right."""
    problem = _call_learner(fn, call.args, call)
    if problem is not None:
        return problem
    got = call.got
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
        return (f"it {calls_said(used)}, the model this check compares against. Write the "
                "arithmetic yourself, in plain Python, from the counts in the text")
    numbers = [c.error is None and isinstance(c.got, Real) and not isinstance(c.got, bool)
               and math.isfinite(float(c.got)) for c in calls]
    answered = [c for c, number in zip(calls, numbers, strict=True) if number]
    if not answered:
        first = next((c.error for c in calls if c.error), None)
        return (f"it raised {first}" if first else "it did not return a number")
    wrong = [c for c in answered if not _same(float(c.got), float(c.want))]
    odd = next((c for c, number in zip(calls, numbers, strict=True) if not number), None)
    if not wrong and odd is not None:  # every number it gave is right: the rest is the fault
        args = ", ".join(map(repr, odd.args))
        return (f"for ({args}) it raised {odd.error}" if odd.error else
                f"for ({args}) it returned {odd.got!r}, not a finite number")
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


# ---------------------------------------------------------------- the ridge point
#
# The learner writes two more functions:
#
#     ridge_point(peak_flops, bytes_per_s) -> float        P / B, FLOP per byte
#     regime(intensity, peak_flops, bytes_per_s) -> str    "memory" left of the ridge,
#                                                          "compute" otherwise
#
# Both are checked on roofs of `course.hardware`'s table and on made-up GPUs drawn fresh
# each run, in base units (FLOP/s, bytes/s) as the functions take them. A wrong ridge is
# compared with the usual slips (an inverted ratio, a unit prefix applied or dropped, the
# peak halved or doubled for FMAs); a wrong regime with swapped sides, one answer for
# everything, the wrong boundary, or a boundary that follows the learner's own wrong ridge.

_REGIMES = ("memory", "compute")
_NOTHING = object()  # no odd answer (None is one a function can return)
# (GPU of course.hardware, the math its peak is for, halve the peak?). The peaks count an
# FMA as two FLOPs; the no-FMA roof halves the float32 peak before the call, as chapter 02
# does for a count with no FMAs.
_FIXED_ROOFS = (("H100 SXM", torch.bfloat16, False), ("H100 SXM", torch.float32, False),
                ("H100 SXM", torch.float32, True), ("A100 40GB", torch.bfloat16, False),
                ("T4", torch.float16, False), ("L4", torch.float32, True))
# Where a kernel sits: a copy (no arithmetic), fused RMSNorm in float32 and in bfloat16,
# and an 8192³ bfloat16 matrix product (2n³ FLOPs over three n×n matrices of 2 bytes).
_KERNELS = (("a copy", 0.0), ("fused RMSNorm, float32", 0.5), ("fused RMSNorm, bfloat16", 1.0),
            ("an 8192³ bfloat16 matmul", 2 * 8192**3 / (3 * 8192**2 * 2)))
_NEAR_RIDGE = (0.8, 1.25)  # intensities this close to the ridge, on either side, too


@dataclass(frozen=True)
class _Roof:
    """One GPU's roof for one kind of math: what a case of the ridge check is about."""

    name: str
    peak_flops: float   # FLOP/s
    bytes_per_s: float

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bytes_per_s

    def label(self) -> str:
        return (f"{self.name} ({self.peak_flops / 1e12:g} TFLOP/s, "
                f"{self.bytes_per_s / 1e9:g} GB/s)")


def _roofs(seed: int) -> list[_Roof]:
    roofs = []
    for gpu, dtype, halved in _FIXED_ROOFS:
        spec = hardware.lookup(gpu)
        math_name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        peak = spec.peak_flops(dtype) / (2 if halved else 1)
        roofs.append(_Roof(f"{spec.name} {math_name}" + (" no-FMA" if halved else ""), peak,
                           spec.hbm_bytes_per_s))
    rng = random.Random(seed)
    for index in range(2):  # made-up GPUs, fresh every run, so no table of answers passes
        peak = 10 ** rng.uniform(13, math.log10(3e15))
        bandwidth = 10 ** rng.uniform(math.log10(2e11), 13)
        roofs.append(_Roof(f"made-up GPU {index + 1}", peak, bandwidth))
    return roofs


def _ridge_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake("your ratio is inverted: bytes_per_s / peak_flops is bytes per FLOP. The "
                 "ridge is FLOP per byte, peak_flops / bytes_per_s (about 295 for an H100's "
                 "bfloat16 math, not 0.0034)", lambda p, b, _: b / p),
        _Mistake("you returned the product: the ridge is the ratio peak_flops / bytes_per_s",
                 lambda p, b, _: p * b),
        _Mistake("you divided TFLOP/s by GB/s, which makes the ridge 1000 times too small "
                 "(tera is 1e12, giga 1e9). Both arguments are already in base units, FLOP/s "
                 "and bytes/s: peak_flops / bytes_per_s", lambda p, b, _: (p / 1e12) / (b / 1e9)),
        _Mistake("you converted both to base units again (TFLOP/s x 1e12 over GB/s x 1e9), "
                 "which makes the ridge 1000 times too large: the arguments are already in "
                 "FLOP/s and bytes/s", lambda p, b, _: (p * 1e12) / (b * 1e9)),
        _Mistake("you treated bytes_per_s as GB/s (multiplied it by 1e9): it is already in "
                 "bytes per second", lambda p, b, _: p / (b * 1e9)),
        _Mistake("you converted bytes_per_s to GB/s (divided it by 1e9): the ridge is FLOP per "
                 "byte, so keep bytes per second", lambda p, b, _: p / (b / 1e9)),
        _Mistake("you treated peak_flops as TFLOP/s (multiplied it by 1e12): it is already in "
                 "FLOP per second", lambda p, b, _: p * 1e12 / b),
        _Mistake("you converted peak_flops to TFLOP/s (divided it by 1e12): the ridge is FLOP "
                 "per byte, so keep FLOP per second", lambda p, b, _: p / 1e12 / b),
        _Mistake("you halved the peak (an FMA counted as one FLOP?): ridge_point takes the peak "
                 "as given. Whoever calls it with a datasheet peak, which counts an FMA as two "
                 "FLOPs, halves it first when their count has no FMAs (the no-FMA column does)",
                 lambda p, b, _: p / 2 / b),
        _Mistake("you doubled the peak (an FMA counted as two FLOPs?): the datasheet peaks "
                 "already count an FMA as two, and ridge_point takes the peak as given",
                 lambda p, b, _: 2 * p / b),
        _Mistake("you used integer division (//), which rounds the ridge down to a whole "
                 "number: use /", lambda p, b, _: p // b),
    )


_RIDGE = _Function("ridge_point", False, _ridge_mistakes)


@dataclass(frozen=True)
class _Rule:
    why: str
    answer: Callable[[float, _Roof], str]  # (intensity, roof) -> "memory" or "compute"


def _side(intensity: float, boundary: float) -> str:
    return "memory" if intensity < boundary else "compute"


def _regime_rules() -> tuple[_Rule, ...]:
    return (
        _Rule("you have the sides swapped: left of the ridge (intensity below it) a kernel "
              "waits for bytes, so it is memory-bound; right of it, compute-bound",
              lambda i, r: "compute" if _side(i, r.ridge) == "memory" else "memory"),
        _Rule("it answers 'memory' for every kernel, also for an 8192³ matmul at 2731 "
              "FLOP/byte, far right of an H100's ridge (295): compare the intensity with the "
              "ridge point",
              lambda i, r: "memory"),
        _Rule("it answers 'compute' for every kernel, also for a copy at 0 FLOP/byte: compare "
              "the intensity with the ridge point", lambda i, r: "compute"),
        _Rule("you compared the intensity with bytes_per_s / peak_flops (bytes per FLOP): "
              "the ridge is peak_flops / bytes_per_s, FLOP per byte",
              lambda i, r: _side(i, r.bytes_per_s / r.peak_flops)),
        _Rule("you compared the intensity with half the ridge (the peak halved for FMAs?): "
              "regime takes the peak as given, like ridge_point",
              lambda i, r: _side(i, r.ridge / 2)),
        _Rule("you compared the intensity with twice the ridge (the peak doubled for FMAs?): "
              "regime takes the peak as given, like ridge_point",
              lambda i, r: _side(i, 2 * r.ridge)),
    )


@dataclass
class _RegimeCall:
    intensity: float
    kernel: str
    roof: _Roof
    got: object = None
    error: str | None = None
    traffic_used: tuple[str, ...] = field(default=())

    @property
    def want(self) -> str:
        return _side(self.intensity, self.roof.ridge)

    def args(self) -> str:
        return f"{self.intensity!r}, {self.roof.peak_flops!r}, {self.roof.bytes_per_s!r}"


def _run_regime(fn: Callable, call: _RegimeCall) -> str | None:
    """What is wrong with one call of the learner's regime, or None when it is right."""
    problem = _call_learner(fn, (call.intensity, call.roof.peak_flops, call.roof.bytes_per_s),
                            call)
    if problem is None and call.got != call.want:
        return f"returned {call.got!r}, expected {call.want!r}"
    return problem


def _diagnose_regime(calls: list[_RegimeCall], own_ridges: dict[_Roof, float]) -> str:
    used = list(dict.fromkeys(name for c in calls for name in c.traffic_used))
    if used:
        return (f"it {calls_said(used)}, the model this check compares against. Write the "
                "comparison yourself, in plain Python")
    answered = [c for c in calls if c.error is None]
    if not answered:
        return f"it raised {calls[0].error}"
    odd = next((c.got for c in answered if not (isinstance(c.got, str) and c.got in _REGIMES)),
               _NOTHING)
    if odd is not _NOTHING:
        if isinstance(odd, str) and odd.strip().lower().startswith(_REGIMES):
            return (f"it returned {odd!r}: return exactly 'memory' or 'compute' (lower case, "
                    "nothing after it)")
        return (f"it returned {odd!r} ({type(odd).__name__}): return the string 'memory' or "
                "'compute'")
    raised = next((c for c in calls if c.error is not None), None)
    if raised is not None and all(c.got == c.want for c in answered):
        return (f"for {raised.kernel} at {raised.intensity:.4g} FLOP/byte on "
                f"{raised.roof.label()} it raised {raised.error} (every answer it gave is "
                "right)")
    # A regime built on the learner's own ridge_point is right once that is.
    if own_ridges and any(not _same(own, roof.ridge) for roof, own in own_ridges.items()) \
            and all(c.roof in own_ridges and c.got == _side(c.intensity, own_ridges[c.roof])
                    for c in answered):
        return ("its answers follow your ridge_point, which is off (see above): fix "
                "ridge_point, and regime will follow")
    for rule in _regime_rules():
        if all(c.got == rule.answer(c.intensity, c.roof) for c in answered):
            return rule.why
    wrong = next(c for c in answered if c.got != c.want)
    side = "left" if wrong.want == "memory" else "right"
    return (f"for {wrong.kernel} at {wrong.intensity:.4g} FLOP/byte on {wrong.roof.label()}, "
            f"whose ridge is {wrong.roof.ridge:.4g} FLOP/byte, it answered {wrong.got!r}: the "
            f"kernel is {side} of the ridge, so {wrong.want}-bound")


@learner_facing
def ridge_point(ridge_point: Callable[[float, float], float],
                regime: Callable[[float, float, float], str], *,
                seed: int | None = None, quiet: bool = False) -> Report:
    """Check chapter 02's `ridge_point(peak_flops, bytes_per_s)` and `regime(intensity,
    peak_flops, bytes_per_s)` on roofs of `course.hardware`'s table and on made-up GPUs;
    raise AssertionError naming each wrong function and its likely mistake, return the
    report (printed unless quiet) when both are right."""
    for name, fn in (("ridge_point", ridge_point), ("regime", regime)):
        if not callable(fn):
            raise TypeError(f"pass your function {name} itself, not {type(fn).__name__}")
    seed = fresh_seed() if seed is None else int(seed)
    results: list[CaseResult] = []
    ridge_calls: list[_Call] = []
    regime_calls: list[_RegimeCall] = []
    own_ridges: dict[_Roof, float] = {}
    for roof in _roofs(seed):
        findings = []
        call = _Call((roof.peak_flops, roof.bytes_per_s), (roof.peak_flops, roof.bytes_per_s, 0),
                     roof.ridge)
        ridge_calls.append(call)
        problem = _run(ridge_point, call, _RIDGE)
        if problem is not None:
            findings.append(Finding("ridge_point", f"ridge_point({roof.peak_flops!r}, "
                                                   f"{roof.bytes_per_s!r}) {problem}"))
        if call.error is None and isinstance(call.got, Real) and not isinstance(call.got, bool):
            own_ridges[roof] = float(call.got)
        kernels = [*_KERNELS, *((f"a kernel at {f:g}x the ridge", f * roof.ridge)
                                for f in _NEAR_RIDGE)]
        for kernel, intensity in kernels:
            regime_call = _RegimeCall(intensity, kernel, roof)
            regime_calls.append(regime_call)
            problem = _run_regime(regime, regime_call)
            if problem is not None and not any(f.kind == "regime" for f in findings):
                findings.append(Finding("regime", f"regime({regime_call.args()}) {problem}"))
        results.append(CaseResult(roof, findings=tuple(findings)))  # type: ignore[arg-type]
    advice = []
    for name, diagnose in (("ridge_point", lambda: _diagnose(_RIDGE, ridge_calls)),
                           ("regime", lambda: _diagnose_regime(regime_calls, own_ridges))):
        failing = [r for r in results if r.finding(name)]
        if failing:
            advice.append(f"{name} is off: {diagnose()}.\n  Wrong on {len(failing)} of "
                          f"{len(results)} GPUs, e.g. {failing[0].finding(name).message}.")
    report = Report("ridge_point", seed, results, advice)
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report
