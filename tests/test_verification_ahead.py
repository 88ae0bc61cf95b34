"""start_chapter starts the verifier before nbgrader runs the chapter (its start, torch and
the first learner's process, then overlaps nbgrader's run), and the verifier runs nothing
of a submission until nbgrader is done and the code stamp checked: a grading that stops
there leaves no verifier behind and no verdict. A tiny chapter in tmp_path; nbgrader is
stood in for (what it does is tested end to end in tests/test_grader.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

import nbformat  # noqa: E402
from grader_submissions import load_instructor  # noqa: E402  (after the skip above)

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "ch99_small"

pytestmark = pytest.mark.slow  # it starts the verifier and a learner's process


def _cell(source: str, grade_id: str, **nbgrader):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": grade_id, "schema_version": 3, "locked": False,
                                 "solution": False, "grade": False, **nbgrader}
    return cell


def _notebook(answer: str):
    return nbformat.v4.new_notebook(cells=[
        _cell("import torch", "imports"),
        _cell(answer, "ex01_add_code", solution=True),
        _cell("assert add(2, 3) == 5", "ex01_add", grade=True, points=2, locked=True),
    ])


@pytest.fixture
def setup(tmp_path):
    instructor = load_instructor(ROOT, "instructor_verification_ahead")
    root = tmp_path / "course"
    (root / "grader").mkdir(parents=True)
    (root / "solutions" / CHAPTER).mkdir(parents=True)
    nbformat.write(_notebook("def add(a, b):\n    return a + b\n"),
                   root / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    ran = tmp_path / "the submission ran"
    submitted = root / "submitted" / "alice" / CHAPTER / f"{CHAPTER}.ipynb"
    submitted.parent.mkdir(parents=True)
    nbformat.write(_notebook(f"import pathlib\npathlib.Path({str(ran)!r}).touch()\n"
                             "def add(a, b):\n    return a + b\n"), submitted)
    course = instructor.Course(root, root / "submitted", root / "autograded",
                               root / "feedback", f"sqlite:///{root / 'gradebook.db'}", "test")
    started = []

    class Recorded(instructor.Verification):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    instructor.Verification = Recorded
    return instructor, course, submitted, ran, started


def _grade(instructor, course):
    stamp = instructor.code_stamp(course)
    started = instructor.start_chapter(course, CHAPTER, ["alice"], force=False,
                                       cell_timeout_s=60, per_student=False, stamp=stamp)
    return instructor.finish_chapter(course, started, stamp)


def test_the_verifier_is_started_before_nbgrader_and_waits_for_it(setup):
    instructor, course, submitted, ran, started = setup
    seen = {}

    def nbgrader(course, chapter, names, **_):
        # nbgrader running: the verifier is up, and has run nothing of the submission
        seen["verifier running"] = len(started) == 1 and started[0].process.poll() is None
        seen["submission ran"] = ran.exists()
        out = course.autograded_notebook("alice", chapter)
        out.parent.mkdir(parents=True)
        shutil.copy(submitted, out)
        return list(names), [], course.logs / "autograde.log"

    instructor._nbgrader_autograde = nbgrader
    graded = _grade(instructor, course)
    assert seen == {"verifier running": True, "submission ran": False}
    cells = graded.verdicts["alice"]["cells"]
    assert [(c["grade_id"], c["points"]) for c in cells] == [("ex01_add", 2)] and ran.exists()
    assert started[0].process.returncode == 0


def test_a_grading_stopped_during_nbgrader_leaves_no_verifier_and_no_verdict(setup):
    instructor, course, submitted, ran, started = setup

    def nbgrader(course, chapter, names, **_):
        raise instructor.GraderError("nbgrader stopped")

    instructor._nbgrader_autograde = nbgrader
    with pytest.raises(instructor.GraderError, match="nbgrader stopped"):
        _grade(instructor, course)
    assert len(started) == 1 and started[0].process.poll() is not None  # killed, reaped
    assert not ran.exists()
    assert instructor.current_verdict(course, CHAPTER, "alice") is None
    assert "stopped before it began" in (course.logs / f"verify_{CHAPTER}.log").read_text()


SECOND = "ch98_small"


def _second_chapter(course) -> None:
    """A copy of the chapter, under another name."""
    shutil.copytree(course.root / "solutions" / CHAPTER, course.root / "solutions" / SECOND)
    (course.root / "solutions" / SECOND / f"{CHAPTER}.ipynb").rename(
        course.root / "solutions" / SECOND / f"{SECOND}.ipynb")


def test_the_next_chapter_is_recorded_while_this_one_is_verified(setup):
    """autograde runs the next chapter's nbgrader (and starts its verifier) while this
    chapter's verifier runs, and that verifier runs nothing of its submission until this
    chapter's points are in."""
    instructor, course, submitted, ran, started = setup
    # The first submission's code waits until the second chapter's nbgrader has run: graded
    # one chapter after the other, it would give up and define nothing.
    recorded = ran.with_name("the second chapter was recorded")
    nbformat.write(_notebook(
        f"import pathlib, time\nfor _ in range(300):\n"
        f"    if pathlib.Path({str(recorded)!r}).exists():\n        break\n"
        f"    time.sleep(0.1)\nelse:\n    raise RuntimeError('not overlapped')\n"
        f"pathlib.Path({str(ran)!r}).touch()\ndef add(a, b):\n    return a + b\n"), submitted)
    _second_chapter(course)
    ran_second = ran.with_name("the second submission ran")
    second = course.submitted / "alice" / SECOND / f"{SECOND}.ipynb"
    second.parent.mkdir(parents=True)
    nbformat.write(_notebook(f"import pathlib\npathlib.Path({str(ran_second)!r}).touch()\n"
                             "def add(a, b):\n    return a + b\n"), second)
    seen = []

    def nbgrader(course, chapter, names, **_):
        if chapter == SECOND:  # the first chapter's verifier was told to go, and runs
            seen.append(("first told to go", started[0].process.stdin.closed))
            seen.append(("second's verifier waits", started[1].process.poll() is None))
            recorded.touch()
        out = course.autograded_notebook("alice", chapter)
        out.parent.mkdir(parents=True)
        shutil.copy(course.submitted / "alice" / chapter / f"{chapter}.ipynb", out)
        return list(names), [], course.logs / "autograde.log"

    def points(course, chapters):
        seen.append((f"points of {chapters[0]}", ran.exists(), ran_second.exists()))
        return []

    instructor._nbgrader_autograde = nbgrader
    instructor.apply_verdicts = points
    instructor.prepare = lambda *args, **kwargs: instructor.Plan(
        {CHAPTER: ["alice"], SECOND: ["alice"]}, {}, "flags.csv", False)
    runs = instructor.autograde(course, cell_timeout_s=60, at_once=1, say=lambda line: None)
    assert seen == [("first told to go", True), ("second's verifier waits", True),
                    (f"points of {CHAPTER}", True, False), (f"points of {SECOND}", True, True)]
    assert [run.chapter for run in runs] == [CHAPTER, SECOND]
    for chapter in (CHAPTER, SECOND):
        verdict = instructor.current_verdict(course, chapter, "alice")
        assert [(c["grade_id"], c["points"]) for c in verdict["cells"]] == [("ex01_add", 2)]


def test_a_next_chapter_that_cannot_be_recorded_lets_this_one_finish_first(setup):
    instructor, course, submitted, ran, started = setup
    _second_chapter(course)
    applied = []

    def nbgrader(course, chapter, names, **_):
        if chapter == SECOND:
            raise instructor.GraderError("nbgrader stopped")
        out = course.autograded_notebook("alice", chapter)
        out.parent.mkdir(parents=True)
        shutil.copy(submitted, out)
        return list(names), [], course.logs / "autograde.log"

    instructor._nbgrader_autograde = nbgrader
    instructor.apply_verdicts = lambda course, chapters: applied.extend(chapters)
    instructor.prepare = lambda *args, **kwargs: instructor.Plan(
        {CHAPTER: ["alice"], SECOND: ["alice"]}, {}, "flags.csv", False)
    with pytest.raises(instructor.GraderError, match="nbgrader stopped"):
        instructor.autograde(course, cell_timeout_s=60, at_once=1, say=lambda line: None)
    assert applied == [CHAPTER] and ran.exists()
    verdict = instructor.current_verdict(course, CHAPTER, "alice")
    assert [(c["grade_id"], c["points"]) for c in verdict["cells"]] == [("ex01_add", 2)]
    assert len(started) == 2 and started[1].process.poll() is not None  # stopped, reaped


def test_a_students_chapters_go_side_by_side_and_the_next_student_waits(setup):
    """With two chapters at once, alice's two chapters verify side by side, and bob's start
    only when both of alice's are done: no submission's code runs beside another student's
    timings."""
    instructor, course, submitted, ran, started = setup
    _second_chapter(course)
    answer = _notebook("def add(a, b):\n    return a + b\n")
    for student, chapter in (("alice", SECOND), ("bob", CHAPTER), ("bob", SECOND)):
        path = course.submitted / student / chapter / f"{chapter}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(answer, path)
    events = []
    recorded = instructor.Verification

    class Watched(recorded):
        def go(self):
            if self.process is not None and not self.process.stdin.closed:
                events.append(("go", self.chapter, *self.students))
            super().go()

        def finish(self):
            verdicts = super().finish()
            events.append(("done", self.chapter, *self.students))
            return verdicts

    def nbgrader(course, chapter, names, **_):
        events.append(("recorded", chapter, *names))
        for student in names:
            out = course.autograded_notebook(student, chapter)
            out.parent.mkdir(parents=True)
            shutil.copy(course.submitted / student / chapter / f"{chapter}.ipynb", out)
        return list(names), [], course.logs / "autograde.log"

    instructor.Verification = Watched
    instructor._nbgrader_autograde = nbgrader
    instructor.apply_verdicts = lambda course, chapters: []
    instructor.prepare = lambda *args, **kwargs: instructor.Plan(
        {CHAPTER: ["alice", "bob"], SECOND: ["alice", "bob"]}, {}, "flags.csv", False)
    runs = instructor.autograde(course, cell_timeout_s=60, at_once=2, say=lambda line: None)
    # Each chapter told to go as soon as it is recorded; one more recorded and waiting.
    assert events == [("recorded", CHAPTER, "alice"), ("go", CHAPTER, "alice"),
                      ("recorded", SECOND, "alice"), ("go", SECOND, "alice"),
                      ("recorded", CHAPTER, "bob"),
                      ("done", CHAPTER, "alice"), ("done", SECOND, "alice"),
                      ("go", CHAPTER, "bob"), ("recorded", SECOND, "bob"),
                      ("go", SECOND, "bob"), ("done", CHAPTER, "bob"), ("done", SECOND, "bob")]
    assert [(run.chapter, run.students) for run in runs] == [
        (CHAPTER, ["alice"]), (SECOND, ["alice"]), (CHAPTER, ["bob"]), (SECOND, ["bob"])]
    for chapter in (CHAPTER, SECOND):
        for student in ("alice", "bob"):
            verdict = instructor.current_verdict(course, chapter, student)
            assert [(c["grade_id"], c["points"]) for c in verdict["cells"]] == [("ex01_add", 2)]


def test_a_students_chapters_start_longest_first(tmp_path):
    """Each chapter's nbgrader call runs before its verifier goes, one after another: the
    chapter that takes longest to verify (the mean of its verdicts on file) starts first,
    and chapters never verified yet before any, the later ones first."""
    instructor = load_instructor(ROOT, "instructor_longest_first")
    course = instructor.Course(root=tmp_path, submitted=tmp_path / "submitted",
                               autograded=tmp_path / "autograded",
                               feedback=tmp_path / "feedback", course_id="course",
                               db_url=f"sqlite:///{tmp_path / 'gradebook.db'}")
    for chapter, times in (("ch02_b", [30, 50]), ("ch03_c", [10]), ("ch05_e", [45, "x"])):
        for k, seconds in enumerate(times):
            path = instructor.verdict_path(course, chapter, f"student{k}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"seconds": seconds}))
    (tmp_path / "grader" / "verified" / "ch03_c" / "broken.json").write_text("{")
    chapters = ["ch01_a", "ch02_b", "ch03_c", "ch04_d", "ch05_e"]
    assert instructor.longest_first(course, chapters) == [
        "ch04_d", "ch01_a", "ch05_e", "ch02_b", "ch03_c"]
    todo = {"ch02_b": ["bob", "alice"], "ch03_c": ["alice"], "ch04_d": ["bob"]}
    assert instructor.one_student_at_a_time(instructor.longest_first_todo(course, todo)) == [
        ("ch04_d", ["bob"]), ("ch02_b", ["bob"]), ("ch02_b", ["alice"]), ("ch03_c", ["alice"])]


@pytest.mark.parametrize("cores, gpus, expected", [
    (2, 1, 1), (16, 1, 8), (64, 1, 8), (16, 2, 4), (32, 2, 8), (32, 4, 4), (8, 8, 1)])
def test_the_cores_are_shared_among_the_gpus_before_the_cap_of_eight(monkeypatch, cores,
                                                                       gpus, expected):
    # A verifier and a learner's process a chapter, about two cores: a 32-core host with
    # two GPUs verifies 8 chapters on each (it verified 4 when the cap came first).
    instructor = load_instructor(ROOT, "instructor_chapters_at_once")
    monkeypatch.setattr(instructor.os, "cpu_count", lambda: cores)
    assert instructor.chapters_at_once(gpus) == expected


def test_a_lock_file_held_by_something_else_costs_the_cells_not_a_hang(setup):
    """A submission's process runs as the grading user and can find its student's lock
    file and hold it: the verifier waits no longer than a cell's time limit, scores the
    cells lost, and ends."""
    import fcntl
    import os
    import time

    instructor, course, submitted, ran, started = setup
    instructor._nbgrader_autograde = lambda course, chapter, names, **_: (
        list(names), [], course.logs / "autograde.log")
    lock = instructor.gpu_lock_file("alice")
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as an outsider would, before the chapter begins
    try:
        stamp = instructor.code_stamp(course)
        began = time.monotonic()
        chapter = instructor.start_chapter(course, CHAPTER, ["alice"], force=False,
                                           cell_timeout_s=3, per_student=True, stamp=stamp,
                                           gpu_lock=lock)
        verdicts = chapter.verification.finish()
        assert time.monotonic() - began < 60
    finally:
        os.close(holder)
    verdict = verdicts["alice"]
    assert [(c["grade_id"], c["points"], c["status"]) for c in verdict["cells"]] == [
        ("ex01_add", 0, "lost")]
    assert "not free within 3 s" in verdict["lost"][0] and not ran.exists()


@pytest.mark.parametrize("students, gpus, expected", [
    (1, 2, 1), (4, 2, 2), (6, 2, 3), (7, 2, 4), (200, 2, 8), (3, 4, 1)])
def test_a_task_takes_the_class_shared_evenly_among_the_gpus_up_to_eight(students, gpus,
                                                                        expected):
    instructor = load_instructor(ROOT, "instructor_students_per_task")
    assert instructor.students_per_task(students, gpus) == expected
