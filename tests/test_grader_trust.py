"""A class that cheats, graded with the instructor's stock commands: `make collect`,
`make autograde`, `make feedback`, `make override`, `make grades`.

The class (tests/grader_submissions.py, CH04_CHEATS) is one honest submission of chapter
04 and one per way of cheating from inside the notebook: the checkers replaced with
setattr or in sys.modules, the comparisons replaced, the clocks patched, a result cached
by the input's address, an exception swallowed with every error hidden, the course's own
kernel called, PyTorch in a grid function or in an int subclass's comparisons, inputs
zeroed where only the hidden cell looks. Run in one Python process with the test cells,
most of them would earn points; graded by the verifier (course.verify; nbgrader runs none
of the cells), each scores 0 on what it targets, and says why, and the honest one keeps
every correctness point.
Interpreter mode: the bandwidth cell needs a GPU and scores 0 for everyone (the GPU run is
in tests/test_grader.py).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from course import runtime

import pytest

nbformat = pytest.importorskip("nbformat", reason="the grader tests need the Jupyter stack")
pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

from grader_submissions import (  # noqa: E402  (after the skips above)
    CH04_BANDWIDTH,
    CH04_CHEATS,
    CH04_CORRECTNESS,
    ROOT,
    TAMPERING,
    copy_course,
    course_for_make,
    write_inbox,
)

CHAPTER = "ch04_fused"
CELL_TIMEOUT_S = 180

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter-mode class; "
                                 "tests/test_grader.py grades bandwidth on a GPU")]


@dataclass
class Graded:
    root: Path
    printed: dict[str, str]   # make target -> what it printed
    scores: dict[str, float] = None      # student -> points in grades.csv, after autograde
    cells: dict[tuple[str, str], dict[str, str]] = None  # (student, cell) -> verdict row

    def csv(self, name: str) -> list[dict[str, str]]:
        with open(self.root / "grader" / name, newline="") as handle:
            return list(csv.DictReader(handle))

    def export(self) -> tuple[dict[str, float], dict[tuple[str, str], dict[str, str]]]:
        """`make grades`: student -> score in grades.csv, and the verdict of every cell."""
        self.printed["grades"] = make(self.root, "grades")
        return ({r["student_id"]: float(r["score"]) for r in self.csv("grades.csv")},
                {(r["student_id"], r["grade_id"]): r for r in self.csv("grades_verdicts.csv")})


def make(root: Path, *args: str) -> str:
    done = subprocess.run(["make", "-s", *args], cwd=root, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, f"make {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def make_course(where: Path) -> Path:
    """A copy of the course as an instructor has it, ready for `make`."""
    return course_for_make(ROOT, where / "course", (CHAPTER,))


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Graded:
    where = tmp_path_factory.mktemp("class")
    root = make_course(where)
    write_inbox(root, where / "inbox", CH04_CHEATS)
    printed = {"collect": make(root, "collect", f"FROM={where / 'inbox'}"),
               "autograde": make(root, "autograde", f"CHAPTERS={CHAPTER}",
                                 f"CELL_TIMEOUT={CELL_TIMEOUT_S}")}
    graded = Graded(root, printed)
    graded.scores, graded.cells = graded.export()
    return graded


def test_the_honest_submission_gets_every_correctness_point(graded):
    got = graded.cells
    for grade_id in CH04_CORRECTNESS:
        assert got[("honest", grade_id)]["status"] == "passed", got[("honest", grade_id)]
    assert got[("honest", CH04_BANDWIDTH)]["points"] == "0"  # no GPU here
    assert graded.scores["honest"] == 6.0


@pytest.mark.parametrize("cheat", [s for s in CH04_CHEATS if s.student != "honest"],
                         ids=lambda s: s.student)
def test_each_cheat_scores_0_on_what_it_targets_and_says_why(graded, cheat):
    for grade_id in cheat.loses:
        row = graded.cells[(cheat.student, grade_id)]
        assert row["points"] == "0", (cheat.what, row)
        assert cheat.reason in row["reason"], (cheat.what, row["reason"])
    kept = [grade_id for grade_id in CH04_CORRECTNESS if grade_id not in cheat.loses]
    # A cheat aimed at one cell (its kernel right elsewhere) keeps the others' points.
    assert all(graded.cells[(cheat.student, g)]["status"] == "passed" for g in kept)
    if not kept:
        assert graded.scores[cheat.student] == 0.0


def test_the_feedback_notebook_holds_the_verifiers_run(graded):
    """nbgrader runs none of the cells: under each test cell is what the verifier's run
    printed and raised, and its points (the setattr cheat's checkers never ran there)."""
    for student, status in (("setattr", "Tampering: "), ("honest", "cases pass")):
        notebook = nbformat.read(graded.root / "grader" / "autograded" / student / CHAPTER /
                                 f"{CHAPTER}.ipynb", as_version=4)
        tests = {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells
                 if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") in
                 CH04_CORRECTNESS}
        assert sorted(tests) == sorted(CH04_CORRECTNESS)
        for cell in tests.values():
            said = "".join(o.get("text", "") + f"{o.get('ename')}: {o.get('evalue')}"
                           for o in cell.outputs)
            assert "NotVerified" not in said and "Verified apart from your code: " in said
            if student == "setattr":
                assert status in said and TAMPERING in said and ": 0 of" in said, said
            else:  # every point of the cell
                assert re.search(r"your code: (\d+) of \1 points", said), said
        if student == "honest":
            first = tests[CH04_CORRECTNESS[0]].outputs[0]
            assert first["name"] == "stdout" and status in first["text"], first


def test_autograde_says_which_submissions_tampered(graded):
    printed = graded.printed["autograde"]
    for student in ("setattr", "modules", "compare", "timer"):
        assert f"  {student}: TAMPERING in ex04_fused_code" in printed, printed
    assert "  honest: verified 6 / 10" in printed


def test_the_feedback_page_says_why_points_were_lost(graded):
    make(graded.root, "feedback", f"CHAPTERS={CHAPTER}")
    page = (graded.root / "grader" / "feedback" / "timer" / CHAPTER / f"{CHAPTER}.html")
    text = page.read_text()
    assert "Verified apart from your code" in text and "time.perf_counter" in text


def test_an_override_is_recorded_with_its_reason_and_reaches_the_grades(graded):
    reason = "reviewed by hand: the patch was a leftover experiment"
    make(graded.root, "override", f"CHAPTER={CHAPTER}", "STUDENT=timer",
         "CELL=ex04_fused_correct", "POINTS=4", f"REASON={reason}")
    try:
        scores, cells = graded.export()
        assert scores["timer"] == 4.0
        row = cells[("timer", "ex04_fused_correct")]
        assert row["status"] == "overridden" and reason in row["reason"]
        recorded = graded.csv("overrides.csv")
        assert [(r["student_id"], r["grade_id"], r["points"], r["reason"])
                for r in recorded] == [("timer", "ex04_fused_correct", "4", reason)]
    finally:
        make(graded.root, "override", f"CHAPTER={CHAPTER}", "STUDENT=timer",
             "CELL=ex04_fused_correct", "REMOVE=1", "REASON=undo")
    assert graded.export()[0]["timer"] == 0.0


def test_an_override_outside_the_cells_points_is_refused(graded):
    done = subprocess.run(["make", "-s", "override", f"CHAPTER={CHAPTER}", "STUDENT=timer",
                           "CELL=ex04_fused_correct", "POINTS=5", "REASON=too many"],
                          cwd=graded.root, capture_output=True, text=True)
    assert done.returncode != 0 and "worth 0 to 4 points, not 5" in done.stderr


def test_a_submission_without_a_verdict_is_exported_as_0(graded):
    """A verifier killed before it wrote a verdict (or a gradebook edited by nbgrader
    alone) leaves no verdict for the notebook collected: it is exported as 0 and named."""
    path = graded.root / "grader" / "verified" / CHAPTER / "honest.json"
    kept = path.read_text()
    path.unlink()
    try:
        scores, _ = graded.export()
        assert "honest/ch04_fused: NOT VERIFIED, exported as 0" in graded.printed["grades"]
        assert scores["honest"] == 0.0
    finally:
        path.write_text(kept)
    assert graded.export()[0]["honest"] == 6.0
    assert json.loads(kept)["sha256"]  # it is the collected notebook's verdict


def test_grading_stops_when_its_own_code_changes_under_it(tmp_path):
    """A submission runs as the user who grades, and could rewrite the checkers or the
    test cells for the students after it: autograde stops and says so."""
    import importlib.util
    import sys

    root = copy_course(ROOT, tmp_path / "course", (CHAPTER,))
    spec = importlib.util.spec_from_file_location("instructor_stamp_under_test",
                                                  root / "grader" / "instructor.py")
    instructor = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = instructor  # dataclasses look their module up while it loads
    spec.loader.exec_module(instructor)
    course = instructor.Course.at(root)
    before = instructor.code_stamp(course)
    assert any(name.endswith("course/check/runner.py") for name in before)
    instructor.check_code_stamp(course, before, "nothing")  # unchanged: no error
    source = root / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
    source.write_text(source.read_text().replace("check.rmsnorm_forward(rmsnorm)", "pass"))
    with pytest.raises(instructor.GraderError, match=f"changed while the test ran: .*{CHAPTER}"):
        instructor.check_code_stamp(course, before, "the test")
