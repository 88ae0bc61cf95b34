"""What a submission can do to its own grading, and what the tooling does about it.

- `grader/instructor.py collect` copies a submission's notebook and nothing else: a
  `course/__init__.py` sent beside it used to land next to the autograded notebook and
  replace the course package (the audit's 10/10 for `rmsnorm = lambda x, w: x`).
- The integrity scan (`course.grade.integrity_flags`) reads the code a learner controls and
  reports what a solution has no reason to do; `course grade` prints it, `autograde` lists
  flagged submissions and writes every flag to grader/grades_integrity.csv. It must stay
  silent on an untouched release notebook and on the course's own answers.
- `course grade`'s "no GPU here" note is about the cells that measure speed, not about any
  cell whose text contains "bandwidth".
"""

from __future__ import annotations

import copy
import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from course import grade, runtime
from course.grade import integrity_flags

import nbformat
import pytest
from grader_submissions import (
    GPU_ONLY_CELLS,
    ROOT,
    answered,
    copy_course,
    gpu_only_cells_of,
    load_instructor,
    release,
    solutions,
)
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CHAPTERS = sorted(p.name for p in (ROOT / "solutions").glob("ch[0-9][0-9]_*") if p.is_dir())


def source_of(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)


def released(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)


def instructor(course_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(course_root / "grader" / "instructor.py"),
                           *args], cwd=course_root, capture_output=True, text=True,
                          timeout=900)


# ---------------------------------------------------------------- the scan: no false alarms


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_an_untouched_release_notebook_has_no_flags(chapter):
    assert integrity_flags(released(chapter), source_of(chapter)) == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_course_solutions_in_the_release_notebook_have_no_flags(chapter):
    answers = solutions(ROOT, chapter)
    nb = answered(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", answers)
    assert integrity_flags(nb, source_of(chapter)) == []
    # and the source notebook itself (solutions with their markers, hidden tests)
    assert integrity_flags(source_of(chapter), source_of(chapter)) == []


def test_the_starter_codes_input_checks_come_from_course_and_solutions_is_flagged():
    """Chapters 05 and 06 hand the learner `from course import validation` in the exercise
    cell: the scan accepts that import (and its use). Nothing from solutions/ is allowed,
    not even the reference kernels' copy of the same checks: the learner's package has no
    solutions/."""
    starters = [c.source for ch in CHAPTERS for c in released(ch).cells
                if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert any("from course import validation" in s for s in starters)
    assert not any("solutions" in s for s in starters)
    nb = with_exercise("ch05_fused_add", "ex05_add_rmsnorm_wrapper_code",
                       "from course.validation import as_rows\n"
                       "from course import validation\n"
                       "def add_rmsnorm(x, residual, weight, eps=1e-6):\n"
                       "    return validation.as_rows(x), as_rows(residual)\n")
    assert integrity_flags(nb, source_of("ch05_fused_add")) == []
    nb = with_exercise("ch05_fused_add", "ex05_add_rmsnorm_wrapper_code",
                       "from solutions.kernels import validation\n"
                       "def add_rmsnorm(x, residual, weight, eps=1e-6):\n"
                       "    return validation.as_rows(x)\n")
    assert [f.what for f in integrity_flags(nb, source_of("ch05_fused_add"))] == [
        "imports solutions.kernels.validation", "uses solutions.kernels.validation.as_rows"]


def test_an_older_version_of_a_course_cell_is_not_flagged_for_what_the_course_did():
    """A learner may hold an older release: a course cell (same cell id) that uses
    course.hardware as the course did is not flagged; the same code in a cell the learner
    added is, and so is a module change even in a course cell."""
    chapter = "ch04_fused"
    nb = released(chapter)
    index = next(i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and not c.get("metadata", {}).get("nbgrader"))
    old_code = "from course import hardware\nspec = hardware.current()  # an older wording\n"
    nb.cells[index].source = old_code
    assert integrity_flags(nb, source_of(chapter)) == []
    nb.cells.insert(index + 1, new_code_cell(old_code))
    flags = integrity_flags(nb, source_of(chapter))
    # (line 1 is also a line of the course's notebook, so it is not flagged by itself)
    assert [(f.cell, f.line, f.what) for f in flags] == [
        (f"cell {index + 2} (added)", 2, "uses course.hardware.current")]
    nb.cells[index].source = "from course import hardware\nhardware.copy_bandwidth = len\n"
    assert [f.what for f in integrity_flags(nb, source_of(chapter))][0] == \
        "changes course.hardware.copy_bandwidth"


# ---------------------------------------------------------------- the scan: what it finds


def with_exercise(chapter: str, grade_id: str, code: str, *added: str,
                  at: int | None = None) -> nbformat.NotebookNode:
    """The release notebook with `code` in exercise cell `grade_id`, and `added` cells
    inserted at `at` (default: at the end)."""
    nb = released(chapter)
    cells = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
             == grade_id]
    assert len(cells) == 1, f"{chapter} has no exercise cell {grade_id}"
    cells[0].source = code
    for offset, text in enumerate(added):
        nb.cells.insert(len(nb.cells) if at is None else at + offset, new_code_cell(text))
    return nb


def ch04(code: str, *added: str, at: int | None = None) -> nbformat.NotebookNode:
    return with_exercise("ch04_fused", "ex04_fused_code", code, *added, at=at)


PASSING_WRAPPER = "def rmsnorm(x, weight, eps=1e-6):\n    return x\n"

# name -> (chapter, notebook, [(None for the exercise cell, or "added", line, what), ...]):
# the flags that must be among those found.
CHEATS = {
    "the audit's patch of the checkers": (
        "ch04_fused",
        ch04("import course.check as _c\nimport course.check.compare as _cc\n"
             "_c.rmsnorm_forward = lambda *a, **k: None\n_cc.compare = lambda *a, **k: None\n"
             + PASSING_WRAPPER),
        [(None, 1, "imports course.check"), (None, 3, "changes course.check.rmsnorm_forward"),
         (None, 4, "changes course.check.compare.compare")]),
    "a patch through the test cells' own import line": (
        "ch04_fused",
        ch04("from course import check\ncheck.rmsnorm_forward = print\n" + PASSING_WRAPPER),
        [(None, 2, "changes course.check.rmsnorm_forward")]),
    "setattr on the checker": (
        "ch04_fused",
        ch04("import course.check\nsetattr(course.check, 'rmsnorm_forward', print)\n"),
        [(None, 2, "calls setattr() on course.check")]),
    "a module swapped in sys.modules": (
        "ch04_fused",
        ch04("import sys\nsys.modules['course.check'] = object()\n"),
        [(None, 2, "changes something in sys.modules")]),
    "importlib": (
        "ch04_fused",
        ch04("import importlib\nchecker = importlib.import_module('course' + '.check')\n"),
        [(None, 1, "imports importlib"), (None, 2, "uses importlib.import_module")]),
    "dispatch modes switched off": (
        "ch04_fused",
        ch04("def rmsnorm(x, weight, eps=1e-6):\n"
             "    from torch.utils._python_dispatch import _disable_current_modes\n"
             "    with _disable_current_modes():\n"
             "        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n"),
        [(None, 2, "imports torch.utils._python_dispatch._disable_current_modes"),
         (None, 3, "uses torch.utils._python_dispatch._disable_current_modes")]),
    "work in another thread": (
        "ch04_fused",
        ch04("import concurrent.futures\nimport threading\n"),
        [(None, 1, "imports concurrent.futures"), (None, 2, "imports threading")]),
    "NumPy on the inputs": (
        "ch04_fused",
        ch04("import numpy as np\ndef rmsnorm(x, weight, eps=1e-6):\n    xs = x.numpy()\n"
             "    return torch.from_numpy(xs / np.sqrt((xs * xs).mean(-1, keepdims=True)))\n"),
        [(None, 1, "imports numpy"), (None, 3, "calls .numpy() on a tensor"),
         (None, 4, "uses torch.from_numpy")]),
    "an autotuner pre_hook": (
        "ch04_fused",
        ch04("@triton.autotune(configs=[triton.Config({}, pre_hook=print)], key=[])\n"
             "@triton.jit\ndef k(x_ptr):\n    pass\n"),
        [(None, 1, "passes pre_hook=")]),
    ".run() on a kernel": (
        "ch04_fused",
        ch04("@triton.jit\ndef k(x_ptr):\n    pass\n\n\ndef rmsnorm(x, weight, eps=1e-6):\n"
             "    k.run(x, grid=(1,), warmup=False)\n    return x\n"),
        [(None, 7, "calls k.run()")]),
    "the course's solutions imported in the exercise cell": (
        "ch05_fused_add",
        with_exercise("ch05_fused_add", "ex05_add_rmsnorm_wrapper_code",
                      "from solutions import kernels\n\n\n"
                      "def add_rmsnorm(x, residual, weight, eps=1e-6):\n"
                      "    return kernels.add_rmsnorm(x, residual, weight, eps)\n"),
        [(None, 1, "imports solutions.kernels"),
         (None, 5, "uses solutions.kernels.add_rmsnorm")]),
    "the course's solutions behind a helper in an added cell": (
        "ch04_fused",
        ch04("def rmsnorm(x, weight, eps=1e-6):\n    return helper(x, weight, eps)\n",
             "from solutions.kernels import rmsnorm as reference\n\n\n"
             "def helper(x, weight, eps):\n    return reference.rmsnorm(x, weight, eps)\n"),
        [("added", 1, "imports solutions.kernels.rmsnorm"),
         ("added", 5, "uses solutions.kernels.rmsnorm.rmsnorm")]),
    "builtins": (
        "ch04_fused",
        ch04("import builtins\nbuiltins.isinstance = lambda *a: True\n"),
        [(None, 1, "imports builtins"), (None, 2, "changes builtins.isinstance")]),
    "a module file written with %%writefile": (
        "ch04_fused",
        ch04(PASSING_WRAPPER, "%%writefile course/check.py\nrmsnorm_forward = print\n", at=1),
        [("added", 1, "runs the magic %%writefile")]),
    "a module file written with open()": (
        "ch04_fused",
        ch04("with open('course/__init__.py', 'w') as f:\n    f.write('')\n"),
        [(None, 1, "opens a file for writing")]),
    "the grading variable changed": (
        "ch04_fused",
        ch04("import os\nos.environ['COURSE_GRADING'] = '0'\n", "%env COURSE_GRADING=0"),
        [(None, 2, "changes os.environ"), ("added", 1, "runs the magic %env")]),
    "code hidden under %%capture": (
        "ch04_fused",
        ch04(PASSING_WRAPPER, "%%capture\nimport course.check as c\nc.rmsnorm_forward = print\n"),
        [("added", 2, "imports course.check"),
         ("added", 3, "changes course.check.rmsnorm_forward")]),
    "exec": (
        "ch04_fused",
        ch04("exec('import course.check')\n"),
        [(None, 1, "calls exec()"), (None, 1, "names course.check in a string")]),
    "the test cell's frame": (
        "ch04_fused",
        ch04("import sys\nframe = sys._getframe(1)\nframe.f_globals['check'] = None\n"),
        [(None, 2, "uses sys._getframe"), (None, 3, "uses .f_globals")]),
    "a shell command": (
        "ch04_fused",
        ch04(PASSING_WRAPPER, "!cp /tmp/fake.py course/check.py"),
        [("added", 1, "runs a shell command (!)")]),
}


def _matches(flag, cell: str | None, line: int, what: str) -> bool:
    where = re.fullmatch(r"ex\d\d_\w+", flag.cell) if cell is None else \
        flag.cell.endswith(f"({cell})")
    return bool(where) and flag.line == line and flag.what == what


@pytest.mark.parametrize("name", list(CHEATS))
def test_each_way_to_tamper_with_grading_is_flagged_where_it_is(name):
    chapter, nb, expected = CHEATS[name]
    flags = integrity_flags(nb, source_of(chapter))
    for cell, line, what in expected:
        assert any(_matches(f, cell, line, what) for f in flags), \
            (name, (cell, line, what), [str(f) for f in flags])
    for flag in flags:  # each says why it matters and shows the line
        assert flag.why and flag.code and str(flag).startswith(flag.short)


def test_a_second_cell_with_the_exercise_id_is_scanned_as_the_learners_own():
    """nbgrader keeps a duplicated grade id on the last cell only: the first one runs as a
    plain cell, and is read as one the learner added."""
    nb = released("ch04_fused")
    index = next(i for i, c in enumerate(nb.cells)
                 if c.metadata.get("nbgrader", {}).get("grade_id") == "ex04_fused_code")
    twin = copy.deepcopy(nb.cells[index])
    twin.source, twin["id"] = "import course.check as c\nc.rmsnorm_forward = print\n", "twin"
    nb.cells.insert(index, twin)
    flags = integrity_flags(nb, source_of("ch04_fused"))
    assert [(f.cell, f.line) for f in flags] == [(f"cell {index + 1} (added)", 1),
                                                 (f"cell {index + 1} (added)", 2)]


def test_test_cells_are_not_read_because_the_grader_puts_its_own_back():
    nb = released("ch04_fused")
    test_cell = next(c for c in nb.cells
                     if c.metadata.get("nbgrader", {}).get("grade_id") == "ex04_fused_correct")
    test_cell.source = "import course.check as c\nc.rmsnorm_forward = print\n"
    assert integrity_flags(nb, source_of("ch04_fused")) == []


def test_a_cell_that_does_not_compile_is_not_flagged_since_none_of_it_runs():
    nb = ch04("import course.check as c\nc.rmsnorm_forward = print\ndef broken(:\n")
    assert integrity_flags(nb, source_of("ch04_fused")) == []


# ---------------------------------------------------------------- course grade


def _meta(grade_id: str, *, solution: bool = False, points: float | None = None) -> dict:
    meta = {"grade": points is not None, "grade_id": grade_id, "locked": not solution,
            "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def tiny_chapter(*, speed_cell: bool = False) -> nbformat.NotebookNode:
    """ch09_tiny: a function to write; its hidden test has a variable named `bandwidth` (as
    chapter 02's does), and, with `speed_cell`, a test cell named like a speed cell. A test
    cell checks that nothing but the notebook lies in its folder."""
    hidden = ("# Hidden tests\n### BEGIN HIDDEN TESTS\nbandwidth = 3.0e11\n"
              "assert add(bandwidth, -bandwidth) == 0\n### END HIDDEN TESTS\n")
    cells = [
        new_markdown_cell("# 09 · tiny"),
        new_code_cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n"
                      "    ### END SOLUTION\n", metadata=_meta("ex09_add_code", solution=True)),
        new_code_cell("assert add(1, 2) == 3\n", metadata=_meta("ex09_add", points=2)),
        new_code_cell(hidden, metadata=_meta("ex09_add_hidden", points=1)),
        new_code_cell("import os\nleft = sorted(set(os.listdir('.')) - {'ch09_tiny.ipynb', "
                      "'timestamp.txt'})\nassert not left, f'beside the notebook: {left}'\n",
                      metadata=_meta("ex09_alone", points=1)),
    ]
    if speed_cell:
        cells.append(new_code_cell("pass\n", metadata=_meta("ex09_add_bandwidth", points=1)))
    for index, cell in enumerate(cells):
        cell["id"] = f"tiny-{index}"
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def tiny_course(where: Path, **kwargs) -> Path:
    root = copy_course(ROOT, where, ())
    (root / "solutions" / "ch09_tiny").mkdir()
    nbformat.write(tiny_chapter(**kwargs), root / "solutions" / "ch09_tiny" / "ch09_tiny.ipynb")
    return root


def tiny_answer(code: str) -> nbformat.NotebookNode:
    nb = tiny_chapter()
    nb.cells[1].source = code
    nb.cells[3].source = "# Hidden tests\n"
    return nb


CHEAT = ("import builtins\n_real_any = builtins.any\n\n\ndef add(a, b):\n    return 0\n")


def test_speed_cells_are_found_by_checker_call_or_grade_id_not_by_a_variable_name():
    found = {g for ch in CHAPTERS for g in grade.speed_cells(source_of(ch))}
    assert found == set(GPU_ONLY_CELLS)
    for chapter in CHAPTERS:
        assert set(grade.speed_cells(source_of(chapter))) == gpu_only_cells_of(ROOT, chapter)
    ch02 = source_of("ch02_roofline")
    assert any("bandwidth" in c.source for c in ch02.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("grade")), \
        "chapter 02's tests no longer mention bandwidth: this test lost its point"
    assert grade.speed_cells(ch02) == []
    assert grade.speed_cells(tiny_chapter(speed_cell=True)) == ["ex09_add_bandwidth"]


def _alone(folder: Path, nb: nbformat.NotebookNode) -> Path:
    """`nb` as ch09_tiny.ipynb in a folder of its own (ex09_alone looks at the folder)."""
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "ch09_tiny.ipynb")
    return folder / "ch09_tiny.ipynb"


@pytest.mark.slow
def test_course_grade_prints_the_flags_and_the_gpu_note_only_for_speed_cells(tmp_path):
    root = tiny_course(tmp_path / "course")
    honest = _alone(tmp_path / "honest", tiny_answer("def add(a, b):\n    return a + b\n"))
    report = grade.grade_notebook(honest, course_root=root)
    assert report.full_marks and report.integrity == []
    assert not any("no GPU here" in n for n in report.notes)  # `bandwidth = ...` is no cell
    assert "INTEGRITY" not in report.table()

    cheat = _alone(tmp_path / "cheat", tiny_answer(CHEAT))
    done = subprocess.run([sys.executable, "-m", "course", "grade", str(cheat), "--course",
                           str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # add returns 0: points lost
    lines = done.stdout.splitlines()
    assert lines[2].startswith("INTEGRITY: 2 place(s) in your code flagged"), done.stdout
    assert "ex09_add_code line 1: imports builtins (Python's built-in functions" in done.stdout
    assert "ex09_add_code line 2: uses builtins.any" in done.stdout
    assert done.stdout.index("total") < done.stdout.rindex("ex09_add_code line 1")

    # Full marks do not make flagged code pass: the command still exits 1.
    flagged = _alone(tmp_path / "flagged", tiny_answer(
        "import builtins\n\n\ndef add(a, b):\n    return a + b\n"))
    done = subprocess.run([sys.executable, "-m", "course", "grade", str(flagged), "--course",
                           str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "INTEGRITY: 1 place(s)" in done.stdout and "4 / 4" in done.stdout

    timed_root = tiny_course(tmp_path / "timed", speed_cell=True)
    report = grade.grade_notebook(honest, course_root=timed_root)
    notes = [n for n in report.notes if "no GPU here" in n]
    if runtime.on_gpu():
        assert notes == []
    else:
        assert len(notes) == 1 and "(ex09_add_bandwidth)" in notes[0], report.notes


def test_the_scan_loads_without_the_course_package_or_torch():
    """The instructor's commands load course/grade.py from its file for the scan; that must
    not import torch (it would pick a Triton mode in the instructor's process)."""
    path = str(ROOT / "course" / "grade.py")
    code = ("import sys, importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('scan', {path!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['scan'] = m\n"
            "spec.loader.exec_module(m)\n"
            "assert callable(m.integrity_flags)\n"
            "print(sorted(k for k in ('torch', 'course', 'triton') if k in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items()
                                            if k != "TRITON_INTERPRET"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------- collect


@pytest.fixture
def small_course(tmp_path) -> Path:
    return copy_course(ROOT, tmp_path / "course", ("ch01_math",))


def _inbox(inbox: Path, student: str, chapter: str = "ch01_math") -> Path:
    folder = inbox / student / chapter
    folder.mkdir(parents=True)
    shutil.copy2(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", folder)
    return folder


def test_collect_copies_only_the_notebook_and_lists_every_other_file(small_course, tmp_path):
    inbox = tmp_path / "inbox"
    alice = _inbox(inbox, "alice")
    (alice / "course").mkdir()
    (alice / "course" / "__init__.py").write_text("raise SystemExit('not the course')\n")
    (alice / "helpers.py").write_text("")
    (alice / ".ipynb_checkpoints").mkdir()  # editor litter: not copied, not listed
    (alice / ".ipynb_checkpoints" / "ch01_math-checkpoint.ipynb").write_text("{}")
    _inbox(inbox, "bob")
    done = instructor(small_course, "collect", str(inbox))
    assert done.returncode == 0, done.stderr
    assert "collected 2 submission(s)" in done.stdout
    left_out = [ln.strip() for ln in done.stdout.splitlines() if "file(s) left out" in ln]
    assert left_out == ["alice/ch01_math: 2 file(s) left out: course/__init__.py, helpers.py"]
    for student in ("alice", "bob"):
        target = small_course / "grader" / "submitted" / student / "ch01_math"
        assert sorted(p.name for p in target.iterdir()) == ["ch01_math.ipynb",
                                                             "timestamp.txt"]


def test_collect_keeps_a_timestamp_nbgrader_can_read_and_replaces_any_other(small_course,
                                                                          tmp_path):
    inbox = tmp_path / "inbox"
    (_inbox(inbox, "alice") / "timestamp.txt").write_text("2031-04-05 06:07:08.000000 UTC\n")
    (_inbox(inbox, "bob") / "timestamp.txt").write_text("import course\n")
    done = instructor(small_course, "collect", str(inbox))
    assert done.returncode == 0, done.stderr
    submitted = small_course / "grader" / "submitted"
    assert (submitted / "alice" / "ch01_math" / "timestamp.txt").read_text() == \
        "2031-04-05 06:07:08.000000 UTC\n"
    assert "bob/ch01_math: 1 file(s) left out: timestamp.txt (not a timestamp nbgrader can " \
           "read)" in done.stdout
    bob_stamp = (submitted / "bob" / "ch01_math" / "timestamp.txt").read_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ UTC\n", bob_stamp)


def test_files_in_submitted_stop_autograde_and_collecting_again_removes_them(small_course,
                                                                          tmp_path):
    """Files put into submitted/ some other way (by hand, by an older collect that copied
    whole folders) would reach the autograded notebook's folder: autograde refuses them, and
    collecting the same notebook again copies it afresh (so it is regraded)."""
    inbox = tmp_path / "inbox"
    _inbox(inbox, "alice")
    assert instructor(small_course, "collect", str(inbox)).returncode == 0
    target = small_course / "grader" / "submitted" / "alice" / "ch01_math"
    (target / "course").mkdir()
    (target / "course" / "__init__.py").write_text("")
    module = load_instructor(small_course, "instructor_integrity_under_test")
    with pytest.raises(module.GraderError) as refused:
        module.autograde(module.Course.at(small_course))
    message = str(refused.value)
    assert "nothing was graded" in message and "alice/ch01_math: course/__init__.py" in message
    assert "make collect" in message
    again = instructor(small_course, "collect", str(inbox))
    assert "collected 1 submission(s)" in again.stdout, again.stdout + again.stderr
    assert sorted(p.name for p in target.iterdir()) == ["ch01_math.ipynb", "timestamp.txt"]
    unchanged = instructor(small_course, "collect", str(inbox))
    assert "collected 0 submission(s)" in unchanged.stdout and "1 unchanged" in unchanged.stdout


# ---------------------------------------------------------------- autograde, end to end


@pytest.mark.slow
def test_autograde_reports_flagged_submissions_and_writes_their_flags_beside_the_grades(
        tmp_path):
    root = tiny_course(tmp_path / "course")
    release(root)
    inbox = tmp_path / "inbox"
    answers = {"honest": "def add(a, b):\n    return a + b\n",
               "sender": "def add(a, b):\n    return a + b\n",
               "patcher": CHEAT.replace("return 0", "return a + b")}
    for student, code in answers.items():
        nb = nbformat.read(root / "notebooks" / "ch09_tiny" / "ch09_tiny.ipynb", as_version=4)
        nb.cells[1].source = code
        folder = inbox / student / "ch09_tiny"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "ch09_tiny.ipynb")
    (inbox / "sender" / "ch09_tiny" / "course").mkdir()
    (inbox / "sender" / "ch09_tiny" / "course" / "__init__.py").write_text("")
    collected = instructor(root, "collect", str(inbox))
    assert collected.returncode == 0, collected.stderr
    assert "sender/ch09_tiny: 1 file(s) left out: course/__init__.py" in collected.stdout

    done = instructor(root, "autograde")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "integrity scan: 1 collected submission(s) flagged for review" in output
    flagged = [ln for ln in output.splitlines() if "FLAGGED FOR REVIEW" in ln]
    assert flagged == ["  patcher: FLAGGED FOR REVIEW, 2 integrity flag(s) (details in "
                       "grader/grades_integrity.csv): ex09_add_code line 1: imports builtins; "
                       "ex09_add_code line 2: uses builtins.any"], output
    scores = {ln.split()[1]: ln for ln in output.splitlines() if ln.startswith("  ch09_tiny")}
    assert "4 / 4" in scores["honest"] and "FLAGGED" not in scores["honest"]
    # the sent course/ folder was not beside the notebook: the test cell that looks passes
    assert "4 / 4" in scores["sender"] and "FLAGGED" not in scores["sender"]
    # the flags cost no points: a person decides
    assert "4 / 4" in scores["patcher"] and "FLAGGED: 2 integrity flag(s)" in scores["patcher"]
    assert not (root / "grader" / "autograded" / "sender" / "ch09_tiny" / "course").exists()

    def rows(path: Path) -> list[dict[str, str]]:
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))

    written = rows(root / "grader" / "grades_integrity.csv")
    assert [(r["assignment"], r["student_id"], r["cell"], r["line"], r["flag"], r["code"])
            for r in written] == [
        ("ch09_tiny", "patcher", "ex09_add_code", "1", "imports builtins", "import builtins"),
        ("ch09_tiny", "patcher", "ex09_add_code", "2", "uses builtins.any",
         "_real_any = builtins.any")]
    assert all(r["why"] for r in written)

    out = tmp_path / "exports" / "marks.csv"
    exported = instructor(root, "grades", "--out", str(out))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert rows(out.with_name("marks_integrity.csv")) == written
    assert str(out.with_name("marks_integrity.csv")) in exported.stdout
