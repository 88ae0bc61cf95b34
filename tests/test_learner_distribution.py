"""Two distributions: the learners' package (`make dist`: `course` alone) holds no reference
kernels and no hidden tests, and `course` never imports `solutions`; the instructor's
(`make dist-instructor`, or `pip install -e .`) keeps the reference kernels. The learners'
wheel, installed in a fresh virtual environment with no checkout in sight, runs chapter 04
top to bottom."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from course import peers

import nbformat
import pytest
from grader_submissions import answered, solutions
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
COURSE_MODULES = ("course", "course.check", "course.bench", "course.widgets", "course.cli",
                  "course.grade", "course.peers", "course.shootout")


def _load_build_script():
    spec = importlib.util.spec_from_file_location("build_dist_script",
                                                  ROOT / "scripts" / "build_dist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_dist = _load_build_script()


# ------------------------------------------------------------------ course never imports solutions


def test_importing_the_course_loads_no_solutions_module():
    probe = (f"import {', '.join(COURSE_MODULES)}\nimport sys\n"
             "print([m for m in sys.modules if m == 'solutions' or "
             "m.startswith('solutions.')])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing the course loaded {done.stdout.strip()}"


def _module_level_imports_of_solutions(path: Path) -> list[str]:
    """Imports of solutions outside a function body (a function may import it lazily)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0:
                names = [child.module or ""]
            if not in_function and any(n == "solutions" or n.startswith("solutions.")
                                       for n in names):
                found.append(f"{path.relative_to(ROOT)}:{child.lineno}")
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def test_no_course_module_imports_solutions_except_lazily_in_a_function():
    found = [hit for path in sorted((ROOT / "course").rglob("*.py"))
             for hit in _module_level_imports_of_solutions(path)]
    assert not found, f"course/ imports solutions at module level: {found}"


def test_course_bench_says_the_reference_kernels_come_with_a_checkout(monkeypatch):
    # _ours keeps what it imported: another test in this process may have called it first
    monkeypatch.setattr(peers, "_ours", peers._ours.__wrapped__)
    for name in ("solutions", "solutions.kernels"):
        monkeypatch.setitem(sys.modules, name, None)  # as in the learners' package: absent
    with pytest.raises(peers.Unavailable, match="come with a checkout of the repository"):
        peers._ours()


# ------------------------------------------------------------------ the wheels


@pytest.fixture(scope="module")
def learner_wheel(tmp_path_factory) -> Path:
    return build_dist.build("learner", tmp_path_factory.mktemp("dist"))


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


@pytest.mark.slow
def test_the_learner_wheel_holds_the_course_and_its_data_and_no_answers(learner_wheel):
    names = _names(learner_wheel)
    assert learner_wheel.name.startswith("norm_kernels-")
    assert {"course/__init__.py", "course/validation.py", "course/kernel_records.py",
            "course/data/kernel_fingerprints.json", "course/data/reference_plans.json"} <= \
        set(names)
    assert any(n.startswith("course/data/") and n.endswith(".csv") for n in names)
    assert not [n for n in names if n.startswith("solutions")], "reference kernels shipped"
    assert not [n for n in names if n.endswith(".ipynb")], "source notebooks shipped"
    assert build_dist.wheel_problems(learner_wheel, "learner") == []
    with zipfile.ZipFile(learner_wheel) as archive:
        top = archive.read(next(n for n in names if n.endswith("top_level.txt"))).decode()
        meta = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert top.split() == ["course"]
    assert "Name: norm-kernels" in meta


@pytest.mark.slow
def test_the_instructor_wheel_keeps_the_reference_kernels(tmp_path):
    wheel = build_dist.build("instructor", tmp_path)
    names = _names(wheel)
    assert "solutions/kernels/rmsnorm.py" in names and "course/validation.py" in names
    assert not [n for n in names if n.endswith(".ipynb")]


def test_the_wheel_inspection_catches_what_a_learner_must_not_get(tmp_path):
    wheel = tmp_path / "bad-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("course/__init__.py", "")
        archive.writestr("solutions/kernels/rmsnorm.py", "")
        archive.writestr("course/extra.ipynb", "### BEGIN HIDDEN TESTS\n")
    problems = build_dist.wheel_problems(wheel, "learner")
    assert "holds solutions/kernels/rmsnorm.py" in problems
    assert "holds a notebook, course/extra.ipynb" in problems
    assert any("BEGIN HIDDEN TESTS" in p for p in problems)
    assert "no course/data/kernel_fingerprints.json" in problems


@pytest.mark.skipif(shutil.which("make") is None, reason="needs `make` on PATH")
def test_make_dist_and_make_dist_instructor_build_the_two_wheels():
    for target, kind in (("dist", "learner"), ("dist-instructor", "instructor")):
        plan = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert plan.returncode == 0, plan.stderr
        assert f"scripts/build_dist.py {kind}" in plan.stdout, plan.stdout


# ------------------------------------------------------------------ a learner's machine


def _fresh_venv(root: Path, wheel: Path) -> Path:
    """A virtual environment with the learner wheel installed and nothing of the checkout:
    the course's dependencies (torch, triton, Jupyter) come from this environment's
    site-packages through a .pth line, and a directory added that way has its own .pth files
    ignored, so the checkout's editable install (a .pth finder) stays out of sight."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    # Installed before the .pth line exists, so that pip sees no other norm-kernels.
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-index", "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "norm_kernels_test_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    return python


PROBE = ("import importlib.util, json, sys\nimport course\n"
         "print(json.dumps({'course': course.__file__, 'prefix': sys.prefix, "
         "'solutions': importlib.util.find_spec('solutions') is not None}))")


@pytest.mark.slow
def test_the_learner_wheel_runs_chapter_04_in_a_fresh_venv_without_the_repository(
        tmp_path, learner_wheel, monkeypatch):
    python = _fresh_venv(tmp_path, learner_wheel)
    # A kernel spec for that Python, found first; interpreter mode even on a GPU machine.
    spec_dir = tmp_path / "jupyter" / "kernels" / "learner"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "learner", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    # The released chapter, answered as a learner who got every exercise right would, copied
    # away from the checkout; a last cell says where `course` came from.
    chapter = "ch04_fused"
    work = tmp_path / "work"
    work.mkdir()
    nb = answered(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", solutions(ROOT, chapter))
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbformat.write(nb, work / f"{chapter}.ipynb")
    client = NotebookClient(nb, timeout=600, kernel_name="learner",
                            resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError, with the cell, on any error
    probe = json.loads("".join(o.get("text", "") for o in nb.cells[-1].outputs))
    venv = (tmp_path / "venv").resolve()
    assert Path(probe["course"]).resolve().is_relative_to(venv), probe
    assert Path(probe["prefix"]).resolve() == venv, probe
    assert probe["solutions"] is False, probe
    checked = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert checked and all(not any(o.get("output_type") == "error" for o in c.outputs)
                           for c in checked)
