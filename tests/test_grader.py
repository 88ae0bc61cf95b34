"""The autograder end to end, as an instructor runs it: release, collect, stock
`nbgrader autograde` (one call per chapter), feedback, grades CSV; and the instructor
commands' checks on bad input.

The end-to-end run works on a copy of the course in a temporary folder, with synthetic
submissions (tests/grader_submissions.py): a correct one for every chapter with exercises,
and one per mistake, each wrong in one exercise only. It asserts the exact points of every
test cell of every submission.

Without a GPU (this run), the cells that measure speed (bandwidth, and chapter 08's race
against torch.compile) fail under the autograder with the checker's "needs a GPU" message
(`grader/instructor.py autograde` sets COURSE_GRADING=1), for every submission: the correct
one gets every correctness point and none of those. The `gpu` test at the end grades them.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from course import runtime

import pytest

nbformat = pytest.importorskip("nbformat", reason="the grader tests need the Jupyter stack")
nbgrader_api = pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

from grader_submissions import (  # noqa: E402  (after the skips above)
    CH04_BANDWIDTH,
    CH04_CH03_ANSWER,
    CH04_ILLEGAL_ADDRESS,
    CH04_SIDE_STREAM,
    CH04_SUBMISSIONS,
    CH04_TWO_PASS_SLOW,
    GPU_ONLY_CELLS,
    READS_TWICE,
    ROOT,
    SHORT_LIMIT_SUBMISSIONS,
    Submission,
    copy_course,
    expected_points,
    gpu_only_cells_of,
    graded_cells,
    load_instructor,
    release,
    solutions,
    write_inbox,
)

SHORT_LIMIT_CHAPTERS = ("ch02_roofline",)  # every legitimate cell takes a few seconds at most
SHORT_TIMEOUT_S = 20                       # so a hang there costs 20 s, not the default 300
LONG_TIMEOUT_S = 180                       # elsewhere: an unexpected hang still ends
NEEDS_GPU = "needs a GPU"  # in each speed checker's message without a GPU
# The expected points below are those of interpreter mode (speed cells fail); on a GPU the
# gpu test at the end runs instead.
interpreter_only = pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter-mode run; "
                                      "on a GPU, the gpu test below grades bandwidth")


def instructor(course_root: Path, *args: str, timeout: float = 900,
               env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """grader/instructor.py of `course_root`, as `make collect/autograde/...` runs it."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, str(course_root / "grader" / "instructor.py"),
                           *args], cwd=course_root, capture_output=True, text=True,
                          timeout=timeout, env=env)


def gradebook_points(course_root: Path, student: str, chapter: str) -> dict[str, float] | None:
    """grade id -> score of a submission, read with nbgrader's own API; None if absent."""
    url = f"sqlite:///{course_root / 'grader' / 'gradebook.db'}"
    with nbgrader_api.Gradebook(url) as gb:
        try:
            submission = gb.find_submission(chapter, student)
        except nbgrader_api.MissingEntry:
            return None
        points = {}
        for nb in submission.notebooks:
            by_hand = {c.name for c in nb.notebook.solution_cells}  # answers graded by hand
            points.update({g.name: float(g.score) for g in nb.grades if g.name not in by_hand})
        return points


def autograded(course_root: Path, student: str, chapter: str) -> Path:
    return course_root / "grader" / "autograded" / student / chapter / f"{chapter}.ipynb"


def cell_outputs(path: Path) -> dict[str, str]:
    """grade id -> everything a test cell printed or raised, as text."""
    out = {}
    for cell in nbformat.read(path, as_version=4).cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id and cell.cell_type == "code":
            parts = []
            for o in cell.get("outputs", []):
                if o.get("output_type") == "error":
                    parts.append(f"{o.get('ename')}: {o.get('evalue')}")
                elif o.get("output_type") == "stream":
                    # nbgrader scores a test cell 0 for any stderr, so say which stream it was.
                    parts.append(("[stderr] " if o.get("name") == "stderr" else "")
                                 + o.get("text", ""))
                elif o.get("output_type") == "execute_result":
                    parts.append("[value] " + str(o.get("data", {}).get("text/plain", "")))
            out[grade_id] = "\n".join(parts)
    return out


def lost_cells_output(root: Path, student: str, chapter: str, got: dict[str, float]) -> str:
    """What each test cell that lost points printed, for an assertion message."""
    full = graded_cells(root, chapter)
    printed = cell_outputs(autograded(root, student, chapter))
    lost = [g for g in full if got.get(g) != full[g]]
    return "\n".join(f"{student}/{chapter} {g}: {got.get(g)} of {full[g]} points; printed:\n"
                     f"{printed.get(g, '')[-2000:]}" for g in lost)


# ---------------------------------------------------------------- the end-to-end run


@dataclass
class GradedCourse:
    root: Path
    submissions: list[Submission]
    chapters: tuple[str, ...]
    outputs: dict[str, str]        # autograde group -> what the command printed
    statuses: dict[str, int]
    seconds: dict[str, float]
    other_root: Path               # the copy where the other chapters were graded

    @property
    def output(self) -> str:
        return "\n".join(self.outputs.values())

    def submission(self, student: str, chapter: str) -> Submission:
        return next(s for s in self.submissions if (s.student, s.chapter) == (student, chapter))


# The chapters with autograded exercises, each added once its source notebook ran clean with
# nbclient (a chapter still being written must not break this test).
EXERCISE_CHAPTERS = ("ch01_math", "ch02_roofline", "ch03_two_pass", "ch04_fused",
                     "ch05_fused_add", "ch06_layernorm", "ch07_backward", "ch08_performance_lab")
MISTAKES = SHORT_LIMIT_SUBMISSIONS + CH04_SUBMISSIONS
# Chapters without mistakes: only the correct submission, graded in a copy of their own.
OTHER_CHAPTERS = tuple(ch for ch in EXERCISE_CHAPTERS if ch not in {s.chapter for s in MISTAKES})


def exercise_chapters() -> list[str]:
    missing = [ch for ch in EXERCISE_CHAPTERS if not graded_cells(ROOT, ch)]
    assert not missing, f"no autograded test cell in {missing}"
    return list(EXERCISE_CHAPTERS)


def prepared_course(where: Path, submissions: list[Submission]) -> Path:
    """A released copy of the course with `submissions` collected into it."""
    chapters = tuple(sorted({s.chapter for s in submissions}))
    root = copy_course(ROOT, where / "course", chapters)
    release(root)
    write_inbox(root, where / "inbox", submissions)
    done = instructor(root, "collect", str(where / "inbox"))
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> GradedCourse:
    """Everything graded once. The chapters with mistakes are graded in one copy of the
    course, the other chapters' correct submission in another copy at the same time (its
    own gradebook), which fills the time the hanging submissions leave the CPU idle."""
    exercise_chapters()
    start = time.perf_counter()
    others = [Submission("correct", ch) for ch in OTHER_CHAPTERS]
    other_root = prepared_course(tmp_path_factory.mktemp("other_chapters"), others)
    background = subprocess.Popen(
        [sys.executable, str(other_root / "grader" / "instructor.py"), "autograde",
         "--cell-timeout", str(LONG_TIMEOUT_S)], cwd=other_root, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        root = prepared_course(tmp_path_factory.mktemp("mistakes"), MISTAKES)
        seconds = {"prepare": time.perf_counter() - start}
        chapters = tuple(sorted({s.chapter for s in MISTAKES}))
        groups = {"short": ([c for c in chapters if c in SHORT_LIMIT_CHAPTERS], SHORT_TIMEOUT_S),
                  "long": ([c for c in chapters if c not in SHORT_LIMIT_CHAPTERS],
                           LONG_TIMEOUT_S)}
        outputs, statuses = {}, {}
        for name, (group, limit) in groups.items():
            begin = time.perf_counter()
            done = instructor(root, "autograde", "--chapters", ",".join(group),
                              "--cell-timeout", str(limit))
            seconds[f"autograde {', '.join(group)}"] = time.perf_counter() - begin
            outputs[name], statuses[name] = done.stdout + done.stderr, done.returncode
        outputs["others"] = background.communicate(timeout=1800)[0]
        statuses["others"] = background.returncode
    finally:
        if background.poll() is None:  # this fixture failed: stop its nbgrader and kernels
            os.killpg(background.pid, signal.SIGKILL)
            background.wait()
    seconds["all"] = time.perf_counter() - start
    print("\n  " + ", ".join(f"{k}: {v:.0f} s" for k, v in seconds.items()))
    return GradedCourse(root, MISTAKES, chapters, outputs, statuses, seconds, other_root)


def _ids(submissions: list[Submission]) -> list[str]:
    return [s.key for s in submissions]


@pytest.mark.slow
@interpreter_only
def test_correct_submission_gets_every_correctness_point_in_every_chapter(graded):
    assert graded.statuses["others"] == 0, graded.outputs["others"]
    for root, chapters in ((graded.root, graded.chapters), (graded.other_root, OTHER_CHAPTERS)):
        for chapter in chapters:
            got = gradebook_points(root, "correct", chapter)
            expected = expected_points(root, Submission("correct", chapter))
            assert got == expected, (chapter, got, graded.output)
            correctness = {g: p for g, p in graded_cells(root, chapter).items()
                           if g not in GPU_ONLY_CELLS}
            assert correctness and all(got[g] == p for g, p in correctness.items())
    assert sorted(graded.chapters + OTHER_CHAPTERS) == sorted(EXERCISE_CHAPTERS)


def test_the_cells_that_measure_speed_are_the_ones_expected_to_need_a_gpu():
    found = set().union(*(gpu_only_cells_of(ROOT, ch) for ch in EXERCISE_CHAPTERS))
    assert found == set(GPU_ONLY_CELLS)


def test_the_grader_sets_the_variable_the_checkers_read():
    from course.runtime import GRADING_ENV

    spec = importlib.util.spec_from_file_location("instructor_names",
                                                  ROOT / "grader" / "instructor.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.GRADING_ENV == {GRADING_ENV: "1"}


BAD = [s for s in MISTAKES if s.student != "correct"]


@pytest.mark.slow
@interpreter_only
@pytest.mark.parametrize("sub", BAD, ids=_ids(BAD))
def test_bad_submission_loses_the_points_of_its_own_exercise_only(graded, sub):
    got = gradebook_points(graded.root, sub.student, sub.chapter)
    assert got == expected_points(graded.root, sub), f"{sub.what}\n{graded.output}"
    assert sub.loses, "a mistake must cost something"
    if sub.reason:  # lost for the right reason, not by accident: the visible test says it
        printed = cell_outputs(autograded(graded.root, sub.student, sub.chapter))
        assert sub.reason in printed[sub.loses[0]], printed[sub.loses[0]]
        for grade_id in sub.loses:  # (the hidden test may say it differently, as for caching)
            assert "Error: " in printed[grade_id], (grade_id, printed[grade_id])


@pytest.mark.slow
@interpreter_only
def test_each_student_is_graded_per_chapter_apart_from_their_other_mistakes(graded):
    """Students with a mistake in two chapters (or a killed chapter beside a graded one)."""
    two = [st for st in {s.student for s in BAD}
           if len({s.chapter for s in graded.submissions if s.student == st}) >= 2]
    assert len(two) >= 3, two
    for student in two:
        for sub in [s for s in graded.submissions if s.student == student]:
            assert gradebook_points(graded.root, student, sub.chapter) == \
                expected_points(graded.root, sub), sub.key


@pytest.mark.slow
@interpreter_only
def test_without_a_gpu_the_speed_cells_fail_with_the_needs_a_gpu_message(graded):
    """For every submission that ran, the broken kernels as much as the correct ones."""
    seen = 0
    for root, subs in ((graded.root, graded.submissions),
                       (graded.other_root, [Submission("correct", ch) for ch in OTHER_CHAPTERS])):
        for sub in subs:
            points = gradebook_points(root, sub.student, sub.chapter)
            printed = cell_outputs(autograded(root, sub.student, sub.chapter))
            for grade_id in set(GPU_ONLY_CELLS) & set(points):
                assert points[grade_id] == 0, (sub.key, grade_id)
                assert "NeedsGPU: " in printed[grade_id] and NEEDS_GPU in printed[grade_id], \
                    (sub.key, printed[grade_id])
                seen += 1
    assert seen >= len(GPU_ONLY_CELLS)


@pytest.mark.slow
@interpreter_only
def test_infinite_loop_is_interrupted_at_the_configured_limit_and_grading_goes_on(graded):
    sub = graded.submission("mistakes_c", "ch02_roofline")
    printed = cell_outputs(autograded(graded.root, sub.student, sub.chapter))
    for grade_id in sub.loses:  # the config's message states the limit that applied
        assert f"CellTimeoutError: stopped after {SHORT_TIMEOUT_S} s" in printed[grade_id]


@pytest.mark.slow
@interpreter_only
def test_a_hang_that_ignores_the_interrupt_is_killed_and_costs_its_own_cells_only(graded):
    """The verifier kills the learner's process and carries on in a new one; nbgrader, which
    runs none of the submission's code, records it like any other."""
    sub = graded.submission("mistakes_d", "ch02_roofline")
    assert graded.statuses["short"] == 0, graded.outputs["short"]
    assert (f"{sub.student}: the learner's process was lost: ex02_roofline_functions: the "
            f"learner's code did not stop within") in graded.outputs["short"]
    assert "NOT GRADED" not in graded.output
    printed = cell_outputs(autograded(graded.root, sub.student, sub.chapter))
    for grade_id in sub.loses:  # each test cell that called the hanging function
        assert f"CellTimeoutError: stopped after {SHORT_TIMEOUT_S} s" in printed[grade_id]
    assert graded.statuses["long"] == 0, graded.outputs["long"]


@pytest.mark.slow
def test_nbgrader_runs_no_cell_and_records_0_until_the_verifier_grades(tmp_path):
    """Stock `nbgrader autograde` alone: the learner's code does not run (its cell would
    leave a file), and every test cell scores 0, saying it awaits the verifier. Then
    `instructor.py autograde`: the verifier runs it, and its points replace the zeros."""
    ran = tmp_path / "ran"
    code = (solutions(ROOT, "ch01_math")["ex01_torch_rmsnorm_code"]
            + f"\nimport pathlib\npathlib.Path({str(ran)!r}).touch()\nprint('ran here')\n")
    sub = Submission("marks", "ch01_math", replaced={"ex01_torch_rmsnorm_code": code})
    root = prepared_course(tmp_path, [sub])
    done = instructor(root, "prepare")
    assert done.returncode == 0, done.stdout + done.stderr
    # the stock command: this Python's, or on PATH (wheels installed with pip --target)
    nbgrader = shutil.which("nbgrader", path=str(Path(sys.executable).parent)) or "nbgrader"
    done = subprocess.run([str(nbgrader), "autograde", sub.chapter], cwd=root / "grader",
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not ran.exists()
    assert gradebook_points(root, sub.student, sub.chapter) == \
        dict.fromkeys(graded_cells(root, sub.chapter), 0.0)
    printed = cell_outputs(autograded(root, sub.student, sub.chapter))
    assert all(printed[g].startswith("NotVerified: ") for g in graded_cells(root, sub.chapter))
    done = instructor(root, "autograde", "--cell-timeout", str(LONG_TIMEOUT_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert ran.exists()
    assert gradebook_points(root, sub.student, sub.chapter) == expected_points(root, sub)
    printed = cell_outputs(autograded(root, sub.student, sub.chapter))
    assert printed["ex01_torch_rmsnorm_code"] == "ran here\n"  # what the verifier's run printed
    assert "NotVerified" not in "".join(printed.values())
    assert all(f"Verified apart from your code: {p:g} of {p:g} points" in printed[g]
               for g, p in graded_cells(root, sub.chapter).items())


@pytest.mark.slow
def test_a_notebook_nbgrader_cannot_process_gets_the_verifiers_points_and_is_named(tmp_path):
    """One notebook with a cell marked as graded under a grade id the course does not have
    (nbgrader refuses it), and one with a cell of the learner's own that raises: the first
    is named, exits 1, and still gets the verifier's points; the second's error is under
    its own cell on the feedback notebook."""
    chapter = "ch01_math"
    subs = [Submission("bogus", chapter), Submission("added", chapter)]
    root = copy_course(ROOT, tmp_path / "course", (chapter,))
    release(root)
    write_inbox(root, tmp_path / "inbox", subs)

    def edit(student: str, cell) -> int:
        path = tmp_path / "inbox" / student / chapter / f"{chapter}.ipynb"
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(cell)
        nbformat.write(nb, path)
        return len(nb.cells) - 1

    bogus = nbformat.v4.new_code_cell("x = 1")
    bogus.metadata["nbgrader"] = {"grade": True, "grade_id": "not_the_courses", "points": 1,
                                  "solution": False, "locked": False, "schema_version": 3}
    edit("bogus", bogus)
    added = edit("added", nbformat.v4.new_code_cell("print('before')\n"
                                                    "raise ValueError('my own cell')"))
    assert instructor(root, "collect", str(tmp_path / "inbox")).returncode == 0
    done = instructor(root, "autograde", "--cell-timeout", str(LONG_TIMEOUT_S))
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("  bogus: NOT GRADED by nbgrader: it could not process the notebook (see the log)"
            in done.stdout), done.stdout
    assert not autograded(root, "bogus", chapter).exists()
    for sub in subs:
        assert gradebook_points(root, sub.student, chapter) == expected_points(root, sub)
    cell = nbformat.read(autograded(root, "added", chapter), as_version=4).cells[added]
    assert [(o.output_type, o.get("text"), o.get("ename")) for o in cell.outputs] == \
        [("stream", "before\n", None), ("error", None, "ValueError")]
    assert cell.outputs[1].evalue.startswith("my own cell (at ")  # and the line that raised


@pytest.mark.slow
@interpreter_only
def test_grades_csv_has_every_student_and_chapter_with_exact_scores(graded):
    done = instructor(graded.root, "grades")
    assert done.returncode == 0, done.stdout + done.stderr
    with open(graded.root / "grader" / "grades.csv") as handle:
        by_key = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(handle)}
    students = sorted({s.student for s in graded.submissions})
    assert sorted(by_key) == sorted((ch, st) for ch in graded.chapters for st in students)
    for chapter in graded.chapters:
        maximum = sum(graded_cells(graded.root, chapter).values())
        for student in students:
            row = by_key[(chapter, student)]
            subs = [s for s in graded.submissions if (s.student, s.chapter) ==
                    (student, chapter)]
            score = sum(expected_points(graded.root, subs[0]).values()) if subs else 0.0
            assert (float(row["score"]), float(row["max_score"])) == (score, maximum), row
    with open(graded.root / "grader" / "grades_by_exercise.csv") as handle:
        cells = {(r["assignment"], r["student_id"], r["grade_id"]): float(r["score"])
                 for r in csv.DictReader(handle)}
    for sub in graded.submissions:
        for grade_id, points in expected_points(graded.root, sub).items():
            assert cells[(sub.chapter, sub.student, grade_id)] == points, (sub.key, grade_id)


@pytest.mark.slow
@interpreter_only
def test_feedback_is_written_for_every_autograded_submission(graded):
    done = instructor(graded.root, "feedback", "--chapters", "ch02_roofline")
    assert done.returncode == 0, done.stdout + done.stderr
    feedback = graded.root / "grader" / "feedback"
    written = sorted(p.relative_to(feedback).parts[0]
                     for p in feedback.glob("*/ch02_roofline/ch02_roofline.html"))
    assert written == sorted(s.student for s in graded.submissions
                             if s.chapter == "ch02_roofline")
    html = (feedback / "mistakes_b" / "ch02_roofline" / "ch02_roofline.html").read_text()
    assert "NameError" in html and "bytes_per_sec" in html


@pytest.mark.slow
@interpreter_only
def test_autograde_again_skips_what_is_graded_and_keeps_the_scores(graded):
    before = gradebook_points(graded.root, "mistakes_a", "ch01_math")
    done = instructor(graded.root, "autograde", "--chapters", "ch01_math", "--students",
                      "mistakes_a,correct")
    assert done.returncode == 0, done.stdout + done.stderr
    log = (graded.root / "grader" / "logs" / "autograde_ch01_math.log").read_text()
    assert log.count("Skipping existing assignment") == 2, log
    assert gradebook_points(graded.root, "mistakes_a", "ch01_math") == before


# ---------------------------------------------------------------- bad input, fast


@pytest.fixture
def small_course(tmp_path) -> Path:
    return copy_course(ROOT, tmp_path / "course", ("ch01_math", "ch02_roofline"))


def _inbox_notebook(inbox: Path, student: str, chapter: str, text: str | None = None) -> Path:
    folder = inbox / student / chapter
    folder.mkdir(parents=True)
    path = folder / f"{chapter}.ipynb"
    if text is None:
        shutil.copy2(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", path)
    else:
        path.write_text(text)
    return path


def test_collect_checks_everything_first_and_copies_nothing_on_a_problem(small_course, tmp_path):
    inbox = tmp_path / "inbox"
    _inbox_notebook(inbox, "alice", "ch01_math")
    _inbox_notebook(inbox, "bob", "ch42_unknown", text="{}")
    _inbox_notebook(inbox, "carol", "ch02_roofline", text="{not json")
    (inbox / "dave" / "ch01_math").mkdir(parents=True)
    _inbox_notebook(inbox, "bad id!", "ch01_math")
    done = instructor(small_course, "collect", str(inbox))
    assert done.returncode == 1
    message = done.stderr
    assert "nothing was collected" in message
    assert "bob/ch42_unknown: not a chapter folder" in message
    assert "carol/ch02_roofline/ch02_roofline.ipynb: not a readable notebook" in message
    assert "dave/ch01_math: no ch01_math.ipynb in it" in message
    assert "bad id!: a student id is" in message
    assert not (small_course / "grader" / "submitted").exists()


def test_collect_copies_submissions_and_a_second_run_changes_nothing(small_course, tmp_path):
    inbox = tmp_path / "inbox"
    _inbox_notebook(inbox, "alice", "ch01_math")
    _inbox_notebook(inbox, "alice", "ch02_roofline")
    (inbox / "alice" / "ch01_math" / ".ipynb_checkpoints").mkdir()
    first = instructor(small_course, "collect", str(inbox))
    assert first.returncode == 0, first.stderr
    assert "collected 2 submission(s)" in first.stdout
    target = small_course / "grader" / "submitted" / "alice" / "ch01_math"
    assert sorted(p.name for p in target.iterdir()) == ["ch01_math.ipynb", "timestamp.txt"]
    stamp = (target / "timestamp.txt").read_text()
    second = instructor(small_course, "collect", str(inbox))
    assert "collected 0 submission(s)" in second.stdout and "2 unchanged" in second.stdout
    assert (target / "timestamp.txt").read_text() == stamp  # nothing to regrade


def test_autograde_refuses_unknown_chapters_and_an_empty_submitted_folder(small_course):
    unknown = instructor(small_course, "autograde", "--chapters", "ch01_math,ch42_nope")
    assert unknown.returncode == 1
    assert "unknown chapter(s) ch42_nope" in unknown.stderr
    empty = instructor(small_course, "autograde")
    assert empty.returncode == 1
    assert "no submissions to autograde" in empty.stderr and "make collect" in empty.stderr


def test_a_bad_cell_timeout_setting_is_refused_with_its_name(small_course):
    done = instructor(small_course, "grades", env_extra={"GRADER_CELL_TIMEOUT_S": "ten"})
    assert done.returncode == 1
    assert "GRADER_CELL_TIMEOUT_S must be a whole number" in done.stderr
    module = load_instructor(small_course)
    with pytest.raises(module.GraderError, match="above 0 s"):
        module.autograde(module.Course.at(small_course), cell_timeout_s=0)


def test_without_alembic_on_path_the_grader_says_so_before_nbgrader_starts(small_course,
                                                                           tmp_path,
                                                                           monkeypatch):
    # A Python whose bin/ holds no alembic (as with `pip install --target`), and a bare PATH.
    module = load_instructor(small_course)
    monkeypatch.setattr(module.sys, "executable", str(tmp_path / "bin" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(module.GraderError, match="needs the `alembic` command"):
        module.run_nbgrader(module.Course.at(small_course), ["--version"],
                            tmp_path / "log.txt")
    assert not (tmp_path / "log.txt").exists()


def test_the_timeout_setting_reaches_nbgrader_and_its_message(small_course):
    from traitlets.config.loader import PyFileConfigLoader

    os.environ["GRADER_CELL_TIMEOUT_S"] = "7"
    try:
        config = PyFileConfigLoader("nbgrader_config.py",
                                    path=str(small_course / "grader")).load_config()
    finally:
        del os.environ["GRADER_CELL_TIMEOUT_S"]
    assert config.Execute.timeout == 7
    assert config.Execute.interrupt_on_timeout is True
    assert config.Execute.error_on_timeout["evalue"] == "stopped after 7 s"
    assert config.Execute.iopub_timeout > 0  # how long an interrupted cell has to stop


@pytest.mark.skipif(shutil.which("make") is None, reason="needs `make` on PATH")
def test_make_targets_run_the_instructor_commands():
    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True)

    collect = plan("collect", "FROM=/some/inbox")
    assert 'grader/instructor.py collect "/some/inbox"' in collect.stdout, collect.stderr
    missing = plan("collect")
    assert missing.returncode != 0 and "needs FROM=" in missing.stderr
    autograde = plan("autograde", "CHAPTERS=ch01_math,ch04_fused", "CELL_TIMEOUT=60", "FORCE=1")
    text = " ".join(autograde.stdout.split())
    assert 'grader/instructor.py autograde --chapters "ch01_math,ch04_fused"' in text, text
    assert "--force" in text and '--cell-timeout "60"' in text
    assert "grader/instructor.py feedback" in plan("feedback").stdout
    assert "grader/instructor.py grades" in plan("grades").stdout


def test_grading_state_and_exports_are_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a checkout to ask which paths are ignored")
    paths = ["grader/solution/ch01_math/ch01_math.ipynb",
             "grader/source_with_tests/ch01_math/ch01_math.ipynb",
             "grader/logs/autograde_ch01_math.log", "grader/grades.csv",
             "grader/grades_by_exercise.csv"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert sorted(ignored) == sorted(paths)
    tracked = subprocess.run(["git", "check-ignore", "grader/instructor.py",
                              "grader/README.md"], cwd=ROOT, capture_output=True, text=True)
    assert tracked.stdout == ""


# ---------------------------------------------------------------- on a GPU


def collected_course(tmp_path, chapters, submissions):
    root = copy_course(ROOT, tmp_path / "course", tuple(chapters))
    release(root)
    write_inbox(root, tmp_path / "inbox", submissions)
    assert instructor(root, "collect", str(tmp_path / "inbox")).returncode == 0
    return root


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_bandwidth_is_graded_and_crashes_are_contained(tmp_path, capsys):
    """A correct submission of every chapter earns every point, bandwidth included; a slow
    but correct kernel (two passes) loses the fused exercise's bandwidth points only, for
    its second read of x, and so does chapter 03's own answer (fast enough on an H200 to
    pass the target); a kernel that writes y four times on a side stream the call never
    waits for loses them too (the verifier times its replay of the call's work); an illegal
    address loses its chapter (the CUDA context is gone for the rest of that notebook) and
    nothing else."""
    import torch

    chapters = exercise_chapters()
    all_ch04 = tuple(graded_cells(ROOT, "ch04_fused"))
    other = next(ch for ch in chapters if ch != "ch04_fused")
    submissions = [Submission("correct", ch) for ch in chapters] + [
        Submission("slow_two_pass", "ch04_fused", "correct, but reads x twice",
                   {"ex04_fused_code": CH04_TWO_PASS_SLOW}, (CH04_BANDWIDTH,), READS_TWICE),
        Submission("ch03_answer", "ch04_fused", "chapter 03's two-pass answer",
                   {"ex04_fused_code": CH04_CH03_ANSWER}, (CH04_BANDWIDTH,), READS_TWICE),
        Submission("side_stream", "ch04_fused", "writes y four times, on a side stream",
                   {"ex04_fused_code": CH04_SIDE_STREAM}, (CH04_BANDWIDTH,),
                   "is below the target"),
        Submission("illegal_address", "ch04_fused", "stores 2**40 elements past y",
                   {"ex04_fused_code": CH04_ILLEGAL_ADDRESS}, all_ch04),
        Submission("illegal_address", other),
    ]
    root = collected_course(tmp_path, chapters, submissions)

    # The first autograde of a class registers the chapters in the gradebook (once); the
    # time quoted per submission is the next one's, a whole correct submission on its own.
    start = time.perf_counter()
    first = instructor(root, "autograde", "--students", "illegal_address", timeout=3600)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    alone = instructor(root, "autograde", "--students", "correct", timeout=3600)
    one_submission_s = time.perf_counter() - start
    assert alone.returncode == 0, alone.stdout + alone.stderr
    rest = instructor(root, "autograde", timeout=3600)  # skips what is graded already
    not_graded = re.findall(r"^  (\S+): NOT GRADED", first.stdout + rest.stdout, re.M)
    # An illegal address usually leaves the kernel alive (with a dead CUDA context); should
    # it kill the kernel instead, its chapter is scored 0 all the same, and reported.
    assert set(not_graded) <= {"illegal_address"}, first.stdout + rest.stdout + rest.stderr
    assert first.returncode == (1 if not_graded else 0), first.stdout + first.stderr
    assert rest.returncode == 0, rest.stdout + rest.stderr
    with capsys.disabled():
        print(f"\n  registering {len(chapters)} chapters and grading 2 of them: {first_s:.0f} s"
              f"\n  one complete submission ({len(chapters)} chapters) autograded on "
              f"{torch.cuda.get_device_name()} in "
              f"{one_submission_s:.0f} s (target: 180 s)\n{alone.stdout}\n{rest.stdout}")

    for chapter in chapters:
        got = gradebook_points(root, "correct", chapter)
        assert got == graded_cells(root, chapter), lost_cells_output(root, "correct", chapter, got)
    for sub in submissions[len(chapters):]:
        got = gradebook_points(root, sub.student, sub.chapter)
        assert got == expected_points(root, sub, gpu=True), (sub.key, got, rest.stdout)
        if sub.reason:
            printed = cell_outputs(autograded(root, sub.student, sub.chapter))
            assert all(sub.reason in printed[g] for g in sub.loses), printed


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_five_autogrades_of_one_submission_score_the_same(tmp_path):
    """Bandwidth cells are timed, so this is where a flaky target would show: the fused
    chapter, submitted five times, must score full marks five times."""
    repeats = [Submission(f"repeat_{i}", "ch04_fused") for i in range(1, 6)]
    root = collected_course(tmp_path, ["ch04_fused"], repeats)
    graded = instructor(root, "autograde", timeout=3600)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    full = graded_cells(root, "ch04_fused")
    for sub in repeats:
        got = gradebook_points(root, sub.student, "ch04_fused")
        assert got == full, lost_cells_output(root, sub.student, "ch04_fused", got)
