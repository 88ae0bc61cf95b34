"""Checker for chapter 01's exercise: RMSNorm in plain PyTorch.

The learner writes `rmsnorm_torch(x, weight, eps=1e-6) -> y` with torch operations (no
Triton): statistics in float32, y in x's dtype. Here torch ops are the point, so the
dishonesty checks of the kernel exercises (launch count, torch ops, output provenance) are
left out; what is checked hard is precision.

"Statistics in float32" is checked on the ops themselves: a reduction (mean, sum, norm,
var) or a square root computed on a float16 or bfloat16 tensor fails, with the line that
ran it. The values alone cannot tell reliably: PyTorch accumulates 16-bit reductions in
float32 internally and rounds only the result, so a bfloat16 mean of squares scales each
row by a few tenths of a percent, about as much as the legitimate habit of rounding
x * rstd to bfloat16 before multiplying by the weight (as Hugging Face's Llama does, and
`course.baselines.eager_rmsnorm`): multiplying a row of 8-bit mantissas by one scalar and
rounding moves the whole row coherently, by up to 2^-9. The bfloat16 row-scale tolerance
is widened to admit that; float16 statistics also fail on values whose squares overflow.

A float32 statistic rounded to 16 bits afterwards (rstd.to(x.dtype) before the multiply)
is as wrong as one computed in 16 bits, but runs no 16-bit reduction: it is recognised by
its values instead (the suspect `rstd_rounded`). PyTorch's own RMSNorm is the answer rather
than a way to it, so the call refuses it however it is reached: torch.nn.functional.rms_norm,
torch.rms_norm, torch.nn.RMSNorm, the operator torch.ops.aten.rms_norm (its packet or an
overload) and aten._fused_rms_norm, with torch-function modes switched off too
(torch._C.DisableTorchFunction). A torch-function mode sees the first three; a profile hook
(`course.check.profiled`) sees the Python function or the builtin run, whatever the modes.
A call that switched that hook off is refused as well. Both are per thread, so for the
length of the call the two operators are also replaced in PyTorch's dispatcher, for every
thread, by a kernel that refuses them (a thread of the call's own, started where the hook
is not set, meets it there).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from types import FrameType

from course import reference
from course.check import guards, profiled
from course.check.cases import Case
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.rmsnorm import RMSNORM_FORWARD
from course.check.rmsnorm import SUSPECTS as KERNEL_SUSPECTS
from course.check.runner import Exercise, Finding, Suspect, Tensors
from course.check.sandbox import CallRecord
from course.check.suite import check_and_raise

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# PyTorch is fast: more rows than a kernel exercise can afford, so that a wrongly rounded
# statistic shows on many rows at once, and the coherent rounding described above is met.
_EXTRA_CASES = (
    Case("bfloat16, many long rows", (32, 4096), torch.bfloat16,
         frozenset({"half", "bf16", "long"}), offset=1.0, scale=0.5),
    Case("bfloat16, many rows", (1024, 1024), torch.bfloat16,
         frozenset({"half", "bf16", "pow2"})),
)

# Ops whose result is a row statistic, or a function of one.
_STATISTICS = ("aten.mean", "aten.sum", "aten.nansum", "aten.nanmean", "aten.var",
               "aten.var_mean", "aten.std", "aten.std_mean", "aten.norm",
               "aten.linalg_vector_norm", "aten.rsqrt", "aten.sqrt")
_LOW_PRECISION = ("float16", "bfloat16")


def _statistics_precision(record: CallRecord, case: Case) -> list[Finding]:
    """A finding for each line that computes a statistic in a 16-bit dtype."""
    by_site: dict[str, list[str]] = {}
    for use in record.forbidden_ops:  # every compute op the call ran (allowed here)
        if use.dtype in _LOW_PRECISION and ".".join(use.op.split(".")[:2]) in _STATISTICS:
            ops = by_site.setdefault(use.site, [])
            entry = f"{use.op} on {use.dtype}"
            if entry not in ops:
                ops.append(entry)
    if not by_site:
        return []
    where = "; ".join(f"{', '.join(ops)} at {site}" for site, ops in by_site.items())
    return [Finding("low_precision_statistics", f"computed statistics in 16 bits: {where}")]

_UPCAST = ("Upcast first, h = x.to(torch.float32), take the mean of h * h and its rsqrt in "
           "float32, keep rstd in float32, and convert only y back with .to(x.dtype).")

_ADVICE = {
    "low_precision_statistics": (
        "Your statistics are computed in 16 bits: " + _UPCAST + " A 16-bit mean of squares "
        "is rounded to 8 (bfloat16) or 11 (float16) significant bits, which scales the whole "
        "row by a wrong factor, and in float16 the square of a value above 256 overflows."),
    "half": (
        "float32 inputs pass but 16-bit inputs fail: a row statistic is held in the input's "
        "precision somewhere. " + _UPCAST + " In bfloat16 (8 significant bits) a mean of "
        "squares or an rstd rounded to 16 bits is off by up to 0.4 %, which scales a whole "
        "row by a wrong factor; in float16 the square of a value above 256 overflows to inf."),
    "eps": ("Only the case with a non-default eps fails: use the eps argument your function "
            "is given, not a constant."),
    "extra_launches": (
        "This chapter's exercise is plain PyTorch: write the formula with torch operations; "
        "Triton kernels come from chapter 03 on."),
    "input_written": (
        "Your function writes into an input: an in-place op (x.mul_(...), x.pow_(2), "
        "x *= ..., out=x) overwrote the caller's tensor. Use the out-of-place forms (x * r, "
        "x.pow(2)), which return new tensors. Beware that x.to(torch.float32) returns x "
        "itself when x is already float32, so an in-place op on the result still writes "
        "into x."),
}


def _rstd_rounded(t: Tensors, case: Case) -> torch.Tensor | None:
    """y with a correct float32 rstd rounded to the input's 16-bit dtype before use."""
    if case.dtype not in (torch.float16, torch.bfloat16):
        return None
    rstd = reference.rmsnorm_rstd(t["x"], eps=case.eps).to(case.dtype).to(torch.float64)
    return t["x"].to(torch.float64) * rstd.unsqueeze(-1) * t["weight"].to(torch.float64)


# The kernel exercise's suspects, less the one about a kernel's padded block, and one of
# this exercise's own.
_SUSPECTS = (*(s for s in KERNEL_SUSPECTS if s.name != "divided_by_block"),
             Suspect("rstd_rounded", "y",
                     "Your mean of squares is right, but rstd is rounded to 16 bits before "
                     "it is used (rstd.to(x.dtype) before the multiply, say): bfloat16 keeps "
                     "8 significant bits, so every row is scaled by a factor up to 0.4 % off. "
                     "Keep rstd in float32, compute x * rstd * weight in float32, and convert "
                     "only y with .to(x.dtype).", expected=_rstd_rounded))


class BuiltInRMSNormRefused(RuntimeError):
    """Raised inside the learner's call when it uses PyTorch's own RMSNorm."""


# torch.rms_norm is the op behind F.rms_norm (and nn.RMSNorm); older versions may lack it.
_BUILT_INS = tuple(f for f in (F.rms_norm, getattr(torch, "rms_norm", None)) if f is not None)
# The names PyTorch's RMSNorm goes by: Python functions of torch's modules (F.rms_norm, the
# reference implementations), builtins (torch.rms_norm, torch._fused_rms_norm) and
# operators (torch.ops.aten.rms_norm, aten._fused_rms_norm where this torch has it).
_NAMES = frozenset({"rms_norm", "_fused_rms_norm"})


def _operator_builtins() -> tuple[object, ...]:
    """The builtins behind the RMSNorm operators' packets and overloads (an overload's has
    no name, so it is known by identity)."""
    found = []
    for name in sorted(_NAMES):
        try:
            packet = getattr(torch.ops.aten, name)
        except (AttributeError, RuntimeError):  # not in this torch
            continue
        found.append(packet._op)
        for overload in packet.overloads():
            found.append(getattr(packet, overload)._op)
    return tuple(found)


_OPERATOR_BUILTINS = _operator_builtins()
_OPERATOR_IDS = frozenset(id(b) for b in _OPERATOR_BUILTINS)  # the tuple keeps them alive
_OPERATOR_METHODS = ("__call__", "decompose", "redispatch")
_WATCHED_CODE = _NAMES | frozenset(_OPERATOR_METHODS)


def _refused_message(what: str) -> str:
    return (f"{what} is PyTorch's own RMSNorm (torch.nn.functional.rms_norm, torch.rms_norm, "
            "nn.RMSNorm and the aten operator are all one), which computes the whole answer, "
            "so this exercise does not accept it: write the formula with torch operations "
            "(the mean of x * x in float32, torch.rsqrt, then multiply by x and the weight)")


def _operator_name(op: object) -> str | None:
    """'aten.rms_norm' for an RMSNorm operator's packet or overload, else None."""
    qualified = getattr(op, "_qualified_op_name", None) or getattr(op, "_name", None)
    if not isinstance(qualified, str):
        return None
    namespace, _, name = qualified.rpartition("::")
    return f"{namespace or 'aten'}.{name}" if name in _NAMES else None


def _built_in_run(frame: FrameType, event: str, arg: object) -> str | None:
    """What of PyTorch's RMSNorm a profile event runs ('torch.nn.functional.rms_norm', ...),
    or None. Called on every event of the call: the common case returns first."""
    if event == "call":
        code = frame.f_code.co_name
        if code not in _WATCHED_CODE or not _in_torch(frame):
            return None
        module = frame.f_globals["__name__"]
        if code in _NAMES:
            return f"{module}.{code}"
        if module == "torch._ops":
            op = _operator_name(frame.f_locals.get("self"))
            return f"torch.ops.{op}" if op is not None else None
        return None
    if event == "c_call":
        if id(arg) in _OPERATOR_IDS:
            return "torch.ops.aten.rms_norm"
        name = getattr(arg, "__name__", None)
        return f"torch.{name}" if name in _NAMES else None
    return None


def _in_torch(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__")
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def _site(frame: FrameType | None) -> str:
    """' at file, line n' for the first frame outside torch and this module."""
    while frame is not None and (_in_torch(frame) or frame.f_globals is globals()):
        frame = frame.f_back
    if frame is None:
        return ""
    return f" at {os.path.basename(frame.f_code.co_filename)}, line {frame.f_lineno}"


# Every dispatch key a call of the operators can reach a kernel through: the composite
# (CPU and CUDA alike), autograd's, and the backends' own (under no_grad or inference mode).
_DISPATCH_KEYS = ("CompositeImplicitAutograd", "Autograd", "CPU", "CUDA")


def _refusing_library(found: list[tuple[str, str]]) -> torch.library.Library:
    """The RMSNorm operators replaced in PyTorch's dispatcher, for every thread, by a kernel
    that records the call in `found` and raises; `_destroy()` puts PyTorch's back."""
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        for name in sorted(_NAMES):
            if not hasattr(torch.ops.aten, name):  # not in this torch
                continue

            def refuse(*args, _what=f"torch.ops.aten.{name}", **kwargs):
                found.append((_what, _site(sys._getframe(1))))
                raise BuiltInRMSNormRefused(_refused_message(_what))

            for key in _DISPATCH_KEYS:
                library.impl(name, refuse, key)
    return library


def _still_refusing(found: list[tuple[str, str]]) -> bool:
    """Whether the dispatcher still runs the refusing kernel (a call may have found a way to
    take it out); the probe's own entry in `found` is taken back."""
    before = len(found)
    try:
        torch.ops.aten.rms_norm(torch.zeros(1, 1), [1], None, None)
    except BuiltInRMSNormRefused:
        del found[before:]
        return True
    return False


class _RefuseBuiltInRMSNorm(TorchFunctionMode):
    """Refuses PyTorch's RMSNorm inside the body, however it is reached (the module's text);
    a context manager, in the checker's process and in the learner's (course.verify)."""

    def __enter__(self):
        self._found: list[tuple[str, str]] = []  # (what ran, where), from any thread
        self._library = _refusing_library(self._found)
        self._profile = profiled.watching(self._hook)
        try:
            self._watch = self._profile.__enter__()
            try:
                return super().__enter__()
            except BaseException:
                self._profile.__exit__(None, None, None)
                raise
        except BaseException:
            self._library._destroy()
            raise

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            try:
                super().__exit__(exc_type, exc_value, traceback)
            finally:
                self._profile.__exit__(None, None, None)
            taken_out = not _still_refusing(self._found)
        finally:
            self._library._destroy()
        if taken_out:
            raise BuiltInRMSNormRefused(
                "your function took the check's stand-in for PyTorch's RMSNorm out of the "
                "dispatcher, which this exercise does not accept. Write the formula with "
                "torch operations")
        if isinstance(exc_value, BuiltInRMSNormRefused):
            return None
        if self._found:  # refused, and the refusal caught: the call fails all the same
            what, where = self._found[0]
            raise BuiltInRMSNormRefused(f"{_refused_message(what)}; called{where}")
        if self._watch.switched_off:
            raise BuiltInRMSNormRefused(
                "your function switched off the check's profile hook (sys.setprofile or "
                "threading.setprofile), which watches for PyTorch's own RMSNorm: this "
                "exercise does not accept a call it cannot watch. Write the formula with "
                "torch operations, and leave the profile hooks alone")
        return None

    def _hook(self, frame: FrameType, event: str, arg: object) -> None:
        what = _built_in_run(frame, event, arg)
        if what is not None:
            origin = frame if event == "c_call" else frame.f_back
            self._found.append((what, _site(origin)))
            raise BuiltInRMSNormRefused(_refused_message(what))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if any(func is f for f in _BUILT_INS):
            raise BuiltInRMSNormRefused(_refused_message(
                "torch.nn.functional.rms_norm" if func is F.rms_norm else "torch.rms_norm"))
        return func(*args, **(kwargs or {}))


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    with guards.guarded(guards.REFUSE_BUILT_IN_RMSNORM), _RefuseBuiltInRMSNorm():
        return RMSNORM_FORWARD.call(fn, t, case)


TORCH_RMSNORM = Exercise(
    name="torch_rmsnorm",
    signature="rmsnorm_torch(x, weight, eps=1e-6) -> y",
    cases=RMSNORM_FORWARD.cases + _EXTRA_CASES,
    make_inputs=RMSNORM_FORWARD.make_inputs,
    call=_call,
    expected=RMSNORM_FORWARD.expected,
    output_names=("y",),
    max_launches=0,
    min_launches=0,
    torch_ops_allowed=True,
    advice=_ADVICE,
    dtype_reasons={"y": "the input's dtype: compute the statistics in float32, then convert "
                        "y back with .to(x.dtype)"},
    dtype_fix="Convert the result before returning it: return y.to(x.dtype)",
    outputs_from_triton=False,
    # Rounding x * rstd to bfloat16, then multiplying by the weight, moves a row coherently
    # by up to 2^-9 (measured: 0.22 % at worst over 4099 rows); bfloat16 statistics are
    # caught on the ops instead.
    row_scale_tolerances={torch.bfloat16: 2.0 ** -8},
    inspect=_statistics_precision,
    suspects=_SUSPECTS,
)


@learner_facing
def torch_rmsnorm(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's plain-PyTorch `rmsnorm_torch(x, weight, eps=1e-6)`; raise
    AssertionError with advice on failure, return the report (printed unless quiet)."""
    return check_and_raise(TORCH_RMSNORM, fn, seed=seed, quiet=quiet)
