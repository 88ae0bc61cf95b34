"""Running a whole exercise: every case, the repeat-call probes (new inputs of a shape that
passed, then the same input tensors refilled in place with new values), then the advice."""

from __future__ import annotations

from collections.abc import Callable

from course.check.diagnose import advise
from course.check.report import Report
from course.check.runner import (
    ADVICE,
    CaseResult,
    Exercise,
    fresh_seed,
    kept_result,
    probe_caching,
    probe_repeat,
    run_case,
)

import torch


def run_exercise(exercise: Exercise, fn: Callable, *, seed: int | None = None) -> Report:
    """Check `fn` on every case of `exercise` with fresh random inputs (reproducible from the
    seed printed in the report)."""
    if not callable(fn):
        raise TypeError(f"pass your function itself, e.g. {exercise.signature.split('(')[0]}, "
                        f"not {type(fn).__name__}")
    seed = fresh_seed() if seed is None else int(seed)
    runnable = [c for c in exercise.cases if c.runnable()]
    notes = [f"skipped {c.label()}: this GPU has no bfloat16 support in Triton"
             for c in exercise.cases if not c.runnable()]
    results: list[CaseResult] = []
    for index, case in enumerate(runnable):
        result = run_case(exercise, fn, case, torch.Generator().manual_seed(seed * 1000 + index))
        results.append(result)
        if result.fatal:
            notes.append("stopped after a GPU memory fault: later cases were not run")
            break
    if any(r.launches for r in results):  # memory returned without a launch was kept
        results = [kept_result(r) if r.kept else r for r in results]
    passing = [r for r in results if r.passed]
    # Only while no case has wrong values: a formula that is wrong everywhere may pass one
    # case by chance (a row whose mean is near 0, where a variance is a mean square) and
    # fail on the probe's new values, which is not state kept between calls.
    if passing and not any(r.fatal or r.mismatches for r in results):
        # Results keep their inputs alive (CaseResult.inputs): the probes' new inputs cannot
        # land at an address a case used, and the refilled ones keep theirs.
        findings = (probe_caching(exercise, fn, passing[0], seed)
                    or probe_repeat(exercise, fn, passing[0], seed))
        if findings:
            results.append(CaseResult(passing[0].case, findings=findings))
    copies = sorted({c for r in results for c in r.copies})
    if copies and not exercise.torch_ops_allowed:  # copies are fine in plain PyTorch
        notes.append("your wrapper copies data with PyTorch (" + "; ".join(copies[:3]) +
                     "): allowed, but each copy is an extra read and write of the tensor")
    notes += warning_notes(results)
    advice = advise(results, exercise.suspects, {**ADVICE, **exercise.advice})
    return Report(exercise.name, seed, results, advice, notes)


def check_and_raise(exercise: Exercise, fn: Callable, *, seed: int | None = None,
                    quiet: bool = False) -> Report:
    report = run_exercise(exercise, fn, seed=seed)
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report


def warning_notes(results: list[CaseResult]) -> list[str]:
    """One note per distinct warning the learner's function raised. They are collected while
    it runs, not printed: under nbgrader, a graded cell that writes to stderr scores 0."""
    seen = list(dict.fromkeys(w for r in results for w in r.warnings))
    notes = [f"your function raised a warning: {w}" for w in seen[:5]]
    if len(seen) > 5:
        notes.append(f"and {len(seen) - 5} more warning(s)")
    return notes
