"""A callback the submission hands over, called later on top of the course's own frames,
graded by the verifier: the function of a `weakref.finalize`, a `__del__` that is a
`functools.partial` of the standard library's, a lazy `map` a `deque` drains from C. Each
is called when the input tensor it was attached to dies in the learner's serve loop, with
a frame of the course innermost; none of its calls is one the course's code names, so it
asks as a library at most (course.verify.walls `asker`): starting Python (which would run
without walls, read solutions/ and write grader/overrides.csv) and moving a file into the
checkout are refused, and the learner's process reports the refusal. Otherwise the
submission is the source's answer: its control keeps every point.

The refusal lands in the middle of a test cell, in a reply before that cell's last: the
changes the learner's process reports add up until the verifier notes them at the cell's
end (`LearnerProcess.new_tampering`; it was replaced by each reply, and these refusals
kept every point), so the cells from that one on score 0."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat", reason="the grader tests need the Jupyter stack")

from grader_submissions import (  # noqa: E402
    ROOT,
    Submission,
    answered,
    expected_points,
    solutions,
    source_path,
    verified,
)

pytestmark = pytest.mark.slow

CHAPTER = "ch04_fused"
WRAPPER = "def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:\n"
DOCSTRING = ('    """RMSNorm over x\'s last dimension in one read of x; y has x\'s shape and '
             'dtype."""\n')

# Arms one callback on the first input tensor the verifier sends (the serve loop drops it
# after the call), not on one of a notebook's own cells.
ARMED = '''
import collections, functools, os, subprocess, sys, weakref

_armed = []
_MARK = MARK_PATH
_PYTHON = [sys.executable, "-c", "open(%r, 'w').write('ran without walls')" % _MARK]


class _Dropped:
    __del__ = DEL


def _in_a_cell():
    frame = sys._getframe(2)
    while frame is not None and not (frame.f_code.co_name == "<module>" and
                                     frame.f_code.co_filename.startswith("<ipython")):
        frame = frame.f_back
    return frame is not None


def _arm(x):
    if not _armed and not _in_a_cell():
        _armed.append(True)
        ARM

'''

# (student, what, the callback armed; __del__ of the object attached to the tensor)
ATTACKS = {
    "finalize_starts_python": (
        "a weakref.finalize whose function is subprocess.run, starting Python",
        "weakref.finalize(x, subprocess.run, _PYTHON)", "None"),
    "del_partial_starts_python": (
        "a __del__ that is functools.partial(subprocess.run, ...), called from C",
        "x._dropped = _Dropped()", "functools.partial(subprocess.run, _PYTHON)"),
    "del_drains_a_map": (
        "a __del__ that drains map(subprocess.run, ...) through collections.deque, in C",
        "x._dropped = _Dropped()",
        "functools.partial(collections.deque, map(subprocess.run, [_PYTHON]), 0)"),
    "finalize_renames_into_the_checkout": (
        "a weakref.finalize whose function is os.rename, planting a file in the checkout",
        "open(_MARK + '.src', 'w').write('planted'); "
        "weakref.finalize(x, os.rename, _MARK + '.src', PLANTED)", "None"),
}


def _submission(student: str, mark: str, planted: str) -> Submission:
    what, arm, dropped = ATTACKS[student]
    answer = solutions(ROOT, CHAPTER)["ex04_fused_code"]
    assert WRAPPER + DOCSTRING in answer, "chapter 4's answer changed: update ARMED"
    armed = ARMED.replace("MARK_PATH", repr(mark)).replace("DEL", dropped).replace(
        "ARM", arm.replace("PLANTED", repr(planted)))
    code = answer.replace(WRAPPER + DOCSTRING, armed + WRAPPER + DOCSTRING + "    _arm(x)\n")
    return Submission(student, CHAPTER, what, {"ex04_fused_code": code})


def _verified_with_reports(sub: Submission, tmp_path):
    """verified(sub), and every change and refusal its learner's process reported."""
    from course.verify.verifier import _grading_env, learner_process, verify

    path = tmp_path / sub.chapter / f"{sub.chapter}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(answered(ROOT / "notebooks" / sub.chapter / f"{sub.chapter}.ipynb",
                            solutions(ROOT, sub.chapter) | sub.replaced), path)
    source = source_path(ROOT, sub.chapter)
    first = learner_process(tmp_path / "work", _grading_env(source))
    first.launch()
    verdict = verify(path, source, cell_timeout_s=300, workdir=tmp_path / "work", first=first)
    return verdict, first.tampering


@pytest.mark.parametrize("student", list(ATTACKS))
def test_a_callback_called_on_the_courses_frames_is_not_the_course(student, tmp_path):
    mark = tmp_path / "callback-ran"
    planted = ROOT / f"course-walls-callback-{student}.txt"  # in the checkout: kept
    sub = _submission(student, str(mark), str(planted))
    try:
        verdict, reported = _verified_with_reports(sub, tmp_path)
        ran, moved = mark.exists(), planted.exists()
    finally:
        planted.unlink(missing_ok=True)
    assert not ran and not moved, (sub.what, "ran" if ran else "moved")
    refused = "tried os.rename on" if "rename" in student else "tried starting"
    assert any(r.startswith(refused) and r.endswith("which was refused") for r in reported), \
        (sub.what, reported, verdict.to_json()[:4000])
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got["ex04_fused_correct"] == got["ex04_fused_hidden"] == 0, (sub.what, got)
    assert any(refused in change for note in verdict.tampering for change in note["changes"])


def test_the_control_keeps_its_points(tmp_path):
    """The source's answer, graded the same way: every point (the speed cell needs a GPU)."""
    sub = Submission("control", CHAPTER)
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub, gpu=verdict.mode == "gpu"), verdict.to_json()[:4000]
