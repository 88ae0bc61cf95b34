"""`course grade NOTEBOOK`: a learner's notebook graded as the autograder grades it.

Most tests use a tiny chapter made here (ch09_tiny: a function to write, a visible and a
hidden test cell), so that a kernel runs in a second or two; one grades a real chapter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from course import grade
from course.grade import NotAChapterError, grade_notebook

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]


def _meta(grade_id: str, *, solution: bool = False, points: float | None = None) -> dict:
    meta = {"grade": points is not None, "grade_id": grade_id, "locked": not solution,
            "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


SOLUTION = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION\n"
VISIBLE = 'assert add(1, 2) == 3, "add(1, 2) should be 3"\nprint("add passes")\n'
HIDDEN = ('# Hidden tests\n### BEGIN HIDDEN TESTS\nassert add(-1, 1) == 0, "add(-1, 1) should '
          'be 0"\n### END HIDDEN TESTS\n')
# The autograder's environment: nbgrader's marker, and the one with which the course's
# bandwidth checkers fail without a GPU instead of skipping.
GRADING_ENV = ('import os\nassert os.environ.get("NBGRADER_EXECUTION") == "autograde", '
               '"not run as the autograder runs it"\n'
               'assert os.environ.get("COURSE_GRADING") == "1", "bandwidth would be skipped"\n')


def _chapter(cells: list) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def _source() -> nbformat.NotebookNode:
    return _chapter([
        new_markdown_cell("# 09 · tiny"),
        new_code_cell("import sys"),
        new_code_cell(SOLUTION, metadata=_meta("ex09_add_code", solution=True)),
        new_code_cell(VISIBLE, metadata=_meta("ex09_add", points=2)),
        new_code_cell(HIDDEN, metadata=_meta("ex09_add_hidden", points=1)),
        new_code_cell(GRADING_ENV, metadata=_meta("ex09_env", points=1)),
    ])


def learner(answer: str, *, edit=None) -> nbformat.NotebookNode:
    """The released ch09_tiny (hidden tests removed) with `answer` in the exercise cell."""
    nb = _source()
    nb.cells[2].source = answer
    nb.cells[4].source = "# Hidden tests\n"
    if edit is not None:
        edit(nb)
    return nb


@pytest.fixture(scope="module")
def course_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("course")
    (root / "solutions" / "ch09_tiny").mkdir(parents=True)
    nbformat.write(_source(), root / "solutions" / "ch09_tiny" / "ch09_tiny.ipynb")
    (root / "grader").mkdir()
    shutil.copy2(ROOT / "grader" / "nbgrader_config.py", root / "grader")
    return root


def _write(tmp_path: Path, nb, name: str = "ch09_tiny.ipynb") -> Path:
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def _scores(report) -> dict[str, tuple[float | None, str]]:
    return {s.grade_id: (s.points, s.status) for s in report.scores}


def test_a_correct_notebook_gets_every_point_with_the_hidden_tests_run(course_root, tmp_path):
    report = grade_notebook(_write(tmp_path, learner("def add(a, b):\n    return a + b\n")),
                            course_root=course_root)
    assert _scores(report) == {"ex09_add": (2, "passed"), "ex09_add_hidden": (1, "passed"),
                               "ex09_env": (1, "passed")}
    assert report.full_marks and (report.points, report.max_points) == (4, 4)
    table = report.table()
    assert "graded as chapter ch09_tiny" in table
    assert "total" in table and "4 / 4" in table


def test_a_wrong_answer_loses_its_tests_with_the_first_line_of_each_failure(course_root,
                                                                           tmp_path):
    report = grade_notebook(_write(tmp_path, learner("def add(a, b):\n    return a - b\n")),
                            course_root=course_root)
    by_id = {s.grade_id: s for s in report.scores}
    assert by_id["ex09_add"].points == 0
    assert by_id["ex09_add"].failure == "AssertionError: add(1, 2) should be 3"
    assert by_id["ex09_add_hidden"].points == 0  # the hidden test ran: -1 - 1 != 0
    assert by_id["ex09_add_hidden"].failure == "AssertionError: add(-1, 1) should be 0"
    assert by_id["ex09_env"].points == 1
    assert not report.full_marks and report.points == 1
    assert "failed: AssertionError: add(1, 2) should be 3" in report.table()


def test_edited_and_invented_test_cells_are_replaced_or_ignored(course_root, tmp_path):
    def cheat(nb):
        nb.cells[3].source = "pass  # the learner emptied the visible test"
        nb.cells.append(new_code_cell("pass", metadata=_meta("ex09_bonus", points=100)))

    report = grade_notebook(_write(tmp_path, learner("def add(a, b):\n    return 0\n",
                                                     edit=cheat)), course_root=course_root)
    assert _scores(report)["ex09_add"] == (0, "failed")
    assert "ex09_bonus" not in _scores(report) and report.max_points == 4


def test_a_deleted_test_cell_scores_zero_and_says_so(course_root, tmp_path):
    def delete_hidden(nb):
        del nb.cells[4]

    report = grade_notebook(_write(tmp_path, learner("def add(a, b):\n    return a + b\n",
                                                     edit=delete_hidden)),
                            course_root=course_root)
    hidden = next(s for s in report.scores if s.grade_id == "ex09_add_hidden")
    assert (hidden.points, hidden.status) == (0, "missing")
    assert "copy it back" in hidden.failure


def test_output_on_stderr_fails_a_test_cell_as_in_nbgrader(course_root, tmp_path):
    noisy = ("import sys\n\n\ndef add(a, b):\n    print('debug', file=sys.stderr)\n"
             "    return a + b\n")
    report = grade_notebook(_write(tmp_path, learner(noisy)), course_root=course_root)
    by_id = {s.grade_id: s for s in report.scores}
    assert by_id["ex09_add"].points == 0
    assert by_id["ex09_add"].failure.startswith("wrote to stderr")
    assert by_id["ex09_env"].points == 1  # does not call add


def test_a_hanging_cell_is_stopped_at_the_time_limit_and_the_rest_still_runs(course_root,
                                                                          tmp_path):
    loop = "def add(a, b):\n    while True:\n        pass\n"
    report = grade_notebook(_write(tmp_path, learner(loop)), course_root=course_root,
                            cell_timeout_s=3)
    by_id = {s.grade_id: s for s in report.scores}
    assert by_id["ex09_add"].failure == "CellTimeoutError: stopped after 3 s"
    assert by_id["ex09_add_hidden"].failure == "CellTimeoutError: stopped after 3 s"
    assert by_id["ex09_env"].points == 1 and report.aborted is None


def test_a_cell_that_ignores_the_interrupt_is_killed_and_scores_the_chapter_zero(course_root,
                                                                              tmp_path):
    deaf = ("import signal\n\n\ndef add(a, b):\n    signal.signal(signal.SIGINT, "
            "signal.SIG_IGN)\n    while True:\n        pass\n")
    report = grade_notebook(_write(tmp_path, learner(deaf)), course_root=course_root,
                            cell_timeout_s=2)
    assert report.aborted is not None and "its kernel was killed" in report.aborted
    assert "cell 4" in report.aborted  # the visible test cell, counted from 1
    assert report.points == 0 and {s.status for s in report.scores} == {"not graded"}
    assert "scores the whole chapter 0" in report.table()


def test_files_that_are_not_chapters_are_refused_with_the_reason(course_root, tmp_path):
    text = tmp_path / "notes.ipynb"
    text.write_text("these are my notes")
    with pytest.raises(NotAChapterError, match="not a Jupyter notebook"):
        grade_notebook(text, course_root=course_root)
    with pytest.raises(NotAChapterError, match="no such file"):
        grade_notebook(tmp_path / "missing.ipynb", course_root=course_root)
    plain = _write(tmp_path, _chapter([new_code_cell("1 + 1")]), "plain.ipynb")
    with pytest.raises(NotAChapterError, match="has no graded exercise cells"):
        grade_notebook(plain, course_root=course_root)

    def other_chapter(nb):
        nb.cells[3].metadata = _meta("ex05_add", points=2)

    mixed = _write(tmp_path, learner("", edit=other_chapter), "mixed.ipynb")
    with pytest.raises(NotAChapterError, match="do not belong to one chapter"):
        grade_notebook(mixed, course_root=course_root)
    unknown = _write(tmp_path, _chapter([new_code_cell("pass", metadata=_meta(
        "ex07_x", points=1))]), "seven.ipynb")
    with pytest.raises(NotAChapterError, match="no source notebook for chapter 07"):
        grade_notebook(unknown, course_root=course_root)
    stranger = _write(tmp_path, _chapter([new_code_cell("pass", metadata=_meta(
        "ex09_other", points=1))]), "stranger.ipynb")
    with pytest.raises(NotAChapterError, match="is not that chapter's notebook"):
        grade_notebook(stranger, course_root=course_root)
    with pytest.raises(NotAChapterError, match="no solutions/ folder"):
        grade_notebook(_write(tmp_path, learner("")), course_root=tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="above 0 s"):
        grade_notebook(_write(tmp_path, learner("")), course_root=course_root,
                       cell_timeout_s=0)


def _course_grade(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "course", "grade", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_command_exits_0_on_full_marks_1_on_lost_points_2_on_a_stranger(course_root,
                                                                          tmp_path):
    right = _write(tmp_path, learner("def add(a, b):\n    return a + b\n"), "right.ipynb")
    wrong = _write(tmp_path, learner("def add(a, b):\n    return 3\n"), "wrong.ipynb")
    done = _course_grade(str(right), "--course", str(course_root))
    assert done.returncode == 0, done.stderr
    assert "4 / 4" in done.stdout
    done = _course_grade(str(wrong), "--course", str(course_root))
    assert done.returncode == 1, done.stderr
    assert "failed: AssertionError: add(-1, 1) should be 0" in done.stdout
    done = _course_grade(str(ROOT / "README.md"))
    assert done.returncode == 2 and "course grade:" in done.stderr
    assert "not a Jupyter notebook" in done.stderr


@pytest.mark.slow
def test_a_real_chapter_answered_with_its_solutions_gets_every_point(tmp_path):
    """The released ch02 with the source's answers, graded against the repository's
    solutions/ (the default course root), hidden tests included."""
    chapter = "ch02_roofline"
    source = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    released = nbformat.read(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    for cell in released.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = answers[meta["grade_id"]]
    report = grade_notebook(_write(tmp_path, released, f"{chapter}.ipynb"))
    assert grade.DEFAULT_COURSE_ROOT == ROOT
    assert {s.grade_id: s.points for s in report.scores} == {
        "ex02_ridge_point": 2, "ex02_roofline_functions": 4,
        "ex02_roofline_functions_hidden": 2}
    assert report.chapter == chapter and report.full_marks


# ---------------------------------------------------------------- what the learner reads (#34)


def _score(grade_id: str, status: str, points: float, max_points: float, message: str = "",
           traceback: str = "") -> grade.CellScore:
    failure = message.splitlines()[0] if message and status == "failed" else ""
    return grade.CellScore(grade_id, max_points, points, status, failure, message, traceback)


def _report(*scores: grade.CellScore) -> grade.GradeReport:
    return grade.GradeReport(Path("ch04_fused.ipynb"), "ch04_fused", list(scores), 1.0,
                             "interpreter")


def test_a_failed_cells_whole_message_is_printed_a_screenful_unless_verbose():
    lines = [f"advice line {i}" for i in range(grade.SCREEN_LINES + 12)]
    long = _score("ex04_fused_correct", "failed", 0, 4,
                  "AssertionError: rmsnorm_forward check failed.\n\n" + "\n".join(lines))
    short = _score("ex04_fused_hidden", "failed", 0, 2, "AssertionError: one line says it all")
    report = _report(long, short)
    table = report.table()
    assert "What went wrong, cell by cell:" in table
    assert "ex04_fused_correct (0 / 4, failed):" in table
    assert "    advice line 0" in table
    shown = grade.SCREEN_LINES - 2  # the message's first two lines are its header
    assert f"advice line {shown - 1}\n" in table and f"advice line {shown}\n" not in table
    assert "[14 more line(s): `course grade --verbose` prints them all]" in table
    # A one-line message is all in the table's row already: not repeated below.
    assert "ex04_fused_hidden (0 / 2" not in table
    verbose = report.table(verbose=True)
    assert all(f"    {line}" in verbose for line in lines) and "more line(s)" not in verbose


def test_verbose_adds_the_traceback_of_an_unexpected_error_but_not_of_a_checkers_verdict():
    trace = "Traceback (most recent call last):\n  File \"<cell>\", line 3\nIndexError: oops"
    error = _score("ex04_fused_correct", "failed", 0, 4, "IndexError: oops\nsecond line",
                   traceback=trace)
    assert "Traceback" not in _report(error).table()
    assert "adds where the error came from" in _report(error).table()
    assert "    Traceback (most recent call last):" in _report(error).table(verbose=True)


def test_cells_that_need_a_gpu_are_shown_apart_and_count_as_nothing_lost():
    report = _report(_score("ex04_fused_correct", "passed", 4, 4),
                     _score("ex04_fused_hidden", "passed", 2, 2),
                     _score("ex04_fused_bandwidth", grade.NEEDS_GPU, 0, 4))
    assert report.total() == "6 / 6 correctness points; 4 bandwidth points need a GPU"
    assert report.complete_here and not report.full_marks  # nbgrader's total stays 6 / 10
    assert (report.points, report.max_points) == (6, 10)
    table = report.table()
    assert "- / 4  needs a GPU" in table and "What went wrong" not in table
    one = _report(_score("ex08_lab_correct", "passed", 2, 2),
                  _score("ex08_lab_speed", grade.NEEDS_GPU, 0, 1))
    assert one.total() == "2 / 2 correctness points; 1 speed point needs a GPU"
    lost = _report(_score("ex04_fused_correct", "failed", 0, 4, "AssertionError: wrong"),
                   _score("ex04_fused_bandwidth", grade.NEEDS_GPU, 0, 4))
    assert lost.total() == "0 / 4 correctness points; 4 bandwidth points need a GPU"
    assert not lost.complete_here


def test_a_speed_cell_that_raised_needs_gpu_is_scored_as_needing_a_gpu():
    source = _chapter([
        new_code_cell("pass", metadata=_meta("ex09_add_code", solution=True)),
        new_code_cell("check()", metadata=_meta("ex09_add", points=2)),
        new_code_cell("check_bandwidth()", metadata=_meta("ex09_add_bandwidth", points=3)),
    ])
    ran = nbformat.from_dict(source)
    ran.cells[1].outputs = [nbformat.v4.new_output(
        "error", ename="AssertionError", evalue="add check failed.\n\nfirst\nsecond",
        traceback=["\x1b[31mAssertionError\x1b[0m: add check failed."])]
    ran.cells[2].outputs = [nbformat.v4.new_output(
        "error", ename="NeedsGPU", evalue="the bandwidth check needs a GPU", traceback=[])]
    scores = {s.grade_id: s for s in grade.score_cells(ran, source, {0, 1, 2})}
    assert (scores["ex09_add"].status, scores["ex09_add"].failure) == (
        "failed", "AssertionError: first")
    assert scores["ex09_add"].message == "AssertionError: add check failed.\n\nfirst\nsecond"
    assert scores["ex09_add"].traceback == ""  # a checker's verdict: its message says it all
    assert (scores["ex09_add_bandwidth"].status, scores["ex09_add_bandwidth"].points) == (
        grade.NEEDS_GPU, 0)


def _chapter_04(tmp_path: Path, *, replace: tuple[str, str] | None = None) -> Path:
    """The released chapter 04 answered with the source's solution (changed by `replace`)."""
    chapter = "ch04_fused"
    source = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    released = nbformat.read(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    for cell in released.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = answers[meta["grade_id"]]
            if replace is not None:
                cell.source = cell.source.replace(*replace)
    return _write(tmp_path, released, f"{chapter}.ipynb")


def _interpreted_grade(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`course grade` in Triton's interpreter, as on a laptop, even on a GPU machine."""
    return subprocess.run([sys.executable, "-m", "course", "grade", str(path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COURSE_DEVICE": "cpu"})


@pytest.mark.slow
def test_a_correct_chapter_04_without_a_gpu_earns_every_correctness_point(tmp_path):
    source = nbformat.read(ROOT / "solutions" / "ch04_fused" / "ch04_fused.ipynb",
                           as_version=4)
    speed = set(grade.speed_cells(source))
    points = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
              for c in source.cells if c.metadata.get("nbgrader", {}).get("grade")}
    here = sum(p for g, p in points.items() if g not in speed)
    gpu = sum(p for g, p in points.items() if g in speed)
    assert speed == {"ex04_fused_bandwidth"} and here and gpu
    done = _interpreted_grade(_chapter_04(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr  # nothing left to earn here
    assert "(interpreter mode," in done.stdout
    assert f"{here:g} / {here:g} correctness points; {gpu:g} bandwidth points need a GPU" \
        in done.stdout, done.stdout
    row = next(line for line in done.stdout.splitlines() if "ex04_fused_bandwidth" in line)
    assert row.split()[-3:] == ["needs", "a", "GPU"] and "failed" not in done.stdout, row
    # The kernel was started with encrypted messages: ipykernel had nothing to warn about.
    assert "without encryption" not in done.stdout + done.stderr


@pytest.mark.slow
def test_a_wrong_chapter_04_kernel_gets_the_checkers_whole_advice(tmp_path):
    # Every program reads row 0: the hidden test's check (seed 44) names the row offset.
    wrong = _chapter_04(tmp_path, replace=("x_ptr + row * stride_x_row + cols",
                                           "x_ptr + cols"))
    done = _interpreted_grade(wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "What went wrong, cell by cell:" in out
    block = out[out.index("ex04_fused_hidden (0 / 2, failed):"):]
    # The whole advice, past the 160 characters the table's row keeps, then the check's own
    # table of cases, down to its last line.
    assert ("Row 0 is right but the other rows are wrong: each program must offset its "
            "pointers by its row, x_ptr + row * stride_x_row (and the same for the output), "
            "where stride_x_row is the row stride of the 2-D view the kernel receives: "
            "x2.stride(0) for x2 = validation.as_rows(x).") in " ".join(block.split())
    assert re.search(r"rmsnorm_forward: \d+/\d+ cases pass \(interpreter mode, seed 44\)", block)
    assert "many rows (257x512, float16)" in block and "more line(s)" not in block
