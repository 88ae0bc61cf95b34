"""Grading a class in parallel: a worker per GPU on one node (`make autograde GPUS=0,1`),
and shares on a cluster (grader/slurm_autograde.sbatch's array tasks, then `merge`), each
giving the gradebook a one-worker run gives.

The class: chapter 02's correct submission and two of its mistakes (one that raises, one
that ignores the interrupt, its process killed), chapter 04's setattr cheat (checkers replaced:
tampering, scored 0 by the verifier) and chapter 04's correct answers (so that one student
has two chapters, which side by side go together); tests/test_grader.py grades the whole class of
mistakes once. This one is small, for it is graded four times, in four copies of the
course: one worker, two workers (GPUs "0" and "1": in interpreter mode the variable they
set changes nothing else), three Slurm array tasks run one after the other here (the
same script sbatch would run, with Slurm's variables set by hand), and one worker verifying
both chapters side by side (`CHAPTERS_AT_ONCE=2`). Same points, cell by cell. The copies
are made from one course in which the class was released, collected and registered once
(`instructor.py prepare`): what differs between them is the grading.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course import runtime

import pytest

pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

from grader_submissions import (  # noqa: E402  (after the skip above)
    CH04_CHEATS,
    ROOT,
    SHORT_LIMIT_SUBMISSIONS,
    Submission,
    course_for_make,
    write_inbox,
)

CELL_TIMEOUT_S = 20  # every legitimate cell of these chapters takes seconds in the interpreter
CLASS = [s for s in SHORT_LIMIT_SUBMISSIONS if s.chapter == "ch02_roofline"
         and s.student in ("correct", "mistakes_b", "mistakes_d")] + \
    [s for s in CH04_CHEATS if s.student == "setattr"] + [Submission("correct", "ch04_fused")]
CHAPTERS = ("ch02_roofline", "ch04_fused")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(runtime.on_gpu(), reason="interpreter mode: on a GPU node "
                                 "the same commands run with real GPUs (docs/benchmarks.md)")]


def run(root: Path, *command: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(list(command), cwd=root, capture_output=True, text=True,
                          timeout=1800, env=dict(os.environ, **(env or {})))
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def prepare_class(where: Path) -> Path:
    """A copy of the course for `make`, with the class collected, then scanned and
    registered in the gradebook (`instructor.py prepare`); its root."""
    root = course_for_make(ROOT, where / "course", CHAPTERS)
    write_inbox(root, where / "inbox", CLASS)
    run(root, "make", "-s", "collect", f"FROM={where / 'inbox'}")
    run(root, str(root / ".venv" / "bin" / "python"), "grader/instructor.py", "prepare")
    return root


def copy_of(prepared: Path, where: Path) -> Path:
    """A copy of a prepared course (its .venv stays a link to this checkout's)."""
    return Path(shutil.copytree(prepared, where / "course", symlinks=True))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return prepare_class(tmp_path_factory.mktemp("prepared"))


def graded(prepared: Path, where: Path, how: str) -> tuple[Path, str]:
    """A copy of the prepared course, graded `how`; its root and what the grading
    printed."""
    root = copy_of(prepared, where)
    limit = f"CELL_TIMEOUT={CELL_TIMEOUT_S}"
    if how == "one":
        printed = run(root, "make", "-s", "autograde", limit, "CHAPTERS_AT_ONCE=1")
    elif how == "side":  # the chapters verified side by side, timings taking turns
        printed = run(root, "make", "-s", "autograde", limit, "CHAPTERS_AT_ONCE=2")
    elif how == "two":
        printed = run(root, "make", "-s", "autograde", limit, "GPUS=0,1", "CHAPTERS_AT_ONCE=1")
    elif how == "two_side":  # a student's chapters a batch, side by side on its GPU
        printed = run(root, "make", "-s", "autograde", limit, "GPUS=0,1", "CHAPTERS_AT_ONCE=2")
    else:
        python = str(root / ".venv" / "bin" / "python")
        printed = run(root, python, "grader/instructor.py", "prepare")
        for index in range(3):
            printed += run(root, "bash", "grader/slurm_autograde.sbatch",
                           env={"SLURM_ARRAY_TASK_ID": str(index),
                                "SLURM_ARRAY_TASK_COUNT": "3",
                                "SLURM_SUBMIT_DIR": str(root),
                                "CELL_TIMEOUT": str(CELL_TIMEOUT_S)})
        printed += run(root, python, "grader/instructor.py", "merge")
    printed += run(root, "make", "-s", "grades")
    return root, printed


def table(root: Path, name: str, columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    with open(root / "grader" / name, newline="") as handle:
        return sorted(tuple(row[c] for c in columns) for row in csv.DictReader(handle))


@pytest.fixture(scope="module")
def runs(prepared, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """The five gradings, each in a copy of its own, three then two side by side: most of a
    grading's time is spent waiting on the submission that ignores the interrupt, and the
    others fill it."""
    where = {how: tmp_path_factory.mktemp(how)
             for how in ("one", "slurm", "two", "side", "two_side")}
    found = {}
    for group in (("one", "slurm", "two"), ("side", "two_side")):
        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            side_by_side = {how: pool.submit(graded, prepared, where[how], how)
                            for how in group}
            found.update({how: future.result() for how, future in side_by_side.items()})
    return found


@pytest.mark.parametrize("how", ["two", "slurm", "side", "two_side"])
def test_parallel_grading_gives_the_grades_of_one_worker(runs, how):
    one, other = runs["one"][0], runs[how][0]
    columns = ("assignment", "student_id", "raw_score", "score", "max_score")
    assert table(other, "grades.csv", columns) == table(one, "grades.csv", columns)
    cells = ("assignment", "student_id", "grade_id", "points", "status")
    assert table(other, "grades_verdicts.csv", cells) == \
        table(one, "grades_verdicts.csv", cells)
    assert table(one, "grades.csv", ("student_id", "score"))  # not empty


def test_the_class_is_graded_as_the_end_to_end_test_expects(runs):
    got = {(r[0], r[1]): float(r[2]) for r in
           table(runs["one"][0], "grades.csv", ("assignment", "student_id", "score"))}
    assert got[("ch02_roofline", "correct")] == 8.0
    for student in ("mistakes_b", "mistakes_d"):
        # They lose the four functions' 6 points; the ridge exercise before them, answered
        # with the solution, keeps its 2.
        assert got[("ch02_roofline", student)] == 2.0
    assert got[("ch04_fused", "setattr")] == 0.0
    assert got[("ch04_fused", "correct")] > 0.0  # its correctness cells (no GPU here)


def test_two_workers_each_pinned_to_its_gpu(runs):
    root, printed = runs["two"]
    assert "with 2 worker(s), one per GPU (0, 1) ..." in printed
    log = (root / "grader" / "logs" / "autograde_workers.log").read_text()
    assert "[gpu 0] $" in log and "[gpu 1] $" in log
    assert not (root / "grader" / "tasks").exists()  # merged, then removed


def test_two_workers_each_take_a_students_chapters_side_by_side(runs):
    root, printed = runs["two_side"]
    assert "with 2 worker(s), one per GPU (0, 1), 2 chapters of a student at once" in printed
    log = (root / "grader" / "logs" / "autograde_workers.log").read_text()
    # A batch a few students, each with their chapters together: the four students shared
    # evenly between the GPUs (where one worker a GPU takes a batch a chapter, split
    # between the GPUs).
    commands = [line for line in log.splitlines() if line.startswith("[gpu ")]
    assert sorted(re.search(r"--item (.*?) --cell-timeout", c)[1] for c in commands) == \
        ["ch02_roofline correct mistakes_b --item ch04_fused correct",
         "ch02_roofline mistakes_d --item ch04_fused setattr"]
    assert all(c.endswith("--chapters-at-once 2") for c in commands)
    assert not (root / "grader" / "tasks").exists()


def test_merge_names_a_submission_that_no_task_finished(prepared, tmp_path):
    """A task that died before it graded a submission leaves no verdict for it: merge says
    so, and exits 1, and the export scores it 0."""
    root = copy_of(prepared, tmp_path)
    python = str(root / ".venv" / "bin" / "python")
    done = subprocess.run([python, "grader/instructor.py", "merge"], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode == 1
    for sub in CLASS:
        assert f"{sub.key}: NOT VERIFIED (no task graded it" in done.stdout, done.stdout


def test_a_gpu_named_twice_is_refused(prepared, tmp_path):
    root = copy_of(prepared, tmp_path)
    done = subprocess.run(["make", "-s", "autograde", "GPUS=0,0"], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode != 0 and "names a GPU twice" in done.stderr
    assert not (root / "grader" / "tasks").exists() and \
        not (root / "grader" / "autograded").exists()  # refused before anything was graded
