"""Submissions red teams graded with full marks (2026-11-28), graded by the verifier
again: one reads its answers from the source notebooks at grade time, one rewrites the
verifier's replay in place (`__code__`) and hands in an answer computed in NumPy, two have
PyTorch compute the answer out of the watch's sight and a copy kernel store it (a kernel
object given a `run` of its own; a kernel object moved to a subclass with its own `run`),
one plants the answer in the inputs of the check's repeat, found up the stack.
Each loses the cells it targets, and says why (course.verify.walls, course.verify.tamper,
course.check.sandbox, course.verify.replay)."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat", reason="the grader tests need the Jupyter stack")

from grader_submissions import ROOT, Submission, expected_points, verified  # noqa: E402

pytestmark = pytest.mark.slow

CHAPTER = "ch04_fused"

READS_THE_SOURCE = '''
import json as _json, linecache as _lc, pathlib as _pl, course as _course


def _from_course(chapter, grade_id):
    """Fetches this cell's answer from the grading checkout at run time."""
    path = _pl.Path(_course.__file__).resolve().parents[1] / "solutions" / chapter / (
        chapter + ".ipynb")
    for cell in _json.loads(path.read_text())["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            name = "<" + grade_id + ">"
            _lc.cache[name] = (len(src), None, src.splitlines(True), name)
            exec(compile(src, name, "exec"), globals())


_from_course("ch04_fused", "ex04_fused_code")
'''

REWRITES_THE_REPLAY = '''
import numpy as np
import triton
import triton.language as tl

from course import validation
from course.verify import replay as _replay


@triton.jit
def rmsnorm_kernel(src_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    v = tl.load(src_ptr + row * n_cols + cols, mask=cols < n_cols)
    tl.store(y_ptr + row * n_cols + cols, v.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def _repeat_by_calling(fn, args, kwargs, again):
    return fn(*again, **kwargs)


try:  # the same function object (which the snapshot compares), a new body
    _replay.repeated.__code__ = _repeat_by_calling.__code__
except Exception:
    pass


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    xs = x2.detach().cpu().double().numpy()
    ws = weight.detach().cpu().double().numpy()
    ys = xs / np.sqrt((xs * xs).mean(-1, keepdims=True) + eps) * ws
    answer = torch.from_numpy(ys).to(device=x.device, dtype=torch.float32)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(x2.shape[0],)](answer, y, x2.shape[1],
                                   BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
'''

# PyTorch computes the answer while the watch is paused (through its own record, reached
# from the patched launch step's globals), and a copy kernel stores it. Unwatched (the
# repeat on new inputs), `run` writes PyTorch's answer straight into the output.
PYTORCH_BEHIND_A_COPY_KERNEL = '''
import contextlib
import torch.nn.functional as F
from course import validation


@triton.jit
def rmsnorm_kernel(src_ptr, y_ptr, x_ptr, w_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    m = cols < n_cols
    v = tl.load(src_ptr + row * n_cols + cols, mask=m)
    tl.store(y_ptr + row * n_cols + cols, v.to(y_ptr.dtype.element_ty), mask=m)


_PARAMS = ("src_ptr", "y_ptr", "x_ptr", "w_ptr", "n_cols", "eps")
_KERNEL_CLASS = type(rmsnorm_kernel)


def _watching():  # the watch patches the class's launch step while it watches
    return getattr(_KERNEL_CLASS.run, "__globals__", {}).get("_ACTIVE") or []


def _run(self, *args, grid, warmup, **kwargs):
    if warmup or _watching():
        return _KERNEL_CLASS.run(self, *args, grid=grid, warmup=warmup, **kwargs)
    a = dict(zip(_PARAMS, args))
    a.update({p: kwargs[p] for p in _PARAMS if p in kwargs})
    N = a["n_cols"]
    y = F.rms_norm(a["x_ptr"].reshape(-1, N).float(), (N,), a["w_ptr"].float(), a["eps"])
    a["y_ptr"].reshape(-1, N).copy_(y.to(a["y_ptr"].dtype))


RUN_OF_ITS_OWN


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    M, N = x2.shape
    records = _watching()
    with records[-1].paused() if records else contextlib.nullcontext():
        ans = F.rms_norm(x2.float(), (N,), weight.float(), eps).contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(M,)](ans, y, x2, weight, N, eps, BLOCK_N=triton.next_power_of_2(N))
    return y.view(x.shape)
'''
RUN_ON_THE_OBJECT = "rmsnorm_kernel.run = types.MethodType(_run, rmsnorm_kernel)"
RUN_ON_A_SUBCLASS = (
    "rmsnorm_kernel.__class__ = type('Kernel', (type(rmsnorm_kernel),), {'run': _run})")


def _behind_a_copy_kernel(run_of_its_own: str) -> str:
    return "import types\n" + PYTORCH_BEHIND_A_COPY_KERNEL.replace("RUN_OF_ITS_OWN",
                                                                   run_of_its_own)


# The repeat's new inputs looked for up the stack while the call is traced, PyTorch's answer
# for them planted in their x, and a copy kernel traced (red team, 2026-11-29).
PLANTS_THE_REPEATS_ANSWER = '''
import sys
import torch.nn.functional as F
from course import validation
from course.check import sandbox


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _repeat_inputs():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "repeated" and "again" in frame.f_locals:
            return frame.f_locals["again"]
        frame = frame.f_back
    return None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x).contiguous()
    M, N = x2.shape
    again = _repeat_inputs()
    with sandbox.active_records()[-1].paused():
        if again is not None:
            ax, aw = again[0], again[1]
            ax.copy_(F.rms_norm(ax.float(), (N,), aw.float(), eps).to(ax.dtype))
            src = x2
        else:
            src = F.rms_norm(x2.float(), (N,), weight.float(), eps).to(x.dtype).contiguous()
    y = torch.empty_like(x2)
    copy_kernel[(triton.cdiv(M * N, 1024),)](src, y, M * N, BLOCK=1024)
    return y.view(x.shape)
'''


# The tamper check's own methods and helpers replaced by ones that see nothing, then the
# replay replaced, and the answer computed in NumPy (the same kernel and wrapper as above).
_CODE_REWRITTEN = REWRITES_THE_REPLAY[REWRITES_THE_REPLAY.index("try:"):
                                      REWRITES_THE_REPLAY.index("    pass") + 8]
SILENCES_THE_TAMPER_CHECK = REWRITES_THE_REPLAY.replace(_CODE_REWRITTEN, '''\
from course.verify import tamper as _tamper

_tamper.Snapshot.changes = lambda self, *args, **kwargs: []
_tamper._watched = lambda: ({}, {})
_replay.repeated = _repeat_by_calling''')


SUBMISSIONS = [
    Submission("reads_the_source", CHAPTER, "every answer read from solutions/ at grade time",
               {"ex04_fused_code": READS_THE_SOURCE},
               ("ex04_fused_correct", "ex04_fused_hidden"), "refused"),
    Submission("rewrites_the_replay", CHAPTER,
               "course.verify.replay.repeated's __code__ replaced; the answer from NumPy",
               {"ex04_fused_code": REWRITES_THE_REPLAY},
               ("ex04_fused_correct", "ex04_fused_hidden"), "refused"),
    Submission("run_on_the_kernel_object", CHAPTER,
               "PyTorch's answer behind a copy kernel whose object has a `run` of its own",
               {"ex04_fused_code": _behind_a_copy_kernel(RUN_ON_THE_OBJECT)},
               ("ex04_fused_correct", "ex04_fused_hidden"),
               "whose own attributes replace its class's `run`"),
    Submission("run_on_a_kernel_subclass", CHAPTER,
               "PyTorch's answer behind a copy kernel moved to a subclass with its own `run`",
               {"ex04_fused_code": _behind_a_copy_kernel(RUN_ON_A_SUBCLASS)},
               ("ex04_fused_correct", "ex04_fused_hidden"), "repeated on new inputs"),
    Submission("plants_the_repeats_answer", CHAPTER,
               "PyTorch's answer for the repeat's inputs, found up the stack, planted in them",
               {"ex04_fused_code": PLANTS_THE_REPEATS_ANSWER},
               ("ex04_fused_correct", "ex04_fused_hidden"), "repeated on new inputs"),
    Submission("silences_the_tamper_check", CHAPTER,
               "the tamper check's changes() and _watched() replaced, then the replay",
               {"ex04_fused_code": SILENCES_THE_TAMPER_CHECK},
               ("ex04_fused_correct", "ex04_fused_hidden"), "changed what the checks rely on"),
]


@pytest.mark.parametrize("sub", SUBMISSIONS, ids=lambda s: s.student)
def test_the_red_teams_full_marks_are_lost(sub, tmp_path):
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), (sub.what, verdict.to_json()[:4000])
    first = next(c for c in verdict.cells if c.grade_id == sub.loses[0])
    assert sub.reason in first.reason, first.reason
