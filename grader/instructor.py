"""The instructor's steps around stock nbgrader, one command each (grader/README.md).

    python grader/instructor.py collect FOLDER            # make collect FROM=FOLDER
    python grader/instructor.py autograde [--chapters ch01_math,ch04_fused]
                                          [--students alice,bob] [--force]
                                          [--cell-timeout SECONDS]   # make autograde
    python grader/instructor.py feedback [--chapters ...]  # make feedback
    python grader/instructor.py grades [--out FILE]        # make grades

nbgrader runs from grader/, so grader/nbgrader_config.py applies (paths, time limit per
cell, and an autograde that runs no cell). Each chapter is its own assignment, recorded by
its own nbgrader call, then run and graded by the verifier (course/verify/), where the
submission's code runs in a process of its own and cannot reach the checks: a submission
that crashes or hangs costs points in its own cells only. Grading sets COURSE_GRADING=1, so
that a bandwidth cell fails without a GPU. The paths below come from the configuration, so
the same commands work in a copy of the course (the tests use one).

Two more things narrow what a submission can do (grader/README.md, "Grading out of the
learner's reach"): collect copies only the notebook, never files beside it, and autograde
runs the integrity scan of course/grade.py on every submission and reports what it flags,
per submission and in grader/grades_integrity.csv, for the instructor to review.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import compileall
import contextlib
import csv
import datetime
import functools
import hashlib
import importlib.util
import itertools
import json
import marshal
import os
import py_compile
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

# Without jsonschema's IRI parsers, which nothing here uses (scripts/release.py,
# SKIP_IRI_PARSERS): 1.5 to 2 s less at every start of this command.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from traitlets.config.loader import PyFileConfigLoader  # noqa: E402

GRADER_DIR = Path(__file__).resolve().parent
ROOT = GRADER_DIR.parent
STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
# The line under each test cell of the feedback that gives the verified points.
VERIFIED_LINE = "Verified apart from your code:"
# nbgrader logs this line for every submission it could not process.
FAILED_LINE = re.compile(r"There was an error processing assignment '([^']+)' for student "
                         r"'([^']+)'")
# What collect copies from a submission's chapter folder: the notebook, and nbgrader's record
# of when it was submitted (kept only if nbgrader can read it). Nothing else: nbgrader copies
# every file of submitted/ beside the notebook it runs, and the notebook's kernel imports from
# its own folder first, so a `course/` folder shipped there would replace the course's
# checkers. No chapter needs any other file.
TIMESTAMP = "timestamp.txt"
# Left behind by editors; not worth listing among the files a submission brought.
EDITOR_LITTER = {".ipynb_checkpoints", ".DS_Store"}
# Where `autograde` writes the integrity scan's flags (grades*.csv is git-ignored).
INTEGRITY_CSV = "grades_integrity.csv"
# Set for the notebooks' kernels while autograding (they inherit nbgrader's environment):
# the checkers then fail a bandwidth cell without a GPU instead of skipping it
# (course/runtime.py, GRADING_ENV; a test keeps the two names equal). Read here, not
# imported, so that these commands do not load torch.
GRADING_ENV = {"COURSE_GRADING": "1"}
# The file of the lock a verifier's timings hold alone on their GPU (course/gpu_lock.py, ENV;
# a test keeps the two names equal), so that chapters verified side by side take turns.
GPU_LOCK_ENV = "COURSE_GPU_LOCK"


class GraderError(RuntimeError):
    """A step cannot be done as asked; the message says why and what to do."""


def _load_release_script(root: Path):
    """scripts/release.py: the chapter discovery and nbgrader launcher `make release` uses."""
    path = root / "scripts" / "release.py"
    if not path.is_file():
        raise GraderError(f"no {path}: the grader uses the release script's chapter rules")
    spec = importlib.util.spec_from_file_location("course_release_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Course:
    """A course checkout (or a copy of one), with the paths its nbgrader config sets."""

    root: Path
    submitted: Path
    autograded: Path
    feedback: Path
    db_url: str
    course_id: str
    # A share of the grading run apart (several GPUs, a cluster): its own gradebook there.
    task_dir: Path | None = None

    @classmethod
    def at(cls, root: Path = ROOT) -> Course:
        config_path = root / "grader" / "nbgrader_config.py"
        if not config_path.is_file():
            raise GraderError(f"no nbgrader configuration at {config_path}")
        try:
            config = PyFileConfigLoader(config_path.name, path=str(config_path.parent)
                                        ).load_config()
        except Exception as exc:  # the config raises on a bad GRADER_CELL_TIMEOUT_S
            raise GraderError(f"{config_path}: {exc}") from exc
        course_dir = config.CourseDirectory
        base = Path(course_dir.root)
        return cls(base, base / course_dir.submitted_directory,
                   base / course_dir.autograded_directory, base / course_dir.feedback_directory,
                   course_dir.db_url, course_dir.course_id)

    @property
    def grader_dir(self) -> Path:
        return self.root / "grader"

    @property
    def logs(self) -> Path:
        """Where the logs of a run go: grader/logs, or a task's own folder."""
        return self.task_dir / "logs" if self.task_dir is not None else \
            self.grader_dir / "logs"

    def chapters(self) -> list[str]:
        release = _load_release_script(self.root)
        try:
            return release.find_chapters(self.root / "solutions")
        except release.ReleaseError as exc:
            raise GraderError(str(exc)) from exc

    def select(self, chapters: Sequence[str] | None) -> list[str]:
        known = self.chapters()
        if not chapters:
            return known
        unknown = [ch for ch in chapters if ch not in known]
        if unknown:
            raise GraderError(f"unknown chapter(s) {', '.join(unknown)}; the chapters are "
                              f"{', '.join(known)}")
        return list(dict.fromkeys(chapters))

    def submissions(self, chapter: str) -> list[str]:
        """Students with a submitted notebook for `chapter`, sorted."""
        if not self.submitted.is_dir():
            return []
        return sorted(p.name for p in self.submitted.iterdir()
                      if (p / chapter / f"{chapter}.ipynb").is_file())

    def autograded_notebook(self, student: str, chapter: str) -> Path:
        return self.autograded / student / chapter / f"{chapter}.ipynb"


def run_nbgrader(course: Course, args: Sequence[str], log_path: Path,
                 env_extra: dict[str, str] | None = None) -> int:
    """Run nbgrader from grader/ (so that its config applies), output to `log_path`."""
    release = _load_release_script(course.root)
    env = dict(os.environ)
    # nbgrader starts `alembic` by name when it creates the gradebook (DESIGN.md's trap).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(env_extra or {})
    if shutil.which("alembic", path=env["PATH"]) is None:
        raise GraderError("nbgrader needs the `alembic` command to create its gradebook, and "
                          "it is not on PATH (nor beside this Python). Install nbgrader into "
                          "this environment, or put the bin/ folder of the one holding "
                          "alembic on PATH.")
    if course.task_dir is not None:  # a task's own gradebook
        args = [*args, f"--CourseDirectory.db_url={course.db_url}"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write(f"$ nbgrader {' '.join(args)}\n")
        log.flush()
        done = subprocess.run(release.nbgrader_command() + list(args), cwd=course.grader_dir,
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    return done.returncode


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join(text[-lines:])


# ---------------------------------------------------------------- collect


@dataclass
class Collected:
    copied: list[tuple[str, str]] = field(default_factory=list)     # (student, chapter)
    unchanged: list[tuple[str, str]] = field(default_factory=list)
    # (student, chapter) -> the files beside the notebook that were not copied
    skipped: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def _valid_timestamp(path: Path) -> bool:
    """Whether nbgrader can read `path` as a submission time (it fails a submission whose
    timestamp.txt it cannot parse)."""
    from nbgrader.utils import parse_utc

    try:
        text = path.read_text().strip()
        return bool(text) and parse_utc(text) is not None
    except (OSError, UnicodeDecodeError, ValueError, TypeError, OverflowError):
        return False


def _files_in(folder: Path, *, leave_out: frozenset[str] | set[str] = frozenset()
              ) -> list[str]:
    """Every file (and link) under `folder`, as sorted paths relative to it; a file or
    folder named in `leave_out` is skipped."""
    found = []
    for here, subfolders, files in os.walk(folder):
        here = Path(here)
        subfolders[:] = [d for d in subfolders if d not in leave_out]
        found += [(here / name).relative_to(folder).as_posix()
                  for name in files + [d for d in subfolders if (here / d).is_symlink()]
                  if name not in leave_out]
    return sorted(found)


def _other_files(chapter_dir: Path, chapter: str) -> list[str]:
    """Every file (or link) in a submission's chapter folder but the notebook and a readable
    timestamp.txt, as paths relative to it; editor litter is left out."""
    found = []
    for relative in _files_in(chapter_dir, leave_out=EDITOR_LITTER):
        if relative == f"{chapter}.ipynb":
            continue
        if relative == TIMESTAMP:
            if _valid_timestamp(chapter_dir / TIMESTAMP):
                continue
            relative += " (not a timestamp nbgrader can read)"
        found.append(relative)
    return found


def collect(course: Course, folder: Path) -> Collected:
    """Import submissions laid out as FOLDER/<student>/<chapter>/<chapter>.ipynb into
    nbgrader's submitted/ folder. Everything is checked first: one problem anywhere and
    nothing is copied. Only the notebook is copied (and a timestamp.txt that nbgrader can
    read); any other file is left out and listed in the result. A submission identical to
    the one already collected is left alone (with its timestamp), so collecting the same
    folder twice regrades nothing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GraderError(f"no folder {folder} to collect submissions from")
    chapters = set(course.chapters())
    problems, found = [], []
    for student_dir in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
        if not student_dir.is_dir():
            problems.append(f"{student_dir}: expected a folder per student, found a file")
            continue
        if not STUDENT_ID.fullmatch(student_dir.name):
            problems.append(f"{student_dir}: a student id is letters, digits and . _ @ + -")
            continue
        entries = sorted(p for p in student_dir.iterdir() if not p.name.startswith("."))
        if not entries:
            problems.append(f"{student_dir}: no chapter folder in it")
        for chapter_dir in entries:
            if not chapter_dir.is_dir() or chapter_dir.name not in chapters:
                problems.append(f"{chapter_dir}: not a chapter folder (the chapters are "
                                f"{', '.join(sorted(chapters))})")
                continue
            notebook = chapter_dir / f"{chapter_dir.name}.ipynb"
            if not notebook.is_file():
                problems.append(f"{chapter_dir}: no {notebook.name} in it")
                continue
            try:
                nbformat.read(notebook, as_version=4)
            except Exception as exc:  # any unreadable notebook is reported, not raised
                problems.append(f"{notebook}: not a readable notebook ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''})")
                continue
            found.append((student_dir.name, chapter_dir.name))
    if problems:
        raise GraderError("nothing was collected; fix these and run again:\n  " +
                          "\n  ".join(problems))
    if not found:
        raise GraderError(f"{folder} holds no submissions (expected "
                          f"{folder}/<student>/<chapter>/<chapter>.ipynb)")
    result = Collected()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    for student, chapter in found:
        incoming = folder / student / chapter
        target = course.submitted / student / chapter
        name = f"{chapter}.ipynb"
        skipped = _other_files(incoming, chapter)
        if skipped:
            result.skipped[(student, chapter)] = skipped
        # Unchanged: the same notebook, and nothing else in submitted/ (an older collect
        # copied whole folders; such a submission is copied again, and so regraded).
        if (target / name).is_file() and \
                (target / name).read_bytes() == (incoming / name).read_bytes() and \
                not extra_files(target, chapter):
            result.unchanged.append((student, chapter))
            continue
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        shutil.copy2(incoming / name, target / name)
        if (incoming / TIMESTAMP).is_file() and _valid_timestamp(incoming / TIMESTAMP):
            shutil.copy2(incoming / TIMESTAMP, target / TIMESTAMP)
        else:  # nbgrader regrades what is newer
            (target / TIMESTAMP).write_text(stamp + "\n")
        result.copied.append((student, chapter))
    return result


def extra_files(submission_dir: Path, chapter: str) -> list[str]:
    """The files (and links) a folder of submitted/ holds besides the notebook and
    timestamp.txt, relative to it."""
    return [f for f in _files_in(submission_dir) if f not in (f"{chapter}.ipynb", TIMESTAMP)]


# ---------------------------------------------------------------- integrity scan


def _course_grade():
    """course/grade.py of the installed course package, loaded from its file: the scan lives
    there (`course grade` runs it for learners), and so does `prepare`, the notebook as the
    verifier runs it. Loading the file alone does not import the `course` package, which
    would start torch and pick a Triton mode in this process."""
    loaded = sys.modules.get("course_grade_scan")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("course")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise GraderError("the `course` package is not installed in this Python, and the "
                          "integrity scan lives in it (course/grade.py): run `make test` once "
                          "(it builds .venv), or `pip install -e .` in the checkout")
    path = Path(list(spec.submodule_search_locations)[0]) / "grade.py"
    scan_spec = importlib.util.spec_from_file_location("course_grade_scan", path)
    module = importlib.util.module_from_spec(scan_spec)
    sys.modules[scan_spec.name] = module  # dataclasses look their module up while it loads
    try:
        scan_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[scan_spec.name]
        raise
    return module


# A flag is the scan's own course.grade.IntegrityFlag (cell, line, what, why, code, short),
# kept under the (chapter, student) of its submission.
Flags = dict[tuple[str, str], list]


def integrity_flags(course: Course, student: str, chapter: str) -> list:
    """The integrity scan of a collected submission against its chapter's source notebook:
    the learner's own code that does what a solution should not need to (course/grade.py
    says what it looks for). Nothing is scored from it: a person reviews the flags."""
    scan = _course_grade()
    notebook = course.submitted / student / chapter / f"{chapter}.ipynb"
    source = course.root / "solutions" / chapter / f"{chapter}.ipynb"
    try:
        found = scan.integrity_flags(nbformat.read(notebook, as_version=4),
                                     nbformat.read(source, as_version=4))
    except Exception as exc:  # a notebook put there by hand may not be readable
        return [scan.IntegrityFlag("notebook", 0, "could not be scanned",
                                   f"{type(exc).__name__}: {exc}", "")]
    return found


def all_integrity_flags(course: Course) -> Flags:
    """(chapter, student) -> flags, for every collected submission (clean ones included,
    with no flags)."""
    return {(chapter, student): integrity_flags(course, student, chapter)
            for chapter in course.chapters() for student in course.submissions(chapter)}


def write_integrity_csv(flags: Flags, path: Path) -> tuple[Path, int]:
    """A row per flag (`all_integrity_flags`) at `path`; returns it and how many submissions
    were flagged. A submission with no row was scanned and raised no flag."""
    flagged = {key: found for key, found in flags.items() if found}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["assignment", "student_id", "cell", "line", "flag", "why", "code"])
        for (chapter, student), found in flagged.items():
            for f in found:
                writer.writerow([chapter, student, f.cell, f.line, f.what, f.why, f.code])
    return path, len(flagged)


def flag_line(student: str, flags: list, csv_path: str) -> str:
    """The line autograde prints for a flagged submission."""
    return (f"  {student}: FLAGGED FOR REVIEW, {len(flags)} integrity flag(s) (details in "
            f"{csv_path}): " + "; ".join(f.short for f in flags))


# ---------------------------------------------------------------- autograde


@dataclass
class ChapterRun:
    chapter: str
    students: list[str]
    graded: list[str]
    failed: list[str]       # nbgrader could not finish the notebook: scored 0
    seconds: float
    log: Path
    # Student -> integrity flags, for every collected submission of the chapter.
    flags: dict[str, list] = field(default_factory=dict)


def _source_hashes(course: Course) -> dict[str, str]:
    return {ch: hashlib.sha256((course.root / "solutions" / ch / f"{ch}.ipynb").read_bytes()
                               ).hexdigest() for ch in course.chapters()}


def _registered(course: Course) -> set[str]:
    """The assignments the gradebook holds (none if there is no gradebook yet)."""
    from nbgrader.api import Gradebook

    if not Path(course.db_url.removeprefix("sqlite:///")).is_file():
        return set()
    with Gradebook(course.db_url, course.course_id) as gb:
        return {a.name for a in gb.assignments}


def register_chapters(course: Course) -> bool:
    """Put every chapter, with its test cells and points, into the gradebook: stock
    generate_assignment WITH the database, into a scratch folder (notebooks/ is left to
    `make release`). Skipped when the gradebook already holds the chapters exactly as
    solutions/ has them now (a stamp of their hashes says so). Returns whether it ran."""
    stamp = course.logs / "registered.json"
    hashes = _source_hashes(course)
    if stamp.is_file() and json.loads(stamp.read_text()) == hashes and \
            set(hashes) <= _registered(course):
        return False
    release = _load_release_script(course.root)
    with tempfile.TemporaryDirectory(prefix="nbgrader-release-") as scratch:
        log = course.logs / "register.log"
        status = run_nbgrader(course, ["generate_assignment", release.CHAPTER_GLOB, "--force",
                                       f"--CourseDirectory.release_directory={scratch}"], log)
    if status != 0:
        stamp.unlink(missing_ok=True)
        raise GraderError(f"nbgrader generate_assignment failed (exit status {status}); "
                          f"the end of {log}:\n{_tail(log)}")
    stamp.write_text(json.dumps(hashes, indent=1))
    return True


def _zero_grades(course: Course, chapter: str, student: str) -> None:
    """nbgrader keeps whatever grades a submission had when a later run of it fails (none,
    or an earlier version's): record 0 for each of its test cells instead. A submission the
    gradebook does not hold (its worker died before any of its grades reached it) is put in,
    so that it is exported as 0, not left out."""
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    with Gradebook(course.db_url, course.course_id) as gb:
        try:
            submission = gb.find_submission(chapter, student)
        except MissingEntry:
            gb.update_or_create_student(student)
            with warnings.catch_warnings():  # as in _copy_submission
                warnings.simplefilter("ignore", SAWarning)
                submission = gb.update_or_create_submission(chapter, student)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                grade.auto_score = 0.0
                grade.manual_score = None
                grade.needs_manual_grade = False
        gb.db.commit()


@dataclass
class Plan:
    """What an autograde run grades, once its submissions were checked and scanned."""

    todo: dict[str, list[str]]          # chapter -> students
    scanned: Flags
    flags_csv: str                      # where the scan's flags were written, for messages
    subset: bool                        # only some students: nbgrader is called per student


def prepare(course: Course, chapters: Sequence[str] | None = None,
            students: Sequence[str] | None = None,
            say: Callable[[str], None] = print) -> Plan:
    """Everything before grading: the submissions to grade, checked (no file beside a
    notebook), scanned (the integrity flags, written to grader/grades_integrity.csv), and the
    chapters registered in the gradebook. First the grading's own Python is byte-compiled
    (`compile_code`), so that the code stamps taken from here on hold its compiled files."""
    rewritten = compile_code(course)
    if (note := compile_packages()) is not None:
        say(note)
    if rewritten:
        say(f"{len(rewritten)} compiled file(s) did not hold their source's code and were "
            "compiled again (one a submission forged, in an earlier run?): "
            + ", ".join(map(str, rewritten[:5])) + (" ..." if len(rewritten) > 5 else ""))
    todo = course_todo(course, chapters, students)
    # nbgrader would copy these beside the notebook, whose kernel imports from its own folder
    # first: a course/ folder there replaces the checkers. `collect` never copies them.
    extras = [f"{student}/{chapter}: {', '.join(files)}" for chapter, names in todo.items()
              for student in names
              if (files := extra_files(course.submitted / student / chapter, chapter))]
    if extras:
        raise GraderError(f"nothing was graded: these folders of {course.submitted} hold files "
                          "besides the notebook, which nbgrader would put beside it where its "
                          "code can import them in place of the course's own modules:\n  " +
                          "\n  ".join(extras) + "\nCollect them again with `make collect "
                          "FROM=<folder>` (it copies only the notebook), or delete those files.")
    scanned = all_integrity_flags(course)  # once: the CSV, and each chapter's lines below
    csv_path, flagged = write_integrity_csv(scanned, course.grader_dir / INTEGRITY_CSV)
    shown = csv_path.relative_to(course.root) if csv_path.is_relative_to(course.root) \
        else csv_path
    say(f"integrity scan: {flagged} collected submission(s) flagged for review "
        f"(every flag: {shown})")
    register_chapters(course)
    return Plan(todo, scanned, str(shown), bool(students))


def course_todo(course: Course, chapters: Sequence[str] | None,
                students: Sequence[str] | None) -> dict[str, list[str]]:
    """chapter -> the collected submissions to grade in it (of `students`, if given)."""
    selected = course.select(chapters)
    wanted = set(students or [])
    todo = {ch: [s for s in course.submissions(ch) if not wanted or s in wanted]
            for ch in selected}
    todo = {ch: names for ch, names in todo.items() if names}
    if not todo:
        raise GraderError(f"no submissions to autograde in {course.submitted} for "
                          f"{', '.join(selected)}: run `make collect FROM=<folder>` first")
    return todo


@dataclass
class Graded:
    """One chapter's submissions, graded: recorded by nbgrader, run by the verifier."""

    graded: list[str]        # nbgrader wrote their autograded notebooks
    failed: list[str]        # nbgrader could not: scored 0 by it, graded by the verifier
    verdicts: dict[str, dict | None]
    log: Path


def _nbgrader_autograde(course: Course, chapter: str, names: Sequence[str], *, force: bool,
                        per_student: bool, env: dict[str, str]
                        ) -> tuple[list[str], list[str], Path]:
    """nbgrader autograde of `names` in `chapter` (one call, or one per student):
    (graded, failed, log); a submission it could not process scores 0 from it."""
    logs = course.logs
    log = logs / f"autograde_{chapter}.log"
    args = ["autograde", chapter] + (["--force"] if force else [])
    if per_student:  # nbgrader's --student is one glob: a call per student keeps it exact
        parts = [logs / f"autograde_{chapter}_{student}.log" for student in names]
        status = max(run_nbgrader(course, args + [f"--student={student}"], part, env)
                     for student, part in zip(names, parts, strict=True))
        if len(parts) == 1:  # one of a student's chapters: the log is its own
            log = parts[0]
        else:
            log.write_text("\n".join(part.read_text(errors="replace") for part in parts))
            for part in parts:
                part.unlink()
    else:
        status = run_nbgrader(course, args, log, env)
    text = log.read_text(errors="replace")
    reported = {s for ch, s in FAILED_LINE.findall(text) if ch == chapter}
    graded = [s for s in names if course.autograded_notebook(s, chapter).is_file()]
    failed = [s for s in names if s not in graded]
    unexplained = [s for s in failed if s not in reported]
    if unexplained:
        raise GraderError(f"nbgrader autograde {chapter} (exit status {status}) did not "
                          f"grade {', '.join(unexplained)} and gave no reason; the end of "
                          f"{log}:\n{_tail(log)}")
    for student in failed:
        _zero_grades(course, chapter, student)
    return graded, failed, log


@dataclass
class Started:
    """A chapter's submissions recorded by nbgrader, their verifier started and waiting."""

    chapter: str
    verification: Verification
    verdicts: dict[str, dict | None]   # the current ones, for what is not verified again
    graded: list[str]
    failed: list[str]
    log: Path
    going: bool = False  # told to go


@functools.cache
def _lock_folder() -> str:
    folder = tempfile.mkdtemp(prefix="course-gpu-locks-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


_lock_numbers = itertools.count()


@functools.cache
def gpu_lock_file(student: str) -> str:
    """The lock file `student`'s chapters take turns on (course/gpu_lock.py): one a student,
    in a folder of this process's, removed as it exits. Only one student's chapters run at
    once on a GPU, so no lock need be shared between students; and a submission's process,
    which runs as this user and can find the file and hold it, so stalls only its own
    chapters."""
    return str(Path(_lock_folder()) / f"{next(_lock_numbers)}.lock")


def chapters_at_once(gpus: int = 1) -> int:
    """How many chapters of a student `autograde` verifies side by side on each of `gpus`
    GPUs by default: a verifier and a learner's process each, about two cores' work, the
    cores shared among the GPUs, up to the eight chapters."""
    return max(1, min(8, (os.cpu_count() or 1) // 2 // max(1, gpus)))


def students_per_task(students: int, gpus: int) -> int:
    """How many students' chapters a task takes with GPUS and chapters side by side: the
    class shared evenly among the GPUs, at most STUDENTS_PER_TASK. Within a task the next
    student's first chapter is recorded and its verifier started while this one's chapters
    run, as one worker does; a task a student paid its start and that first chapter each
    time."""
    return max(1, min(STUDENTS_PER_TASK, -(-students // max(1, gpus))))


def by_chapter(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """(chapter, student) pairs as chapter -> its students, in the pairs' order."""
    found: dict[str, list[str]] = {}
    for chapter, student in pairs:
        found.setdefault(chapter, []).append(student)
    return found


def by_student(todo: dict[str, list[str]]) -> dict[str, list[str]]:
    """chapter -> students as student -> their chapters, in `todo`'s order."""
    found: dict[str, list[str]] = {}
    for chapter, names in todo.items():
        for student in names:
            found.setdefault(student, []).append(chapter)
    return found


def _named(batch: Sequence[tuple[str, str]]) -> str:
    """A batch of (chapter, student) pairs as a log names it: chapter/student,student."""
    return " ".join(f"{chapter}/{','.join(names)}"
                    for chapter, names in by_chapter(batch).items())


def verify_seconds(course: Course, chapter: str, sample: int = 16) -> float | None:
    """The mean time the verifier took on `chapter`'s submissions graded so far (up to
    `sample` of their verdict files: enough to rank the chapters), None before any."""
    times = []
    for path in itertools.islice((course.grader_dir / VERIFIED / chapter).glob("*.json"),
                                 sample):
        try:
            seconds = json.loads(path.read_text()).get("seconds")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(seconds, (int, float)) and seconds > 0:
            times.append(float(seconds))
    return sum(times) / len(times) if times else None


def longest_first(course: Course, chapters: Sequence[str]) -> list[str]:
    """`chapters` in the order to verify them side by side: the longest first, so that it
    is not the last to start (each chapter's nbgrader call runs before its verifier goes,
    one after another). A chapter not verified yet counts as the longest, a later one
    (by its name, chNN_...) before an earlier one: the later chapters time more."""
    seconds = {chapter: verify_seconds(course, chapter) for chapter in chapters}
    return sorted(chapters, reverse=True, key=lambda chapter: (
        seconds[chapter] if seconds[chapter] is not None else float("inf"), chapter))


def longest_first_todo(course: Course, todo: dict[str, list[str]]) -> dict[str, list[str]]:
    """`todo` (chapter -> students) with its chapters in `longest_first` order."""
    return {chapter: todo[chapter] for chapter in longest_first(course, list(todo))}


def one_student_at_a_time(todo: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """`todo` as (chapter, [student]) items, each student's chapters together, in `todo`'s
    order of chapters."""
    return [(chapter, [student]) for student, chapters in by_student(todo).items()
            for chapter in chapters]


def grading_order(course: Course, todo: dict[str, list[str]],
                  at_once: int) -> list[tuple[str, list[str]]]:
    """`todo` as the (chapter, students) items `grade_side_by_side` takes: a chapter at a
    time, or with `at_once` above 1 a student at a time, their longest chapters first."""
    if at_once == 1:
        return list(todo.items())
    return one_student_at_a_time(longest_first_todo(course, todo))


def side_by_side_lock(names: Sequence[str], at_once: int) -> str | None:
    """The GPU lock file of an item of `grading_order` (its one student's), or None when
    chapters are not verified side by side."""
    return gpu_lock_file(names[0]) if at_once > 1 else None


def start_chapter(course: Course, chapter: str, names: Sequence[str], *, force: bool,
                  cell_timeout_s: int | None, per_student: bool, stamp: dict[str, str],
                  gpu_lock: str | None = None) -> Started:
    """The verifier of `names` in `chapter` started (it waits for `go`), and nbgrader
    autograde of them (one call, or one per student), which runs no cell: see
    grader/nbgrader_config.py. Nothing of a submission has run yet."""
    env = dict(GRADING_ENV)
    if cell_timeout_s is not None:
        env["GRADER_CELL_TIMEOUT_S"] = str(cell_timeout_s)
    # The verifier starts first, its start (torch, the first learner's process)
    # overlapping nbgrader's run.
    verdicts = {student: current_verdict(course, chapter, student) for student in names}
    stale = [student for student in names if force or verdicts[student] is None]
    verification = Verification(course, chapter, stale,
                                cell_timeout_s or configured_timeout(course),
                                gpu_lock=gpu_lock)
    try:
        graded, failed, log = _nbgrader_autograde(course, chapter, names, force=force,
                                                  per_student=per_student, env=env)
        check_code_stamp(course, stamp, f"nbgrader autograde {chapter}")
    except BaseException:
        verification.abort()
        raise
    return Started(chapter, verification, verdicts, graded, failed, log)


def finish_chapter(course: Course, started: Started, stamp: dict[str, str]) -> Graded:
    """Let the chapter's verifier run the submissions, and wait: its outputs go into the
    autograded notebooks; its points are not yet in the gradebook (`apply_verdicts`)."""
    verdicts = dict(started.verdicts, **started.verification.finish())
    check_code_stamp(course, stamp, f"the verification of {started.chapter}")
    for student in started.graded:  # nbgrader's notebook, written now or in an earlier run
        annotate(course, started.chapter, student, verdicts[student])
    return Graded(started.graded, started.failed, verdicts, started.log)


def autograde(course: Course, chapters: Sequence[str] | None = None,
              students: Sequence[str] | None = None, *, force: bool = False,
              cell_timeout_s: int | None = None, gpus: Sequence[str] | None = None,
              at_once: int | None = None,
              say: Callable[[str], None] = print) -> list[ChapterRun]:
    """Autograde the collected submissions: one nbgrader call per chapter records them in
    the gradebook, without running a cell, and the verifier runs and grades each (its
    points and outputs replace nbgrader's zeros). A submission that nbgrader cannot process
    (a notebook it cannot read) is listed; other chapters are not touched. Before grading,
    every collected submission is scanned for code that a solution should not need (the
    integrity scan): flagged submissions are listed, and every flag is written to
    grader/grades_integrity.csv, for the instructor to review. The flags cost no points.
    Up to `at_once` chapters of one student (`chapters_at_once()` by default) are verified
    side by side, their timings taking turns on the GPU (course.gpu_lock). With `gpus`, a
    worker per GPU grades the submissions (`autograde_on_gpus`)."""
    if cell_timeout_s is not None and cell_timeout_s <= 0:
        raise GraderError(f"the time limit per cell must be above 0 s, not {cell_timeout_s}")
    plan = prepare(course, chapters, students, say)
    if gpus:
        return autograde_on_gpus(course, plan, gpus, force=force,
                                 cell_timeout_s=cell_timeout_s, at_once=at_once, say=say)
    stamp = code_stamp(course)
    at_once = max(1, at_once or chapters_at_once())
    todo = grading_order(course, plan.todo, at_once)

    def start(index: int) -> Started:
        chapter, names = todo[index]
        return start_chapter(course, chapter, names, force=force,
                             cell_timeout_s=cell_timeout_s,
                             per_student=plan.subset or at_once > 1, stamp=stamp,
                             gpu_lock=side_by_side_lock(names, at_once))

    runs = []
    began = time.perf_counter()

    def graded(chapter: str, names: list[str], done: Graded) -> None:
        nonlocal began
        apply_verdicts(course, [chapter])
        now = time.perf_counter()
        runs.append(report_chapter(course, plan, chapter, names, done, now - began, say))
        began = now

    grade_side_by_side(course, todo, start, at_once=at_once, stamp=stamp, graded=graded,
                       say=say)
    return runs


def grade_side_by_side(course: Course, todo: Sequence[tuple[str, list[str]]],
                       start: Callable[[int], Started], *, at_once: int,
                       stamp: dict[str, str],
                       graded: Callable[[str, list[str], Graded], None],
                       say: Callable[[str], None]) -> None:
    """Grade `todo`'s (chapter, students) items in order, `start(i)` starting item i, up to
    `at_once` of them side by side (their timings take turns on the GPU: course.gpu_lock),
    never two students' at once: a submission's code may leave work on the GPU, which
    should slow no one's kernel but its own. One more is recorded by nbgrader, its verifier
    started and waiting: it runs nothing of a submission, nor anything on the GPU, until its
    `go`. `graded(chapter, students, done)` follows each item, in order. An item that cannot
    be started stops the rest: those already running are finished first, then its error is
    raised."""
    window: collections.deque[tuple[list[str], Started]] = collections.deque()
    started, stopped, current = 0, None, None

    def go_ahead() -> None:
        for names, waiting in list(window)[:at_once]:
            if waiting.going:
                continue
            if any(other.going and others != names for others, other in window):
                return  # the next student's chapters wait for this one's
            say(f"{waiting.chapter}: autograding {len(names)} submission(s) ...")
            waiting.verification.go()
            waiting.going = True

    try:
        while started < len(todo) or window:
            go_ahead()
            while stopped is None and started < len(todo) and \
                    all(entry.going for _, entry in window):
                try:
                    window.append((list(todo[started][1]), start(started)))
                except Exception as exc:  # the chapters already running finish first
                    stopped = exc
                    break
                started += 1
                go_ahead()
            if not window:
                break
            names, current = window.popleft()
            chapter = current.chapter
            done = finish_chapter(course, current, stamp)
            current = None  # finished: nothing of it is left to stop
            graded(chapter, names, done)
    except BaseException:
        for other in [current] + [entry for _, entry in window]:
            if other is not None:
                other.verification.abort()
        raise
    if stopped is not None:
        raise stopped


def report_chapter(course: Course, plan: Plan, chapter: str, names: Sequence[str],
                   done: Graded, seconds: float, say: Callable[[str], None]) -> ChapterRun:
    """What autograde says of one chapter; its ChapterRun."""
    # Every collected submission of the chapter, as the summary lists them all.
    flags = {s: found for s in course.submissions(chapter)
             if (found := plan.scanned.get((chapter, s)))}
    log = done.log
    shown_log = log.relative_to(course.root) if log.is_relative_to(course.root) else log
    say(f"{chapter}: {len(done.graded)} graded, {len(done.failed)} could not be processed "
        f"by nbgrader, in {seconds:.0f} s (log: {shown_log})")
    for student in done.failed:
        say(f"  {student}: NOT GRADED by nbgrader: it could not process the notebook (see "
            "the log), so there is no feedback page; its points are the verifier's alone")
    for student in names:
        if student in done.verdicts:
            for line in verdict_lines(done.verdicts[student], student):
                say(line)
        if student in flags:
            say(flag_line(student, flags[student], plan.flags_csv))
    return ChapterRun(chapter, list(names), done.graded, done.failed, seconds, log, flags)


# ---------------------------------------------------------------- several GPUs, a cluster
#
# A grading run split in shares ("tasks"): each grades its submissions one at a time into a
# gradebook of its own (grader/tasks/<name>/gradebook.db, a copy of the main one taken after
# `prepare`), while the autograded notebooks and the verdicts go where a single run puts
# them. `merge` then copies each task's submissions into the main gradebook, one writer, one
# transaction per submission, and puts in the verified points. On one node, `autograde
# --gpus 0,1` runs a worker per GPU, each pinned to its GPU and taking the next submission
# when it is done with one; on a cluster, each array task of grader/slurm_autograde.sbatch
# grades a fixed share (`task --share K/N`).

TASKS = "tasks"
TASK_RESULTS = "results.json"
# With GPUS and chapters side by side, a task takes at most this many students (see
# `students_per_task`): fewer tasks of more students save each further student's start,
# more of fewer balance the GPUs' work at the end.
STUDENTS_PER_TASK = 8


def task_course(course: Course, task_dir: Path) -> Course:
    """The course as a task grades it: with its own gradebook, a copy of the main one."""
    task_dir.mkdir(parents=True, exist_ok=True)
    own = task_dir / "gradebook.db"
    if not own.is_file():
        main = Path(course.db_url.removeprefix("sqlite:///"))
        if not main.is_file() or not _registered(course):
            raise GraderError("the gradebook has no chapters yet: run `python grader/"
                              "instructor.py prepare` (it scans and registers them) first")
        shutil.copy2(main, own)  # nothing writes the main gradebook while tasks run
    return replace(course, db_url=f"sqlite:///{own}", task_dir=task_dir)


def read_results(task_dir: Path) -> list[dict]:
    try:
        return json.loads((task_dir / TASK_RESULTS).read_text())
    except (OSError, ValueError):
        return []


def run_task(course: Course, task_dir: Path, items: Sequence[tuple[str, str]], *,
             force: bool = False, cell_timeout_s: int | None = None, at_once: int = 1,
             say: Callable[[str], None] = print) -> list[dict]:
    """Grade `items` ((chapter, student) pairs) into the task at `task_dir`, a chapter at a
    time: nbgrader (a call per student), then one verifier for the chapter's students (its
    start-up, the copy bandwidth and the compiled kernels, paid once); with `at_once` above
    1, a student at a time, that many of their chapters side by side (`grade_side_by_side`).
    After each chapter, the task's results say what it did, so a task that dies keeps what
    it finished."""
    task = task_course(course, task_dir)
    # `prepare` compiled the code (in this run's `autograde`, or before the Slurm array):
    # only what is missing or older than its source is compiled here, as an import would.
    compile_code(course, repair=False)
    stamp = code_stamp(course)
    results = read_results(task_dir)
    chapters = by_chapter(items)
    todo = grading_order(task, chapters, at_once)

    def start(index: int) -> Started:
        chapter, students = todo[index]
        return start_chapter(task, chapter, students, force=force,
                             cell_timeout_s=cell_timeout_s, per_student=True, stamp=stamp,
                             gpu_lock=side_by_side_lock(students, at_once))

    def graded(chapter: str, students: list[str], done: Graded) -> None:
        nonlocal results
        results = [r for r in results if not (r["chapter"] == chapter
                                              and r["student"] in students)]
        results += [{"chapter": chapter, "student": student,
                     "nbgrader": student in done.graded} for student in students]
        partial = task_dir / (TASK_RESULTS + ".partial")
        partial.write_text(json.dumps(results, indent=1))
        os.replace(partial, task_dir / TASK_RESULTS)
        for student in students:
            say(f"{chapter}/{student}: " + ("graded" if student in done.graded else
                                            "NOT GRADED by nbgrader")
                + "; " + "; ".join(line.strip() for line in
                                   verdict_lines(done.verdicts[student], student)))

    grade_side_by_side(task, todo, start, at_once=at_once, stamp=stamp, graded=graded,
                       say=say)
    return results


def share(plan: Plan, index: int, count: int) -> list[tuple[str, str]]:
    """Task `index` of `count`'s submissions: every count-th of the sorted list."""
    if not 0 <= index < count:
        raise GraderError(f"share {index}/{count}: the index goes from 0 to {count - 1}")
    items = sorted((chapter, student) for chapter, names in plan.todo.items()
                   for student in names)
    return items[index::count]


def merge(course: Course, say: Callable[[str], None] = print) -> list[dict]:
    """Copy every task's submissions (grader/tasks/*/) into the main gradebook, one
    transaction per submission, then put in the verified points; the merged tasks' folders
    go. Returns every task's results."""
    from nbgrader.api import Gradebook, MissingEntry

    began = time.perf_counter()
    merged: list[dict] = []
    folders = sorted(p for p in (course.grader_dir / TASKS).glob("*") if p.is_dir())
    with Gradebook(course.db_url, course.course_id) as gb:
        for folder in folders:
            results = read_results(folder)
            own = folder / "gradebook.db"
            if results and own.is_file():
                with Gradebook(f"sqlite:///{own}", course.course_id) as tb:
                    for r in results:
                        try:
                            theirs = tb.find_submission(r["chapter"], r["student"])
                        except MissingEntry:
                            continue
                        _copy_submission(gb, theirs, r["chapter"], r["student"])
                        gb.db.commit()
            logs = course.grader_dir / "logs" / f"task_{folder.name}"
            if (folder / "logs").is_dir():
                shutil.rmtree(logs, ignore_errors=True)
                shutil.copytree(folder / "logs", logs)
            merged += results
            shutil.rmtree(folder)
    if folders and not any((course.grader_dir / TASKS).iterdir()):
        (course.grader_dir / TASKS).rmdir()  # every task merged: nothing left to say
    chapters = sorted({r["chapter"] for r in merged})
    if chapters:
        apply_verdicts(course, chapters)
    say(f"merged {len(merged)} graded submission(s) from {len(folders)} task(s) in "
        f"{time.perf_counter() - began:.0f} s")
    return merged


def _copy_submission(gb, theirs, chapter: str, student: str) -> None:
    """A task's submission (nbgrader's record of it) into the main gradebook `gb`."""
    from sqlalchemy.exc import SAWarning

    gb.update_or_create_student(student)
    with warnings.catch_warnings():  # nbgrader's own autoflush chatter while it creates one
        warnings.simplefilter("ignore", SAWarning)
        gb.update_or_create_submission(chapter, student, timestamp=theirs.timestamp)
    for notebook in theirs.notebooks:
        for grade in notebook.grades:
            mine = gb.find_grade(grade.name, notebook.name, chapter, student)
            mine.auto_score, mine.manual_score = grade.auto_score, grade.manual_score
            mine.extra_credit, mine.needs_manual_grade = (grade.extra_credit,
                                                          grade.needs_manual_grade)
        for comment in notebook.comments:
            mine = gb.find_comment(comment.name, notebook.name, chapter, student)
            mine.auto_comment, mine.manual_comment = comment.auto_comment, comment.manual_comment


def _gpu_answers(gpu: str) -> bool:
    """Whether GPU `gpu` still runs a kernel (after a worker on it was killed); True where
    there is no GPU (interpreter mode)."""
    probe = ("import torch\nok = not torch.cuda.is_available() or "
             "float(torch.ones(4, device='cuda').sum()) == 4.0\nraise SystemExit(0 if ok else 1)")
    try:
        return subprocess.run([sys.executable, "-c", probe], timeout=120,
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu),
                              capture_output=True).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _start_task(course: Course, command: list[str], gpu: str) -> subprocess.Popen:
    """A worker's `task` process, pinned to GPU `gpu`, in a process group of its own (killed
    whole at its time limit). tests/test_grader_worker_deaths.py wraps it to make one die."""
    return subprocess.Popen(command, cwd=course.root, start_new_session=True,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def autograde_on_gpus(course: Course, plan: Plan, gpus: Sequence[str], *, force: bool,
                      cell_timeout_s: int | None, at_once: int | None = None,
                      say: Callable[[str], None] = print) -> list[ChapterRun]:
    """Grade `plan` with a worker per GPU, never two on one GPU. Each chapter's submissions
    are split into a batch per GPU; a worker takes the next batch and grades it in a process
    of its own pinned to its GPU (`task`: one verifier start-up per batch, not per
    submission). With `at_once` above 1 (by default `chapters_at_once(len(gpus))`: the
    cores shared among the GPUs), a batch is the chapters of a few students instead
    (`students_per_task`), each student's verified that many side by side. A
    batch whose process dies or runs past its limit goes back in the queue as single
    submissions, less those it finished; a single one that fails again scores 0 and is
    listed. A GPU that stops answering takes no more work. Then `merge`."""
    if len(set(gpus)) != len(gpus):
        raise GraderError(f"GPUS names a GPU twice ({','.join(gpus)}): two workers would "
                          "measure on the same GPU at once")
    shutil.rmtree(course.grader_dir / TASKS, ignore_errors=True)  # an earlier run's leftovers
    at_once = max(1, at_once or chapters_at_once(len(gpus)))
    # A batch: (chapter, student) pairs, one chapter's students or one student's chapters.
    if at_once == 1:
        items = collections.deque(
            [(chapter, st) for st in names[k::len(gpus)]] for chapter, names in
            plan.todo.items() for k in range(min(len(gpus), len(names))))
    else:
        students = list(by_student(plan.todo).items())
        size = students_per_task(len(students), len(gpus))
        items = collections.deque(
            [(chapter, student) for student, chapters in students[k:k + size]
             for chapter in chapters] for k in range(0, len(students), size))

    lost: dict[tuple[str, str], str] = {}
    # Each task process checks a stamp of its own, taken as it starts: one taken after an
    # earlier batch changed the code would not see it (and a task that stops on it dies
    # like any other, its batch coming back in the queue). This process checks its own,
    # taken before any task ran, after each batch: on a change, no batch starts any more.
    stamp = code_stamp(course)
    tampered: list[str] = []
    lock = threading.Lock()
    # A worker with an empty queue waits while another's batch runs: that batch may die
    # and come back as single submissions, which any worker left should then take.
    queue_changed = threading.Condition(lock)
    running = [0]
    timeout = cell_timeout_s or configured_timeout(course)
    start = time.perf_counter()
    log = course.grader_dir / "logs" / "autograde_workers.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"grading {sum(len(b) for b in items)} submission(s) with {len(gpus)} "
        f"worker(s), one per GPU "
        f"({', '.join(gpus)})" + (f", {at_once} chapters of a student at once" if at_once > 1
                                  else "") + " ...")

    def work(gpu: str) -> None:
        while True:
            with queue_changed:
                while not items and running[0] and not tampered:
                    queue_changed.wait()
                if not items or tampered:
                    return
                batch = items.popleft()
                running[0] += 1
            try:
                answers = grade_batch(gpu, batch)
            finally:
                with queue_changed:
                    running[0] -= 1
                    queue_changed.notify_all()
            if not answers:
                say(f"  GPU {gpu} no longer answers after {_named(batch)}: its worker "
                    "stops, the others take the rest")
                return

    def grade_batch(gpu: str, batch: list[tuple[str, str]]) -> bool:
        """One batch in a task process on `gpu`; False when the task died and the GPU no
        longer answers."""
        folder = course.grader_dir / TASKS / f"gpu-{gpu}"
        command = [sys.executable, str(course.grader_dir / "instructor.py"), "task",
                   "--task-dir", str(folder)]
        for chapter, students in by_chapter(batch).items():
            command += ["--item", chapter, *students]
        command += ["--cell-timeout", str(timeout)] + (["--force"] if force else []) + (
            ["--chapters-at-once", str(at_once)] if at_once > 1 else [])
        limit = 2 * sum(_verify_timeout(course, chapter, timeout) for chapter, _ in batch)
        with lock, open(log, "a") as handle:
            handle.write(f"[gpu {gpu}] $ {' '.join(command)}\n")
        began = time.perf_counter()
        process = _start_task(course, command, gpu)
        try:
            out, _ = process.communicate(timeout=limit)
            why = None if process.returncode == 0 else (
                f"its worker on GPU {gpu} ended with status {process.returncode}")
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            why = f"its worker on GPU {gpu} ran past {limit:.0f} s and was killed"
        finished = {(r["chapter"], r["student"]) for r in read_results(folder)}
        try:
            check_code_stamp(course, stamp, f"the batch {_named(batch)} on GPU {gpu}")
            changed = None
        except GraderError as exc:
            changed = str(exc)
        with lock, open(log, "a") as handle:
            handle.write(out + f"(GPU {gpu}: {_named(batch)} in "
                         f"{time.perf_counter() - began:.0f} s)\n")
            if changed is not None:  # no batch starts any more
                tampered.append(changed)
                items.clear()
                return True
            left = [pair for pair in batch if pair not in finished]
            for chapter, st in left if why else []:  # nbgrader would skip what the dead
                # task began or finished of these (their folder under autograded/), whose
                # grades are in no gradebook that merge reads: graded afresh
                shutil.rmtree(course.autograded_notebook(st, chapter).parent,
                              ignore_errors=True)
            if why and len(batch) > 1:  # again one at a time: one costs only itself
                items.extend([pair] for pair in left)
            elif why:
                lost.update({pair: why for pair in left})
        return not why or _gpu_answers(gpu)

    workers = [threading.Thread(target=work, args=(gpu,), daemon=True) for gpu in gpus]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if tampered:  # nothing is merged: the tasks' grades are not to be trusted
        raise GraderError(tampered[0])
    check_code_stamp(course, stamp, "the grading on GPUs")
    for batch in items:  # every GPU stopped answering before these were graded
        lost.update({pair: "no GPU was left answering to grade it" for pair in batch})
    merged = merge(course, say)
    seconds = time.perf_counter() - start
    results_of: dict[str, list[dict]] = collections.defaultdict(list)
    for r in merged:
        results_of[r["chapter"]].append(r)
    runs = []
    for chapter, names in plan.todo.items():
        done = [r["student"] for r in results_of[chapter]]
        for student in names:
            if student not in done:
                _zero_grades(course, chapter, student)
        graded = [r["student"] for r in results_of[chapter] if r["nbgrader"]]
        verdicts = {st: current_verdict(course, chapter, st) for st in names}
        runs.append(report_chapter(
            course, plan, chapter, names,
            # a lost submission gets its own line below, not nbgrader's
            Graded(graded, [st for st in names if st not in graded and (chapter, st) not in lost],
                   verdicts, log),
            seconds, say))
        for student in names:
            if (chapter, student) in lost:
                say(f"  {student}: NOT GRADED: {lost[(chapter, student)]} (log: "
                    f"{log.relative_to(course.root)})")
    return runs


def configured_timeout(course: Course) -> int:
    """The time limit per cell that grader/nbgrader_config.py sets (GRADER_CELL_TIMEOUT_S
    included)."""
    config_path = course.grader_dir / "nbgrader_config.py"
    config = PyFileConfigLoader(config_path.name, path=str(config_path.parent)).load_config()
    return int(config.Execute.timeout)


# ---------------------------------------------------------------- verification
#
# The points come from `python -m course.verify`: the submission's cells run in a process of
# their own and the course's test cells in another, where nothing of the learner's runs
# (nbgrader, which would run them beside the learner's code, runs none: it records each
# test cell at 0, grader/nbgrader_config.py). A submission caught changing what the checks
# rely on scores 0 from that point on. The verdicts are kept under grader/verified/, and the
# instructor's overrides in grader/overrides.csv; both are applied to the gradebook after
# each autograde and before feedback and export.

VERIFIED = "verified"
OVERRIDES_CSV = "overrides.csv"
VERDICTS_CSV = "grades_verdicts.csv"
VERDICT_VERSION = 1  # course/verify/verifier.py's
OVERRIDE_FIELDS = ["assignment", "student_id", "grade_id", "points", "reason", "when"]


def verdict_path(course: Course, chapter: str, student: str) -> Path:
    return course.grader_dir / VERIFIED / chapter / f"{student}.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source(course: Course, chapter: str) -> Path:
    return course.root / "solutions" / chapter / f"{chapter}.ipynb"


def test_cells(course: Course, chapter: str) -> dict[str, float]:
    """grade id -> points of each autograded test cell of `chapter`, from its source."""
    return _test_cells_of(nbformat.read(_source(course, chapter), as_version=4))


def _test_cells_of(nb) -> dict[str, float]:
    found = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            found[meta["grade_id"]] = float(meta["points"])
    return found


def current_verdict(course: Course, chapter: str, student: str) -> dict | None:
    """The verdict for the notebook now collected, against the source now in solutions/;
    None when there is none, or it was made for other versions of either."""
    try:
        verdict = json.loads(verdict_path(course, chapter, student).read_text())
        notebook = course.submitted / student / chapter / f"{chapter}.ipynb"
        if verdict.get("version") != VERDICT_VERSION or \
                verdict.get("sha256") != _sha256(notebook) or \
                verdict.get("source_sha256") != _sha256(_source(course, chapter)):
            return None
        return verdict
    except (OSError, ValueError, AttributeError):
        return None


def _course_package() -> list[Path]:
    """The installed `course` package's folders (the checkers, the verifier)."""
    spec = importlib.util.find_spec("course")
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _site_dirs() -> list[Path]:
    """The grading interpreter's site-packages folders, the user's included."""
    return list(dict.fromkeys(Path(d) for d in [*site.getsitepackages(),
                                                site.getusersitepackages()]))


# A .pth line that starts with `import` is run by every Python process as it starts.
PTH_IMPORT = re.compile(r"\bimport\s+([\w.]+(?:\s*,\s*[\w.]+)*)|__import__\(\s*['\"]([\w.]+)")


def _module_files(folder: Path, name: str) -> list[Path]:
    """The files of top-level module `name` in `folder`: name.py (.pyc, .so, ...) or a
    package name/."""
    if not folder.is_dir():
        return []
    found = [f for f in folder.glob(f"{name}.*") if f.is_file()]
    if (folder / name).is_dir():
        found += [f for f in (folder / name).rglob("*")
                  if f.is_file() and "__pycache__" not in f.parts]
    return found


def _startup_files() -> list[Path]:
    """What Python runs as any later process starts, before a line of the course's: every
    site-packages folder's *.pth files and the modules their `import` lines load from
    there (setuptools' editable finder of `course` is one), and any sitecustomize or
    usercustomize on sys.path or in a site-packages folder (the user's is put on sys.path
    only once it exists)."""
    found: list[Path] = []
    for folder in _site_dirs():
        pths = sorted(folder.glob("*.pth")) if folder.is_dir() else []
        found += pths
        for pth in pths:
            try:
                lines = pth.read_text(errors="replace").splitlines()
            except OSError:
                continue
            names = {name.strip().split(".")[0]
                     for line in lines if line.startswith(("import ", "import\t"))
                     for listed, called in PTH_IMPORT.findall(line)
                     for name in (listed.split(",") if listed else [called])}
            found += [f for name in sorted(names) for f in _module_files(folder, name)]
    for entry in dict.fromkeys([*map(str, _site_dirs()), *sys.path]):
        for name in ("sitecustomize", "usercustomize"):
            found += _module_files(Path(os.path.abspath(entry or os.curdir)), name)
    return list(dict.fromkeys(found))


def _stamped_files(course: Course) -> list[Path]:
    """The grading's own files that code_stamp hashes, less their compiled files."""
    folders = [*_course_package(), course.root / "solutions"]
    files = sorted({f for folder in folders if folder.is_dir() for f in folder.rglob("*")
                    if f.is_file() and "__pycache__" not in f.parts
                    and ".ipynb_checkpoints" not in f.parts})
    files += sorted(course.grader_dir.glob("*.py"))
    return files + [f for f in _startup_files() if f not in files]


def _compiled_files(sources: Sequence[Path]) -> list[Path]:
    """The compiled files of the Python `sources` there are, where an import of them reads
    them (importlib's cache_from_source, sys.pycache_prefix included), at every level of
    optimisation."""
    return [cfile for source in sources if source.suffix == ".py"
            for level in ("", 1, 2)
            if (cfile := Path(importlib.util.cache_from_source(str(source),
                                                               optimization=level))).is_file()]


# What the grading's processes import (nbgrader and its kernel, the verifier, the learner's
# process): without compiled files, each process compiles their source again as it starts.
GRADING_IMPORTS = ("torch", "torch._dynamo", "triton", "numpy", "nbformat", "nbclient",
                   "nbgrader.apps", "ipykernel.kernelapp", "matplotlib.pyplot", "course.verify")


def uncompiled_modules(packages: Sequence[str]) -> tuple[int, int, list[str]]:
    """(modules without a compiled file where an import looks for one, modules, the
    packages' folders): the Python files of `packages` whose .pyc (at Python's own place for
    it, `importlib.util.cache_from_source`) is missing or older than the source."""
    missing = total = 0
    folders = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            folders.append(folder)
            for source in Path(folder).rglob("*.py"):
                total += 1
                missing += _uncompiled(str(source))
    return missing, total, folders


def _uncompiled(source: str) -> bool:
    """Whether an import of `source` would compile it: its .pyc (at Python's own place for
    it) is missing or older than the source."""
    try:
        return os.stat(importlib.util.cache_from_source(source)).st_mtime < \
            os.stat(source).st_mtime
    except (OSError, ValueError):
        return True


# Run in a fresh process: each Python source that `imports` load, with the folder of its
# top-level package (or the file of a lone module).
_IMPORTED_SOURCES = """
import importlib, json, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        pass
found = []
for module in list(sys.modules.values()):
    source = getattr(module, "__file__", None) or ""
    if source.endswith(".py"):
        top = sys.modules.get(module.__name__.split(".")[0])
        where = getattr(top, "__path__", None)
        found.append((source, list(where)[0] if where else getattr(top, "__file__", source)))
print(json.dumps(found))
"""


def compile_packages(imports: Sequence[str] = GRADING_IMPORTS) -> str | None:
    """Byte-compile, once, the packages the grading's processes import, where they have no
    compiled files (a Docker image built with PYTHONDONTWRITEBYTECODE or pip --no-compile):
    otherwise every process compiles them again as it starts. On the H100 image measured,
    `import torch, torch._dynamo` took 8.9 to 9.5 s uncompiled and 3.0 to 3.6 s compiled,
    and a full submission starts about 24 such processes (docs/grading-time.md). Compiled in
    place, as pip does: a submission that can write these compiled files can write their
    sources too. What to tell the instructor, or None when there was nothing to do."""
    packages = sorted({name.split(".")[0] for name in imports})
    missing, total, _ = uncompiled_modules(packages)
    if total == 0 or missing < total // 4:
        return None
    started = time.perf_counter()
    listed = subprocess.run([sys.executable, "-c", _IMPORTED_SOURCES, *imports],
                            capture_output=True, text=True, check=False)
    try:
        imported = json.loads(listed.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        imported = []
    folders = sorted({where for source, where in imported if _uncompiled(source)})
    if folders:
        subprocess.run([sys.executable, "-m", "compileall", "-qq", "-j", "0", *folders],
                       check=False)
    left, total, package_folders = uncompiled_modules(packages)
    if left < total // 4:
        return (f"{missing} of the {total} Python modules of {', '.join(packages)} had no "
                f"compiled file, which every grading process would compile again as it "
                f"starts: compiled once, with what they import, in "
                f"{time.perf_counter() - started:.0f} s ({len(folders)} folders).")
    return (f"{left} of the {total} Python modules of {', '.join(packages)} have no "
            "compiled file, and this user cannot write one: every grading process (three a "
            "chapter) compiles them again, several seconds each. Compile them once, as the "
            "user who owns them:\n  "
            f"{sys.executable} -m compileall -q -j 0 " + " ".join(folders or package_folders))


def compile_code(course: Course, *, repair: bool = True) -> list[Path]:
    """Byte-compile the grading's own Python (the files code_stamp hashes) where an import
    would write it, before the first stamp of a run: a process that imports them later reads
    these and writes none, and a compiled file written while grading then means tampering.
    Only what is missing or older than its source is compiled (compileall, Python's default
    invalidation mode). With `repair`, each compiled file is then checked to hold its
    source's code, and compiled again if not: a submission of an earlier run may have forged
    one, with the source's time and size in its header, which every import would run.
    Returns those compiled again. About 0.2 s for the course."""
    rewritten = []
    for source in _stamped_files(course):
        if source.suffix != ".py":
            continue
        compileall.compile_file(source, quiet=2)
        if not repair:
            continue
        cfile = Path(importlib.util.cache_from_source(str(source)))
        try:
            code = compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            continue  # not importable: no import reads a compiled file of it either
        try:
            data = cfile.read_bytes()
            if data[16:] == marshal.dumps(code) or marshal.loads(data[16:]) == code:
                continue
        except (OSError, ValueError, EOFError, TypeError):
            if not cfile.exists():
                continue  # not writable there: an import cannot write it either
        py_compile.compile(str(source), doraise=False, quiet=2)
        rewritten.append(cfile)
    return rewritten


def _hashes(files: Sequence[Path]) -> dict[str, str]:
    found = {}
    for f in dict.fromkeys(files):
        try:
            found[str(f)] = _sha256(f)
        except OSError:  # gone since it was listed: as if not there
            pass
    return found


def code_stamp(course: Course) -> dict[str, str]:
    """A hash of every file of the grading's own code: the installed `course` package (the
    checkers, the verifier), solutions/ (the test cells, the reference kernels) and grader/'s
    Python, the compiled files of their Python (which an import runs in place of the
    source when their header matches the source's time and size: a forged one would run in
    every later process), and what Python runs as any process starts (`_startup_files`:
    the .pth files of site-packages, sitecustomize, usercustomize). The learner's code runs
    as the user who grades: a submission that rewrote one of these would change how later
    submissions are graded. `compile_code` runs first, so that no import writes a compiled
    file while grading."""
    files = _stamped_files(course)
    return _hashes(files + _compiled_files(files))


def _stamp_kind(name: str) -> str:
    path = Path(name)
    if "__pycache__" in path.parts or path.suffix == ".pyc":
        return "compiled"
    if path.suffix == ".pth" or path.name.startswith(("sitecustomize", "usercustomize")) \
            or any(path.is_relative_to(d) for d in _site_dirs()):
        return "run as Python starts"
    return ""


def check_code_stamp(course: Course, before: dict[str, str], after_what: str) -> None:
    now = code_stamp(course)
    changed = sorted(f for f in set(before) | set(now) if before.get(f) != now.get(f))
    if changed:
        notes = {f: [n for n in ("new" if f not in before else "removed" if f not in now
                                 else "", _stamp_kind(f)) if n] for f in changed}
        shown = [f"{f} ({', '.join(notes[f])})" if notes[f] else f for f in changed]
        raise GraderError(
            f"the grading's own code changed while {after_what} ran: "
            + ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5
                                      else "")
            + ". A submission may have written them (its code runs as the user who grades). "
            "Restore the checkout (git checkout, reinstall), delete any .pth, sitecustomize "
            "or usercustomize file named that you did not install (compiled files are "
            "checked against their source and compiled again at the next autograde), then "
            "grade in a container or as a user who cannot write the code (grader/README.md); "
            "the grades written so far are not to be trusted.")


def _verify_timeout(course: Course, chapter: str, cell_timeout_s: int) -> float:
    """Long enough for every cell of the chapter to reach its time limit."""
    cells = sum(c.cell_type == "code"
                for c in nbformat.read(_source(course, chapter), as_version=4).cells)
    return (cells + 2) * (cell_timeout_s + 15) + 600


class Verification:
    """The verifier on collected submissions of one chapter (one process for all, each
    submission's code in a process of its own), started ahead: it imports and starts the
    first learner's process while nbgrader runs the chapter, then waits for `go()`
    before it runs any submission (nothing of it runs on the GPU meanwhile)."""

    def __init__(self, course: Course, chapter: str, students: Sequence[str],
                 cell_timeout_s: int, *, gpu_lock: str | None = None):
        self.course, self.chapter, self.students = course, chapter, list(students)
        self.process = None
        if not students:
            return
        self.limit = len(students) * _verify_timeout(course, chapter, cell_timeout_s)
        log = course.logs / f"verify_{chapter}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "course.verify", str(_source(course, chapter)),
                   "--cell-timeout", str(cell_timeout_s), "--after-go"]
        for student in students:
            verdict_path(course, chapter, student).unlink(missing_ok=True)
            command += ["--submission",
                        str(course.submitted / student / chapter / f"{chapter}.ipynb"),
                        str(verdict_path(course, chapter, student))]
        self.log = open(log, "a")  # noqa: SIM115 (closed by finish or abort)
        self.log.write(f"$ {' '.join(command)}\n")
        self.log.flush()
        self.process = subprocess.Popen(command, cwd=course.grader_dir,
                                        env=dict(os.environ, **GRADING_ENV, **(
                                            {GPU_LOCK_ENV: gpu_lock} if gpu_lock else {})),
                                        stdin=subprocess.PIPE, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def go(self) -> None:
        """Let it verify (once)."""
        if self.process is None or self.process.stdin.closed:
            return
        with contextlib.suppress(OSError):  # it may have died: then its verdicts are absent
            self.process.stdin.write(b"go\n")
            self.process.stdin.close()

    def finish(self) -> dict[str, dict | None]:
        """Let it verify if not yet told to, and wait: student -> verdict, None where it
        produced none (the verifier was killed or failed: that submission then scores 0)."""
        if self.process is None:
            return {}
        self.go()
        try:
            self.process.wait(timeout=self.limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.log.write("\n[killed: the verification ran past its time limit]\n")
        self.log.close()
        return {student: current_verdict(self.course, self.chapter, student)
                for student in self.students}

    def abort(self) -> None:
        """The grading stopped before the verification could finish."""
        if self.process is None or self.log.closed:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        self.log.write("\n[stopped before it began: the chapter's grading stopped]\n")
        self.log.close()


ERROR_NAME = re.compile(r"([A-Za-z_][\w.]*): ")
# The error a test cell shows for a verdict whose reason names no exception.
STATUS_ERRORS = {"tampering": "Tampering", "lost": "LearnerProcessLost", "not run": "NotRun",
                 "failed": "Failed", "timeout": "CellTimeoutError"}


def _error_output(reason: str, status: str = "failed") -> dict:
    named = ERROR_NAME.match(reason)  # "Name: message", as the verifier writes errors
    ename = named.group(1) if named else STATUS_ERRORS.get(status, "Failed")
    evalue = reason[named.end():] if named else reason
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                  traceback=reason.splitlines() or [ename])


def _verified_outputs(found: dict | None) -> list:
    """A test cell's outputs on the feedback page: what it printed when the verifier ran it,
    its error, and the points it earned."""
    if found is None:
        return [_error_output("NotVerified: this submission could not be verified, so this "
                              "cell scores 0")]
    outputs = []
    if found["output"]:
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=found["output"]))
    if found["status"] != "passed":
        outputs.append(_error_output(found["reason"] or found["status"], found["status"]))
    outputs.append(nbformat.v4.new_output(
        "stream", name="stdout", text=f"{VERIFIED_LINE} {found['points']:g} of "
                                      f"{found['max_points']:g} points\n"))
    return outputs


def annotate(course: Course, chapter: str, student: str, verdict: dict | None) -> None:
    """Put the verifier's run into the autograded notebook (what the feedback page shows),
    in place of the outputs nbgrader left (it runs no cell): under each test cell what it
    printed, its error and its points; under each of the learner's cells the end of what it
    printed, and its error."""
    path = course.autograded_notebook(student, chapter)
    if not path.is_file():
        return
    nb = nbformat.read(path, as_version=4)
    # The cells as the verifier ran and named them: the same cells, in the same order (the
    # autograded notebook's own names where that could not be had).
    submitted = course.submitted / student / chapter / f"{chapter}.ipynb"
    source = nbformat.read(_source(course, chapter), as_version=4)
    try:
        ran = _course_grade().prepare(nbformat.read(submitted, as_version=4), source).cells
    except Exception:  # not readable here: the autograded notebook names its own cells
        ran = nb.cells
    if len(ran) != len(nb.cells):
        ran = nb.cells
    tests = _test_cells_of(source)
    by_id = {c["grade_id"]: c for c in (verdict or {}).get("cells", [])}
    # A cell run again after a lost process appears twice: its last run is shown.
    errors = {e["cell"]: e["error"] for e in (verdict or {}).get("learner_errors", [])}
    printed = {e["cell"]: e["output"] for e in (verdict or {}).get("learner_output", [])}
    for index, (cell, as_run) in enumerate(zip(nb.cells, ran, strict=True)):
        if cell.cell_type != "code":
            continue
        meta = as_run.get("metadata", {}).get("nbgrader", {})
        label = meta.get("grade_id") or f"cell {index + 1}"  # as the verifier names cells
        if meta.get("grade") and not meta.get("solution") and label in tests:
            cell.outputs = _verified_outputs(by_id.get(label))
            continue
        cell.outputs = []
        if label in printed:
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout",
                                                       text=printed[label]))
        if label in errors:
            cell.outputs.append(_error_output(errors[label]))
    nbformat.write(nb, path)


@dataclass(frozen=True)
class Override:
    chapter: str
    student: str
    grade_id: str
    points: float
    reason: str
    when: str


def read_overrides(course: Course) -> dict[tuple[str, str, str], Override]:
    path = course.grader_dir / OVERRIDES_CSV
    if not path.is_file():
        return {}
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {(r["assignment"], r["student_id"], r["grade_id"]):
            Override(r["assignment"], r["student_id"], r["grade_id"], float(r["points"]),
                     r["reason"], r["when"]) for r in rows}


def _write_overrides(course: Course, overrides: dict[tuple[str, str, str], Override]) -> None:
    path = course.grader_dir / OVERRIDES_CSV
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(OVERRIDE_FIELDS)
        for o in overrides.values():
            writer.writerow([o.chapter, o.student, o.grade_id, f"{o.points:g}", o.reason, o.when])
    os.replace(partial, path)


def override(course: Course, chapter: str, student: str, grade_id: str,
             points: float | None, reason: str) -> Override | None:
    """Record the instructor's decision on one test cell of one submission (points None:
    remove an earlier one), with the reason, and apply it to the gradebook."""
    if chapter not in course.chapters():
        raise GraderError(f"unknown chapter {chapter}; the chapters are "
                          f"{', '.join(course.chapters())}")
    cells = test_cells(course, chapter)
    if grade_id not in cells:
        raise GraderError(f"{chapter} has no autograded test cell {grade_id!r}; its test cells "
                          f"are {', '.join(cells)}")
    if student not in course.submissions(chapter):
        raise GraderError(f"no collected submission of {chapter} by {student!r}")
    if not reason.strip():
        raise GraderError("say why (--reason): the reason is recorded with the points")
    overrides = read_overrides(course)
    key = (chapter, student, grade_id)
    if points is None:
        if key not in overrides:
            raise GraderError(f"no override of {grade_id} for {student} in {chapter} to remove")
        del overrides[key]
        found = None
    else:
        if not 0 <= points <= cells[grade_id]:
            raise GraderError(f"{grade_id} is worth 0 to {cells[grade_id]:g} points, not "
                              f"{points:g}")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        found = overrides[key] = Override(chapter, student, grade_id, float(points),
                                          reason.strip(), stamp)
    _write_overrides(course, overrides)
    if Path(course.db_url.removeprefix("sqlite:///")).is_file():
        apply_verdicts(course, [chapter])
    return found


@dataclass(frozen=True)
class CellVerdict:
    chapter: str
    student: str
    grade_id: str
    points: float
    max_points: float
    status: str          # the verifier's, "not verified", or "overridden"
    reason: str


def apply_verdicts(course: Course, chapters: Sequence[str] | None = None) -> list[CellVerdict]:
    """Put the verified points (or the instructor's overrides) into the gradebook for every
    autograded test cell of every submission nbgrader graded in `chapters`; a submission
    with no current verdict scores 0 there. One transaction per submission. Returns every
    test cell's points and why."""
    from nbgrader.api import Gradebook, MissingEntry

    overrides = read_overrides(course)
    rows = []
    with Gradebook(course.db_url, course.course_id) as gb:
        for chapter in course.select(chapters):
            cells = test_cells(course, chapter)
            for student in course.submissions(chapter):
                try:
                    submission = gb.find_submission(chapter, student)
                except MissingEntry:
                    continue
                verdict = current_verdict(course, chapter, student)
                by_id = {c["grade_id"]: c for c in (verdict or {}).get("cells", [])}
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        if grade.name not in cells:
                            continue
                        found = by_id.get(grade.name)
                        points = float(found["points"]) if found else 0.0
                        status = found["status"] if found else "not verified"
                        reason = found["reason"] if found else (
                            "no verdict for this version of the notebook: run `make autograde` "
                            "again (it verifies what has none)")
                        chosen = overrides.get((chapter, student, grade.name))
                        if chosen is not None:
                            points, status = chosen.points, "overridden"
                            reason = f"{chosen.reason} (overridden {chosen.when})"
                        grade.auto_score = points
                        grade.manual_score = None
                        grade.needs_manual_grade = False
                        rows.append(CellVerdict(chapter, student, grade.name, points,
                                                cells[grade.name], status, reason))
                gb.db.commit()
    return rows


def write_verdicts_csv(rows: list[CellVerdict], path: Path) -> Path:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["assignment", "student_id", "grade_id", "points", "max_points",
                         "status", "reason"])
        for r in rows:
            writer.writerow([r.chapter, r.student, r.grade_id, f"{r.points:g}",
                             f"{r.max_points:g}", r.status, r.reason])
    os.replace(partial, path)
    return path


def verdict_lines(verdict: dict | None, student: str) -> list[str]:
    """What autograde says of one verified submission."""
    if verdict is None:
        return [f"  {student}: NOT VERIFIED, scored 0: the verifier gave no verdict (see "
                "grader/logs/verify_*.log)"]
    got = sum(c["points"] for c in verdict["cells"])
    out_of = sum(c["max_points"] for c in verdict["cells"])
    waited = sum(verdict.get("gpu_wait_seconds", {}).values())
    lines = [f"  {student}: verified {got:g} / {out_of:g} in {verdict['seconds']:.0f} s"
             + (f" ({waited:.0f} s of it waiting for the GPU beside other chapters)"
                if waited >= 0.5 else "")]
    for found in verdict.get("tampering", []):
        lines.append(f"  {student}: TAMPERING in {found['cell']}, scored 0 from there on: "
                     + "; ".join(found["changes"][:3]))
    for why in verdict.get("lost", []):
        lines.append(f"  {student}: the learner's process was lost: {why.splitlines()[0]}")
    return lines


# ---------------------------------------------------------------- scores, feedback, grades


@dataclass(frozen=True)
class CellGrade:
    chapter: str
    student: str
    grade_id: str
    score: float
    max_score: float


def cell_grades(course: Course) -> list[CellGrade]:
    """Every student's score on every test cell of every chapter in the gradebook (0 where
    nothing was submitted), in chapter, student, notebook order."""
    from nbgrader.api import Gradebook, MissingEntry

    rows = []
    with Gradebook(course.db_url, course.course_id) as gb:
        students = sorted(s.id for s in gb.students)
        for assignment in sorted(gb.assignments, key=lambda a: a.name):
            for student in students:
                try:
                    submission = gb.find_submission(assignment.name, student)
                except MissingEntry:
                    submission = None
                for notebook in assignment.notebooks:
                    scores = {}
                    if submission is not None:
                        found = gb.find_submission_notebook(notebook.name, assignment.name,
                                                            student)
                        scores = {g.name: float(g.score or 0.0) for g in found.grades}
                    for cell in notebook.grade_cells:
                        rows.append(CellGrade(assignment.name, student, cell.name,
                                              scores.get(cell.name, 0.0),
                                              float(cell.max_score)))
    return rows


def summary(course: Course, chapters: Sequence[str], flags: Flags | None = None) -> str:
    """A line per student and chapter: score, the test cells that lost points, and how many
    integrity flags the submission has (they cost no points: a person reviews them).
    `flags`: the scan's results if already at hand (`all_integrity_flags`)."""
    flags = all_integrity_flags(course) if flags is None else flags
    lines = []
    by_key: dict[tuple[str, str], list[CellGrade]] = {}
    for row in cell_grades(course):
        if row.chapter in chapters:
            by_key.setdefault((row.chapter, row.student), []).append(row)
    for chapter in chapters:
        for student in course.submissions(chapter):
            cells = by_key.get((chapter, student), [])
            got, out_of = sum(c.score for c in cells), sum(c.max_score for c in cells)
            lost = ", ".join(f"{c.grade_id} ({c.max_score - c.score:g})" for c in cells
                             if c.score < c.max_score)
            found = flags.get((chapter, student))
            lines.append(f"  {chapter:<22} {student:<20} {got:>6g} / {out_of:g}"
                         + (f"   lost: {lost}" if lost else "")
                         + (f"   FLAGGED: {len(found)} integrity flag(s), review by hand"
                            if found else ""))
    return "\n".join(lines)


def feedback(course: Course, chapters: Sequence[str] | None = None) -> list[Path]:
    """HTML feedback for every autograded submission: grader/feedback/<student>/<chapter>/."""
    selected = course.select(chapters)
    todo = [ch for ch in selected
            if any(course.autograded_notebook(s, ch).is_file() for s in course.submissions(ch))]
    if not todo:
        raise GraderError("nothing autograded yet for " + ", ".join(selected) +
                          ": run `make autograde` first")
    apply_verdicts(course, todo)  # the feedback shows the verified points
    for chapter in todo:
        log = course.logs / f"feedback_{chapter}.log"
        status = run_nbgrader(course, ["generate_feedback", chapter, "--force"], log)
        if status != 0:
            raise GraderError(f"nbgrader generate_feedback {chapter} failed (exit status "
                              f"{status}); the end of {log}:\n{_tail(log)}")
    return sorted(p for ch in todo for p in course.feedback.glob(f"*/{ch}/*.html"))


def export_grades(course: Course, out: Path | None = None
                  ) -> tuple[Path, Path, Path, Path, list[CellVerdict]]:
    """nbgrader's CSV (a row per student and chapter) at `out` (default grader/grades.csv),
    a row per student and test cell beside it (grades_by_exercise.csv), a row per test cell
    with its verified points and why (grades_verdicts.csv), and a row per integrity flag of
    every collected submission (grades_integrity.csv). The verified points and the
    instructor's overrides are put into the gradebook first: nothing reaches the CSV files
    that the verifier did not decide, or an instructor."""
    out = (course.grader_dir / "grades.csv") if out is None else Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)  # nbgrader does not create it
    verdicts = apply_verdicts(course) if Path(
        course.db_url.removeprefix("sqlite:///")).is_file() else []
    log = course.logs / "export.log"
    status = run_nbgrader(course, ["export", f"--to={out}"], log)
    if status != 0 or not out.is_file():
        raise GraderError(f"nbgrader export failed (exit status {status}); the end of "
                          f"{log}:\n{_tail(log)}")
    by_exercise = out.with_name(f"{out.stem}_by_exercise.csv")
    with open(by_exercise, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["assignment", "student_id", "grade_id", "score", "max_score"])
        for row in cell_grades(course):
            writer.writerow([row.chapter, row.student, row.grade_id, f"{row.score:g}",
                             f"{row.max_score:g}"])
    checked = write_verdicts_csv(verdicts, out.with_name(f"{out.stem}_verdicts.csv"))
    integrity, _ = write_integrity_csv(all_integrity_flags(course),
                                       out.with_name(f"{out.stem}_integrity.csv"))
    return out, by_exercise, checked, integrity, verdicts


# ---------------------------------------------------------------- command line


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _at_least_one(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {number}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader/instructor.py",
                                     description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True, metavar="STEP")
    collect_step = steps.add_parser("collect", help="import FOLDER/<student>/<chapter>/"
                                                    "<chapter>.ipynb into grader/submitted/")
    collect_step.add_argument("folder", type=Path)
    grade_step = steps.add_parser("autograde", help="autograde collected submissions: "
                                                    "recorded by nbgrader, run and graded by "
                                                    "the verifier")
    grade_step.add_argument("--chapters", default="", help="comma-separated (default: all)")
    grade_step.add_argument("--students", default="", help="comma-separated (default: all)")
    grade_step.add_argument("--force", action="store_true",
                            help="regrade submissions already autograded")
    grade_step.add_argument("--cell-timeout", type=int, default=None, metavar="SECONDS",
                            help="time limit per cell (default: grader/nbgrader_config.py's)")
    grade_step.add_argument("--gpus", default="", metavar="0,1,...",
                            help="a worker per GPU, each pinned to its GPU (default: one run "
                                 "on whatever GPU the environment gives)")
    grade_step.add_argument("--chapters-at-once", type=_at_least_one, default=None, metavar="N",
                            help="chapters of a student verified side by side, their timings "
                                 "taking turns on the GPU (default: half the CPU cores "
                                 "shared among --gpus, at most 8 a GPU; 1 for a GPU short of "
                                 "memory)")
    prepare_step = steps.add_parser("prepare", help="scan and register what a cluster's tasks "
                                                    "will grade (before `task`)")
    prepare_step.add_argument("--chapters", default="", help="comma-separated (default: all)")
    prepare_step.add_argument("--students", default="", help="comma-separated (default: all)")
    task_step = steps.add_parser("task", help="grade a share of the submissions into a task "
                                              "folder of its own (then `merge`)")
    task_step.add_argument("--task-dir", type=Path, default=None,
                           help="default: grader/tasks/share-K-of-N, or grader/tasks/item")
    which = task_step.add_mutually_exclusive_group(required=True)
    which.add_argument("--share", default=None, metavar="K/N",
                       help="the K-th of N shares of the collected submissions (K from 0)")
    which.add_argument("--item", nargs="+", action="append", metavar="CHAPTER STUDENT",
                       help="a chapter and one or more of its students (again for more "
                            "chapters)")
    task_step.add_argument("--chapters", default="", help="comma-separated (default: all)")
    task_step.add_argument("--students", default="", help="comma-separated (default: all)")
    task_step.add_argument("--force", action="store_true")
    task_step.add_argument("--cell-timeout", type=int, default=None, metavar="SECONDS")
    task_step.add_argument("--chapters-at-once", type=_at_least_one, default=1, metavar="N",
                           help="a student's chapters verified side by side (default: 1)")
    steps.add_parser("merge", help="the tasks' grades into the gradebook (grader/tasks/)")
    feedback_step = steps.add_parser("feedback", help="HTML feedback in grader/feedback/")
    feedback_step.add_argument("--chapters", default="", help="comma-separated (default: all)")
    override_step = steps.add_parser(
        "override", help="set the points of one test cell of one submission by hand, with "
                         "the reason (recorded in grader/overrides.csv)")
    override_step.add_argument("chapter")
    override_step.add_argument("student")
    override_step.add_argument("grade_id", help="the test cell, e.g. ex04_fused_correct")
    override_step.add_argument("points", type=float, nargs="?", default=None)
    override_step.add_argument("--reason", required=True, help="why (kept with the points)")
    override_step.add_argument("--remove", action="store_true",
                               help="drop an earlier override: the verified points apply")
    grades_step = steps.add_parser("grades", help="export the grades as CSV")
    grades_step.add_argument("--out", type=Path, default=None,
                             help="CSV file (default: grader/grades.csv)")
    return parser


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    args = build_parser().parse_args(argv)
    try:
        course = Course.at(root)
        if args.step == "collect":
            done = collect(course, args.folder)
            print(f"collected {len(done.copied)} submission(s) into {course.submitted}"
                  + (f"; {len(done.unchanged)} unchanged since the last collection"
                     if done.unchanged else ""))
            for student, chapter in done.copied:
                print(f"  {student}/{chapter}")
            if done.skipped:
                print("only the notebooks were collected; these files beside them were "
                      "left out (a file there could stand in for a course module when the "
                      "notebook runs):")
            for (student, chapter), files in done.skipped.items():
                print(f"  {student}/{chapter}: {len(files)} file(s) left out: "
                      + ", ".join(files))
            return 0
        if args.step == "prepare":
            plan = prepare(course, _split(args.chapters), _split(args.students))
            count = sum(len(names) for names in plan.todo.values())
            print(f"ready: {count} submission(s) to grade; the chapters are in the gradebook")
            return 0
        if args.step == "task":
            if args.item:
                if any(len(item) < 2 for item in args.item):
                    raise GraderError("--item takes a chapter and at least one student")
                items = [(item[0], student) for item in args.item for student in item[1:]]
                folder = args.task_dir or course.grader_dir / TASKS / "item"
            else:
                index, _, count = args.share.partition("/")
                if not (index.isdigit() and count.isdigit() and int(count) > 0):
                    raise GraderError(f"--share takes K/N, as 3/10, not {args.share!r}")
                plan = Plan(course_todo(course, _split(args.chapters), _split(args.students)),
                            {}, "", True)
                items = share(plan, int(index), int(count))
                folder = args.task_dir or course.grader_dir / TASKS / f"share-{index}-of-{count}"
            run_task(course, folder, items, force=args.force, cell_timeout_s=args.cell_timeout,
                     at_once=args.chapters_at_once)
            return 0
        if args.step == "merge":
            merged = merge(course)
            missing = [(ch, st) for ch in course.chapters() for st in course.submissions(ch)
                       if current_verdict(course, ch, st) is None]
            for chapter, student in missing:
                print(f"  {student}/{chapter}: NOT VERIFIED (no task graded it, or its task "
                      "died): it scores 0 until graded")
            return 0 if merged and not missing else 1
        if args.step == "autograde":
            runs = autograde(course, _split(args.chapters), _split(args.students),
                             force=args.force, cell_timeout_s=args.cell_timeout,
                             gpus=_split(args.gpus), at_once=args.chapters_at_once)
            scanned = {(r.chapter, s): found for r in runs for s, found in r.flags.items()}
            chapters = list(dict.fromkeys(r.chapter for r in runs))
            print("scores:\n" + summary(course, chapters, scanned))
            return 1 if any(r.failed for r in runs) else 0
        if args.step == "feedback":
            files = feedback(course, _split(args.chapters))
            print(f"wrote {len(files)} feedback file(s) under {course.feedback}")
            return 0
        if args.step == "grades":
            out, by_exercise, checked, integrity, verdicts = export_grades(course, args.out)
            print(f"wrote {out} (per chapter), {by_exercise} (per test cell), {checked} (the "
                  f"verified points of each test cell, and why) and {integrity} (per integrity "
                  "flag)")
            unverified = sorted({(v.chapter, v.student) for v in verdicts
                                 if v.status == "not verified"})
            for chapter, student in unverified:
                print(f"  {student}/{chapter}: NOT VERIFIED, exported as 0: run "
                      f"`make autograde CHAPTERS={chapter} STUDENTS={student}`")
            return 0
        if args.step == "override":
            points = None if args.remove else args.points
            if points is None and not args.remove:
                raise GraderError("give the points, or --remove to drop an earlier override")
            done = override(course, args.chapter, args.student, args.grade_id, points,
                            args.reason)
            print(f"{args.student}/{args.chapter} {args.grade_id}: "
                  + (f"{done.points:g} points, recorded in {course.grader_dir / OVERRIDES_CSV}"
                     if done else "override removed: the verified points apply again"))
            return 0
    except GraderError as exc:
        print(f"{args.step} failed: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled step {args.step!r}")  # argparse refuses others


if __name__ == "__main__":
    raise SystemExit(main())
