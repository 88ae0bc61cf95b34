"""Chapter 03's plain-Python answers as a learner writes them, and the mistakes a learner
makes in them.

The answers are the source notebook's own solutions of the two exercises that need no
kernel (`eager_launch_bytes`, `time_per_call`), with the chapter's locked `time_workload`
cell, run as one namespace. A mistake is the same answers with an edit or two in one
exercise cell, each a line a learner really writes wrong.

    answers = load(MISTAKES["weight_forgotten"].edits)
    check.eager_launch_bytes(answers["eager_launch_bytes"])   # AssertionError, named
"""

from __future__ import annotations

from dataclasses import dataclass

import nbformat
from grader_submissions import ROOT, solutions, with_edits

CHAPTER = "ch03_two_pass"
SOURCE = ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
BYTES, TIMER = "ex03_eager_bytes_code", "ex03_timer_code"
WRAPPER_CELL = "ex03-time-workload"  # the locked cell that wraps time_per_call


@dataclass(frozen=True)
class Mistake:
    what: str
    edits: dict[str, list[tuple[str, str]]]
    loses: tuple[str, ...]   # the test cells it must fail
    phrase: str              # in the check's message


_BYTES_CELLS = ("ex03_eager_bytes", "ex03_eager_bytes_hidden")
_TIMER_CELLS = ("ex03_timer", "ex03_timer_hidden")

MISTAKES = {
    "temporaries_at_input_width": Mistake(
        "counts the float32 temporaries at x's width",
        {BYTES: [("MN, e, f32 = M * N, elem_bytes, 4",
                  "MN, e, f32 = M * N, elem_bytes, elem_bytes"),
                 ("converts = e != f32", "converts = e != 4")]},
        _BYTES_CELLS, "float32 temporaries at x's width"),
    "weight_forgotten": Mistake(
        "leaves out the weight's read",
        {BYTES: [('("w * h", N * e + MN * e + MN * e)', '("w * h", MN * e + MN * e)')]},
        _BYTES_CELLS, "left out the weight's read"),
    "weight_per_row": Mistake(
        "counts the weight once per row",
        {BYTES: [('("w * h", N * e + MN * e + MN * e)', '("w * h", MN * e + MN * e + MN * e)')]},
        _BYTES_CELLS, "you counted the weight once per row"),
    "mean_as_mn": Mistake(
        "counts the per-row mean as M*N values",
        {BYTES: [('("mean(-1)", MN * f32 + M * f32)', '("mean(-1)", MN * f32 + MN * f32)')]},
        _BYTES_CELLS, "the per-row mean as M*N values"),
    "downcast_missing": Mistake(
        "leaves out the downcast before the weight multiply",
        {BYTES: [('    if converts:\n        launches.append(("to(x.dtype)", MN * f32 + MN * e))\n',
                  "")]},
        _BYTES_CELLS, "the one missing is 'to(bf16)'"),
    "output_as_float32": Mistake(
        "counts the weight multiply's output as float32",
        {BYTES: [('("w * h", N * e + MN * e + MN * e)', '("w * h", N * e + MN * e + MN * f32)')]},
        _BYTES_CELLS, "output of w * h at the wrong width"),
    "host_clock_no_sync": Mistake(
        "times with the host's clock and never synchronises",
        {TIMER: [("    starts = [", "    start = gpu.clock()\n    starts = ["),
                 ("    gpu.synchronize()  # the GPU has reached every end event\n"
                  "    return sum(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))"
                  " / reps / 1e3",
                  "    return (gpu.clock() - start) / reps")]},
        _TIMER_CELLS, "it measured the launch only"),
    "no_warmup": Mistake(
        "times from the first call",
        {TIMER: [("    for args in inputs[:3]:  # warm-up: compilation, caches, clocks\n"
                  "        fn(*args)\n", "")]},
        _TIMER_CELLS, "counted the first call's compilation"),
    "same_input": Mistake(
        "times the same input every call",
        {TIMER: [("args = inputs[i % len(inputs)]", "args = inputs[0]")]},
        _TIMER_CELLS, "timed the same input every call"),
    "same_output": Mistake(
        "lets each output be freed, so the next call reuses its block",
        {TIMER: [("outputs.append(fn(*args))", "fn(*args)")]},
        _TIMER_CELLS, "wrote to memory a recent call had written"),
    "total_not_mean": Mistake(
        "returns the total of the calls, not divided by reps",
        {TIMER: [("/ reps / 1e3", "/ 1e3")]},
        _TIMER_CELLS, "it returned the total of all the calls"),
    "milliseconds": Mistake(
        "returns elapsed_time's milliseconds",
        {TIMER: [("/ reps / 1e3", "/ reps")]},
        _TIMER_CELLS, "it returned milliseconds"),
}


def answers(edits: dict[str, list[tuple[str, str]]] | None = None) -> dict[str, str]:
    """grade id -> the source's answer, with `edits` ((old, new) per exercise) applied."""
    return with_edits(solutions(ROOT, CHAPTER), edits or {})


def load(edits: dict[str, list[tuple[str, str]]] | None = None) -> dict[str, object]:
    """The two exercises' answers (with `edits`) and the wrapper cell, run in one namespace."""
    wrapper = next(c.source for c in nbformat.read(SOURCE, as_version=4).cells
                   if c.id == WRAPPER_CELL)
    found = answers(edits)
    namespace: dict[str, object] = {}
    exec(compile("\n\n".join([found[BYTES], found[TIMER], wrapper]), "<ch03 answers>", "exec"),
         namespace)
    return namespace
