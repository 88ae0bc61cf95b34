"""Running an exercise's cases against a learner's function, one watched call per case."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from course import runtime
from course.check import sandbox
from course.check.cases import Case
from course.check.compare import DEFAULT_DTYPE_REASON, Mismatch, compare, layout_problem
from course.check.inputs import GuardedInput

import torch

Inputs = dict[str, GuardedInput]
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Suspect:
    """A wrong answer learners often produce. When an output that fails matches it on most of
    the cases where that output fails, the advice names the bug instead of the numbers.

    Give either `expected` (the wrong answer in float64, compared with the usual tolerance;
    None where it does not apply) or `matches` (returns a detail for the message when `got`
    is that wrong answer, None otherwise).
    """

    name: str
    output: str
    advice: str
    expected: Callable[[Tensors, Case], torch.Tensor | None] | None = None
    matches: Callable[[Tensors, Case, torch.Tensor], str | None] | None = None
    # A condition on the results of every case that must hold too (the pattern across
    # cases: "M = 1 passes", "some cases right"), for wrong answers one case cannot tell
    # apart from another suspect's.
    across: Callable[[Sequence[CaseResult]], bool] | None = None


@dataclass(frozen=True)
class Exercise:
    """What a checker needs to know about one exercise."""

    name: str
    signature: str                      # shown in messages: how the checker calls you
    cases: tuple[Case, ...]
    make_inputs: Callable[[Case, torch.Generator], Inputs]
    call: Callable[[Callable, Tensors, Case], object]
    expected: Callable[[Tensors, Case], tuple[torch.Tensor, ...]]  # float64
    output_names: tuple[str, ...]
    max_launches: int = 1
    min_launches: int = 1               # 0: plain PyTorch, no kernel needed
    torch_ops_allowed: bool = False     # True for the plain-PyTorch exercise
    atomics_allowed: bool = True
    # Output dtypes for a case (default: every output in the input's dtype).
    dtypes: Callable[[Case], tuple[torch.dtype, ...]] | None = None
    # Absolute error a correct float32 computation may add to an output beyond rounding it
    # once (see compare): (output name, inputs, case) -> number, tensor or None.
    extra_atol: Callable[[str, Tensors, Case], float | torch.Tensor | None] | None = None
    suspects: tuple[Suspect, ...] = ()
    # Advice that replaces the generic text for a finding kind ("extra_launches"), a finding
    # about one input ("input_written:dy") or a value pattern ("half", "mean", ...).
    advice: Mapping[str, str] = field(default_factory=dict)
    dtype_reasons: Mapping[str, str] = field(default_factory=dict)  # output name -> why
    # How to fix an output's wrong dtype; None: in the kernel's store (see layout_problem).
    dtype_fix: str | None = None
    outputs_from_triton: bool = True    # False: the interpreter's bf16 rounding is not theirs
    # Per output dtype, the row-scale tolerance where it differs from compare's default.
    row_scale_tolerances: Mapping[torch.dtype, float] = field(default_factory=dict)
    # Exercise-specific findings read from what the call did (the ops it ran, say).
    inspect: Callable[[sandbox.CallRecord, Case], list[Finding]] | None = None
    # The outputs this check grades, when it grades only some of what the function returns
    # (chapter 07 grades dx and dw in separate cells): the others are neither compared nor
    # traced to a kernel. None: all of them.
    graded: tuple[str, ...] | None = None

    def is_graded(self, name: str) -> bool:
        return self.graded is None or name in self.graded

    def output_dtypes(self, case: Case) -> tuple[torch.dtype, ...]:
        if self.dtypes is not None:
            return tuple(self.dtypes(case))
        return (case.dtype,) * len(self.output_names)

    def layout_problem(self, name: str, got: object, want: torch.Tensor,
                       dtype: torch.dtype) -> str | None:
        """What keeps `got` from being compared (a wrong type, shape, dtype or device)."""
        return layout_problem(name, got, want, dtype,
                              self.dtype_reasons.get(name, DEFAULT_DTYPE_REASON), self.dtype_fix)

    def compare(self, name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                inputs: Tensors, case: Case) -> Mismatch | None:
        extra = self.extra_atol(name, inputs, case) if self.extra_atol is not None else None
        kwargs = {"dtype_reason": self.dtype_reasons[name]} if name in self.dtype_reasons else {}
        return compare(name, got, want, dtype, extra_atol=extra,
                       bf16_truncated=runtime.interpreted() and self.outputs_from_triton,
                       row_scale_tolerance=self.row_scale_tolerances.get(dtype),
                       dtype_fix=self.dtype_fix, **kwargs)


@dataclass(frozen=True)
class Finding:
    kind: str       # no_launch, extra_launches, torch_ops, input_written, ...
    message: str
    subject: str = ""  # the input a finding is about, if any (advice may be specific to it)


@dataclass
class CaseResult:
    case: Case
    mismatches: tuple[Mismatch, ...] = ()
    findings: tuple[Finding, ...] = ()
    error: str | None = None
    fatal: bool = False
    launches: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    outputs: tuple[torch.Tensor, ...] = field(default=(), repr=False)
    hints: tuple[tuple[str, str], ...] = ()  # (suspect name, detail) for matched suspects
    warnings: tuple[str, ...] = ()  # Python warnings raised during the call
    expected: tuple[torch.Tensor, ...] = field(default=(), repr=False)  # float64 answers
    # The inputs the call was given, kept alive: the same-buffer probe refills them in
    # place, and while they live no later input can take their memory (their address).
    inputs: Inputs = field(default_factory=dict, repr=False, compare=False)
    # It launched nothing and returned memory that existed before the call (see kept_result).
    kept: bool = False

    @property
    def passed(self) -> bool:
        return not (self.mismatches or self.findings or self.error)

    def finding(self, kind: str) -> Finding | None:
        return next((f for f in self.findings if f.kind == kind), None)


_FATAL_MARKERS = ("illegal memory access", "CUDA error", "device-side assert",
                  "unspecified launch failure", "misaligned address")


def _learner_frame(exc: BaseException) -> str:
    remote = getattr(exc, "learner_frame", None)  # raised in the learner's own process
    if remote is not None:
        return remote
    here = Path(__file__).resolve().parent.parent
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = frame.filename
        if "/torch/" in path or "/triton/" in path or here in Path(path).resolve().parents:
            continue
        return f" (at {Path(path).name}, line {frame.lineno}: {(frame.line or '').strip()})"
    return ""


def explain_error(exc: BaseException) -> tuple[str, bool]:
    """The learner's exception as a report line (with the line of their code that raised
    it), and whether it left the GPU unusable."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 600:
        text = text[:600] + " ..."
    fatal = runtime.on_gpu() and any(m in text for m in _FATAL_MARKERS)
    if fatal:
        text += ("\nThe GPU reported a memory fault. The CUDA context is now unusable: fix the "
                 "kernel (usually a missing mask or a wrong offset), then restart the notebook's "
                 "kernel (Kernel > Restart) before running anything else on the GPU.")
    return text + _learner_frame(exc), fatal


def _output_count_problem(out: object, n: int, signature: str) -> str | None:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) == n:
        return None
    return f"your function returned {len(outs)} value(s), expected {n}: {signature}"


def _as_outputs(out: object) -> tuple[object, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# Advice for the findings this module makes that course.check.diagnose has no text for;
# an exercise's own advice still takes precedence (see suite.run_exercise).
ADVICE = {
    "course_kernel": (
        "Your function launched one of the course's own kernels (from solutions/ or course/). "
        "The exercise asks you to write the kernel: define it with @triton.jit in your "
        "notebook and launch that one."),
    "launch_argument": (
        "Your function passed a launch a value that only passes for a number or a tensor (a "
        "subclass, or an object with data_ptr). Pass plain Python numbers and tensors."),
    "kernel_object": (
        "Your function launched a kernel object after giving it attributes of its own in "
        "place of its class's methods (such as `run`), so the launch does not go through "
        "Triton's launch step. Launch the @triton.jit kernel as it is."),
    "output_unchanged": (
        "The tensor you return reached your kernel already holding its final values: no "
        "launch changed it. Its values were computed some other way (NumPy, another thread, "
        "PyTorch with interception switched off) and the kernel only received it. Allocate "
        "the output with torch.empty_like(x), let your kernel compute and store every "
        "element, and return that tensor."),
    "output_layout": (
        "What your function returns has the wrong form (type, shape, dtype or device), so its "
        "values could not be compared."),
    "output_count": (
        "Your function returns the wrong number of values: return exactly what the "
        "exercise's signature says, in that order."),
    "work_outside_kernels": (
        "The check repeats your function's GPU work, the allocations, fills, copies and "
        "kernel launches and none of its Python, on new inputs, and that gave a wrong answer. "
        "Whatever computed the answer (Python on the values, something kept from an earlier "
        "call) was not the kernels. Compute every output inside your kernel from the inputs "
        "it is passed; the wrapper only allocates, takes views and launches."),
    "not_repeatable": (
        "The check repeats your function's GPU work without its Python, and that work "
        "could not be repeated. A wrapper may allocate (torch.empty), fill with a number, "
        "copy tensors, take views and launch @triton.jit kernels that read only Triton, "
        "constants and other kernels. Anything else belongs inside the kernel."),
    "state_between_calls": (
        "Wrong when called again: state carried between calls (a cached workspace not "
        "cleared, an output buffer reused). Each call must start from nothing the previous "
        "call left behind: allocate the outputs afresh every call, and zero (or fully "
        "overwrite) any workspace you keep between calls before accumulating into it."),
}


def _launch_findings(record: sandbox.CallRecord, exercise: Exercise) -> list[Finding]:
    return rule_findings(record, max_launches=exercise.max_launches,
                         min_launches=exercise.min_launches,
                         torch_ops_allowed=exercise.torch_ops_allowed,
                         atomics_allowed=exercise.atomics_allowed)


def rule_findings(record: sandbox.CallRecord, *, max_launches: int, min_launches: int = 1,
                  torch_ops_allowed: bool = False, atomics_allowed: bool = True
                  ) -> list[Finding]:
    """What a watched call did that an exercise's rules forbid: too few or too many
    launches, atomics, PyTorch compute ops."""
    findings = []
    if not record.launches and min_launches > 0:
        findings.append(Finding("no_launch", "returned a result without launching any Triton "
                                "kernel"))
    elif len(record.launches) > max_launches:
        allowed = (f"this exercise allows {max_launches}" if max_launches else
                   "this exercise is plain PyTorch, without Triton")
        findings.append(Finding(
            "extra_launches",
            f"launched {len(record.launches)} Triton kernels ({', '.join(record.launches)}); "
            f"{allowed}"))
    if record.atomic_kernels and not atomics_allowed:
        names = ", ".join(dict.fromkeys(record.atomic_kernels))
        findings.append(Finding("atomics", f"launched kernels that use atomics ({names})"))
    if record.forbidden_ops and not torch_ops_allowed:
        by_site: dict[str, list[str]] = {}
        for use in record.forbidden_ops:
            ops = by_site.setdefault(use.site, [])
            if use.op not in ops:
                ops.append(use.op)
        where = "; ".join(f"{', '.join(ops)} at {site}" for site, ops in by_site.items())
        findings.append(Finding("torch_ops", f"ran PyTorch compute ops: {where}"))
    return findings


def memory_findings(record: sandbox.CallRecord, inputs: Inputs, *, rows: int | None = None
                    ) -> list[Finding]:
    """Writes into the inputs or around them, outside the tensors the call allocated, and
    (in the interpreter) loads and stores far from every tensor a launch was given."""
    findings = []
    for name, g in inputs.items():
        inside, outside = g.writes()
        if inside:
            findings.append(Finding("input_written",
                                    f"changed {inside} element(s) of the input `{name}`", name))
        if outside:
            findings.append(Finding("input_guard_written",
                                    f"wrote {outside} element(s) into memory around the input "
                                    f"`{name}` (past a row's end or into the row padding)"))
    for outside in record.outside:
        findings.append(Finding("outside_every_tensor", outside.describe(rows)))
    for alloc, before, after in record.margin_writes():
        where = " and ".join(w for w, k in (("before its start", before), ("after its end", after))
                             if k)
        findings.append(Finding("output_margin_written",
                                f"wrote {before + after} element(s) outside a tensor it allocated "
                                f"(shape {alloc.view_shape}), {where}"))
    return findings


def provenance_findings(record: sandbox.CallRecord, names: tuple[str, ...],
                        outputs: tuple[object, ...], *, who: str = "") -> list[Finding]:
    """An output no launch produced was computed some other way (NumPy, say): either no
    kernel ever received it, or the kernels that did left it as it was. `who` starts the
    messages ("backward "), for a call made of several phases."""
    if not record.launches:
        return []  # already reported as no launch at all
    findings = []
    for name, out in zip(names, outputs, strict=True):
        if not isinstance(out, torch.Tensor):
            continue
        if not record.passed_to_launch(out):
            findings.append(Finding(
                "output_not_from_kernel",
                f"{who}returned `{name}` in a tensor that was never passed to a Triton kernel"))
        elif not record.changed_by_launch(out) and not sandbox.is_poison(out):
            # All poison is a kernel that stores nothing: the values' advice says so.
            findings.append(Finding(
                "output_unchanged",
                f"{who}returned `{name}` holding values it already had when your kernels "
                "received it: no launch changed a single element"))
    return findings


def refused_launch_findings(record: sandbox.CallRecord) -> list[Finding]:
    """The launches the watch refused: a course kernel, arguments that only pass for
    numbers or tensors, or a kernel object with methods of its own."""
    return [Finding("course_kernel", text) for text in dict.fromkeys(record.course_kernels)
            ] + [Finding("launch_argument", text)
                 for text in dict.fromkeys(record.refused_arguments)
                 ] + [Finding("kernel_object", text)
                      for text in dict.fromkeys(record.refused_kernels)]


def run_case(exercise: Exercise, fn: Callable, case: Case, gen: torch.Generator | None = None,
             *, inputs: Inputs | None = None) -> CaseResult:
    """One watched call on new inputs made from `gen`, or on `inputs` as they are now (the
    same-buffer probe passes inputs it refilled in place)."""
    if inputs is None:
        inputs = exercise.make_inputs(case, gen)
    views = {name: g.tensor for name, g in inputs.items()}
    originals = {name: v.clone() for name, v in views.items()}  # in case the call writes them
    runtime.synchronize()
    record = None
    try:
        with sandbox.watch() as record:
            record.note_arguments(views)
            raw = exercise.call(fn, views, case)
        runtime.synchronize()  # asynchronous GPU faults surface here, inside the try
    except Exception as exc:  # the learner's code (its own asserts too) becomes a report line
        warned = tuple(record.warnings) if record is not None else ()
        if record is not None and (record.course_kernels or record.refused_arguments
                                   or record.refused_kernels):
            return CaseResult(case, findings=tuple(refused_launch_findings(record)),
                              warnings=warned)
        if record is not None and record.outside:  # the interpreter's fence stopped a launch
            return CaseResult(case, findings=tuple(memory_findings(record, inputs,
                                                                   rows=case.rows)),
                              launches=tuple(record.launches), warnings=warned)
        text, fatal = explain_error(exc)
        return CaseResult(case, error=text, fatal=fatal, warnings=warned)
    warned = tuple(record.warnings)
    count_problem = _output_count_problem(raw, len(exercise.output_names), exercise.signature)
    if count_problem is not None:
        return CaseResult(case, findings=(Finding("output_count", count_problem),),
                          launches=tuple(record.launches), warnings=warned)
    outputs = _as_outputs(raw)

    findings = refused_launch_findings(record)
    findings += _launch_findings(record, exercise) + memory_findings(record, inputs,
                                                                     rows=case.rows)
    if exercise.inspect is not None:
        findings += exercise.inspect(record, case)
    if not exercise.torch_ops_allowed:  # computing with torch is the plain-PyTorch exercise
        graded = [(n, o) for n, o in zip(exercise.output_names, outputs, strict=True)
                  if exercise.is_graded(n)]
        findings += provenance_findings(record, tuple(n for n, _ in graded),
                                        tuple(o for _, o in graded))

    expected = exercise.expected(originals, case)
    mismatches = []
    comparable = {}
    for name, got, want, dtype in zip(exercise.output_names, outputs, expected,
                                      exercise.output_dtypes(case), strict=True):
        if not exercise.is_graded(name):
            continue
        problem = exercise.layout_problem(name, got, want, dtype)
        if problem is not None:
            findings.append(Finding("output_layout", problem, name))
            continue
        comparable[name] = got
        m = exercise.compare(name, got, want, dtype, originals, case)
        if m is not None:
            mismatches.append(m)
    hints = suspect_hints(exercise, originals, case, comparable, {m.name for m in mismatches})
    kept = not record.launches and any(isinstance(o, torch.Tensor) and record.held_before(o)
                                       for o in outputs)
    return CaseResult(case, tuple(mismatches), tuple(findings), launches=tuple(record.launches),
                      copies=tuple(str(c) for c in record.copies), outputs=outputs, hints=hints,
                      warnings=warned, expected=tuple(expected), inputs=inputs, kept=kept)


def kept_result(result: CaseResult) -> CaseResult:
    """`result`, a call that launched nothing and returned memory from before the call, as
    the result kept from an earlier call that it is (for a function that launched its
    kernels on other calls). Its values are the old call's, so their pattern says nothing
    about the kernel: only the finding stays."""
    wrong = ", ".join(f"{m.n_bad} of {m.n_rows * m.n_cols} elements of `{m.name}` wrong"
                      for m in result.mismatches)
    values = f" ({wrong})" if wrong else ""
    return CaseResult(result.case, findings=(Finding(
        "kept_result", "launched no kernel and returned a tensor that existed before the "
        f"call{values}, where it launched kernels on the other calls"),),
        warnings=result.warnings, inputs=result.inputs)


def suspect_hints(exercise: Exercise, inputs: Tensors, case: Case,
                  outputs: dict[str, torch.Tensor], wrong: set[str]
                  ) -> tuple[tuple[str, str], ...]:
    """(name, detail) of every suspect that a wrong output matches."""
    hints = []
    for suspect in exercise.suspects:
        got = outputs.get(suspect.output)
        if suspect.output not in wrong or not isinstance(got, torch.Tensor):
            continue
        if suspect.matches is not None:
            detail = suspect.matches(inputs, case, got)
        else:
            want = suspect.expected(inputs, case)
            same = (want is not None and want.shape == got.shape and exercise.compare(
                suspect.output, got, want, got.dtype, inputs, case) is None)
            detail = "" if same else None
        if detail is not None:
            hints.append((suspect.name, detail))
    return tuple(hints)


def _same_values(a: object, b: object) -> bool:
    """The same values exactly, NaN equal to NaN (poison the call left alone stays equal)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())
    return torch.equal(a, b)


def _answers(exercise: Exercise, result: CaseResult, earlier: CaseResult) -> bool:
    """Whether `result`'s outputs are the answers to `earlier`'s inputs (a memoised result)."""
    n = len(exercise.output_names)
    if len(earlier.expected) != n or len(result.outputs) != n:
        return False
    for name, got, want, dtype in zip(exercise.output_names, result.outputs, earlier.expected,
                                      exercise.output_dtypes(result.case), strict=True):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return False
        if compare(name, got, want, dtype) is not None:
            return False
    return True


def _kept(result: CaseResult) -> tuple[object, ...]:
    """Copies of what a call returned, to tell later whether another call changed it."""
    return tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o
                 for o in result.outputs)


def _overwritten(exercise: Exercise, kept: tuple[object, ...], result: CaseResult) -> list[str]:
    """The outputs of `result` that no longer hold the values `kept` copied."""
    return [name for name, before, now in zip(exercise.output_names, kept, result.outputs,
                                              strict=False)
            if not _same_values(before, now)]


def refill_inputs(exercise: Exercise, inputs: Inputs, case: Case,
                  gen: torch.Generator) -> None:
    """Give every tensor of `inputs` new values in place: the same tensor objects, storage
    and addresses. The values come from the exercise's own `make_inputs`, so inputs derived
    from others agree as on a fresh call (the backward exercise's rstd is that of the new
    x); margins and row padding keep the guard value (`GuardedInput.refill`)."""
    fresh = exercise.make_inputs(case, gen)
    if set(fresh) != set(inputs):
        raise ValueError(f"{exercise.name}: make_inputs gave {sorted(fresh)}, the call had "
                         f"{sorted(inputs)}")
    for name, g in inputs.items():
        g.refill(fresh[name])


def probe_caching(exercise: Exercise, fn: Callable, passed: CaseResult,
                  seed: int) -> tuple[Finding, ...]:
    """Call three more times at the shape of a case that passed: twice with new inputs,
    then with the second call's own input tensors refilled in place with new values. Every
    answer must be right, and no call may change what an earlier one returned. A wrapper
    that memoises results by shape, keeps a workspace it does not clear, or hands back one
    output buffer per shape fails on the new inputs; one that memoises by the input's
    address (x.data_ptr(): real models refill the same buffers every step, static caches
    and CUDA graphs) fails on the refilled ones.

    Every input stays alive until the probe ends (`passed`'s too, in the CaseResult), so no
    new input can take an earlier one's memory: new inputs are at new addresses, refilled
    ones at the same."""
    case = passed.case
    first = run_case(exercise, fn, case, torch.Generator().manual_seed(seed + 101))
    kept = _kept(first)
    second = run_case(exercise, fn, case, torch.Generator().manual_seed(seed + 202))
    for when, result, earlier in (("again", first, passed), ("a third time", second, first)):
        again = f"called {when} with new inputs of the same shape as {case.label()}"
        if result.error:
            return (Finding("state_between_calls", f"{again}, which passed, it raised "
                            f"{result.error.splitlines()[0]}"),)
        if result.mismatches and _answers(exercise, result, earlier):
            return (Finding("cached", "returned the result of an earlier call when called "
                            "again with new inputs of the same shape"),)
        if result.mismatches:
            wrong = ", ".join(m.name for m in result.mismatches)
            return (Finding("state_between_calls", f"{again}, which passed, it returned a "
                            f"wrong {wrong}:\n{result.mismatches[0].describe()}"),)
    overwritten = _overwritten(exercise, kept, first)
    if overwritten:
        return (Finding(
            "state_between_calls",
            f"called twice with new inputs of the same shape as {case.label()}, the second "
            f"call changed the {', '.join(f'`{n}`' for n in overwritten)} that the first "
            "call had returned: both calls return the same memory"),)
    return probe_same_buffers(exercise, fn, second, seed + 303)


def _old_answers(exercise: Exercise, result: CaseResult, earlier: CaseResult,
                 kept: tuple[object, ...]) -> list[str]:
    """The outputs `result` got wrong that are what `earlier` returned (`kept`: copies) or
    its answer within tolerance: results kept from the call before."""
    by_name = dict(zip(exercise.output_names, zip(result.outputs, kept, earlier.expected,
                                                   exercise.output_dtypes(result.case),
                                                   strict=False), strict=False))
    old = []
    for m in result.mismatches:
        got, before, want, dtype = by_name.get(m.name, (None,) * 4)
        if not isinstance(got, torch.Tensor):
            continue
        if _same_values(got, before) or (got.shape == want.shape
                                         and compare(m.name, got, want, dtype) is None):
            old.append(m.name)
    return old


def cached_finding(same: str, old: list[str], wrong: list[str]) -> Finding:
    """The finding for a call on refilled inputs that returned, for the outputs `old`, the
    answer for the inputs' old values (`wrong`: every output it got wrong)."""
    others = [n for n in wrong if n not in old]
    also = f"; {', '.join(f'`{n}`' for n in others)} wrong too" if others else ""
    return Finding("cached_by_address", f"{same}, it returned the answer for their old "
                   f"values ({' and '.join(f'`{n}`' for n in old)}{also})")


def probe_same_buffers(exercise: Exercise, fn: Callable, earlier: CaseResult,
                       seed: int) -> tuple[Finding, ...]:
    """Refill the input tensors of `earlier` (a call that returned the right answer) in
    place with new values and pass those very tensor objects again: the answer must be the
    one for the new values, and what `earlier` returned must stay as it was."""
    case = earlier.case
    if not earlier.inputs:  # no answer to compare with (a call that returned too few values)
        return ()
    kept = _kept(earlier)
    refill_inputs(exercise, earlier.inputs, case, torch.Generator().manual_seed(seed))
    again = run_case(exercise, fn, case, inputs=earlier.inputs)
    same = "called again with the same input tensors (the same memory) refilled with new values"
    if again.error:
        return (Finding("state_between_calls", f"{same}, it raised "
                        f"{again.error.splitlines()[0]}"),)
    old = _old_answers(exercise, again, earlier, kept)
    if old:
        return (cached_finding(same, old, [m.name for m in again.mismatches]),)
    if again.mismatches:
        wrong = ", ".join(m.name for m in again.mismatches)
        return (Finding("stale_by_address", f"{same}, it returned a wrong {wrong}:\n"
                        f"{again.mismatches[0].describe()}"),)
    overwritten = _overwritten(exercise, kept, earlier)
    if overwritten:
        return (Finding(
            "state_between_calls",
            f"{same}, the call changed the {', '.join(f'`{n}`' for n in overwritten)} that "
            "the call before had returned: both calls return the same memory"),)
    return ()


def _arguments(exercise: Exercise, inputs: Inputs, case: Case) -> tuple[tuple, dict]:
    """The arguments `exercise.call` passes the function for `inputs`: (args, kwargs)."""
    passed: list[tuple[tuple, dict]] = []
    exercise.call(lambda *args, **kwargs: passed.append((args, kwargs)),
                  {name: g.tensor for name, g in inputs.items()}, case)
    return passed[0]


def probe_repeat(exercise: Exercise, fn: Callable, passed: CaseResult,
                 seed: int) -> tuple[Finding, ...]:
    """Call `fn` at the shape of a case that passed, then repeat its GPU work (its
    allocations, fills, copies and launches, none of its Python) on other inputs of that
    shape. The repeat must return the answer for those inputs. An answer the wrapper
    computed without a PyTorch op the watch refuses (Python on `x.tolist()`: a copy to the
    CPU, then no op at all), which a kernel only copied, is not there in the repeat."""
    from course.verify.replay import repeated

    if exercise.torch_ops_allowed:
        return ()
    case = passed.case
    first = exercise.make_inputs(case, torch.Generator().manual_seed(seed + 404))
    other = exercise.make_inputs(case, torch.Generator().manual_seed(seed + 505))
    args, kwargs = _arguments(exercise, first, case)
    again, _ = _arguments(exercise, other, case)
    originals = {name: g.tensor.clone() for name, g in other.items()}
    expected = exercise.expected(originals, case)
    def here(args: tuple, kwargs: dict, again: tuple) -> object:
        return repeated(fn, args, kwargs, again)

    # The learner's function in its own process (course.verify) repeats itself there.
    repeat = getattr(fn, "repeated", here)
    got, failed = repeat_or_finding(lambda: repeat(args, kwargs, again), "your function's")
    if failed is not None:
        return (failed,)
    outputs = _as_outputs(got)
    wrong = []
    for name, out, want, dtype in zip(exercise.output_names, outputs, expected,
                                      exercise.output_dtypes(case), strict=False):
        if exercise.is_graded(name) and (
                exercise.layout_problem(name, out, want, dtype) is not None
                or exercise.compare(name, out, want, dtype, originals, case) is not None):
            wrong.append(name)
    if len(outputs) != len(exercise.output_names) or wrong:
        names = ", ".join(f"`{n}`" for n in wrong) or "outputs"
        return (outside_kernels("your kernels'", names, "the answer your function returned"),)
    return ()


REPEATED_ON = "repeated on new inputs of the same shape"


def repeat_or_finding(repeat: Callable[[], object], whose: str
                      ) -> tuple[object, Finding | None]:
    """What `repeat()` (a probe's repeat of the learner's GPU work) returned, or the
    finding that says why it could not be done."""
    from course.verify.replay import NotReplayable

    try:
        return repeat(), None
    except NotReplayable as why:
        return None, Finding("not_repeatable", f"{whose} work could not be {REPEATED_ON}, "
                             f"apart from your Python: {why}")
    except Exception as exc:  # the learner's code, called again
        return None, Finding("not_repeatable", f"{whose} work, {REPEATED_ON}, raised "
                             f"{explain_error(exc)[0].splitlines()[0]}")


def outside_kernels(whose: str, names: str, what: str) -> Finding:
    """The finding for a repeat that gave wrong `names`."""
    return Finding("work_outside_kernels", f"{whose} work, {REPEATED_ON} (the same "
                   f"allocations, fills, copies and launches, without your Python), gave "
                   f"wrong {names}: {what} did not come from its kernels' work on the inputs")


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 1_000_000
