"""The code stamp of grader/instructor.py (`code_stamp`, `check_code_stamp`), which stops
autograde when the grading's own code changed under it, against what a submission (running
as the user who grades) can write besides the sources: a compiled file in __pycache__ that
an import runs in place of its source, a .pth file or a sitecustomize that Python runs as
any process starts. And no false alarm: after `compile_code`, importing the stamped modules
writes nothing. A tiny course in tmp_path; no nbgrader run."""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
import site
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

from grader_submissions import load_instructor  # noqa: E402  (after the skip above)

ROOT = Path(__file__).resolve().parents[1]
IMPORT_ALL = ("import fakecourse.check.runner as runner, solutions.ref\n"
              "print(runner.VERDICT)")


@pytest.fixture
def instructor():
    return load_instructor(ROOT, "instructor_code_stamp")


@pytest.fixture
def course(tmp_path, monkeypatch, instructor):
    """A course whose package is `fakecourse` (tmp_path/pkgs), with solutions/ref.py, and
    a site-packages folder and a user site of its own (empty)."""
    package = tmp_path / "pkgs" / "fakecourse"
    (package / "check").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "check" / "__init__.py").write_text("")
    (package / "check" / "runner.py").write_text("VERDICT = 'honest'\n")
    root = tmp_path / "course"
    (root / "solutions").mkdir(parents=True)
    (root / "solutions" / "ref.py").write_text("REF = 1\n")
    (root / "grader").mkdir()
    for folder in ("site", "usersite"):
        (tmp_path / folder).mkdir()
    # raising=False: the code before the compiled files were stamped has no _course_package
    monkeypatch.setattr(instructor, "_course_package", lambda: [package], raising=False)
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path / "site")])
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(tmp_path / "usersite"))
    return instructor.Course(root, root / "submitted", root / "autograded", root / "feedback",
                             f"sqlite:///{root / 'gradebook.db'}", "test")


def run_python(code: str, course) -> str:
    """`code` in a fresh Python process that imports the course as a notebook's kernel
    would (bytecode written as usual)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(course.root.parent / "pkgs"), str(course.root)])
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=course.root,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def forge(source: Path, code: str) -> Path:
    """A compiled file for `source` that runs `code`, its header holding the source's time
    and size as os.stat reads them: an import takes it for the source's own."""
    stat = source.stat()
    cfile = Path(importlib.util.cache_from_source(str(source)))
    cfile.parent.mkdir(exist_ok=True)
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        (int(stat.st_mtime) & 0xFFFF_FFFF).to_bytes(4, "little") + \
        (stat.st_size & 0xFFFF_FFFF).to_bytes(4, "little")
    cfile.write_bytes(header + marshal.dumps(compile(code, str(source), "exec")))
    return cfile


def test_a_forged_compiled_file_is_caught(course, instructor):
    runner = course.root.parent / "pkgs" / "fakecourse" / "check" / "runner.py"
    assert run_python(IMPORT_ALL, course) == "honest"  # compiled, as imports leave them
    before = instructor.code_stamp(course)
    forge(runner, "VERDICT = 'forged'")
    assert run_python(IMPORT_ALL, course) == "forged"  # every later process runs it
    with pytest.raises(instructor.GraderError,
                       match=r"changed while the test ran: \S*runner\.cpython-\d+\.pyc "
                             r"\(compiled\)"):
        instructor.check_code_stamp(course, before, "the test")


@pytest.mark.parametrize("what", ["a new .pth", "a sitecustomize in the user site",
                                  "the module a .pth imports"])
def test_what_python_runs_as_it_starts_is_stamped(course, instructor, what):
    site_dir = course.root.parent / "site"
    (site_dir / "finder.pth").write_text("import finder; finder.install()\n")
    (site_dir / "finder.py").write_text("def install():\n    pass\n")
    before = instructor.code_stamp(course)
    if what == "a new .pth":
        written = site_dir / "zz.pth"
        written.write_text("import os; os.environ['COURSE_GRADING'] = '0'\n")
        shown = r"zz\.pth \(new, run as Python starts\)"
    elif what == "a sitecustomize in the user site":
        written = course.root.parent / "usersite" / "sitecustomize.py"
        written.write_text("import builtins\n")
        shown = r"sitecustomize\.py \(new, run as Python starts\)"
    else:
        (site_dir / "finder.py").write_text("def install():\n    import course_forged\n")
        shown = r"finder\.py \(run as Python starts\)"
    with pytest.raises(instructor.GraderError, match=f"changed while the test ran: .*{shown}"):
        instructor.check_code_stamp(course, before, "the test")


def test_importing_the_compiled_code_changes_no_stamp(course, instructor):
    """Without the compile step, the first import of each module would write its compiled
    file while grading, which the stamp would take for tampering."""
    assert not instructor.compile_code(course)  # nothing forged to compile again
    before = instructor.code_stamp(course)
    # the fake course's own (the image's sitecustomize, where it has one, is stamped too)
    compiled = sorted(Path(f).name for f in before
                      if f.endswith(".pyc") and Path(f).is_relative_to(course.root.parent))
    assert compiled == sorted(f"{name}.{sys.implementation.cache_tag}.pyc" for name in
                              ["__init__", "__init__", "runner", "ref"]), before
    assert run_python(IMPORT_ALL, course) == "honest"
    assert instructor.code_stamp(course) == before
    instructor.check_code_stamp(course, before, "the import")


def test_the_stamp_is_unchanged_when_nothing_happened(course, instructor):
    (course.root.parent / "site" / "a.pth").write_text("/somewhere\n")
    py_compile.compile(str(course.root / "solutions" / "ref.py"), doraise=True)
    before = instructor.code_stamp(course)
    assert instructor.code_stamp(course) == before
    instructor.check_code_stamp(course, before, "nothing")


def test_compile_code_replaces_a_forged_compiled_file(course, instructor):
    """A pyc forged before a run (by a submission of an earlier one) is not older than its
    source: compileall keeps it; the compile step checks its code and writes it again."""
    runner = course.root.parent / "pkgs" / "fakecourse" / "check" / "runner.py"
    cfile = forge(runner, "VERDICT = 'forged'")
    assert not instructor.compile_code(course, repair=False)
    assert run_python(IMPORT_ALL, course) == "forged"
    assert instructor.compile_code(course) == [cfile]
    assert run_python(IMPORT_ALL, course) == "honest"
    assert not instructor.compile_code(course)


def test_several_gpus_stop_when_a_batch_changed_the_code(tmp_path, monkeypatch, instructor,
                                                         course):
    """The tasks of `autograde --gpus` each stamp the code as they start: a task started
    after an earlier batch forged a compiled file would take the forgery for the code. The
    parent's stamp, taken before any task, catches it after that batch: no batch starts
    any more, nothing is merged."""
    runner = course.root.parent / "pkgs" / "fakecourse" / "check" / "runner.py"
    assert run_python(IMPORT_ALL, course) == "honest"  # compiled, as imports leave them
    ran: list[list[str]] = []
    lock = threading.Lock()

    class Task:
        def __init__(self, students):
            self.students, self.pid = students, 0
            self.returncode = 1 if len(students) == 3 else 0

        def communicate(self, timeout=None):
            time.sleep(0.2 if self.returncode else 0.05)
            if self.returncode:  # [a, c, e] forges, and its own check stops it
                forge(runner, "VERDICT = 'forged'")
            return "", None

    def start_task(course, command, gpu):
        students = command[command.index("--item") + 2:command.index("--cell-timeout")]
        with lock:
            ran.append(students)
        return Task(students)

    merged = []
    for name, value in {"_start_task": start_task, "read_results": lambda folder: [],
                        "_gpu_answers": lambda gpu: True, "_verify_timeout": lambda *a: 100,
                        "merge": lambda course, say: merged.append(1) or [],
                        "_zero_grades": lambda *a: None, "current_verdict": lambda *a: None,
                        "report_chapter": lambda *a: None}.items():
        monkeypatch.setattr(instructor, name, value)
    plan = SimpleNamespace(todo={"ch02_roofline": ["a", "b", "c", "d", "e"]})
    with pytest.raises(instructor.GraderError,
                       match=r"changed while the batch ch02_roofline/a,c,e on GPU \d ran: "
                             r"\S*runner\.cpython-\d+\.pyc \(compiled\)"):
        # at_once 1: a batch per GPU of each chapter's students, whatever this machine's cores
        instructor.autograde_on_gpus(course, plan, ["0", "1"], force=False, cell_timeout_s=10,
                                     at_once=1, say=lambda line: None)
    assert sorted(map(tuple, ran)) == [("a", "c", "e"), ("b", "d")]  # none again, alone
    assert not merged


def _uncompiled_library(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """heavylib (four modules), which imports helperlib (one), neither compiled, where a
    fresh process finds them."""
    libs = tmp_path / "libs"
    package, helper = libs / "heavylib", libs / "helperlib"
    (package / "sub").mkdir(parents=True)
    helper.mkdir()
    for name in ("a.py", "sub/__init__.py", "sub/b.py"):
        (package / name).write_text("X = 1\n")
    (package / "__init__.py").write_text("import helperlib\nfrom . import a\n")
    (helper / "__init__.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(libs))
    monkeypatch.setenv("PYTHONPATH", str(libs))
    return package, helper


def test_packages_the_grading_imports_are_compiled_once(tmp_path, monkeypatch, instructor):
    # Each grading process would compile them again (docs/grading-time.md: on the H100 image,
    # import torch, torch._dynamo took 8.9 to 9.5 s uncompiled, 3.0 to 3.6 s compiled).
    package, helper = _uncompiled_library(tmp_path, monkeypatch)
    assert instructor.uncompiled_modules(("heavylib", "helperlib"))[:2] == (5, 5)
    note = instructor.compile_packages(("heavylib",))
    assert note is not None and note.startswith("4 of the 4 Python modules of heavylib had no")
    # what it imports from another package is compiled too, and nothing else of the user's
    assert instructor.uncompiled_modules(("heavylib", "helperlib"))[:2] == (0, 5)
    assert instructor.compile_packages(("heavylib",)) is None  # once


def test_packages_that_cannot_be_compiled_are_named_with_the_command(tmp_path, monkeypatch,
                                                                     instructor):
    package, helper = _uncompiled_library(tmp_path, monkeypatch)
    for folder in (package, package / "sub", helper):
        # a file where the compiled files' folder would go: unwritable, even for root
        (folder / "__pycache__").write_text("")
    note = instructor.compile_packages(("heavylib",))
    assert note is not None and note.startswith("4 of the 4 Python modules of heavylib have no")
    assert "this user cannot write one" in note
    assert note.endswith(f"-m compileall -q -j 0 {package} {helper}")
    assert instructor.uncompiled_modules(("heavylib",))[:2] == (4, 4)
