"""Checker for chapter 07's second exercise: RMSNorm as a `torch.autograd.Function`.

The learner writes `class RMSNormFunction(torch.autograd.Function)` whose forward runs
their forward kernel (saving rstd) and whose backward runs their backward kernels;
`RMSNormFunction.apply(x, weight, eps)` returns y. The checker runs y.backward(dy) and
compares y, x.grad and weight.grad with the float64 reference, for inputs that all require
grad and for inputs of which only one does.

backward must return one value per input of forward: (dx, dw, None), None for eps. PyTorch
raises for too few, but accepts extra trailing Nones without a word, so the checker counts
what backward returns itself, through a subclass that wraps it.

Last, if the learner's kernels compute in float64 when given float64, a
`torch.autograd.gradcheck` on a tiny case compares backward with finite differences of
forward. Kernels that compute in float32 whatever they are given cannot pass it (a
finite-difference step of 1e-6 is below float32's resolution); for those it is skipped,
and the report says so.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from course import reference, runtime
from course.check import sandbox
from course.check.backward import RMSNORM_BACKWARD, dw_sum_atol, dw_terms
from course.check.cases import Case
from course.check.compare import TOLERANCES, compare
from course.check.diagnose import advise
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import (
    ADVICE,
    CaseResult,
    Finding,
    Inputs,
    Tensors,
    cached_finding,
    explain_error,
    fresh_seed,
    memory_findings,
    outside_kernels,
    provenance_findings,
    refused_launch_findings,
    repeat_or_finding,
    suspect_hints,
)
from course.check.suite import warning_notes

import torch

f32, f16, F64 = torch.float32, torch.float16, torch.float64
EPS = 1e-6


@dataclass(frozen=True)
class _GradCase:
    case: Case
    x_requires_grad: bool = True
    weight_requires_grad: bool = True
    dy_strides_zero: bool = False   # dy one value broadcast, as the gradient of y.sum()


_CASES = (
    _GradCase(Case("x and weight require grad", (16, 64), f32, frozenset({"pow2"}))),
    _GradCase(Case("odd N, float16", (5, 100), f16, frozenset({"odd_n", "half"}))),
    _GradCase(Case("3-D input, strided rows", (2, 3, 32), f32, frozenset({"nd", "strided"}),
                   row_padding=8)),
    # eps outweighs the rows' mean square: a Function that drops the eps it is given (calls
    # rmsnorm_forward(x, weight) with its default) fails here only.
    _GradCase(Case("custom eps", (4, 64), f32, frozenset({"eps", "pow2"}), scale=0.05,
                   eps=0.01)),
    # The gradient of y.sum() reaches backward with strides 0: kernels that assume stride 1
    # along a row need dy.contiguous() first.
    _GradCase(Case("dy with strides 0, as y.sum() gives", (4, 64), f32, frozenset({"pow2"})),
              dy_strides_zero=True),
    _GradCase(Case("only x requires grad", (4, 64), f32, frozenset({"pow2"})),
              weight_requires_grad=False),
    _GradCase(Case("only weight requires grad", (4, 64), f32, frozenset({"pow2"})),
              x_requires_grad=False),
)

_GRADCHECK_CASE = Case("gradcheck, float64", (3, 8), F64)

_ADVICE = {
    "grad_count": (
        "backward must return exactly one value per input of forward: forward takes x, "
        "weight and eps, so `return dx, dw, None` (None for eps, which is not a tensor). "
        "PyTorch raises for too few values and silently drops extra Nones, which hides the "
        "mismatch instead of fixing it."),
    "grad_for_eps": (
        "backward returned a gradient for eps: eps is a float, not a tensor, so its gradient "
        "must be None: `return dx, dw, None`."),
    "no_forward_launch": (
        "Your Function's forward launched no Triton kernel: call your forward kernel (the "
        "one that also saves rstd) inside forward."),
    "no_backward_launch": (
        "Your Function's backward launched no Triton kernel: call your backward kernels "
        "inside backward, with the rstd that forward saved (ctx.save_for_backward)."),
    "not_differentiable": (
        "y does not require grad although an input does: return the output of forward as it "
        "is (no .detach(), no torch.no_grad()), and call the Function through .apply."),
    "missing_grad": (
        "backward returned None for an input that requires grad. Return dx when "
        "ctx.needs_input_grad[0] is true and dw when ctx.needs_input_grad[1] is (or always "
        "return both)."),
    "torch_ops": (
        "Your Function computes with PyTorch in forward or backward. The arithmetic belongs "
        "in your kernels: forward calls the forward kernel (which also writes rstd), "
        "backward calls the backward kernels; around them, only allocations, views and "
        "ctx.save_for_backward."),
    # Writes into an input are told apart by the input, as in the backward exercise.
    "input_written:dy": RMSNORM_BACKWARD.advice["input_written:dy"],
    "input_written:rstd": RMSNORM_BACKWARD.advice["input_written:rstd"],
    "eps": (
        "Only the case with eps = 0.01 fails: the eps given to apply(x, weight, eps) does not "
        "reach your forward kernel. Pass it on, rmsnorm_forward(x, weight, eps): a default "
        "or a constant there ignores what the caller asked for."),
    "gradcheck": (
        "torch.autograd.gradcheck failed in float64: the gradients from your backward differ "
        "from finite differences of your forward."),
}

_GRAD_COUNT = re.compile(r"incorrect number of gradients \(expected (\d+), got (\d+)\)")


def _probe_class(function_class: type) -> tuple[type, list[tuple]]:
    """A subclass of the learner's Function that records what backward returns (as a
    tuple): how many values, and the tensors themselves, before autograd copies them into
    .grad. Subclassing keeps their forward (or setup_context) as it is."""
    returned: list[tuple] = []
    original = function_class.backward

    def backward(ctx, *grads):
        out = original(ctx, *grads)
        returned.append(out if isinstance(out, tuple) else (out,))
        return out

    probe = type(f"Checked{function_class.__name__}", (function_class,),
                 {"backward": staticmethod(backward)})
    return probe, returned


def _grad_count_finding(count: int) -> Finding:
    if count > 3:
        what = (f"returned {count} values for 3 inputs (x, weight, eps); the {count - 3} "
                "extra one(s) are None, so PyTorch dropped them without a word")
    else:
        what = f"returned {count} value(s) for 3 inputs (x, weight, eps)"
    return Finding("grad_count", f"backward {what}")


def _launch_and_op_findings(record: sandbox.CallRecord, phase: str) -> list[Finding]:
    findings = []
    if not record.launches:
        findings.append(Finding(f"no_{phase}_launch", f"{phase} launched no Triton kernel"))
    if record.forbidden_ops:
        by_site: dict[str, list[str]] = {}
        for use in record.forbidden_ops:
            by_site.setdefault(use.site, [])
            if use.op not in by_site[use.site]:
                by_site[use.site].append(use.op)
        sites = [f"{', '.join(ops)} at {site}" for site, ops in by_site.items()]
        more = f"; and {len(sites) - 3} more lines" if len(sites) > 3 else ""
        findings.append(Finding("torch_ops", f"{phase} ran PyTorch compute ops: "
                                + "; ".join(sites[:3]) + more))
    return findings


def _make_inputs(case: Case, gen: torch.Generator) -> Inputs:
    return {"x": case.make_input(gen), "weight": case.make_vector(gen),
            "dy": case.make_like_input(gen)}


def _run_case(function_class: type, spec: _GradCase, gen: torch.Generator | None = None, *,
              inputs: Inputs | None = None,
              named: dict[str, torch.Tensor] | None = None) -> CaseResult:
    """One case, with the warnings forward and backward raised (collected, not printed):
    on new inputs made from `gen`, or on `inputs` as they are now. `named`, if given,
    receives y, dx and dw as the call returned them."""
    watched: list[sandbox.CallRecord] = []
    inputs = _make_inputs(spec.case, gen) if inputs is None else inputs
    result = _checked_case(function_class, spec, inputs, watched,
                           {} if named is None else named)
    warned = tuple(dict.fromkeys(w for record in watched for w in record.warnings))
    return dataclasses.replace(result, warnings=warned)


def _checked_case(function_class: type, spec: _GradCase, inputs: Inputs,
                  watched: list[sandbox.CallRecord], named: dict[str, torch.Tensor]
                  ) -> CaseResult:
    """One case; `watched` receives the record of each watched call (forward, backward),
    `named` the outputs (y, and the gradients backward produced)."""
    case = spec.case
    x_in, w_in, dy_in = inputs["x"], inputs["weight"], inputs["dy"]
    x, w, dy = x_in.tensor, w_in.tensor, dy_in.tensor
    if spec.dy_strides_zero:
        dy = dy.reshape(-1)[:1].reshape((1,) * dy.dim()).expand(dy.shape)
    x.grad = w.grad = None  # a second call on the same tensors must not accumulate
    originals = {"x": x.detach().clone(), "weight": w.detach().clone(),
                 "dy": dy.detach().clone()}
    eps = case.eps
    originals["rstd"] = reference.rmsnorm_rstd(originals["x"], eps).to(f32)
    x.requires_grad_(spec.x_requires_grad)
    w.requires_grad_(spec.weight_requires_grad)
    probe, returned = _probe_class(function_class)
    findings: list[Finding] = []
    launches: list[str] = []
    allocated = sandbox.CallRecord()  # what forward and backward allocated, for margin checks
    try:
        with sandbox.watch() as fwd:
            watched.append(fwd)
            y = probe.apply(x, w, eps)
        allocated.allocations += fwd.allocations
        findings += _launch_and_op_findings(fwd, "forward")
        launches += fwd.launches
        if not isinstance(y, torch.Tensor):
            raise AssertionError(f"apply(x, weight, eps) returned {type(y).__name__}, "
                                 "expected the tensor y")
        named["y"] = y
        findings += provenance_findings(fwd, ("y",), (y,), who="forward ")
        expected_y = reference.rmsnorm(originals["x"], originals["weight"], eps)
        mismatches = [m for m in [compare("y", y, expected_y, case.dtype)] if m is not None]
        if not y.requires_grad:
            findings.append(Finding("not_differentiable", "y.requires_grad is False"))
            return CaseResult(case, tuple(mismatches), tuple(findings),
                              launches=tuple(launches))
        try:
            with sandbox.watch() as bwd:
                watched.append(bwd)
                y.backward(dy)
        except RuntimeError as exc:
            if returned and len(returned[-1]) != 3 and not bwd.course_kernels:
                findings.append(_grad_count_finding(len(returned[-1])))
                return CaseResult(case, tuple(mismatches), tuple(findings),
                                  launches=tuple(launches))
            count = _GRAD_COUNT.search(str(exc))
            if count:
                findings.append(_grad_count_finding(int(count.group(2))))
            elif "different than None at position 3" in str(exc):
                findings.append(Finding("grad_for_eps", "backward returned a value for eps"))
            else:
                raise
            return CaseResult(case, tuple(mismatches), tuple(findings),
                              launches=tuple(launches))
        findings += _launch_and_op_findings(bwd, "backward")
        launches += bwd.launches
        allocated.allocations += bwd.allocations
        if returned and len(returned[-1]) != 3:
            findings.append(_grad_count_finding(len(returned[-1])))
        if returned:
            grads = returned[-1][:2]
            findings += provenance_findings(bwd, ("dx", "dw")[:len(grads)], grads,
                                            who="backward ")
    except Exception as exc:  # the learner's code: reported with the case, not raised
        refused = [f for r in watched for f in refused_launch_findings(r)]
        if refused:
            return CaseResult(case, findings=tuple(refused))
        text, fatal = explain_error(exc)
        return CaseResult(case, error=text, fatal=fatal)
    findings = [f for r in watched for f in refused_launch_findings(r)] + findings
    findings += memory_findings(allocated, {"x": x_in, "weight": w_in, "dy": dy_in})

    dx_want, dw_want = reference.rmsnorm_backward(originals["x"], originals["weight"],
                                                  originals["dy"], eps=eps)
    outputs: dict[str, torch.Tensor] = {}
    for name, leaf, wanted, want, extra in (
            ("dx", x, spec.x_requires_grad, dx_want, None),
            ("dw", w, spec.weight_requires_grad, dw_want, dw_sum_atol(dw_terms(originals)))):
        if not wanted:
            continue  # autograd itself keeps .grad None for inputs that do not require it
        if leaf.grad is None:
            label = "x" if name == "dx" else "weight"
            findings.append(Finding("missing_grad",
                                    f"{label}.grad is None although {label} requires grad"))
            continue
        outputs[name] = named[name] = leaf.grad
        m = compare(name, leaf.grad, want, leaf.dtype, extra_atol=extra)
        if m is not None:
            mismatches.append(m)
    hints = suspect_hints(RMSNORM_BACKWARD, originals, case, outputs,
                          {m.name for m in mismatches})
    return CaseResult(case, tuple(mismatches), tuple(findings), launches=tuple(launches),
                      outputs=tuple(outputs.values()), hints=hints, inputs=inputs)


def _answers(t: Tensors, eps: float) -> dict[str, tuple[torch.Tensor, object]]:
    """The float64 y, dx and dw for the values `t` holds, each with its extra tolerance."""
    dx, dw = reference.rmsnorm_backward(t["x"], t["weight"], t["dy"], eps=eps)
    terms = dw_terms({**t, "rstd": reference.rmsnorm_rstd(t["x"], eps).to(f32)})
    return {"y": (reference.rmsnorm(t["x"], t["weight"], eps), None), "dx": (dx, None),
            "dw": (dw, dw_sum_atol(terms))}


def _probe_same_buffers(function_class: type, spec: _GradCase, passed: CaseResult,
                        seed: int) -> tuple[Finding, ...]:
    """Refill x, weight and dy of a case that passed in place with new values (the same
    tensor objects, storage and addresses; .grad cleared, as zero_grad(set_to_none=True)
    does) and run forward and backward again, both inputs requiring grad: y, dx and dw
    must be the answers for the new values. A Function that keeps y, rstd or a gradient
    between calls, looked up by a tensor's address, returns the old answer here."""
    inputs = passed.inputs
    if not inputs:
        return ()
    spec = dataclasses.replace(spec, x_requires_grad=True, weight_requires_grad=True)
    old = _answers({name: g.tensor.detach().clone() for name, g in inputs.items()},
                   spec.case.eps)
    fresh = _make_inputs(spec.case, torch.Generator().manual_seed(seed))
    for name, g in inputs.items():
        g.refill(fresh[name])
    named: dict[str, torch.Tensor] = {}
    again = _run_case(function_class, spec, inputs=inputs, named=named)
    same = "called again with the same x, weight and dy (the same memory) refilled with new values"
    if again.error:
        return (Finding("state_between_calls", f"{same}, it raised "
                        f"{again.error.splitlines()[0]}"),)
    if not again.mismatches:
        return ()
    wrong = [m.name for m in again.mismatches]
    stale = [name for name in wrong
             if isinstance(named.get(name), torch.Tensor)
             and named[name].shape == old[name][0].shape
             and compare(name, named[name], old[name][0], named[name].dtype,
                         extra_atol=old[name][1]) is None]
    if stale:
        return (cached_finding(same, stale, wrong),)
    return (Finding("stale_by_address", f"{same}, it returned a wrong {', '.join(wrong)}:\n"
                    f"{again.mismatches[0].describe()}"),)


def _gradcheck(function_class: type, gen: torch.Generator) -> tuple[CaseResult | None, str]:
    """gradcheck on a tiny float64 case when the learner's kernels compute in float64:
    (result, "") when it ran, (None, why not) when it was skipped."""
    case = _GRADCHECK_CASE
    x = torch.randn(case.shape, generator=gen, dtype=F64).to(runtime.DEVICE)
    w = (torch.rand(case.n, generator=gen, dtype=F64) + 0.5).to(runtime.DEVICE)
    skip = "skipped the float64 gradcheck: "
    try:
        with sandbox.collect_warnings() as warned:  # reported, not printed (see sandbox)
            y = function_class.apply(x, w, EPS)
    except Exception as exc:
        why = explain_error(exc)[0]
        return None, skip + (f"your kernels do not run on float64 inputs ({why}). That is "
                             "allowed; gradcheck needs float64 arithmetic.")
    want = reference.rmsnorm(x, w, EPS)
    if not isinstance(y, torch.Tensor) or y.dtype != F64 or y.shape != want.shape:
        what = type(y).__name__ if not isinstance(y, torch.Tensor) else y.dtype
        return None, skip + f"given float64 inputs your forward returns {what}."
    err = float((y.detach() - want).abs().max())
    if not err <= TOLERANCES[F64][0] * 10 + TOLERANCES[F64][1] * float(want.abs().max()):
        return None, skip + (f"given float64 inputs your forward is off by up to {err:.1e}: "
                             "it computes in lower precision (float32?), and finite "
                             "differences need float64 arithmetic.")
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    findings = []
    try:
        with sandbox.watch(track_changes=False) as record:
            passed = torch.autograd.gradcheck(lambda a, b: function_class.apply(a, b, EPS),
                                              (xg, wg), eps=1e-6, atol=1e-5, rtol=1e-3,
                                              raise_exception=False)
    except Exception as exc:
        return CaseResult(case, error=explain_error(exc)[0], warnings=tuple(warned)), ""
    if not passed:
        findings.append(Finding("gradcheck", "gradcheck returned False"))
    return CaseResult(case, findings=tuple(findings), launches=tuple(record.launches),
                      warnings=tuple(dict.fromkeys([*warned, *record.warnings]))), ""


def require_function_class(function_class: object, checker: str) -> None:
    """TypeError unless `function_class` is a torch.autograd.Function subclass itself."""
    if not (isinstance(function_class, type)
            and issubclass(function_class, torch.autograd.Function)):
        raise TypeError(f"pass your class itself, e.g. {checker}(RMSNormFunction): a "
                        "subclass of torch.autograd.Function, not "
                        f"{type(function_class).__name__}")


# How a case whose finding came from probe_repeat is named in the report.
REPEATED_CASE = "its GPU work repeated on new inputs"


def probe_repeat(function_class: type, case: Case, seed: int) -> tuple[Finding, ...]:
    """Forward and backward at the shape of a case that passed, then their GPU work
    repeated, none of their Python, on other inputs of that shape (as
    course.check.runner.probe_repeat does for a function): y, dx and dw must be those of the
    new inputs."""
    from course.verify.replay import autograd_step, repeated

    first = _make_inputs(case, torch.Generator().manual_seed(seed + 404))
    other = _make_inputs(case, torch.Generator().manual_seed(seed + 505))
    args = tuple(first[k].tensor for k in ("x", "weight", "dy"))
    again = tuple(other[k].tensor for k in ("x", "weight", "dy"))
    t = {k: other[k].tensor.detach().clone() for k in ("x", "weight", "dy")}
    eps = case.eps
    t["rstd"] = reference.rmsnorm_rstd(t["x"], eps).to(f32)
    y_want = reference.rmsnorm(t["x"], t["weight"], eps)
    dx_want, dw_want = reference.rmsnorm_backward(t["x"], t["weight"], t["dy"], eps=eps)
    def here(args: tuple, again: tuple, eps: float) -> object:
        return repeated(autograd_step(function_class, eps), args, {}, again)

    # The learner's Function in its own process (course.verify) repeats itself there.
    repeat = getattr(function_class, "repeated_step", here)
    got, failed = repeat_or_finding(lambda: repeat(args, again, eps),
                                    "your forward's and backward's")
    if failed is not None:
        return (failed,)
    wanted = (("y", y_want, t["x"].dtype, None), ("dx", dx_want, t["x"].dtype, None),
              ("dw", dw_want, t["weight"].dtype, dw_sum_atol(dw_terms(t))))
    got = tuple(got) if isinstance(got, (tuple, list)) else ()
    wrong = [name for (name, want, dtype, extra), out in zip(wanted, got, strict=False)
             if not isinstance(out, torch.Tensor) or out.shape != want.shape
             or compare(name, out, want, dtype, extra_atol=extra) is not None]
    if len(got) != 3 or wrong:
        names = ", ".join(f"`{n}`" for n in wrong) or "outputs"
        return (outside_kernels("your forward's and backward's kernels'", names,
                                "what your Function returned"),)
    return ()


def _strides_zero_advice(results: list[CaseResult]) -> list[str]:
    """The advice for gradients wrong only where dy has strides 0 (the gradient of
    y.sum()), every other case right; none otherwise."""
    strides_zero = {spec.case.name for spec in _CASES if spec.dy_strides_zero}
    wrong = [r for r in results if r.mismatches]
    if not wrong or any(r.case.name not in strides_zero for r in results if not r.passed):
        return []
    return ["Only the case whose dy has strides 0 fails: the gradient of y.sum() is one value "
            "broadcast over y's shape, and it reaches backward as it is, with no row of "
            "contiguous values for your kernels to read. Call dy = dy.contiguous() in "
            "backward, before your kernels (it copies only when dy is not contiguous)."]


@learner_facing
def rmsnorm_autograd(function_class: type, *, seed: int | None = None,
                     quiet: bool = False) -> Report:
    """Check a learner's `RMSNormFunction` (a torch.autograd.Function used as
    `RMSNormFunction.apply(x, weight, eps)`): y, x.grad and weight.grad against float64,
    the number of values backward returns, gradients only where inputs require them, and
    a float64 gradcheck where the kernels support float64. Raise AssertionError with advice
    on failure; return the report (printed unless quiet)."""
    require_function_class(function_class, "rmsnorm_autograd")
    seed = fresh_seed() if seed is None else int(seed)
    results = []
    for index, spec in enumerate(_CASES):
        gen = torch.Generator().manual_seed(seed * 1000 + index)
        results.append(_run_case(function_class, spec, gen))
        if results[-1].fatal:
            break
    passing = [(spec, r) for spec, r in zip(_CASES, results, strict=False) if r.passed]
    if passing and not any(r.fatal for r in results):  # the latest call that passed
        spec, passed = passing[-1]
        findings = _probe_same_buffers(function_class, spec, passed, seed + 303)
        label = "same tensors refilled, x and weight require grad"
        if not findings:
            findings = probe_repeat(function_class, passed.case, seed)
            label = REPEATED_CASE
        if findings:
            case = dataclasses.replace(passed.case, name=label)
            results.append(CaseResult(case, findings=findings))
    notes = []
    if all(r.passed for r in results):
        checked, why_not = _gradcheck(function_class, torch.Generator().manual_seed(seed))
        if checked is not None:
            results.append(checked)
        else:
            notes.append(why_not + " check.rmsnorm_gradcheck checks kernels that compute "
                         "in float32 against finite differences in float32 instead.")
    else:  # it would only repeat what the failures above say
        notes.append("the float64 gradcheck runs once the cases above pass")
    notes += warning_notes(results)
    report = Report("rmsnorm_autograd", seed, results,
                    _strides_zero_advice(results)
                    + advise(results, RMSNORM_BACKWARD.suspects, {**ADVICE, **_ADVICE}), notes)
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report

