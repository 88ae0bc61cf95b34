"""Pictures under a failed check whose diagnosis is about addresses (a missing mask, a
wrong row offset, a grid too small, ...): what the learner's kernel touched on a smaller
run of the failing case, and what a correct kernel touches on the same input.

One address bug leaves the values right: a load past the end of an input whose lanes the
store then leaves out (the weight loaded without a mask). In Triton's interpreter the call
of one case whose N is not a power of two is recorded, and a load outside an input fails
that case (`input_read_outside`). On a GPU, and while grading, nothing can record it.

The pictures are made only in Triton's interpreter, where `course.accesses` can record a
launch, and never while grading: the grade needs the message, not the picture, and the
learner's function runs in another process there. They cost one small extra call of the
learner's function and of a copy kernel, on failures only; a check that passes runs as
before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from course import runtime
from course.check.cases import Case
from course.check.diagnose import address_failure, advise
from course.check.report import Report
from course.check.runner import ADVICE, Exercise, Finding
from course.check.suite import run_exercise

import torch
import triton
import triton.language as tl

SMALL = 16   # rows and columns of the smaller run keep their remainder modulo this


def check_with_pictures(exercise: Exercise, fn: Callable, *, seed: int | None = None,
                        quiet: bool = False) -> Report:
    """As `suite.check_and_raise`; when the failure is about addresses, the raised
    AssertionError also carries `.pictures` (named in its message, and shown under it in
    a notebook)."""
    reads = _Reads()
    recorded = _recording_reads(exercise, reads) if _can_record() else exercise
    report = run_exercise(recorded, fn, seed=seed)
    if report.passed and reads.outside:
        _fail_reads_outside(report, exercise, reads)
    if not report.passed:
        report.pictures = failure_pictures(exercise, fn, report)
        failure = AssertionError(report.message())
        failure.pictures = report.pictures
        if report.pictures:
            from course.access_picture import show_after_cell
            show_after_cell(report.pictures)
        raise failure
    if not quiet:
        report.show()
    return report


def _can_record() -> bool:
    return runtime.interpreted() and not runtime.grading()


@dataclass
class _Reads:
    """The recorded call: its case, and what it loaded outside its inputs (one line each)."""

    case: Case | None = None
    outside: list[str] = field(default_factory=list)


def _recording_reads(exercise: Exercise, reads: _Reads) -> Exercise:
    """`exercise` whose call records its first run of a case with N not a power of two
    (a block longer than the row) into `reads`."""
    case = next((c for c in exercise.cases if c.n > 1 and c.n & (c.n - 1)), None)

    def call(fn: Callable, views: dict, c: Case):
        if c != case or reads.case is not None:
            return exercise.call(fn, views, c)
        from course import accesses
        from course.access_diagnosis import outside_lines

        reads.case = c
        with accesses.record() as recording:
            out = exercise.call(fn, views, c)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        placed = recording.place(views, dict(zip(exercise.output_names, outs, strict=False)))
        inputs = {name: t for name, t in placed.items() if t.role == "input"}
        reads.outside = outside_lines(inputs, kinds=(accesses.LOAD,))
        return out

    return exercise if case is None else replace(exercise, call=call)


def _fail_reads_outside(report: Report, exercise: Exercise, reads: _Reads) -> None:
    """Fail the recorded case of a passing `report`: it loaded outside its inputs."""
    finding = Finding("input_read_outside", "; ".join(reads.outside))
    report.results = [replace(r, findings=(*r.findings, finding))
                      if r.case == reads.case else r for r in report.results]
    report.advice = advise(report.results, exercise.suspects, {**ADVICE, **exercise.advice})


def small_case(case: Case) -> Case:
    """The case at a size the picture can draw, failing the same way: N = 1 and short rows
    stay; longer rows keep whether N is a power of two and N's remainder modulo 16 (the
    masked lanes of a block of 16 or more), many rows their remainder modulo 16 (a last
    program with fewer rows), row padding up to 8 elements."""
    *lead, n = case.shape
    if n > 2 * SMALL:
        n = SMALL + n % SMALL
    rows = case.rows
    if rows > SMALL:
        lead = [SMALL + rows % SMALL]
    return replace(case, shape=(*lead, n), row_padding=min(case.row_padding, 8))


def failure_pictures(exercise: Exercise, fn: Callable, report: Report) -> list:
    """[your kernel's picture, a correct kernel's] for a failure about addresses whose
    smaller run shows the problem; [] otherwise."""
    if not runtime.interpreted() or runtime.grading():
        return []
    failed = address_failure(report.results, exercise.suspects)
    if failed is None or len(exercise.output_names) != 1:
        return []
    try:
        return _pictures(exercise, fn, failed.case, report.seed)
    except Exception:  # an aid only: whatever goes wrong here, the check's message stands
        return []


def _pictures(exercise: Exercise, fn: Callable, failed: Case, seed: int) -> list:
    from course.access_picture import run_and_picture

    case = small_case(failed)
    inputs = exercise.make_inputs(case, torch.Generator().manual_seed(seed))
    views = {name: g.tensor for name, g in inputs.items()}
    x = next(iter(views.values()))
    shape = " × ".join(map(str, x.shape))
    where = f"{shape} {str(x.dtype).replace('torch.', '')}"
    name = getattr(fn, "__name__", "your function")
    yours = run_and_picture(lambda: exercise.call(fn, views, case), (), {}, views,
                            title=f"Your {name} on {where} (the case '{failed.name}', "
                                  "smaller)", output_names=exercise.output_names)
    if not yours.wrong:
        return []  # at this size the accesses look right: no picture to explain the failure
    correct = run_and_picture(_copy_rows, (x,), {}, {next(iter(views)): x},
                              title="A correct kernel on the same input",
                              output_names=exercise.output_names)
    return [yours, correct]


@triton.jit
def _copy_rows_kernel(x_ptr, y_ptr, stride_x_row, stride_y_row, n_cols,
                      BLOCK_N: tl.constexpr):
    # Where a correct row-wise kernel reads and writes: one program per row, one masked
    # block covering it. (Nothing of the exercise's arithmetic: only the addresses.)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask)
    tl.store(y_ptr + row * stride_y_row + cols, x, mask=mask)


def _copy_rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, x.shape[-1])
    _copy_rows_kernel[(x2.shape[0],)](x2, y2, x2.stride(0), y2.stride(0), x2.shape[1],
                                      BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y
