"""Checker for chapter 03's first exercise: eager RMSNorm's bytes, launch by launch.

The learner writes

    eager_launch_bytes(M, N, elem_bytes) -> list[tuple[str, int]]

one (name, bytes) entry per kernel that `course.baselines.eager_rmsnorm` launches on an
M x N input x and a weight of N, both of `elem_bytes` bytes an element (2 for bfloat16 and
float16, 4 for float32), in the order they run; bytes are what the launch reads from HBM
plus what it writes. The names are the learner's own labels; the byte counts are compared,
launch by launch, with `course.traffic.eager_rmsnorm`, the reference.

A wrong list is compared with the mistakes learners make (float32 temporaries counted at
x's width, the weight's read left out or counted once per row, a per-row statistic counted
as M*N elements, the output of `w * h` at the wrong width, and any combination of them; a
launch missing or one too many) and the message names the one that fits every case. As in
chapter 02, a function that calls into `course.traffic` fails whatever it returns, and so does
one that switches off the profile hook watching for it (`roofline._traffic_calls`, the guard
TRAFFIC_CALLS in the learner's process).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from course import traffic
from course.check.cases import Case
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.roofline import _traffic_calls, calls_said, refused_calls
from course.check.runner import CaseResult, Finding, fresh_seed

import torch

FP32 = 4
# (M, N, elem_bytes): M and N apart, so that a count of the wrong one shows.
_FIXED = ((16384, 4096, 2), (3000, 1024, 4), (1, 7, 2), (97, 12289, 4))
_DTYPES = {2: torch.bfloat16, 4: torch.float32}


@dataclass(frozen=True)
class _Slip:
    """One mistake, as a change of the model below."""

    name: str
    why: str


_SLIPS = (
    _Slip("temp_width", "you counted the float32 temporaries at x's width. The chain's first "
          "line makes h = x.to(torch.float32): from there on every temporary (h, its square, "
          "the mean, rstd, h * rstd) is float32, 4 bytes an element, whatever x's dtype"),
    _Slip("no_weight", "you left out the weight's read in the last launch, w * h: it reads "
          "the N weights (once: the other rows find them in L2) as well as h"),
    _Slip("weight_per_row", "you counted the weight once per row, M*N values: the last "
          "launch, w * h, reads the N weights once from HBM (the first row fetches them; the "
          "other rows find them in L2), so it moves N weights, not M*N"),
    _Slip("mean_as_mn", "you counted the per-row mean as M*N values: mean(-1, keepdim=True) "
          "writes one float32 value a row, M of them"),
    _Slip("row_as_mn", "you counted every per-row statistic as M*N values: mean(-1) writes "
          "one value a row (M of them), and + eps, rsqrt and the read of rstd in h * rstd "
          "move M values too"),
    _Slip("out_width", "you counted the output of w * h at the wrong width: w and "
          "h.to(x.dtype) are both in x's dtype, so y is too (elem_bytes an element), not "
          "float32"),
)


def model_launches(M: int, N: int, e: int, slips: frozenset[str] = frozenset()
                   ) -> list[tuple[str, int]]:
    """The chain's launches with `slips` (names of _SLIPS) made: a way to name a wrong
    answer. Without slips it agrees with course.traffic (tests/test_ch03_exercises.py)."""
    t = e if "temp_width" in slips else FP32      # float32 temporaries
    r = M * N if "row_as_mn" in slips else M      # elements of a per-row statistic
    w = 0 if "no_weight" in slips else (M * N * e if "weight_per_row" in slips else N * e)
    out = FP32 if "out_width" in slips else e
    MN = M * N
    converts = e != FP32
    launches = [("to(float32)", MN * e + MN * t)] if converts else []
    mean = M * N if "mean_as_mn" in slips else r
    launches += [("pow(2)", 2 * MN * t), ("mean(-1)", MN * t + mean * t), ("var + eps", 2 * r * t),
                 ("rsqrt", 2 * r * t), ("h * rstd", 2 * MN * t + r * t)]
    if converts:
        launches.append(("to(x.dtype)", MN * t + MN * e))
    launches.append(("w * h", MN * e + w + MN * out))
    return launches


def _cases(seed: int) -> list[tuple[int, int, int]]:
    gen = torch.Generator().manual_seed(seed)
    cases = list(_FIXED)
    for e in (2, 4):  # fresh sizes every run, so no table of answers passes
        m, n = (int(v) for v in torch.randint(2, 30000, (2,), generator=gen))
        cases.append((m, n, e))
    return cases


def _problem(got: object) -> str | None:
    """What is wrong with the shape of an answer, or None."""
    if not isinstance(got, (list, tuple)):
        return f"returned {got!r} ({type(got).__name__}), not a list of (name, bytes) pairs"
    for i, entry in enumerate(got):
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
            return f"entry {i} is {entry!r}: each entry is a (name, bytes) pair"
        name, nbytes = entry
        if not isinstance(name, str):
            return f"entry {i} has the name {name!r}: a name is a str, e.g. 'pow(2)'"
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            return (f"entry {i} ({name!r}) has {nbytes!r} bytes ({type(nbytes).__name__}): "
                    "bytes are an int")
    return None


def _describe(kernel: traffic.KernelTraffic) -> str:
    return (f"{kernel.name}: reads {kernel.bytes_read:,} and writes {kernel.bytes_written:,} "
            "bytes")


def _missing_or_extra(got: list[int], want: list[int], names: list[str], e: int) -> str:
    """Why the number of launches differs, naming the launch missing or added if one is."""
    head = f"{len(got)} launches, where the chain makes {len(want)}"
    if len(got) == len(want) - 1:
        for i in range(len(want)):
            if want[:i] + want[i + 1:] == got:
                extra = (" The result of h * rstd is float32 and the weight is in x's dtype: "
                         "PyTorch converts h back first, in a kernel of its own."
                         if names[i].startswith("to(") and i > 0 else "")
                return f"{head}: the one missing is {names[i]!r}.{extra}"
    if len(got) == len(want) + 1:
        for i in range(len(got)):
            if got[:i] + got[i + 1:] == want:
                return (f"{head}: your entry {i} is one too many." +
                        (" x.to(torch.float32) on a float32 x returns x itself, with no "
                         "launch" if e == FP32 else ""))
    if e == FP32 and len(got) == len(want) + 2:
        return (f"{head}: for a float32 x, x.to(torch.float32) returns x itself and "
                "h.to(x.dtype) returns h: neither launches a kernel")
    if e != FP32 and len(got) == len(want) - 2:
        return (f"{head}: for a {elem_name(e)} x, the chain converts x to float32 and, before "
                "the weight multiply, h back to x's dtype: two launches of their own")
    return head


def elem_name(e: int) -> str:
    return "bfloat16 (or float16)" if e == 2 else f"{e}-byte"


def _case_finding(M: int, N: int, e: int, got: list[tuple[str, int]]) -> str | None:
    reference = traffic.eager_rmsnorm(M, N, _DTYPES[e])
    want = [k.bytes for k in reference.kernels]
    nbytes = [b for _, b in got]
    if nbytes == want:
        return None
    names = [k.name for k in reference.kernels]
    if len(nbytes) != len(want):
        return _missing_or_extra(nbytes, want, names, e)
    i = next(i for i, (g, w) in enumerate(zip(nbytes, want, strict=True)) if g != w)
    return (f"launch {i} ({got[i][0]!r}) counts {nbytes[i]:,} bytes, expected "
            f"{want[i]:,} ({_describe(reference.kernels[i])})")


def _matching_slips(cases: list[tuple[int, int, int]], answers: list[list[int]]
                    ) -> tuple[_Slip, ...] | None:
    """The smallest set of slips whose model gives every answer, if one does."""
    for size in range(1, len(_SLIPS) + 1):
        for combo in itertools.combinations(_SLIPS, size):
            names = frozenset(s.name for s in combo)
            if all([b for _, b in model_launches(M, N, e, names)] == got
                   for (M, N, e), got in zip(cases, answers, strict=True)):
                return combo
    return None


@learner_facing
def eager_launch_bytes(fn: Callable[[int, int, int], list[tuple[str, int]]], *,
                       seed: int | None = None, quiet: bool = False) -> Report:
    """Check `fn(M, N, elem_bytes)` against `course.traffic.eager_rmsnorm`, launch by
    launch, on fixed and random shapes in 2- and 4-byte dtypes; raise AssertionError naming
    the likely mistake, return the report (printed unless quiet) when every case is right."""
    if not callable(fn):
        raise TypeError(f"pass your function eager_launch_bytes itself, not "
                        f"{type(fn).__name__}")
    seed = fresh_seed() if seed is None else int(seed)
    cases = _cases(seed)
    results: list[CaseResult] = []
    answers: list[list[int] | None] = []
    used: list[str] = []
    for index, (M, N, e) in enumerate(cases):
        case = Case(f"case {index + 1}", (M, N), _DTYPES[e])
        problem, nbytes = None, None
        try:
            with _traffic_calls() as called:
                got = fn(M, N, e)
        except Exception as exc:  # the learner's code: reported, not raised
            problem = f"raised {type(exc).__name__}: {exc}"
        else:
            refused = refused_calls(called)
            used += refused
            problem = calls_said(refused, past=True) if refused else _problem(got)
            if problem is None:
                got = [(name, int(b)) for name, b in got]
                nbytes = [b for _, b in got]
                problem = _case_finding(M, N, e, got)
        answers.append(nbytes)
        findings = () if problem is None else (
            Finding("bytes", f"eager_launch_bytes({M}, {N}, {e}) {problem}"),)
        results.append(CaseResult(case, findings=findings))
    advice = []
    failing = [r for r in results if not r.passed]
    if used:
        advice.append(f"eager_launch_bytes {calls_said(list(dict.fromkeys(used)))}, the model "
                      "this check compares against. Count the bytes yourself, launch by "
                      "launch, from the code of course.baselines.eager_rmsnorm")
    elif failing:
        slips = None
        if all(a is not None for a in answers):
            slips = _matching_slips(cases, answers)
        first = failing[0].findings[0].message.rstrip(".")
        if slips:
            advice.append("eager_launch_bytes is off: " + ";\nand ".join(s.why for s in slips)
                          + f".\n  Wrong on {len(failing)} of {len(results)} cases, e.g. "
                          f"{first}.")
        else:
            advice.append(f"eager_launch_bytes is off on {len(failing)} of {len(results)} "
                          f"cases: {first}.")
    return finish(Report("eager_launch_bytes", seed, results, advice), quiet)


def finish(report: Report, quiet: bool) -> Report:
    """Raise the report's message if it failed; else show it (unless quiet) and return it."""
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report
