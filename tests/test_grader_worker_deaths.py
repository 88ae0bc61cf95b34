"""Grading on several GPUs (`make autograde GPUS=0,1`) when a worker dies: a batch whose
`instructor.py task` process dies goes back in the queue as single submissions, less those
it finished; a single one that dies again scores 0 and is listed as NOT GRADED; the other
worker carries on, and the gradebook holds every submission once, whole.

The deaths are real: the worker's real task process, started by `autograde_on_gpus`
through its `_start_task`, is SIGKILLed (with its whole process group: nbgrader too) at a
chosen point by a small launcher that this test puts in front of the command. No GPU: GPUs
"0" and "1" only set CUDA_VISIBLE_DEVICES, which changes nothing in interpreter mode (as in
tests/test_grader_workers.py). The class is five chapter-02 submissions (its cells take
seconds in the interpreter), split by the workers into the batches [a, c, e] and [b, d]:

- [a, c, e] dies while nbgrader runs c, after nbgrader graded a (into that worker's own
  gradebook); its GPU then stops answering (the probe `_gpu_answers` is stood in for: there
  is no GPU to fault), so that worker takes no more work;
- the other worker grades [b, d], then a, c and e one at a time: a anew (nbgrader's grades
  of it went down with the dead worker's gradebook), and c although nbgrader had begun it
  (its folder under autograded/);
- a, on its own, is graded, writes its results, and then its process dies: it is kept, not
  graded again;
- e's process dies every time, once its nbgrader has begun: e scores 0, NOT GRADED.

The points expected are `expected_points`, the points tests/test_grader.py checks a
one-worker run (`make autograde`) gives, cell by cell, for the same submissions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from course import runtime

import pytest

pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

from grader_submissions import (  # noqa: E402  (after the skip above)
    ROOT,
    SHORT_LIMIT_SUBMISSIONS,
    course_for_make,
    expected_points,
    graded_cells,
    load_instructor,
    write_inbox,
)

CHAPTER = "ch02_roofline"
CELL_TIMEOUT_S = 10  # every legitimate cell of chapter 02 takes seconds in the interpreter
_CORRECT, _RAISES = (next(s for s in SHORT_LIMIT_SUBMISSIONS
                          if s.chapter == CHAPTER and s.student == name)
                     for name in ("correct", "mistakes_b"))
CLASS = {name: dataclasses.replace(sub, student=name) for name, sub in
         (("a", _CORRECT), ("b", _CORRECT), ("c", _CORRECT), ("d", _RAISES),
          ("e", _CORRECT))}
ALWAYS_DIES = "e"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(runtime.on_gpu(), reason="interpreter mode: GPUS=0,1 are "
                                 "labels here; on a GPU node they would be real GPUs")]

# Runs a worker's command, and SIGKILLs its whole process group (the task, its nbgrader,
# this launcher) once `when` holds: a path exists, or the task's results list students. A
# task that ended first is killed all the same if `when` holds by then (it died on its way
# out, after writing its results).
LAUNCHER = """\
import json, os, signal, subprocess, sys, time
when, command = json.loads(sys.argv[1]), sys.argv[2:]
def due():
    if "exists" in when:
        return os.path.exists(when["exists"])
    try:
        with open(when["results"]) as handle:
            listed = {r["student"] for r in json.load(handle) if r["chapter"] == when["chapter"]}
    except (OSError, ValueError):
        return False
    return set(when["students"]) <= listed
task = subprocess.Popen(command)
while task.poll() is None and not due():
    time.sleep(0.05)
if due():
    os.killpg(0, signal.SIGKILL)
sys.exit(task.returncode)
"""


@dataclasses.dataclass
class Graded:
    instructor: object
    course: object
    printed: list[str]
    started: list[tuple[str, list[str]]]  # (gpu, students) of every task process started


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Graded:
    where = tmp_path_factory.mktemp("worker_deaths")
    root = course_for_make(ROOT, where / "course", (CHAPTER,))
    write_inbox(root, where / "inbox", list(CLASS.values()))
    instructor = load_instructor(root, "instructor_worker_deaths")
    course = instructor.Course.at(root)
    instructor.collect(course, where / "inbox")
    started: list[tuple[str, list[str]]] = []
    real_start = instructor._start_task

    def start_task(course, command, gpu):
        chapter = command[command.index("--item") + 1]
        students = command[command.index("--item") + 2:command.index("--cell-timeout")]
        started.append((gpu, students))
        folder = Path(command[command.index("--task-dir") + 1])
        if ALWAYS_DIES in students:  # dies once nbgrader has begun e, or c in [a, c, e]
            cut = ALWAYS_DIES if students == [ALWAYS_DIES] else students[1]
            when = {"exists": str(course.autograded_notebook(cut, chapter).parent)}
        elif students == ["a"]:  # dies after it finished: its results are written
            when = {"results": str(folder / "results.json"), "chapter": chapter,
                    "students": students}
        else:
            return real_start(course, command, gpu)
        return real_start(course, [sys.executable, "-c", LAUNCHER, json.dumps(when), *command],
                          gpu)

    def gpu_answers(gpu):  # the GPU that ran [a, c, e] faulted with it
        return ["a", "c", "e"] not in [names for g, names in started if g == gpu]

    printed: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(instructor, "_start_task", start_task)
        patch.setattr(instructor, "_gpu_answers", gpu_answers)
        instructor.autograde(course, [CHAPTER], gpus=["0", "1"], cell_timeout_s=CELL_TIMEOUT_S,
                             at_once=1, say=printed.append)
    return Graded(instructor, course, printed, started)


def _gradebook(graded: Graded) -> dict[str, list[dict[str, float]]]:
    """student -> the grades of each notebook of their submission of CHAPTER."""
    from nbgrader.api import Gradebook

    course = graded.course
    with Gradebook(course.db_url, course.course_id) as gb:
        return {s.student_id: [{g.name: g.score for g in nb.grades} for nb in s.notebooks]
                for s in gb.assignment_submissions(CHAPTER)}


def test_a_batch_that_dies_is_graded_again_one_submission_at_a_time(graded):
    by_gpu: dict[str, list[list[str]]] = {}
    for gpu, students in graded.started:
        by_gpu.setdefault(gpu, []).append(students)
    dead = next(gpu for gpu, batches in by_gpu.items() if ["a", "c", "e"] in batches)
    (other,) = set(by_gpu) - {dead}
    # [a, c, e] died, and its GPU with it; the other worker took each of them on its own
    # after its batch; a then died after finishing, and was not graded again.
    assert by_gpu == {dead: [["a", "c", "e"]], other: [["b", "d"], ["a"], ["c"], ["e"]]}
    assert f"  GPU {dead} no longer answers after {CHAPTER}/a,c,e: its worker stops, the " \
        "others take the rest" in graded.printed
    got = _gradebook(graded)
    for name in ("a", "b", "c", "d"):
        assert got[name] == [expected_points(ROOT, CLASS[name])], name
        verdict = graded.instructor.current_verdict(graded.course, CHAPTER, name)
        assert {c["grade_id"]: c["points"] for c in verdict["cells"]} == \
            expected_points(ROOT, CLASS[name]), name
        assert graded.course.autograded_notebook(name, CHAPTER).is_file()
    # The verifier's points, and why: d's mistake, not a dead worker.
    assert "bytes_per_sec" in json.dumps(
        graded.instructor.current_verdict(graded.course, CHAPTER, "d"))
    for name in ("a", "b", "c", "d"):
        assert not [line for line in graded.printed if line.startswith(f"  {name}: NOT ")]


def test_a_submission_whose_worker_always_dies_scores_0_and_is_named(graded):
    lines = [line for line in graded.printed
             if line.startswith(f"  {ALWAYS_DIES}: NOT GRADED: its worker")]
    assert len(lines) == 1 and re.fullmatch(
        rf"  {ALWAYS_DIES}: NOT GRADED: its worker on GPU [01] ended with status -9 \(log: "
        r"grader/logs/autograde_workers\.log\)", lines[0]), graded.printed
    # its own reason only: nbgrader's "could not run to the end" line is not about it
    assert not [line for line in graded.printed
                if line.startswith(f"  {ALWAYS_DIES}: NOT GRADED by nbgrader")], graded.printed
    assert _gradebook(graded)[ALWAYS_DIES] == [
        {cell: 0.0 for cell in graded_cells(ROOT, CHAPTER)}]
    assert graded.instructor.current_verdict(graded.course, CHAPTER, ALWAYS_DIES) is None
    # Nothing half-done of it is left behind: `make autograde STUDENTS=e` grades it afresh.
    assert not graded.course.autograded_notebook(ALWAYS_DIES, CHAPTER).parent.exists()


def test_the_gradebook_holds_each_submission_once_and_whole(graded):
    got = _gradebook(graded)
    assert sorted(got) == sorted(CLASS)
    cells = set(graded_cells(ROOT, CHAPTER))
    for name, notebooks in got.items():
        assert len(notebooks) == 1 and set(notebooks[0]) == cells, name
    rows = graded.instructor.cell_grades(graded.course)
    keys = [(r.chapter, r.student, r.grade_id) for r in rows]
    assert len(keys) == len(set(keys)) == len(CLASS) * len(cells)
    grader_dir = graded.course.grader_dir
    assert not (grader_dir / "tasks").exists()  # every task merged, then removed
    assert not list(grader_dir.rglob("*.partial"))
    log = (grader_dir / "logs" / "autograde_workers.log").read_text()
    assert "[gpu 0] $" in log and "[gpu 1] $" in log
