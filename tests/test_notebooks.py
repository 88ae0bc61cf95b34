"""The chapters' notebooks: the sources run clean, notebooks/ is exactly what `make release`
makes of them, an unanswered release fails only where the learner has work to do, and the
nbgrader metadata is what the grader needs.

Notebooks run in a real Jupyter kernel (this environment's python3), from their own folder,
in whatever mode `course` picks (Triton's interpreter without a GPU).
"""

from __future__ import annotations

import ast
import filecmp
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
RELEASE = ROOT / "notebooks"
GRADER = ROOT / "grader"
NBGRADER_SCHEMA = 3  # nbgrader 0.9's cell metadata schema_version


def _load_release_script():
    spec = importlib.util.spec_from_file_location("release_script", ROOT / "scripts" /
                                                  "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release_script = _load_release_script()
CONFIG = PyFileConfigLoader("nbgrader_config.py", path=str(GRADER)).load_config()
CELL_TIMEOUT_S = CONFIG.Execute.timeout
STUB = CONFIG.ClearSolutions.code_stub["python"]
STUB_MESSAGE = re.search(r'NotImplementedError\("(.+)"\)', STUB).group(1)
# Raises ReleaseError (a collection error, so a failure) when solutions/ has no chapter.
CHAPTERS = release_script.find_chapters(SOLUTIONS)
# How the course starts a notebook's kernel (nbgrader and `course grade` read this section
# of its config): with encrypted messages, so that ipykernel does not warn about plain TCP.
KERNEL_CONFIG = Config({"KernelManager": dict(CONFIG.get("KernelManager", {}))})
# What no chapter may show a learner, in a cell's output or on its kernel's stderr: a
# checker's result printed as a dataclass (a test cell's last line displays its value),
# and warnings the learner did not cause.
NOISE = {
    "a checker's result as its dataclass repr": re.compile(
        r"\b\w*(Report|Result|Verdict|Comparison)\("),
    "ipykernel's warning about plain TCP": re.compile(r"running over TCP without encryption"),
    "the profiler's own log lines": re.compile(r"^USDT:", re.MULTILINE),
}
# The source notebooks as executed in this session, with their kernels' stderr.
_EXECUTED: dict[str, tuple[nbformat.NotebookNode, str]] = {}


def _source(chapter: str) -> Path:
    return SOLUTIONS / chapter / f"{chapter}.ipynb"


def _released(chapter: str) -> Path:
    return RELEASE / chapter / f"{chapter}.ipynb"


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_solution(cell) -> bool:
    return bool(_nbgrader(cell).get("solution"))


def _is_test(cell) -> bool:
    meta = _nbgrader(cell)
    return bool(meta.get("grade")) and not meta.get("solution")


def _execute(path: Path, *, allow_errors: bool, kernel_log: list[str] | None = None
             ) -> tuple[nbformat.NotebookNode, float]:
    """Run a notebook as the course runs it; what its kernel wrote to stderr (ipykernel's
    own warnings, which no cell shows) is appended to `kernel_log`, and printed if the run
    fails."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent)}},
                            config=KERNEL_CONFIG)
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+", errors="replace") as stderr:
        try:
            client.execute(stderr=stderr)
        except BaseException:
            stderr.seek(0)
            sys.stderr.write(stderr.read())
            raise
        stderr.seek(0)
        if kernel_log is not None:
            kernel_log.append(stderr.read())
    return nb, time.perf_counter() - start


def _output_texts(cell) -> list[str]:
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            texts.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            texts.append(_error_text(out))
        else:
            texts += [v if isinstance(v, str) else "".join(v)
                      for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return texts


def _errors(cell) -> list[dict]:
    return [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def _error_text(error: dict) -> str:
    text = f"{error.get('ename')}: {error.get('evalue')}\n" + "\n".join(error.get("traceback",
                                                                                    []))
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # tracebacks carry terminal colours


def _describe(index: int, cell) -> str:
    first_line = cell.source.strip().splitlines()[0] if cell.source.strip() else "(empty)"
    grade_id = _nbgrader(cell).get("grade_id")
    return f"cell {index}" + (f" ({grade_id})" if grade_id else "") + f": {first_line!r}"


# ---------------------------------------------------------------- the sources run clean


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_source_notebook_runs_top_to_bottom_without_errors(chapter, capsys):
    """Solutions, visible tests and hidden tests all pass in the source notebook."""
    kernel_log: list[str] = []
    try:
        nb, seconds = _execute(_source(chapter), allow_errors=False, kernel_log=kernel_log)
    except CellExecutionError as error:
        pytest.fail(f"solutions/{chapter}/{chapter}.ipynb fails when run top to bottom:\n"
                    f"{error}")
    _EXECUTED[chapter] = (nb, "".join(kernel_log))
    with capsys.disabled():
        print(f"\n  solutions/{chapter}: ran in {seconds:.1f} s", end="")


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_source_notebook_shows_no_result_reprs_and_no_warnings_nobody_caused(chapter):
    """Issue #34: a test cell that ends with a bare checker call shows the checker's own
    printed report and a one-line repr, not the dataclass (thousands of characters); the
    kernel runs without ipykernel's warning about plain TCP; the profiler cells print no
    "USDT: ..." lines. Uses the previous test's run when there was one."""
    if chapter not in _EXECUTED:
        kernel_log: list[str] = []
        nb, _ = _execute(_source(chapter), allow_errors=True, kernel_log=kernel_log)
        _EXECUTED[chapter] = (nb, "".join(kernel_log))
    nb, kernel_log = _EXECUTED[chapter]
    found = []
    for what, pattern in NOISE.items():
        for index, cell in enumerate(nb.cells):
            for text in _output_texts(cell):
                hit = pattern.search(text)
                if hit:
                    found.append(f"{what} in {_describe(index, cell)}: "
                                 f"{text[max(0, hit.start() - 80):hit.end() + 120]!r}")
        hit = pattern.search(kernel_log)
        if hit:
            found.append(f"{what} on the kernel's stderr: "
                         f"{kernel_log[max(0, hit.start() - 80):hit.end() + 120]!r}")
    assert not found, f"solutions/{chapter}:\n" + "\n".join(found)


# ---------------------------------------------------------------- the release is up to date


def _comparable(nb: dict) -> dict:
    """A notebook without what differs between runs that produce the same notebook."""
    volatile_cell_keys = ("execution", "collapsed", "scrolled", "ExecuteTime")
    cells = []
    for cell in nb["cells"]:
        meta = {k: v for k, v in cell.get("metadata", {}).items() if k not in volatile_cell_keys}
        cells.append({**cell, "metadata": meta})
    meta = dict(nb.get("metadata", {}))
    meta.pop("widgets", None)  # widget state a front end may save
    return {**nb, "cells": cells, "metadata": meta}


def _first_difference(expected: dict, stored: dict) -> str | None:
    for key in ("nbformat", "nbformat_minor", "metadata"):
        if expected.get(key) != stored.get(key):
            return f"notebook {key} differs"
    for index, (want, have) in enumerate(zip(expected["cells"], stored["cells"], strict=False)):
        if want != have:
            fields = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            return (f"cell {index} ({want.get('cell_type')}, id {want.get('id')}) differs in "
                    f"{', '.join(fields)}")
    if len(expected["cells"]) != len(stored["cells"]):
        return f"{len(expected['cells'])} cells expected, {len(stored['cells'])} stored"
    return None


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory) -> tuple[Path, set[str]]:
    """A copy of what a release reads (solutions/, the nbgrader config, the release script),
    released with the script as `make release` runs it, with a stale chapter and an
    unrelated file planted in notebooks/ beforehand. Returns the copy's root and the files
    it held before the release."""
    root = tmp_path_factory.mktemp("course")
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    shutil.copytree(SOLUTIONS, root / "solutions", ignore=ignore)
    (root / "grader").mkdir()
    shutil.copy2(GRADER / "nbgrader_config.py", root / "grader")
    (root / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "release.py", root / "scripts")
    (root / "notebooks" / "ch99_removed").mkdir(parents=True)
    (root / "notebooks" / "ch99_removed" / "ch99_removed.ipynb").write_text("{}")
    (root / "notebooks" / ".gitkeep").write_text("")
    before = _files(root)
    done = subprocess.run([sys.executable, str(root / "scripts" / "release.py")], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"the release failed:\n{done.stdout}{done.stderr}"
    return root, before


def test_release_writes_only_the_chapters_and_no_gradebook(course_copy):
    root, before = course_copy
    after = _files(root)
    outside = {p for p in after - before if not p.startswith("notebooks/")}
    assert not outside, f"the release left files outside notebooks/: {sorted(outside)}"
    released = {p for p in after if p.startswith("notebooks/")}
    expected = {f"notebooks/{ch}/{ch}.ipynb" for ch in CHAPTERS} | {"notebooks/.gitkeep"}
    assert released == expected, (f"notebooks/ should hold each chapter's notebook and what "
                                  f"was there besides chapters; extra: "
                                  f"{sorted(released - expected)}, missing: "
                                  f"{sorted(expected - released)}")


def test_notebooks_folder_is_what_make_release_generates(course_copy):
    fresh = course_copy[0] / "notebooks"
    fix = ("notebooks/ is out of date with solutions/: run `make release` and commit "
           "notebooks/ (never edit release notebooks by hand).")
    stored_chapters = sorted(p.name for p in RELEASE.glob("ch*") if p.is_dir())
    assert stored_chapters == CHAPTERS, (f"{fix}\nchapters in solutions/: {CHAPTERS}; "
                                         f"in notebooks/: {stored_chapters}")
    for chapter in CHAPTERS:
        assert _files(fresh / chapter) == _files(RELEASE / chapter), (
            f"{fix}\nnotebooks/{chapter} holds other files than the release makes")
        for name in sorted(_files(fresh / chapter)):
            if name.endswith(".ipynb"):
                expected = _comparable(json.loads((fresh / chapter / name).read_text()))
                stored = _comparable(json.loads((RELEASE / chapter / name).read_text()))
                difference = _first_difference(expected, stored)
                assert difference is None, f"{fix}\nnotebooks/{chapter}/{name}: {difference}"
            else:
                assert filecmp.cmp(fresh / chapter / name, RELEASE / chapter / name,
                                   shallow=False), f"{fix}\nnotebooks/{chapter}/{name} differs"


def test_a_chapter_folder_without_its_notebook_is_refused_and_nothing_changes(tmp_path):
    (tmp_path / "solutions" / "ch05_fused_add").mkdir(parents=True)
    (tmp_path / "solutions" / "ch05_fused_add" / "draft.ipynb").write_text("{}")
    (tmp_path / "notebooks" / "ch05_fused_add").mkdir(parents=True)
    kept = tmp_path / "notebooks" / "ch05_fused_add" / "ch05_fused_add.ipynb"
    kept.write_text("{}")
    with pytest.raises(release_script.ReleaseError, match=r"ch05_fused_add\.ipynb"):
        release_script.release(tmp_path)
    assert kept.read_text() == "{}"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs `make` on PATH")
def test_make_release_runs_the_release_script():
    plan = subprocess.run(["make", "-n", "release"], cwd=ROOT, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    assert "scripts/release.py" in plan.stdout, plan.stdout


# ---------------------------------------------------------------- an unanswered release


def _bound_names(source: str) -> set[str]:
    """Names a cell defines at its top level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            names.update(n.id for n in ast.walk(node)
                         if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names


def _caused_by_the_stub(error: dict, missing_names: set[str]) -> bool:
    """A test cell fails because of an unanswered exercise when the stub's error reaches it
    (raised through it, or reported in a checker's message), or when it uses a name that
    only the unanswered solution would have defined."""
    text = _error_text(error)
    if error.get("ename") == "NotImplementedError" or STUB_MESSAGE in text:
        return True
    name = re.search(r"name '(\w+)' is not defined", text)
    return error.get("ename") == "NameError" and name is not None and \
        name.group(1) in missing_names


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_unanswered_release_fails_only_in_exercises_and_their_tests(chapter, capsys):
    """Run the learner's notebook as released. The only cells allowed to fail are
    exercise cells raising the stub's NotImplementedError, and test cells failing because
    of it; every other cell must run for a learner who has not answered yet."""
    nb, seconds = _execute(_released(chapter), allow_errors=True)
    sources = {c.id: c for c in nbformat.read(_source(chapter), as_version=4).cells}
    unanswered_names: set[str] = set()
    wrong = []
    failed_tests = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for error in _errors(cell):
            if _is_solution(cell) and error.get("ename") == "NotImplementedError":
                unanswered_names |= _bound_names(sources[cell.id].source)
            elif _is_test(cell) and _caused_by_the_stub(error, unanswered_names):
                failed_tests += 1
            else:
                wrong.append(f"{_describe(index, cell)}\n    {_error_text(error)[:600]}")
    assert not wrong, (f"notebooks/{chapter}: cells that fail for a learner who has not "
                       f"answered yet, and not because of an exercise:\n" + "\n".join(wrong))
    if any(_is_solution(c) for c in nb.cells):
        assert failed_tests, (f"notebooks/{chapter}: no test cell fails on the unanswered "
                              "notebook, so its visible tests award points for nothing")
    with capsys.disabled():
        print(f"\n  notebooks/{chapter} (unanswered): ran in {seconds:.1f} s", end="")


# ---------------------------------------------------------------- metadata and storage


NOTEBOOKS = [pytest.param(path, id=str(path.relative_to(ROOT)))
             for ch in CHAPTERS for path in (_source(ch), _released(ch))]


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    carrying = [_describe(i, c) for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not carrying, (f"{path.relative_to(ROOT)} is stored with outputs or execution "
                          f"counts (clear them, then `make release`): {carrying}")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_graded_cells_carry_readable_ids_points_and_nbgrader_schema(path):
    chapter = path.parent.name
    number = chapter[2:4]
    nb = nbformat.read(path, as_version=4)
    problems = []
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        meta = _nbgrader(cell)
        if not meta:
            continue
        where = _describe(index, cell)
        if meta.get("schema_version") != NBGRADER_SCHEMA:
            problems.append(f"{where}: schema_version {meta.get('schema_version')!r}, "
                            f"expected {NBGRADER_SCHEMA}")
        if not (meta.get("grade") or meta.get("solution")):
            continue
        grade_id = meta.get("grade_id", "")
        if not re.fullmatch(rf"ex{number}_[a-z0-9_]+", grade_id):
            problems.append(f"{where}: grade_id {grade_id!r} should read like "
                            f"ex{number}_what_it_checks")
        if grade_id in seen:
            problems.append(f"{where}: grade_id {grade_id!r} is used twice")
        seen.add(grade_id)
        if meta.get("grade"):
            points = meta.get("points")
            if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
                problems.append(f"{where}: a graded cell needs points > 0, has {points!r}")
        if _is_test(cell) and not meta.get("locked"):
            problems.append(f"{where}: a test cell must be locked (read-only for learners)")
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_markers_stay_in_their_cells_and_out_of_the_release(chapter):
    source = nbformat.read(_source(chapter), as_version=4)
    for index, cell in enumerate(source.cells):
        if "### BEGIN SOLUTION" in cell.source:
            assert _is_solution(cell), (f"{_describe(index, cell)} holds a solution but is not "
                                        "an nbgrader solution cell: it would be released")
        if "### BEGIN HIDDEN TESTS" in cell.source:
            assert _is_test(cell), (f"{_describe(index, cell)} holds hidden tests but is not "
                                    "an nbgrader test cell: they would be released")
    released = _released(chapter).read_text()
    for marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
        assert marker not in released, f"notebooks/{chapter} contains {marker!r}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_course_is_imported_before_triton(chapter):
    """Without a GPU, `course` must switch Triton to its interpreter before Triton loads."""
    cells = [c.source for c in nbformat.read(_source(chapter), as_version=4).cells
             if c.cell_type == "code"]
    first_course = next((i for i, src in enumerate(cells)
                         if re.search(r"^import course$", src, re.M)), None)
    assert first_course is not None and first_course <= 1, (
        f"solutions/{chapter}: `import course` must be the first code cell (after the Colab "
        "setup cell, if any)")
    early_triton = [i for i, src in enumerate(cells[:first_course])
                    if re.search(r"^\s*(import|from) triton\b", src, re.M)]
    assert not early_triton, f"solutions/{chapter}: cells {early_triton} use triton too early"


def test_nbgrader_config_maps_the_course_and_keeps_grading_state_ignored():
    course_dir = CONFIG.CourseDirectory
    assert Path(course_dir.root) == ROOT
    assert (course_dir.source_directory, course_dir.release_directory) == ("solutions",
                                                                          "notebooks")
    state = [course_dir.submitted_directory, course_dir.autograded_directory,
             course_dir.feedback_directory]
    assert all(p.startswith("grader/") for p in state), state
    gradebook = Path(course_dir.db_url.removeprefix("sqlite:///"))
    assert gradebook.parent == GRADER, course_dir.db_url
    assert CELL_TIMEOUT_S and CELL_TIMEOUT_S > 0, "a hanging cell must be stopped"
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a checkout to ask which paths are ignored")
    paths = [f"{p}/learner/ch01_math/ch01_math.ipynb" for p in state] + [
        str(gradebook.relative_to(ROOT))]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert sorted(ignored) == sorted(paths), f"not git-ignored: {set(paths) - set(ignored)}"
