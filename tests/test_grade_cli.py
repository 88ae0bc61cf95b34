"""`course grade NOTEBOOK`: a learner's notebook graded as the autograder grades it.

Most tests use a tiny chapter made here (ch09_tiny: a function to write, a visible and a
hidden test cell), so that a kernel runs in a second or two; one grades a real chapter.
"""

from __future__ import annotations

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
        "ex02_roofline_functions": 4, "ex02_roofline_functions_hidden": 2}
    assert report.chapter == chapter and report.full_marks
