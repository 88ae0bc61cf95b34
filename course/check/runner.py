"""Running an exercise's cases against a learner's function, one watched call per case."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from course import runtime
from course.check import sandbox
from course.check.cases import Case
from course.check.compare import Mismatch, compare
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
    outputs_from_triton: bool = True    # False: the interpreter's bf16 rounding is not theirs
    # Per output dtype, the row-scale tolerance where it differs from compare's default.
    row_scale_tolerances: Mapping[torch.dtype, float] = field(default_factory=dict)
    # Exercise-specific findings read from what the call did (the ops it ran, say).
    inspect: Callable[[sandbox.CallRecord, Case], list[Finding]] | None = None

    def output_dtypes(self, case: Case) -> tuple[torch.dtype, ...]:
        if self.dtypes is not None:
            return tuple(self.dtypes(case))
        return (case.dtype,) * len(self.output_names)

    def compare(self, name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                inputs: Tensors, case: Case) -> Mismatch | None:
        extra = self.extra_atol(name, inputs, case) if self.extra_atol is not None else None
        kwargs = {"dtype_reason": self.dtype_reasons[name]} if name in self.dtype_reasons else {}
        return compare(name, got, want, dtype, extra_atol=extra,
                       bf16_truncated=runtime.interpreted() and self.outputs_from_triton,
                       row_scale_tolerance=self.row_scale_tolerances.get(dtype), **kwargs)


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

    @property
    def passed(self) -> bool:
        return not (self.mismatches or self.findings or self.error)

    def finding(self, kind: str) -> Finding | None:
        return next((f for f in self.findings if f.kind == kind), None)


_FATAL_MARKERS = ("illegal memory access", "CUDA error", "device-side assert",
                  "unspecified launch failure", "misaligned address")


def _learner_frame(exc: BaseException) -> str:
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


def _normalise_outputs(out: object, n: int, signature: str) -> tuple[torch.Tensor, ...]:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != n:
        raise AssertionError(f"your function returned {len(outs)} value(s), expected {n}: "
                             f"{signature}")
    return tuple(outs)


def _launch_findings(record: sandbox.CallRecord, exercise: Exercise) -> list[Finding]:
    findings = []
    max_launches = exercise.max_launches
    if not record.launches and exercise.min_launches > 0:
        findings.append(Finding("no_launch", "returned a result without launching any Triton "
                                "kernel"))
    elif len(record.launches) > max_launches:
        allowed = (f"this exercise allows {max_launches}" if max_launches else
                   "this exercise is plain PyTorch, without Triton")
        findings.append(Finding(
            "extra_launches",
            f"launched {len(record.launches)} Triton kernels ({', '.join(record.launches)}); "
            f"{allowed}"))
    if record.atomic_kernels and not exercise.atomics_allowed:
        names = ", ".join(dict.fromkeys(record.atomic_kernels))
        findings.append(Finding("atomics", f"launched kernels that use atomics ({names})"))
    if record.forbidden_ops and not exercise.torch_ops_allowed:
        by_site: dict[str, list[str]] = {}
        for use in record.forbidden_ops:
            ops = by_site.setdefault(use.site, [])
            if use.op not in ops:
                ops.append(use.op)
        where = "; ".join(f"{', '.join(ops)} at {site}" for site, ops in by_site.items())
        findings.append(Finding("torch_ops", f"ran PyTorch compute ops: {where}"))
    return findings


def memory_findings(record: sandbox.CallRecord, inputs: Inputs) -> list[Finding]:
    """Writes into the inputs or around them, and outside the tensors the call allocated."""
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
    for alloc, before, after in record.margin_writes():
        where = " and ".join(w for w, k in (("before its start", before), ("after its end", after))
                             if k)
        findings.append(Finding("output_margin_written",
                                f"wrote {before + after} element(s) outside a tensor it allocated "
                                f"(shape {alloc.view_shape}), {where}"))
    return findings


def _provenance_findings(record: sandbox.CallRecord, names: tuple[str, ...],
                         outputs: tuple[torch.Tensor, ...]) -> list[Finding]:
    """An output the kernel never received was computed some other way (NumPy, say)."""
    if not record.launches:
        return []  # already reported as no launch at all
    return [Finding("output_not_from_kernel",
                    f"returned `{name}` in a tensor that was never passed to a Triton kernel")
            for name, out in zip(names, outputs, strict=True)
            if isinstance(out, torch.Tensor)
            and out.untyped_storage().data_ptr() not in record.launched_storages]


def run_case(exercise: Exercise, fn: Callable, case: Case, gen: torch.Generator) -> CaseResult:
    inputs = exercise.make_inputs(case, gen)
    views = {name: g.tensor for name, g in inputs.items()}
    originals = {name: v.clone() for name, v in views.items()}  # in case the call writes them
    runtime.synchronize()
    try:
        with sandbox.watch() as record:
            raw = exercise.call(fn, views, case)
        runtime.synchronize()  # asynchronous GPU faults surface here, inside the try
    except Exception as exc:  # the learner's code (its own asserts too) becomes a report line
        text, fatal = explain_error(exc)
        return CaseResult(case, error=text, fatal=fatal)
    outputs = _normalise_outputs(raw, len(exercise.output_names), exercise.signature)

    findings = _launch_findings(record, exercise) + memory_findings(record, inputs)
    if exercise.inspect is not None:
        findings += exercise.inspect(record, case)
    if not exercise.torch_ops_allowed:  # computing with torch is the plain-PyTorch exercise
        findings += _provenance_findings(record, exercise.output_names, outputs)

    expected = exercise.expected(originals, case)
    mismatches = []
    for name, got, want, dtype in zip(exercise.output_names, outputs, expected,
                                      exercise.output_dtypes(case), strict=True):
        m = exercise.compare(name, got, want, dtype, originals, case)
        if m is not None:
            mismatches.append(m)
    hints = suspect_hints(exercise, originals, case,
                          dict(zip(exercise.output_names, outputs, strict=True)),
                          {m.name for m in mismatches})
    return CaseResult(case, tuple(mismatches), tuple(findings), launches=tuple(record.launches),
                      copies=tuple(str(c) for c in record.copies), outputs=outputs, hints=hints)


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


def probe_caching(exercise: Exercise, fn: Callable, case: Case, seed: int) -> Finding | None:
    """Call twice with different inputs of one shape: the second answer must be the second
    input's, not the first's (a wrapper that memoises results by shape fails here)."""
    first = run_case(exercise, fn, case, torch.Generator().manual_seed(seed + 101))
    if first.error or not first.outputs:
        return None
    second = run_case(exercise, fn, case, torch.Generator().manual_seed(seed + 202))
    if second.error or not second.mismatches:
        return None  # an error here is reported by the main cases
    same_as_before = all(isinstance(o, torch.Tensor) and isinstance(p, torch.Tensor)
                         and compare(n, o, p.to(torch.float64), d) is None
                         for n, o, p, d in zip(exercise.output_names, second.outputs,
                                               first.outputs, exercise.output_dtypes(case),
                                               strict=True))
    if same_as_before:
        return Finding("cached", "returned the result of an earlier call when called again "
                       "with new inputs of the same shape")
    return None


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 1_000_000
