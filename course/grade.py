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
grader/nbgrader_config.py (the per-cell time limit and its message).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import course
from course import runtime
from course.runtime import GRADING_ENV as BANDWIDTH_GRADING_ENV

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader import utils as nbgrader_utils
from traitlets.config.loader import PyFileConfigLoader

# The checkout that holds the installed `course` package (an editable install, `make lab`).
DEFAULT_COURSE_ROOT = Path(course.__file__).resolve().parent.parent
GRADE_ID = re.compile(r"ex(\d{2})_[a-z0-9_]+")
CHAPTER_FOLDER_GLOB = "ch[0-9][0-9]_*"
# What the kernel's environment holds while the autograder runs it: nbgrader's own marker,
# and the course's, with which a bandwidth cell without a GPU fails instead of skipping.
GRADING_ENV = {"NBGRADER_EXECUTION": "autograde", BANDWIDTH_GRADING_ENV: "1"}


class NotAChapterError(ValueError):
    """The file cannot be graded as a chapter of the course; the message says why."""


@dataclass(frozen=True)
class CellScore:
    """One graded test cell: the points it earned and, when it lost them, why."""

    grade_id: str
    max_points: float
    points: float | None      # None: graded by hand (a written answer), not by running it
    status: str               # passed, failed, partial, missing, not run, by hand
    failure: str = ""         # first line of what went wrong

    @property
    def lost(self) -> bool:
        return self.points is not None and self.points < self.max_points


@dataclass
class GradeReport:
    notebook: Path
    chapter: str
    scores: list[CellScore]
    seconds: float
    mode: str
    aborted: str | None = None   # why the notebook could not run to the end
    notes: list[str] = field(default_factory=list)

    @property
    def points(self) -> float:
        return sum(s.points or 0.0 for s in self.scores)

    @property
    def max_points(self) -> float:
        return sum(s.max_points for s in self.scores)

    @property
    def full_marks(self) -> bool:
        return self.aborted is None and all(s.points == s.max_points for s in self.scores)

    def table(self) -> str:
        width = max([len(s.grade_id) for s in self.scores] + [len("exercise")])
        lines = [f"{self.notebook.name} graded as chapter {self.chapter} ({self.mode} mode, "
                 f"{self.seconds:.0f} s)", "",
                 f"  {'exercise':<{width}}  {'points':>9}  result"]
        for s in self.scores:
            earned = "-" if s.points is None else f"{s.points:g}"
            result = s.status if not s.failure else f"{s.status}: {s.failure}"
            lines.append(f"  {s.grade_id:<{width}}  {earned + ' / ' + f'{s.max_points:g}':>9}  "
                         f"{result}")
        total = f"{self.points:g} / {self.max_points:g}"
        lines.append(f"  {'total':<{width}}  {total:>9}")
        if self.aborted:
            lines += ["", f"The notebook did not run to the end: {self.aborted}",
                      "The autograder scores the whole chapter 0 when that happens."]
        lines += [f"note: {n}" for n in self.notes]
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


# ---------------------------------------------------------------- running and scoring


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
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


def grading_settings(course_root: Path, cell_timeout_s: int | None = None) -> GradingSettings:
    """The autograder's settings; `cell_timeout_s` overrides the limit per cell as
    GRADER_CELL_TIMEOUT_S does for nbgrader (the timeout message follows it)."""
    path = course_root / "grader" / "nbgrader_config.py"
    if not path.is_file():
        raise NotAChapterError(f"no grader configuration at {path}: `course grade` uses the "
                               "autograder's time limits from it; pass a checkout with --course")
    override = {} if cell_timeout_s is None else {"GRADER_CELL_TIMEOUT_S": str(cell_timeout_s)}
    with _environment(override):
        config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    execute = config.Execute
    return GradingSettings(int(execute.timeout), dict(execute.get("error_on_timeout", {})),
                           int(execute.get("iopub_timeout", 4)))


def _first_line(text: str) -> str:
    """The first line that says something: a checker's 'X check failed.' header and
    terminal colours are skipped."""
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
    lines = [ln for ln in lines if ln]
    informative = [ln for ln in lines if not re.fullmatch(r"\S+ check failed\.", ln)]
    line = (informative or lines or [""])[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _failure(cell: NotebookNode) -> str:
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]
    if errors:  # the last says most: a time limit's CellTimeoutError follows the interrupt
        detail = _first_line(errors[-1].get("evalue", ""))
        return f"{errors[-1].get('ename')}: {detail}" if detail else str(errors[-1].get("ename"))
    for out in outputs:
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            return f"wrote to stderr, which the autograder counts as a failure: " \
                   f"{_first_line(out.get('text', ''))}"
    return ""


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
            if points >= max_points:
                status, failure = "passed", ""
            elif points > 0:
                status, failure = "partial", "the cell's value gave partial credit"
            else:
                status, failure = "failed", _failure(cell)
            scores.append(CellScore(grade_id, max_points, points, status, failure))
    return scores


def grade_notebook(path: str | Path, *, course_root: Path | None = None,
                   cell_timeout_s: int | None = None) -> GradeReport:
    """Grade a learner's chapter notebook as the autograder would; see the module's text.
    Raises NotAChapterError when the file is not one of the course's chapters."""
    path = Path(path).resolve()
    course_root = Path(course_root).resolve() if course_root else DEFAULT_COURSE_ROOT
    if cell_timeout_s is not None and cell_timeout_s <= 0:
        raise ValueError(f"the time limit per cell must be above 0 s, not {cell_timeout_s}")
    learner = read_notebook(path)
    source_path = find_source(learner, path, course_root)
    source = read_notebook(source_path)
    settings = grading_settings(course_root, cell_timeout_s)
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
                            resources={"metadata": {"path": str(path.parent)}})
    aborted = None
    start = time.perf_counter()
    try:
        with _environment(GRADING_ENV):
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
    timed = any("bandwidth" in c.source for c in source.cells if _nbgrader(c).get("grade"))
    if timed and not runtime.on_gpu():
        notes.append("no GPU here: the bandwidth cells fail with 'needs a GPU', as they do "
                     "when the autograder runs without one; graded on a GPU, they measure "
                     "your kernel against the target")
    return GradeReport(path, source_path.parent.name, scores, seconds, runtime.MODE, aborted,
                       notes)
