"""Checker for chapter 07's gradient check on the learner's own kernels, in float32.

`torch.autograd.gradcheck` needs float64, and the chapter's kernels compute in float32.
This check compares, in float32, what the learner's backward says a small change of the
input does to the loss with what the learner's own forward does when the input changes:

    L(x) = sum(y(x) * dy)                  (float32 y, summed in float64)
    finite difference along v:  L(x + h v) - L(x - h v)
    backward along v:           sum(dx * (x_plus - x_minus))

with x_plus and x_minus the float32 inputs actually passed (so their rounding is not an
error), and h = STEP. Its error has two parts. Truncation: a central difference is off by
about h**2 / 6 times the third derivative, 1e-5 relative for h = 1e-2 here. Rounding: each
L carries the float32 rounding of its outputs, about 2**-24 * sum(|y * dy|); dividing by a
step of 2h turns it into an error on the derivative, which a tiny h makes huge (h = 1e-6:
the rounding is as large as the change itself). STEP = 1e-2 balances the two, and the
tolerance allows 16 times that rounding, plus 0.2 % of the derivative.

Directions: random ones, and x itself. RMSNorm cannot see a row's scale (only eps can),
so along x the loss does not change: a backward without its term through rstd fails there
by the whole derivative. Along the weight, L is linear, and only rounding remains.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from course import runtime
from course.check import sandbox
from course.check.autograd import (
    _CASES,
    REPEATED_CASE,
    _launch_and_op_findings,
    probe_repeat,
    require_function_class,
)
from course.check.cases import Case
from course.check.diagnose import advise
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import ADVICE, CaseResult, Finding, explain_error, fresh_seed
from course.check.suite import warning_notes

import torch

F64 = torch.float64
EPS = 1e-6
STEP = 1e-2            # h, for inputs of magnitude about 1
ROUNDING_UNITS = 16    # float32 rounding units of sum(|y * dy|) allowed for each L
RELATIVE = 2e-3        # of the larger of the two derivatives
SHAPES = ((16, 48), (12, 100))  # more rows than the interpreter's programs: sums of rows
RANDOM_DIRECTIONS = 3  # in x, per shape; then x itself; then two in the weight


@dataclass(frozen=True)
class _Direction:
    case: Case
    along: str          # "x" or "weight"
    scale: bool = False  # along x itself


_ADVICE = {
    "forward_sees_scale": (
        "Your forward changes when every row of x is scaled a little, and RMSNorm's does not "
        "(y = x / rms(x) * weight): gradients are only checked against a forward that is "
        "RMSNorm. Make the cell above pass first."),
    "finite_difference": (
        "Your backward disagrees with finite differences of your own forward: moving the "
        "input a little along a direction changes your forward's loss by one amount, and "
        "your backward's gradient predicts another (below). The forward is checked in the "
        "cell above; look at the backward's formula."),
    "finite_difference_scale": (
        "Along x itself the loss does not change (RMSNorm cannot see a row's scale), and "
        "your backward says it does: dx is not orthogonal to x. dx = rstd * (g - x_hat * c) "
        "with c = mean(x_hat * g): is the -x_hat * c term there, with c a mean (divided by "
        "N), and the same rstd in x_hat and outside?"),
    "no_forward_launch": (
        "Your Function's forward launched no Triton kernel: this check is about your "
        "kernels, so forward must call your forward kernel."),
    "no_backward_launch": (
        "Your Function's backward launched no Triton kernel: this check is about your "
        "kernels, so backward must call your backward kernels."),
    "missing_grad": (
        "backward returned None for an input that requires grad: return dx and dw."),
}


def _loss(function_class: type, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
          records: list[sandbox.CallRecord]) -> tuple[float, float]:
    """(sum(y * dy), sum(|y * dy|)) in float64, y from the learner's forward."""
    with sandbox.watch() as record:
        records.append(record)
        y = function_class.apply(x, w, EPS)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        what = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise AssertionError(f"apply(x, weight, eps) returned {what}, expected y of shape "
                             f"{tuple(x.shape)}")
    terms = y.detach().to(F64) * dy.to(F64)
    return float(terms.sum()), float(terms.abs().sum())


def _gradients(function_class: type, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
               findings: list[Finding]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with sandbox.watch() as fwd:
        y = function_class.apply(xg, wg, EPS)
    findings += _launch_and_op_findings(fwd, "forward")
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        raise AssertionError("y does not require grad although x and weight do: return "
                             "forward's output as it is and call the Function by .apply")
    with sandbox.watch() as bwd:
        y.backward(dy)
    findings += _launch_and_op_findings(bwd, "backward")
    for name, leaf in (("x", xg), ("weight", wg)):
        if leaf.grad is None:
            findings.append(Finding("missing_grad", f"{name}.grad is None"))
    return xg.grad, wg.grad


def _compare(direction: _Direction, plus: tuple[float, float], minus: tuple[float, float],
             predicted: float, absolute: float) -> Finding | None:
    measured = plus[0] - minus[0]
    rounding = ROUNDING_UNITS * 2.0 ** -24 * (plus[1] + minus[1])
    if direction.scale and abs(measured) > rounding + 1e-4 * absolute:
        # A backward consistent with any forward passes the comparison below; RMSNorm's own
        # forward is known here: it cannot see a row's scale.
        return Finding("forward_sees_scale", f"{direction.case.name}: L(+h) - L(-h) = "
                       f"{measured:.6g} by your forward, where RMSNorm's is 0 (allowed "
                       f"{rounding + 1e-4 * absolute:.2g})")
    allowed = rounding + RELATIVE * max(abs(measured), abs(predicted)) + 1e-4 * absolute
    if abs(measured - predicted) <= allowed:
        return None
    kind = "finite_difference_scale" if direction.scale else "finite_difference"
    if not math.isfinite(predicted):
        return Finding(kind, f"{direction.case.name}: L(+h) - L(-h) = {measured:.6g} by your "
                       f"forward, {predicted} by your backward: its gradient holds NaN or inf")
    return Finding(kind, f"{direction.case.name}: L(+h) - L(-h) = {measured:.6g} by your "
                   f"forward, {predicted:.6g} by your backward (difference "
                   f"{abs(measured - predicted):.2g}, allowed {allowed:.2g}; h = {STEP})")


def _run_shape(function_class: type, shape: tuple[int, int], gen: torch.Generator
               ) -> list[CaseResult]:
    m, n = shape
    dev = runtime.DEVICE
    x = torch.randn(shape, generator=gen).to(dev)
    w = (torch.rand(n, generator=gen) + 0.5).to(dev)
    dy = torch.randn(shape, generator=gen).to(dev)
    directions = [_Direction(Case(f"x along random direction {i + 1}", shape,
                                  torch.float32), "x") for i in range(RANDOM_DIRECTIONS)]
    directions.append(_Direction(Case("x along x itself", shape, torch.float32),
                                 "x", scale=True))
    directions += [_Direction(Case(f"weight along random direction {i + 1}", (n,),
                                   torch.float32), "weight") for i in range(2)]
    findings: list[Finding] = []
    records: list[sandbox.CallRecord] = []
    try:
        with sandbox.collect_warnings() as warned:
            dx, dw = _gradients(function_class, x, w, dy, findings)
    except Exception as exc:  # the learner's code: a line of the report
        return [CaseResult(directions[0].case, error=explain_error(exc)[0])]
    if findings or dx is None or dw is None:
        return [CaseResult(directions[0].case, findings=tuple(findings),
                           warnings=tuple(warned))]
    results = []
    for direction in directions:
        if direction.scale:
            v = x.clone()
        else:
            v = torch.randn(shape if direction.along == "x" else (n,), generator=gen).to(dev)
        try:
            if direction.along == "x":
                up, down = x + STEP * v, x - STEP * v
                plus = _loss(function_class, up, w, dy, records)
                minus = _loss(function_class, down, w, dy, records)
                grad = dx
            else:
                up, down = w + STEP * v, w - STEP * v
                plus = _loss(function_class, x, up, dy, records)
                minus = _loss(function_class, x, down, dy, records)
                grad = dw
        except Exception as exc:
            results.append(CaseResult(direction.case, error=explain_error(exc)[0]))
            continue
        step = up.to(F64) - down.to(F64)  # the step actually taken, after float32 rounding
        contributions = grad.detach().to(F64) * step
        found = _compare(direction, plus, minus, float(contributions.sum()),
                         float(contributions.abs().sum()))
        launch = [f for r in records[-2:] for f in _launch_and_op_findings(r, "forward")]
        results.append(CaseResult(direction.case, findings=tuple(launch) + (
            (found,) if found else ()), launches=tuple(records[-1].launches)))
    return results


@learner_facing
def rmsnorm_gradcheck(function_class: type, *, seed: int | None = None,
                      quiet: bool = False) -> Report:
    """Check a learner's `RMSNormFunction` (used as `RMSNormFunction.apply(x, weight, eps)`)
    against finite differences of its own forward, in float32: for random directions in x
    and in the weight, and along x itself, the change of sum(y * dy) over a central step of
    h = STEP must match what the gradients from backward predict, within the rounding the
    module's text derives. Raise AssertionError with advice on failure."""
    require_function_class(function_class, "rmsnorm_gradcheck")
    seed = fresh_seed() if seed is None else int(seed)
    results: list[CaseResult] = []
    for index, shape in enumerate(SHAPES):
        results += _run_shape(function_class, shape,
                              torch.Generator().manual_seed(seed * 1000 + index))
    if all(r.passed for r in results):  # gradients that agree with a forward the kernels ran
        case = _CASES[0].case
        found = probe_repeat(function_class, case, seed)
        if found:
            results.append(CaseResult(dataclasses.replace(case, name=REPEATED_CASE),
                                      findings=found))
    notes = warning_notes(results)
    notes.append(f"float32 central differences, h = {STEP}: allowed {ROUNDING_UNITS} float32 "
                 f"units of sum(|y * dy|) for each loss, plus {100 * RELATIVE:.1f} % of the "
                 "derivative")
    report = Report("rmsnorm_gradcheck", seed, results,
                    advise(results, (), {**ADVICE, **_ADVICE}), notes)
    if not report.passed:
        raise AssertionError(report.message())
    if not quiet:
        report.show()
    return report
