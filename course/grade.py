"""`course grade NOTEBOOK`: a learner's own notebook graded as the autograder grades it.

The autograder (stock nbgrader, grader/README.md) takes a submission, puts the course's own
copy of every test cell back in place (hidden tests included), runs the notebook top to
bottom in a fresh kernel with a time limit per cell, and scores each test cell: no error and
nothing written to stderr earns its points. This module does the same outside nbgrader, with
no gradebook: the test cells come from the chapter's source notebook in solutions/, matched
by grade id, and the scoring is nbgrader's own (`nbgrader.utils.determine_grade`).

    report = grade_notebook("notebooks/ch01_math/ch01_math.ipynb")
    print(report.table())

It needs a checkout of the course: solutions/ (the source notebooks) and
grader/nbgrader_config.py (the per-cell time limit and its message, and how the notebook's
kernel is started).

What the learner reads is the part nbgrader has no view on. Each failed cell's whole
message is printed under the table (a screenful of it; `--verbose` prints all), and a
speed cell that cannot measure without a GPU (it raises `NeedsGPU`) is listed as "needs a
GPU", its points shown apart from the ones graded here: a correct chapter graded on a
laptop reads "6 / 6 correctness points; 4 bandwidth points need a GPU", not "6 / 10".
The points themselves stay nbgrader's (`GradeReport.points` counts such a cell as 0, as an
autograder without a GPU does).

Before running anything it also scans the code the learner controls for what a solution
should not need (patching the checker, swapping modules, threads, NumPy, ...):
`integrity_flags`. Nothing is scored from it; the flags are printed for the learner, and
grader/instructor.py reports the same flags to the instructor. This module imports neither
torch nor the `course` package at its top, so that the instructor's commands can load the
scan from this file without starting torch (the grading functions import them when called).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader import utils as nbgrader_utils
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

# The checkout that holds the installed `course` package (an editable install, `make lab`).
DEFAULT_COURSE_ROOT = Path(__file__).resolve().parent.parent
GRADE_ID = re.compile(r"ex(\d{2})_[a-z0-9_]+")
CHAPTER_FOLDER_GLOB = "ch[0-9][0-9]_*"
# A test cell that measures speed: it fails with "needs a GPU" when graded without one.
SPEED_GRADE_ID = re.compile(r"ex\d{2}_\w*_bandwidth")
SPEED_CHECK_CALL = re.compile(r"\bcheck\.(\w+_bandwidth|beats_torch_compile)\(")
# What a speed check raises without a GPU (course.hardware.NeedsGPU), and the status of a
# test cell that raised it: its points cannot be earned on this machine, nor lost.
NEEDS_GPU_ERROR = "NeedsGPU"
NEEDS_GPU = "needs a GPU"
# What a checker raises when it rejects a solution, and the time limit's error: their
# message says everything. Any other error's traceback shows where it came from.
_MESSAGE_ERRORS = ("AssertionError", NEEDS_GPU_ERROR, "CellTimeoutError")
# The lines of one failed cell's message that `course grade` prints without --verbose.
SCREEN_LINES = 40


def grading_env() -> dict[str, str]:
    """What the kernel's environment holds while the autograder runs it: nbgrader's own
    marker, and the course's, with which a bandwidth cell without a GPU fails instead of
    skipping."""
    from course.runtime import GRADING_ENV as BANDWIDTH_GRADING_ENV

    return {"NBGRADER_EXECUTION": "autograde", BANDWIDTH_GRADING_ENV: "1"}


class NotAChapterError(ValueError):
    """The file cannot be graded as a chapter of the course; the message says why."""


@dataclass(frozen=True)
class CellScore:
    """One graded test cell: the points it earned and, when it lost them, why."""

    grade_id: str
    max_points: float
    points: float | None      # None: graded by hand (a written answer), not by running it
    status: str               # passed, failed, partial, missing, not run, by hand, needs a GPU
    failure: str = ""         # first line of what went wrong
    message: str = ""         # all of it: the checker's whole message, the stderr text
    traceback: str = ""       # where an unexpected error came from (not for checker failures)

    @property
    def lost(self) -> bool:
        """Points this machine graded and the cell did not earn; a cell that needs a GPU
        lost nothing here."""
        return (self.points is not None and self.points < self.max_points
                and self.status != NEEDS_GPU)

    def details(self, *, verbose: bool = False) -> list[str]:
        """The lines printed under the table for a cell that lost points: its whole message
        (the first SCREEN_LINES lines unless `verbose`, which adds the traceback of an
        unexpected error). Empty when the table's one line already said it all."""
        text = self.traceback if verbose and self.traceback else self.message
        lines = text.rstrip().splitlines()
        if not lines or (len(lines) == 1 and lines[0].strip() == self.failure
                         and not (verbose and self.traceback)):
            return []
        more = 0 if verbose else max(0, len(lines) - SCREEN_LINES)
        shown = lines[:len(lines) - more]
        earned = "-" if self.points is None else f"{self.points:g}"
        out = [f"{self.grade_id} ({earned} / {self.max_points:g}, {self.status}):"]
        out += [f"    {line}".rstrip() for line in shown]
        if more:
            out.append(f"    [{more} more line(s): `course grade --verbose` prints them all]")
        elif self.traceback and not verbose:
            out.append("    [`course grade --verbose` adds where the error came from]")
        return out


@dataclass
class GradeReport:
    notebook: Path
    chapter: str
    scores: list[CellScore]
    seconds: float
    mode: str
    aborted: str | None = None   # why the notebook could not run to the end
    notes: list[str] = field(default_factory=list)
    # What the integrity scan found in the learner's code; it costs no points by itself.
    integrity: list[IntegrityFlag] = field(default_factory=list)

    @property
    def points(self) -> float:
        """nbgrader's total: a cell that needs a GPU counts 0, as without one it scores."""
        return sum(s.points or 0.0 for s in self.scores)

    @property
    def max_points(self) -> float:
        return sum(s.max_points for s in self.scores)

    @property
    def full_marks(self) -> bool:
        return self.aborted is None and all(s.points == s.max_points for s in self.scores)

    @property
    def needs_gpu(self) -> list[CellScore]:
        """The cells that could not be graded here: they measure speed, and there is no GPU."""
        return [s for s in self.scores if s.status == NEEDS_GPU]

    @property
    def graded_here(self) -> list[CellScore]:
        return [s for s in self.scores if s.status != NEEDS_GPU]

    @property
    def points_here(self) -> float:
        return sum(s.points or 0.0 for s in self.graded_here)

    @property
    def max_points_here(self) -> float:
        return sum(s.max_points for s in self.graded_here)

    @property
    def complete_here(self) -> bool:
        """Every point this machine can grade was earned (full marks, on a GPU)."""
        return self.aborted is None and all(s.points == s.max_points for s in self.graded_here)

    def _total(self) -> tuple[str, str]:
        """The total's points, and what they are when some cells need a GPU."""
        if not self.needs_gpu:
            return f"{self.points:g} / {self.max_points:g}", ""
        kind = "bandwidth" if all(SPEED_GRADE_ID.fullmatch(s.grade_id)
                                  for s in self.needs_gpu) else "speed"
        waiting = sum(s.max_points for s in self.needs_gpu)
        plural = waiting != 1
        return (f"{self.points_here:g} / {self.max_points_here:g}",
                f"correctness points; {waiting:g} {kind} point{'s' if plural else ''} "
                f"need{'' if plural else 's'} a GPU")

    def total(self) -> str:
        """The total: "6 / 10", or without a GPU "6 / 6 correctness points; 4 bandwidth
        points need a GPU"."""
        return " ".join(part for part in self._total() if part)

    def table(self, *, verbose: bool = False) -> str:
        """The report `course grade` prints: a line per test cell, the total, then the
        whole message of each cell that lost points (see CellScore.details)."""
        width = max([len(s.grade_id) for s in self.scores] + [len("exercise")])
        lines = [f"{self.notebook.name} graded as chapter {self.chapter} ({self.mode} mode, "
                 f"{self.seconds:.0f} s)", ""]
        if self.integrity:
            lines += [f"INTEGRITY: {len(self.integrity)} place(s) in your code flagged for your "
                      "instructor to review: see the end of this report.", ""]
        lines += [f"  {'exercise':<{width}}  {'points':>9}  result"]
        for s in self.scores:
            earned = "-" if s.points is None or s.status == NEEDS_GPU else f"{s.points:g}"
            result = s.status if not s.failure else f"{s.status}: {s.failure}"
            lines.append(f"  {s.grade_id:<{width}}  {earned + ' / ' + f'{s.max_points:g}':>9}  "
                         f"{result}")
        numbers, what = self._total()
        lines.append(f"  {'total':<{width}}  {numbers:>9}" + (f" {what}" if what else ""))
        if self.aborted:
            lines += ["", f"The notebook did not run to the end: {self.aborted}",
                      "The autograder scores the whole chapter 0 when that happens."]
        details = [s.details(verbose=verbose) for s in self.scores if s.lost]
        details = [d for d in details if d]
        if details:
            lines += ["", "What went wrong, cell by cell:"]
            for block in details:
                lines += [""] + block
        if self.notes:
            lines.append("")
        lines += [f"note: {n}" for n in self.notes]
        if self.integrity:
            lines += ["", integrity_warning(self.integrity)]
        return "\n".join(lines)


def integrity_warning(flags: list[IntegrityFlag]) -> str:
    """The block `course grade` prints under the scores when the scan flagged something."""
    lines = [f"INTEGRITY: {len(flags)} place(s) in your code do something a solution should "
             "not need to do.",
             "The points above do not count them, but the autograder reports the same places "
             "to your instructor, who reviews them by hand. Remove them unless you are sure "
             "you need them:"]
    lines += [f"  {flag}" for flag in flags]
    return "\n".join(lines)


# ---------------------------------------------------------------- finding the chapter


def read_notebook(path: Path) -> NotebookNode:
    if not path.is_file():
        raise NotAChapterError(f"{path}: no such file")
    try:
        nb = nbformat.read(path, as_version=4)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NotAChapterError(f"{path} is not a Jupyter notebook (not valid JSON: {exc})"
                               ) from exc
    except Exception as exc:  # nbformat's own validation and reader errors
        raise NotAChapterError(f"{path} is not a Jupyter notebook nbformat can read "
                               f"({type(exc).__name__}: {exc})") from exc
    return nb


def _nbgrader(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _grade_ids(nb: NotebookNode) -> list[str]:
    return [_nbgrader(c)["grade_id"] for c in nb.cells
            if _nbgrader(c).get("grade_id") and (_nbgrader(c).get("grade")
                                                 or _nbgrader(c).get("solution"))]


def find_source(nb: NotebookNode, path: Path, course_root: Path) -> Path:
    """The source notebook (solutions/chNN_name/chNN_name.ipynb) of the chapter that a
    learner's notebook belongs to, found from its exercises' grade ids (exNN_...)."""
    solutions = course_root / "solutions"
    if not solutions.is_dir():
        raise NotAChapterError(
            f"no solutions/ folder in {course_root}: `course grade` needs a checkout of the "
            "course repository (its source notebooks hold the hidden tests); pass its "
            "location with --course")
    ids = _grade_ids(nb)
    if not ids:
        raise NotAChapterError(
            f"{path.name} has no graded exercise cells, so it is not one of the course's "
            "chapter notebooks with exercises (those are notebooks/chNN_name/chNN_name.ipynb; "
            "chapter 00 has no exercises)")
    numbers = sorted({m.group(1) for m in map(GRADE_ID.fullmatch, ids) if m})
    if len(numbers) != 1:
        raise NotAChapterError(
            f"{path.name}: its exercise cells do not belong to one chapter of the course "
            f"(grade ids {', '.join(sorted(set(ids)))})")
    candidates = sorted(p for p in solutions.glob(f"ch{numbers[0]}_*") if p.is_dir())
    sources = [p / f"{p.name}.ipynb" for p in candidates if (p / f"{p.name}.ipynb").is_file()]
    if len(sources) != 1:
        known = ", ".join(sorted(p.name for p in solutions.glob(CHAPTER_FOLDER_GLOB)
                                 if p.is_dir())) or "none"
        raise NotAChapterError(f"{path.name} has chapter {numbers[0]}'s exercises, but "
                               f"{solutions} has no source notebook for chapter {numbers[0]} "
                               f"(chapters there: {known})")
    source_ids = set(_grade_ids(read_notebook(sources[0])))
    if not source_ids & set(ids):
        raise NotAChapterError(
            f"{path.name}: none of its exercise cells ({', '.join(sorted(set(ids)))}) is in "
            f"{sources[0].parent.name}, so it is not that chapter's notebook")
    return sources[0]


# ---------------------------------------------------------------- the notebook to run


def prepare(learner: NotebookNode, source: NotebookNode) -> NotebookNode:
    """The learner's notebook as nbgrader's autograde step prepares it: outputs cleared, a
    grade id used twice kept only on its last cell (DeduplicateIds), every locked or test
    cell replaced by the source's version, hidden tests included, and the source's points
    restored (OverwriteCells). Cells whose grade id the source does not have lose it, so a
    cell the learner marked as a test earns nothing. Solution cells keep the learner's code;
    cells the learner added run as they are."""
    nb = nbformat.from_dict(json.loads(json.dumps(learner)))  # a deep copy
    by_id = {_nbgrader(c)["grade_id"]: c for c in source.cells if _nbgrader(c).get("grade_id")}
    seen: set[str] = set()
    for cell in reversed(nb.cells):
        meta = _nbgrader(cell)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if not meta:
            continue
        grade_id = meta.get("grade_id")
        if grade_id in seen or grade_id not in by_id:
            cell.metadata.pop("nbgrader", None)  # a copy, or a cell the course never had
            continue
        seen.add(grade_id)
        original = by_id[grade_id]
        if _nbgrader(original).get("locked") or not _nbgrader(original).get("solution"):
            cell.source = original.source
            if cell.cell_type != original.cell_type:
                cell.cell_type = original.cell_type
                if original.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
                else:
                    cell.pop("outputs", None)
                    cell.pop("execution_count", None)
        cell.metadata["nbgrader"] = json.loads(json.dumps(_nbgrader(original)))
    return nb


# ---------------------------------------------------------------- the integrity scan
#
# A test cell runs in the same Python process as the learner's code, so code that replaces
# the checker (course.check.rmsnorm_forward = lambda *a, **k: None), swaps a module in
# sys.modules or hides PyTorch work from the checker's watch can earn every point. No
# in-process check can rule that out. What can be done is to read the code before it runs
# and report what an honest solution has no reason to do, for a person to review. The scan
# reads the cells whose code the learner controls (exercise cells, cells they added or
# edited; not the test cells and locked cells the grader puts back), follows the names that
# imports bind across the whole notebook (`from course import check` in a test cell, then
# `check.x = ...` in the learner's cell), and ignores lines that the course's own notebook
# contains verbatim (the starter code imports course.validation, for instance).


@dataclass(frozen=True)
class IntegrityFlag:
    """One place in a learner's code that a person should look at."""

    cell: str    # the exercise cell's grade id, else "cell N" (1-based), "cell N (added)"
    line: int    # 1-based, within the cell
    what: str    # what the code does: "changes course.check.rmsnorm_forward"
    why: str     # why that matters to grading
    code: str    # the line itself, shortened

    @property
    def short(self) -> str:
        return f"{self.cell} line {self.line}: {self.what}"

    def __str__(self) -> str:
        return f"{self.short} ({self.why}): {self.code}"


_THREAD = "work in another thread, out of reach of the checker's watch on PyTorch"
_PROCESS = "work in another process, out of the checker's sight"
_DISPATCH = "PyTorch's dispatch internals, which can switch the checker's watch on PyTorch off"
_FRAMES = "another frame's variables, such as a test cell's"
_SHELL = "shell commands"
_ENVIRON_WHY = "environment variables: COURSE_GRADING decides how the speed cells grade"
_NUMPY = "NumPy computes outside Triton, where the checker does not look"
# (dotted name, why it matters); a name matches itself and everything under it. These are
# reported wherever the learner's code uses them.
_WATCHED_NAMES = (
    ("sys.modules", "the table of loaded modules: an entry swapped there replaces a module"),
    ("sys._getframe", _FRAMES),
    ("inspect.currentframe", _FRAMES),
    ("inspect.stack", _FRAMES),
    ("importlib", "modules loaded or reloaded by name"),
    ("builtins", "Python's built-in functions, which the test cells use too"),
    ("threading", _THREAD),
    ("_thread", _THREAD),
    ("concurrent", _THREAD),
    ("multiprocessing", _PROCESS),
    ("torch.multiprocessing", _PROCESS),
    ("torch.utils._python_dispatch", _DISPATCH),
    ("torch._C", _DISPATCH),
    ("torch.overrides", _DISPATCH),
    ("ctypes", "raw memory access"),
    ("gc", "the garbage collector can reach the checker's own objects"),
    ("subprocess", _SHELL),
    ("os.system", _SHELL),
    ("os.popen", _SHELL),
    ("os.putenv", _ENVIRON_WHY),
    ("os.unsetenv", _ENVIRON_WHY),
)
# Reported in exercise cells and in cells the learner added, not in the course's own cells
# (a learner may hold an older version of one, which uses these as the course did then).
_EXERCISE_WATCHED_NAMES = (
    ("course.check", "the checker that grades the exercises"),
    ("course.bench", "the timing code behind the speed checks"),
    ("course.hardware", "the copy bandwidth the speed targets are measured against"),
    ("course.reference", "the reference results the checker compares against"),
    ("solutions", "the course's own solutions"),
    ("numpy", _NUMPY),
    ("torch.from_numpy", _NUMPY),
)
# What exercise code is meant to use from the course besides torch and triton: the input
# checks that the starter code imports. Nothing under solutions/ is (the learner's package
# does not have it).
_ALLOWED_NAMES = ("course.validation",)
# Attribute, keyword or variable names that are suspect whatever object they belong to.
_WATCHED_WORDS = {
    "_python_dispatch": _DISPATCH,
    "_disable_current_modes": _DISPATCH,
    "pre_hook": "code Triton runs inside a launch, before the kernel",
    "post_hook": "code Triton runs inside a launch, after the kernel",
    "pre_run_hooks": "code Triton runs inside a launch, before the kernel",
    "__builtins__": "Python's built-in functions, which the test cells use too",
    "__import__": "modules loaded by name",
    "get_ipython": "the notebook's kernel driven from inside: cells run or names changed out "
                   "of sight",
    "f_back": _FRAMES,
    "f_globals": _FRAMES,
    "f_locals": _FRAMES,
}
# Built-in functions that run code assembled at run time, which no scan can read.
_DYNAMIC_CODE = {"exec", "eval", "compile", "globals"}
_CHANGE_WHY = "code that reassigns a module's names can turn a check into a no-op"
_ENVIRON_METHODS = {"update", "pop", "popitem", "setdefault", "clear", "__setitem__",
                    "__delitem__"}
_FILE_WHY = "a file written beside the notebook can replace a course module at the next import"
# Magics that only run Python (scanned as Python) or only display; any other is reported.
_PYTHON_MAGICS = {"time", "timeit", "prun", "capture"}
_HARMLESS_MAGICS = {"matplotlib", "config", "pinfo", "pinfo2", "pdoc", "pdef", "psource",
                    "who", "whos", "who_ls", "precision", "xmode", "history", "lsmagic",
                    "magic", "pwd"}
_WATCHED_TEXT = re.compile(r"\b(course\.(check|bench|hardware|reference)|sys\.modules|"
                           r"solutions\.\w+|_python_dispatch|"
                           r"_disable_current_modes|COURSE_GRADING|NBGRADER_EXECUTION)\b")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _why_watched(name: str, *, exercise: bool) -> str | None:
    """Why a use of the dotted `name` is reported (None: it is not); `exercise`: in an
    exercise cell or a cell the learner added."""
    if any(_under(name, allowed) for allowed in _ALLOWED_NAMES):
        return None
    table = _WATCHED_NAMES + (_EXERCISE_WATCHED_NAMES if exercise else ())
    return next((why for prefix, why in table if _under(name, prefix)), None)


class _Scan(ast.NodeVisitor):
    """Reads a notebook's code cells in order. Every cell's imports bind names (the course's
    cells included); only the learner's cells are reported on."""

    def __init__(self, course_lines: set[str]) -> None:
        self.course_lines = course_lines
        self.names: dict[str, str] = {}   # local name -> dotted name it stands for
        self.kernels: set[str] = set()     # functions decorated with triton.*
        self.flags: dict[tuple[int, int, str], IntegrityFlag] = {}  # (cell, line, why)
        self.index = 0                     # of the cell being read, in the notebook
        self.cell = ""
        self.lines: list[str] = []
        self.offset = 0
        self.reporting = False
        self.exercise = False              # exercise cell or added cell: every rule applies
        from IPython.core.inputtransformer2 import TransformerManager

        # As the kernel does: %magics and !shell lines become get_ipython() calls.
        self.to_python = TransformerManager().transform_cell

    # -------- reading a cell

    def read(self, index: int, label: str, source: str, *, report: bool,
             exercise: bool) -> None:
        self.index, self.cell, self.lines = index, label, source.splitlines()
        self.reporting, self.exercise = report, exercise
        self._read_code(source, offset=0)

    def _read_code(self, source: str, offset: int) -> None:
        try:
            tree = ast.parse(self.to_python(source))
        except (SyntaxError, ValueError):
            return  # the kernel cannot compile it either, so none of it runs
        saved, self.offset = self.offset, offset
        try:
            self.visit(tree)
        finally:
            self.offset = saved

    def _flag(self, node: ast.AST, what: str, why: str) -> None:
        """Report `node`'s line, unless the course's notebook has that very line."""
        if not self.reporting:
            return
        number = self.offset + getattr(node, "lineno", 1)
        text = self.lines[number - 1].strip() if 0 < number <= len(self.lines) else ""
        if text in self.course_lines:
            return
        key = (self.index, number, why)
        if key not in self.flags:  # one flag per line and reason: the first says most
            code = text if len(text) <= 100 else text[:97] + "..."
            self.flags[key] = IntegrityFlag(self.cell, number, what, why, code)

    # -------- names

    def _dotted(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for, when it starts from an import."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _bind(self, target: ast.AST, value: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            dotted = self._dotted(value) if value is not None else None
            if dotted:
                self.names[target.id] = dotted
            else:
                self.names.pop(target.id, None)
                self.kernels.discard(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, None)

    def _watch(self, node: ast.AST, verb: str, dotted: str) -> None:
        why = _why_watched(dotted, exercise=self.exercise)
        if why:
            self._flag(node, f"{verb} {dotted}", why)

    # -------- statements

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            self.names[alias.asname or top] = alias.name if alias.asname else top
            self._watch(node, "imports", alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # relative imports: a notebook has no package to be relative to
        for alias in node.names:
            dotted = node.module if alias.name == "*" else f"{node.module}.{alias.name}"
            if alias.name != "*":
                self.names[alias.asname or alias.name] = dotted
            self._watch(node, "imports", dotted)

    def _target(self, target: ast.AST, verb: str) -> None:
        """An assignment's or a deletion's target. An attribute or item of anything an
        import bound (a module, or a function or object from one) is a change to it."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, verb)
            return
        if isinstance(target, ast.Starred):
            self._target(target.value, verb)
            return
        base = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
        while isinstance(base, (ast.Attribute, ast.Subscript)) and self._dotted(base) is None:
            base = base.value
        dotted = self._dotted(base) if base is not None else None
        if dotted is None:
            self.visit(target)
        elif _under(dotted, "os.environ"):
            self._flag(target, f"{verb} os.environ", _ENVIRON_WHY)
        else:
            name = f"{dotted}.{target.attr}" if base is target.value and \
                isinstance(target, ast.Attribute) else f"something in {dotted}"
            self._flag(target, f"{verb} {name}", _CHANGE_WHY)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._target(target, "changes")
            self._bind(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self._target(node.target, "changes")
        self._bind(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        self._target(node.target, "changes")

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._target(target, "deletes")
            self._bind(target, None)

    def _define(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.names.pop(node.name, None)
        decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
        if any(_under(self._dotted(d) or "", "triton") for d in decorators):
            self.kernels.add(node.name)
        else:
            self.kernels.discard(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _define

    # -------- expressions

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return  # a name being assigned: _bind follows what it stands for
        if node.id in _WATCHED_WORDS and node.id not in self.names:
            self._flag(node, f"uses {node.id}", _WATCHED_WORDS[node.id])
        dotted = self.names.get(node.id)
        if dotted:
            self._watch(node, "uses", dotted)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _WATCHED_WORDS:
            self._flag(node, f"uses .{node.attr}", _WATCHED_WORDS[node.attr])
        dotted = self._dotted(node)
        if dotted:  # the longest name is reported; its parts add nothing
            self._watch(node, "uses", dotted)
            if _why_watched(dotted, exercise=self.exercise):
                return
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg in _WATCHED_WORDS:
            self._flag(node.value, f"passes {node.arg}=", _WATCHED_WORDS[node.arg])
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            found = _WATCHED_TEXT.search(node.value)
            if found:
                self._flag(node, f"names {found.group(0)} in a string",
                           "a name in a string can be imported or looked up at run time")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.names:
            if func.id in _DYNAMIC_CODE:
                self._flag(node, f"calls {func.id}()", "code assembled or names changed at run "
                           "time, which no scan can read")
            elif func.id in ("setattr", "delattr") and node.args:
                target = self._dotted(node.args[0])
                if target:
                    self._flag(node, f"calls {func.id}() on {target}", _CHANGE_WHY)
            elif func.id == "open" and _writes(node, mode_at=1):
                self._flag(node, "opens a file for writing", _FILE_WHY)
        elif isinstance(func, ast.Attribute):
            if self._ipython_call(node, func):
                return
            owner = func.value.value if isinstance(func.value, ast.Subscript) else func.value
            if func.attr == "run" and isinstance(owner, ast.Name) and owner.id in self.kernels:
                self._flag(node, f"calls {owner.id}.run()", "a launch made past "
                           f"{owner.id}[grid](...), the way every exercise launches")
            elif func.attr == "numpy" and self.exercise:
                self._flag(node, "calls .numpy() on a tensor", _NUMPY)
            elif func.attr in ("write_text", "write_bytes") or \
                    (func.attr == "open" and _writes(node, mode_at=0)):
                self._flag(node, f"calls .{func.attr}() to write a file", _FILE_WHY)
            elif func.attr in _ENVIRON_METHODS and \
                    _under(self._dotted(func.value) or "", "os.environ"):
                self._flag(node, f"calls os.environ.{func.attr}()", _ENVIRON_WHY)
        self.generic_visit(node)

    def _ipython_call(self, node: ast.Call, func: ast.Attribute) -> bool:
        """get_ipython().<method>(...), which is what %magics and !shell lines become.
        Returns whether the call was handled."""
        if not (isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "get_ipython"):
            return False
        strings = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str)
                   else None for a in node.args]
        if func.attr in ("run_line_magic", "run_cell_magic") and strings and strings[0]:
            magic, code = strings[0], strings[-1] if len(strings) > 1 else None
            if magic in _PYTHON_MAGICS and code is not None:
                # %time CODE runs CODE on the magic's line; %%time runs the lines after it.
                cell_magic = func.attr == "run_cell_magic"
                self._read_code(code, self.offset + getattr(node, "lineno", 1)
                                - (0 if cell_magic else 1))
            elif magic not in _HARMLESS_MAGICS:
                prefix = "%%" if func.attr == "run_cell_magic" else "%"
                why = _FILE_WHY if magic in ("writefile", "file") else \
                    _ENVIRON_WHY if magic in ("env", "set_env") else (
                        "a magic that runs shell commands, other files or other interpreters, "
                        "or changes the kernel's state")
                self._flag(node, f"runs the magic {prefix}{magic}", why)
            return True
        if func.attr in ("system", "getoutput"):
            self._flag(node, "runs a shell command (!)", _SHELL)
            return True
        self._flag(node, f"calls get_ipython().{func.attr}()",
                   "the notebook's kernel driven from inside: cells run or names changed "
                   "out of sight")
        return True


def _writes(node: ast.Call, mode_at: int) -> bool:
    """Whether open(...) asks for a mode that writes (a mode the scan cannot read counts);
    the mode is positional argument `mode_at` (1 for open(), 0 for Path.open())."""
    mode = node.args[mode_at] if len(node.args) > mode_at else next(
        (k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(c in mode.value for c in "wax+")
    return True


def _code_lines(nb: NotebookNode) -> set[str]:
    return {line.strip() for cell in nb.cells if cell.cell_type == "code"
            for line in cell.source.splitlines() if line.strip()}


def integrity_flags(learner: NotebookNode, source: NotebookNode) -> list[IntegrityFlag]:
    """What the code a learner controls does that a solution should not need to, in notebook
    order. `source` is the chapter's source notebook: its test and locked cells are what
    the grader runs in their place, and its lines are the course's own (never reported)."""
    nb = prepare(learner, source)
    course_cells = {cell.source.strip() for cell in source.cells if cell.cell_type == "code"}
    # Jupyter keeps a cell's id; the course's cells have ids of their own ("import-course").
    course_ids = {cell.get("id") for cell in source.cells if cell.get("id")}
    scan = _Scan(_code_lines(source))
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = _nbgrader(cell)
        graders = bool(meta.get("locked") or (meta.get("grade") and not meta.get("solution")))
        learners = not graders and cell.source.strip() not in course_cells
        added = cell.get("id") not in course_ids
        label = meta.get("grade_id") or f"cell {index + 1}" + (" (added)" if added else "")
        scan.read(index, label, cell.source, report=learners,
                  exercise=bool(meta.get("solution")) or added)
    order = {key: seen for seen, key in enumerate(scan.flags)}  # within a line: as found
    return [scan.flags[key] for key in sorted(scan.flags, key=lambda k: (k[:2], order[k]))]


# ---------------------------------------------------------------- running and scoring


@contextlib.contextmanager
def temporary_environment(extra: dict[str, str]) -> Iterator[None]:
    """Set variables for a kernel started inside the block (it copies this environment)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class GradingSettings:
    """What grader/nbgrader_config.py sets for the autograder's runs."""

    cell_timeout_s: int
    error_on_timeout: dict
    iopub_timeout_s: int
    # How the notebook's kernel is started (its KernelManager section): transport
    # encryption, without which every kernel warns on stderr that it runs over plain TCP.
    kernel_manager: dict = field(default_factory=dict)

    def kernel_config(self) -> Config:
        """The configuration a NotebookClient hands to the kernel manager it creates."""
        return Config({"KernelManager": dict(self.kernel_manager)})


def grading_settings(course_root: Path, cell_timeout_s: int | None = None) -> GradingSettings:
    """The autograder's settings; `cell_timeout_s` overrides the limit per cell as
    GRADER_CELL_TIMEOUT_S does for nbgrader (the timeout message follows it)."""
    path = course_root / "grader" / "nbgrader_config.py"
    if not path.is_file():
        raise NotAChapterError(f"no grader configuration at {path}: `course grade` uses the "
                               "autograder's time limits from it; pass a checkout with --course")
    override = {} if cell_timeout_s is None else {"GRADER_CELL_TIMEOUT_S": str(cell_timeout_s)}
    with temporary_environment(override):
        config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    execute = config.Execute
    return GradingSettings(int(execute.timeout), dict(execute.get("error_on_timeout", {})),
                           int(execute.get("iopub_timeout", 4)),
                           dict(config.get("KernelManager", {})))


def _first_line(text: str) -> str:
    """The first line that says something: a checker's 'X check failed.' header and
    terminal colours are skipped."""
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
    lines = [ln for ln in lines if ln]
    informative = [ln for ln in lines if not re.fullmatch(r"\S+ check failed\.", ln)]
    line = (informative or lines or [""])[0]
    return line if len(line) <= 160 else line[:157] + "..."


_STDERR_FAILURE = "wrote to stderr, which the autograder counts as a failure:"


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _last_error(cell: NotebookNode) -> dict | None:
    # The last says most: a time limit's CellTimeoutError follows the interrupt.
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return errors[-1] if errors else None


def _stderr(cell: NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")


def _failure(cell: NotebookNode) -> str:
    """The first informative line of what went wrong (the table's result column)."""
    error = _last_error(cell)
    if error:
        detail = _first_line(error.get("evalue", ""))
        return f"{error.get('ename')}: {detail}" if detail else str(error.get("ename"))
    if _stderr(cell):
        return f"{_STDERR_FAILURE} {_first_line(_stderr(cell))}"
    return ""


def _message(cell: NotebookNode) -> tuple[str, str]:
    """What went wrong, whole: the error's name and message (a checker's full advice and
    report), or what the cell wrote to stderr; and, for an error that is not a checker's
    verdict, its traceback (where it came from)."""
    error = _last_error(cell)
    if error:
        name, value = str(error.get("ename", "")), _plain(str(error.get("evalue", ""))).strip()
        trace = "" if name in _MESSAGE_ERRORS else _plain("\n".join(error.get("traceback")
                                                                     or []))
        return (f"{name}: {value}" if value else name), trace
    text = _plain(_stderr(cell)).strip()
    return (f"{_STDERR_FAILURE}\n{text}" if text else ""), ""


def _describe(nb: NotebookNode, running: list[int]) -> str:
    if not running:
        return "a cell"
    lines = nb.cells[running[0]].source.strip().splitlines()
    return f"cell {running[0] + 1} ({lines[0][:60]!r})" if lines else f"cell {running[0] + 1}"


def score_cells(nb: NotebookNode, source: NotebookNode, ran: set[int]) -> list[CellScore]:
    """One score per test cell of the source, in the source's order; `ran` holds the
    indices of the cells of `nb` that were executed."""
    where = {_nbgrader(c).get("grade_id"): i for i, c in enumerate(nb.cells) if _nbgrader(c)}
    scores = []
    for original in source.cells:
        meta = _nbgrader(original)
        if not meta.get("grade"):
            continue
        grade_id, max_points = meta["grade_id"], float(meta["points"])
        index = where.get(grade_id)
        if meta.get("solution") or original.cell_type != "code":
            scores.append(CellScore(grade_id, max_points, None, "by hand"))
        elif index is None:
            scores.append(CellScore(grade_id, max_points, 0.0, "missing",
                                    "this test cell is not in your notebook: copy it back "
                                    "from the released notebook"))
        elif index not in ran:
            scores.append(CellScore(grade_id, max_points, 0.0, "not run"))
        else:
            cell = nb.cells[index]
            points, _ = nbgrader_utils.determine_grade(cell)
            points = float(points)
            message, trace = "", ""
            if points >= max_points:
                status, failure = "passed", ""
            elif points > 0:
                status, failure = "partial", "the cell's value gave partial credit"
            elif (_last_error(cell) or {}).get("ename") == NEEDS_GPU_ERROR:
                status, failure = NEEDS_GPU, ""  # nothing to fix: it cannot run here
            else:
                status, failure = "failed", _failure(cell)
                message, trace = _message(cell)
            scores.append(CellScore(grade_id, max_points, points, status, failure, message,
                                    trace))
    return scores


def grade_notebook(path: str | Path, *, course_root: Path | None = None,
                   cell_timeout_s: int | None = None) -> GradeReport:
    """Grade a learner's chapter notebook as the autograder would; see the module's text.
    Raises NotAChapterError when the file is not one of the course's chapters."""
    from course import runtime

    path = Path(path).resolve()
    course_root = Path(course_root).resolve() if course_root else DEFAULT_COURSE_ROOT
    if cell_timeout_s is not None and cell_timeout_s <= 0:
        raise ValueError(f"the time limit per cell must be above 0 s, not {cell_timeout_s}")
    learner = read_notebook(path)
    source_path = find_source(learner, path, course_root)
    source = read_notebook(source_path)
    settings = grading_settings(course_root, cell_timeout_s)
    flags = integrity_flags(learner, source)  # read before anything of it runs
    timeout = settings.cell_timeout_s
    nb = prepare(learner, source)
    ran: set[int] = set()
    running: list[int] = []  # the code cell being executed, for the message if it hangs

    def on_cell_execute(cell_index: int, **_: object) -> None:
        running[:] = [cell_index]

    def on_cell_executed(cell_index: int, cell: NotebookNode, execute_reply: dict,
                         **_: object) -> None:
        ran.add(cell_index)
        # As nbgrader's Execute does: an error the kernel did not print (the time limit's
        # CellTimeoutError, after the kernel's own KeyboardInterrupt) is added to the cell.
        reply = (execute_reply or {}).get("content", {})
        if reply.get("status") == "error" and not any(
                o.get("output_type") == "error" and o.get("ename") == reply.get("ename")
                for o in cell.outputs):
            cell.outputs.append(nbformat.v4.new_output(
                "error", ename=reply.get("ename", ""), evalue=reply.get("evalue", ""),
                traceback=reply.get("traceback") or []))

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True,
                            error_on_timeout=settings.error_on_timeout or None,
                            iopub_timeout=settings.iopub_timeout_s,
                            raise_on_iopub_timeout=True, on_cell_execute=on_cell_execute,
                            on_cell_executed=on_cell_executed,
                            resources={"metadata": {"path": str(path.parent)}},
                            config=settings.kernel_config())
    aborted = None
    start = time.perf_counter()
    try:
        with temporary_environment(grading_env()):
            client.execute()
    except CellTimeoutError:
        aborted = (f"{_describe(nb, running)} did not stop within {settings.iopub_timeout_s} s "
                   f"of being interrupted after its {timeout} s limit, so its kernel was killed")
    except DeadKernelError:
        aborted = f"the kernel died while running {_describe(nb, running)} (a crash, os._exit)"
    seconds = time.perf_counter() - start
    scores = score_cells(nb, source, ran)
    if aborted is not None:  # nbgrader records no grades for such a notebook: 0 everywhere
        scores = [CellScore(s.grade_id, s.max_points, None if s.points is None else 0.0,
                            "not graded", f"{s.status} before the kernel was lost"
                            if s.status in ("passed", "partial") else s.failure)
                  for s in scores]
    notes = []
    timed = speed_cells(source)
    if timed and not runtime.on_gpu():
        notes.append(f"no GPU here: the cells that measure speed ({', '.join(timed)}) cannot "
                     "measure anything on this machine, so they are listed as needing a GPU, "
                     "their points apart from the total graded here. An autograder without a "
                     "GPU scores them 0; graded on a GPU, they measure your kernel against "
                     "the target")
    return GradeReport(path, source_path.parent.name, scores, seconds, runtime.MODE, aborted,
                       notes, flags)


def speed_cells(source: NotebookNode) -> list[str]:
    """Grade ids of the test cells that measure speed (a bandwidth check, or chapter 08's
    race against torch.compile): named *_bandwidth, or calling such a checker. A hidden test
    that merely has a variable called `bandwidth` is not one."""
    found = []
    for cell in source.cells:
        meta = _nbgrader(cell)
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        if SPEED_GRADE_ID.fullmatch(meta.get("grade_id", "")) or \
                SPEED_CHECK_CALL.search(cell.source):
            found.append(meta["grade_id"])
    return found
