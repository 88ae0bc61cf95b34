"""Grading a submission where its code cannot reach the grading.

    verdict = verify(submitted_notebook, source_notebook, cell_timeout_s=300)
    python -m course.verify SUBMITTED SOURCE --out VERDICT.json   (what the autograder runs)

The submission's cells run in a process of their own (`course.verify.learner`), in
notebook order, as nbgrader prepares them: the course's own copy of every locked cell, the
learner's code in the exercise cells and in cells they added. Each test cell (the course's
source of it, hidden tests included) runs here instead, in this process, where nothing of
the learner's has run: its names for the learner's functions are stand-ins that call them
in the learner's process (`course.verify.proxy`), so the inputs, the float64 references
and the comparisons are all made here. The points a test cell earns are decided here:

- a test cell that raises scores 0, with its message as the reason;
- once the learner's process reports that code replaced something the checks rely on
  (`course.verify.tamper`), every test cell from there on scores 0, and the reason says
  what was replaced and where;
- a cell that hangs is interrupted at the time limit (and its process killed if it does
  not stop); a process that dies is started again and the notebook's cells before that
  point are run again in it, so one bad cell costs its own exercise;
- seeds fixed in a test cell's source are mixed with a secret drawn for this run, so that
  a submission cannot know its inputs in advance.

A cell that measures speed times the learner's kernels here too: one call at the timing
shape is traced in the learner's process and its GPU work replayed here, compiled from the
kernels' source (`course.verify.replay`), on inputs made here, every timed output checked.
What still runs beside the learner's code is the watch of each call (launch counting,
PyTorch ops, poisoned allocations, what each launch changed), guarded by the tamper check;
`grader/README.md` says what that leaves open.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import importlib
import io
import json
import os
import secrets
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course import gpu_lock, runtime
from course.grade import prepare, read_notebook, temporary_environment
from course.verify import walls
from course.verify.protocol import OUTPUT_LIMIT
from course.verify.proxy import (
    CellTimedOut,
    Learner,
    LearnerLost,
    LearnerObject,
    LearnerProcess,
    settle,
)

import torch

VERDICT_VERSION = 1
MAX_RESTARTS = 2
# Modules a test cell may name without importing them, bound to this process's own.
SHARED_MODULES = ("torch", "triton", "triton.language", "numpy", "math")
_UNBOUND = object()  # a stand-in still to be made again for the next test cell


@dataclass
class CellVerdict:
    grade_id: str
    max_points: float
    points: float = 0.0
    status: str = "not run"   # passed, failed, tampering, timeout, lost, not run
    reason: str = ""
    output: str = ""


@dataclass
class Verdict:
    chapter: str
    notebook: str
    sha256: str          # of the submitted notebook
    source_sha256: str   # of the chapter's source notebook (test cells, points)
    mode: str
    cells: list[CellVerdict] = field(default_factory=list)
    tampering: list[dict] = field(default_factory=list)   # {cell, changes}
    learner_errors: list[dict] = field(default_factory=list)  # {cell, error}
    learner_output: list[dict] = field(default_factory=list)  # {cell, output}: what it printed
    lost: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # [cell, seconds] for each code cell run, restarts included: where the time went
    cell_seconds: list[list] = field(default_factory=list)
    # Seconds spent waiting for the GPU beside other chapters (course.gpu_lock): for
    # cells to begin, and for timings to have it alone
    gpu_wait_seconds: dict = field(default_factory=dict)
    version: int = VERDICT_VERSION

    @property
    def points(self) -> float:
        return sum(c.points for c in self.cells)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        data = json.loads(text)
        cells = [CellVerdict(**c) for c in data.pop("cells")]
        return cls(cells=cells, **data)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_test(cell) -> bool:
    meta = _meta(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _label(cell, index: int) -> str:
    return _meta(cell).get("grade_id") or f"cell {index + 1}"


def _trim(text: str, limit: int = OUTPUT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2:]


def free_names(source: str) -> list[str]:
    """Names a cell reads that it never binds itself, in order of first use."""
    tree = ast.parse(source)
    bound: set[str] = set()
    loaded: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded.append if isinstance(node.ctx, ast.Load) else bound.add)(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return [n for n in dict.fromkeys(loaded) if n not in bound]


def course_imports(source_nb) -> str:
    """The import statements of the course's own cells (from its source notebook, which the
    learner cannot change), as code to run here before the test cells."""
    lines = []
    for cell in source_nb.cells:
        if cell.cell_type != "code" or _meta(cell).get("solution") or _is_test(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        lines += [ast.unparse(node) for node in tree.body
                  if isinstance(node, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(lines))


@contextlib.contextmanager
def _working_directory(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


class _SaltedGenerator(torch.Generator):
    """torch.Generator whose seeds are mixed with this run's secret."""

    salt = 0

    def manual_seed(self, seed: int) -> torch.Generator:
        return super().manual_seed((int(seed) ^ self.salt) & ((1 << 63) - 1))


@contextlib.contextmanager
def _secret_seeds():
    """Every torch.Generator made here (by a test cell or a checker) mixes its seed with a
    secret of this run."""
    _SaltedGenerator.salt = secrets.randbits(62)
    original = torch.Generator
    torch.Generator = _SaltedGenerator
    try:
        yield
    finally:
        torch.Generator = original


class _Run:
    """One submission being verified."""

    def __init__(self, nb, source_nb, *, cell_timeout_s: int, workdir: Path, env: dict,
                 verdict: Verdict, first: LearnerProcess | None = None):
        self.nb, self.source_nb = nb, source_nb
        self.cell_timeout_s = cell_timeout_s
        self.workdir, self.env, self.verdict = workdir, env, verdict
        self.learner: Learner | None = None
        self.killers: set[int] = set()  # cells that killed the learner's process
        self.restarts = 0
        self.tampered_from: int | None = None
        self.tamper_reason = ""
        self.namespace: dict = {"__name__": "__main__"}
        self.bound: dict[str, object] = {}  # name -> what _bind put there for the last cell
        self.by_id = {c.grade_id: c for c in verdict.cells}
        self.first = first  # a process launched ahead for this submission, if any

    # ------------------------------------------------------------ the learner's process

    def _start(self) -> None:
        process, self.first = self.first, None
        if process is None:
            process = learner_process(self.workdir, self.env)
        self.learner = Learner(process)  # before start(): closed whatever happens
        process.start()

    def _deadline(self) -> None:
        self.learner.process.deadline = time.monotonic() + self.cell_timeout_s

    def _note_tampering(self, index: int, label: str) -> None:
        changes = self.learner.process.new_tampering
        if not changes:
            return
        self.verdict.tampering.append({"cell": label, "changes": list(changes)})
        if self.tampered_from is None:
            self.tampered_from = index
            self.tamper_reason = (f"code changed what the checks rely on ({'; '.join(changes[:3])}"
                                  f"{'; ...' if len(changes) > 3 else ''}), in {label} or "
                                  "earlier: every test cell from there on scores 0")
        self.learner.process.new_tampering = []

    def _restart(self, upto: int) -> bool:
        """A new learner's process with the notebook's own cells before `upto` run again
        (not those that killed a process); False when no more restarts are allowed."""
        if self.restarts >= MAX_RESTARTS:
            return False
        self.restarts += 1
        self.learner.process.close()
        try:
            self._start()
            for index, cell in enumerate(self.nb.cells[:upto]):
                if cell.cell_type == "code" and not _is_test(cell) and index not in self.killers:
                    self._deadline()
                    self.learner.run_cell(cell.source, _label(cell, index))
                    self._note_tampering(index, _label(cell, index))
        except (LearnerLost, CellTimedOut) as exc:
            self.verdict.lost.append(f"while running the notebook again in a new process: {exc}")
            return False
        return True

    # ------------------------------------------------------------ cells

    def _waited(self, seconds: float) -> None:
        """A timing here waited `seconds` for the GPU: the learner's deadline moves on."""
        if self.learner is not None and self.learner.process.deadline is not None:
            self.learner.process.deadline += seconds

    def run(self) -> None:
        gpu_lock.on_wait.append(self._waited)
        gpu_lock.patience = self.cell_timeout_s  # a cell waits no longer for the GPU
        before = dict(gpu_lock.waited)
        try:
            self._run()
        finally:
            gpu_lock.on_wait.remove(self._waited)
            self.verdict.gpu_wait_seconds = {
                kind: round(gpu_lock.waited[kind] - before[kind], 3) for kind in before}

    def _run(self) -> None:
        self._start()
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(course_imports(self.source_nb), "<course imports>", "exec"),
                 self.namespace)
        alive = True
        for index, cell in enumerate(self.nb.cells):
            if cell.cell_type != "code":
                continue
            label = _label(cell, index)
            if not alive:
                if _is_test(cell) and label in self.by_id:
                    self._score(label, "lost", "not run: " + self.verdict.lost[-1])
                continue
            began = time.perf_counter()
            # Shared: a timing of another chapter on this GPU waits until the cell ends.
            try:
                with gpu_lock.shared():
                    alive = self._cell(index, cell, label)
                    settle()  # this process's GPU work ends before the share is given up
            except gpu_lock.LockTimeout as exc:  # the lock is this student's own (grader)
                self.verdict.lost.append(f"{label}: {exc}")
                if _is_test(cell) and label in self.by_id:
                    self._score(label, "lost", str(exc))
                alive = False
            self.verdict.cell_seconds.append([label, round(time.perf_counter() - began, 3)])
        self.learner.process.close()

    def _cell(self, index: int, cell, label: str) -> bool:
        """Run one code cell; whether a learner's process is left to run the next."""
        try:
            if _is_test(cell):
                self._test_cell(index, cell, label)
            else:
                self._deadline()
                reply = self.learner.run_cell(cell.source, label)
                if reply.get("output"):
                    self.verdict.learner_output.append(
                        {"cell": label, "output": _trim(str(reply["output"]))})
                if reply.get("error"):
                    self.verdict.learner_errors.append(
                        {"cell": label, "error": _error_text(reply["error"])})
                self._note_tampering(index, label)
        except CellTimedOut:
            self.verdict.learner_errors.append(
                {"cell": label,
                 "error": f"CellTimeoutError: stopped after {self.cell_timeout_s} s"})
            if self.learner.process.lost is not None:
                return self._lost(index, cell, label)
        except LearnerLost:
            return self._lost(index, cell, label)
        return True

    def _lost(self, index: int, cell, label: str) -> bool:
        why = self.learner.process.lost or "the learner's process was lost"
        self.verdict.lost.append(f"{label}: {why}")
        if not _is_test(cell):
            self.killers.add(index)
        return self._restart(index + 1 if _is_test(cell) else index)

    def _test_cell(self, index: int, cell, label: str) -> None:
        if label not in self.by_id:
            return  # a test cell the source does not have: nbgrader scores none
        if self.tampered_from is not None:
            self._score(label, "tampering", self.tamper_reason)
            return
        self._deadline()
        self._checked_cell(index, cell, label)
        self._note_tampering(index, label)
        if self.tampered_from is not None and self.by_id[label].status == "passed":
            self._score(label, "tampering", self.tamper_reason)

    def _bind(self, source: str) -> None:
        """Stand-ins here for the names the test cell reads from the learner's notebook,
        made afresh for each test cell (with those an earlier one made, which its functions
        may read): an earlier cell's may call a process since replaced, or show a value
        since changed."""
        # Not since assigned by a test cell (one left unbound by a lost process stays due).
        earlier = [name for name, bound in self.bound.items()
                   if (name not in self.namespace if bound is _UNBOUND
                       else self.namespace.get(name) is bound)]
        for name in earlier:
            self.namespace.pop(name, None)
        self.bound = dict.fromkeys(earlier, _UNBOUND)
        for name in dict.fromkeys(earlier + free_names(source)):
            if name in self.namespace or hasattr(builtins, name):
                continue
            found = self.learner.describe(name)
            kind = found["kind"]
            if kind == "callable":
                self.namespace[name] = self.learner.function(name)
            elif kind == "autograd":
                self.namespace[name] = self.learner.autograd_class(name)
            elif kind == "value":
                self.namespace[name] = _value(found["value"])
            elif kind == "module" and found["module"] in SHARED_MODULES:
                self.namespace[name] = importlib.import_module(found["module"])
            elif kind == "other":
                self.namespace[name] = type(found["type"], (LearnerObject,), {})()
            if name in self.namespace:
                self.bound[name] = self.namespace[name]
            else:  # the learner's process has no such name now
                self.bound.pop(name, None)

    def _checked_cell(self, index: int, cell, label: str) -> None:
        output = io.StringIO()
        tests_dir = self.workdir / "tests"  # a test cell sees an empty folder, as in nbgrader
        tests_dir.mkdir(exist_ok=True)
        try:
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output), \
                    _working_directory(tests_dir):
                self._bind(cell.source)
                exec(compile(cell.source, f"<test cell {label}>", "exec"), self.namespace)
        except CellTimedOut:
            self._score(label, "timeout", f"CellTimeoutError: stopped after "
                        f"{self.cell_timeout_s} s", output.getvalue())
            raise
        except LearnerLost:
            self._score(label, "lost", self.learner.process.lost or "lost", output.getvalue())
            raise
        except Exception as exc:
            self._score(label, "failed", f"{type(exc).__name__}: {exc}", output.getvalue())
        else:
            self._score(label, "passed", "", output.getvalue())

    def _score(self, label: str, status: str, reason: str, output: str = "") -> None:
        cell = self.by_id[label]
        cell.status, cell.reason, cell.output = status, _trim(reason), _trim(output)
        cell.points = cell.max_points if status == "passed" else 0.0


def _error_text(error: dict) -> str:
    return f"{error['type']}: {error['message']}{error.get('frame', '')}"


def _value(field: dict, memo: dict[int, object] | None = None) -> object:
    """The value a `describe` reply's field gives; a field the reply refers to twice is
    built once (a few bytes of pickle can nest one list in itself 2^40 times over)."""
    if "plain" in field:
        return field["plain"]
    if "tensor" in field:
        return field["tensor"].to(torch.device(field["device"]))
    memo = {} if memo is None else memo
    if id(field) not in memo:
        items = [_value(f, memo) for f in field["sequence"]]
        memo[id(field)] = tuple(items) if field["tuple"] else items
    return memo[id(field)]


def learner_process(workdir: Path, env: dict[str, str]) -> LearnerProcess:
    """The learner's process for one submission: its code runs in an empty folder, as
    the notebook does in a folder of its own under nbgrader."""
    (workdir / "notebook").mkdir(parents=True, exist_ok=True)
    return LearnerProcess(cwd=workdir / "notebook",
                          env=dict(env, IPYTHONDIR=str(workdir / ".ipython")),
                          log_path=workdir / "learner.log")


def _grading_env(source: Path) -> dict[str, str]:
    """The learner's process's environment: never the GPU lock's file (only the verifier
    takes it, for the learner's cells too); the source notebook's folder for its walls
    to refuse (`course.verify.walls`)."""
    env = dict(os.environ, MPLBACKEND="Agg", NBGRADER_EXECUTION="autograde",
               **{runtime.GRADING_ENV: "1",
                  walls.DENIED_ENV: str(Path(source).resolve().parent)})
    env.pop(gpu_lock.ENV, None)
    return env


def verify(submitted: str | Path, source: str | Path, *, cell_timeout_s: int = 300,
           workdir: Path | None = None, first: LearnerProcess | None = None) -> Verdict:
    """Verify one submission (see the module's text); never raises for what the
    submission does. `first`: a learner's process launched for it ahead of time, in
    `workdir`."""
    submitted, source = Path(submitted), Path(source)
    started = time.perf_counter()
    learner_nb, source_nb = read_notebook(submitted), read_notebook(source)
    nb = prepare(learner_nb, source_nb)
    verdict = Verdict(chapter=source.parent.name, notebook=str(submitted),
                      sha256=hashlib.sha256(submitted.read_bytes()).hexdigest(),
                      source_sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
                      mode=runtime.MODE,
                      cells=[CellVerdict(_meta(c)["grade_id"], float(_meta(c)["points"]))
                             for c in source_nb.cells if _is_test(c)])
    with contextlib.ExitStack() as stack:
        # The test cells run here as under the autograder: a speed cell fails without a GPU.
        stack.enter_context(temporary_environment({runtime.GRADING_ENV: "1"}))
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="verify-")))
        run = _Run(nb, source_nb, cell_timeout_s=cell_timeout_s, workdir=Path(workdir),
                   env=_grading_env(source), verdict=verdict, first=first)
        try:
            with _secret_seeds():
                run.run()
        except LearnerLost as exc:  # could not even start it
            verdict.lost.append(str(exc))
        except Exception:  # a fault of the verifier: no cell passes on it
            verdict.lost.append("the verifier failed:\n" + traceback.format_exc())
            for cell in verdict.cells:
                if cell.status == "not run":
                    cell.status, cell.reason = "lost", "the verifier failed (see the log)"
        finally:
            if run.learner is not None:
                run.learner.process.close()
            if run.first is not None:
                run.first.close()
    for cell in verdict.cells:
        if cell.status == "not run" and not cell.reason:
            cell.reason = "this test cell is not in the notebook"
    verdict.seconds = time.perf_counter() - started
    return verdict


def verify_all(submissions: list[tuple[Path, Path]], source: str | Path, *,
               cell_timeout_s: int = 300, say=print,
               ready: Callable[[], bool] | None = None) -> None:
    """Verify each (submitted notebook, verdict file) against one chapter's source, one
    after the other, each in a learner's process of its own (the next one started while
    the current one is graded). Each verdict file is written whole, as soon as it is ready:
    if this process dies, the verdicts already written stand and the others are absent.
    `ready`: called once the first learner's process is on its way, before any submission
    runs; False means verify none (the grader started this ahead of time, then gave up)."""
    def launched(workdir: Path) -> LearnerProcess:
        workdir.mkdir()
        process = learner_process(workdir, _grading_env(Path(source)))
        process.launch()
        return process

    with tempfile.TemporaryDirectory(prefix="verify-") as scratch:
        workdirs = [Path(scratch) / f"{i}" for i in range(len(submissions))]
        spare = None
        if ready is not None and submissions:
            spare = launched(workdirs[0])
            if not ready():
                spare.close()
                return
        for i, ((submitted, out), workdir) in enumerate(zip(submissions, workdirs,
                                                            strict=True)):
            workdir.mkdir(exist_ok=True)
            current, spare = spare, None
            if i + 1 < len(submissions):
                spare = launched(workdirs[i + 1])
            verdict = verify(submitted, source, cell_timeout_s=cell_timeout_s,
                             workdir=workdir, first=current)
            out = Path(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_name(out.name + ".partial")
            partial.write_text(verdict.to_json())
            os.replace(partial, out)
            say(summary(verdict) + _log_tail(workdir))


def summary(verdict: Verdict) -> str:
    lines = [f"{verdict.notebook}: {verdict.points:g} / "
             f"{sum(c.max_points for c in verdict.cells):g} in {verdict.seconds:.0f} s"]
    for cell in verdict.cells:
        lines.append(f"  {cell.grade_id:<40} {cell.points:g} / {cell.max_points:g}  "
                     f"{cell.status}" + (f": {cell.reason.splitlines()[0][:150]}"
                                         if cell.reason else ""))
    slowest = sorted(verdict.cell_seconds, key=lambda row: -row[1])[:5]
    if slowest:
        lines.append("  slowest cells: " + ", ".join(f"{cell} {s:.1f} s" for cell, s in slowest))
    waits = {kind: s for kind, s in verdict.gpu_wait_seconds.items() if s >= 0.05}
    if waits:
        lines.append("  waited for the GPU: " + ", ".join(
            f"{s:.1f} s for {'cells to begin' if kind == 'shared' else 'timings alone'}"
            for kind, s in waits.items()))
    for found in verdict.tampering:
        lines.append(f"  TAMPERING in {found['cell']}: {'; '.join(found['changes'][:3])}")
    for why in verdict.lost:
        lines.append(f"  the learner's process was lost: {why.splitlines()[0]}")
    return "\n".join(lines)


def _log_tail(workdir: Path, lines: int = 40) -> str:
    log = workdir / "learner.log"
    if not log.is_file():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return ("\n  what the learner's process printed last:\n    " + "\n    ".join(text)
            if text else "")
