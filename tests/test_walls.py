"""The learner's process's walls (course.verify.walls): what a submission's code is refused
there, and what the course's own work still does. Each case runs in a fresh Python with
the walls up, its code compiled as a cell's is (a file name that is no package's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = r'''
import json, os, sys
sys.path.insert(0, {root!r})
import course, torch, triton
from course.verify import walls
walls.install()
results = {{}}


def attempt(name, fn):
    try:
        fn()
        results[name] = "allowed"
    except PermissionError:
        results[name] = "refused"


cell = {cell!r}
exec(compile(cell, "<ipython-input-1-0>", "exec"))
print(json.dumps({{"results": results, "refused": walls.refusals()}}))
'''


def _probe(cell: str, tmp_path: Path, deny: str = "") -> dict:
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(root=str(ROOT), cell=textwrap.dedent(cell)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COURSE_WALLS_DENY": deny,
           "MPLBACKEND": "Agg", "COURSE_DEVICE": "cpu",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_submission_cannot_read_the_gradings_files(tmp_path):
    source = tmp_path / "course" / "solutions" / "ch04_fused"
    source.mkdir(parents=True)
    (source / "notes.txt").write_text("the answers")
    notebook = tmp_path / "inbox.ipynb"
    notebook.write_text("{}")
    kernels = ROOT / "solutions" / "kernels" / "rmsnorm.py"
    readme = ROOT / "grader" / "README.md"
    data = ROOT / "course" / "data" / "kernel_fingerprints.json"
    got = _probe(f"""
        import os, pathlib
        attempt("a notebook", lambda: pathlib.Path({str(notebook)!r}).read_text())
        attempt("the source's folder", lambda: open({str(source / "notes.txt")!r}).read())
        attempt("the checkout's solutions", lambda: open({str(kernels)!r}).read())
        attempt("the checkout's grader", lambda: os.open({str(readme)!r}, os.O_RDONLY))
        attempt("the parent's command line", lambda: open(f"/proc/{{os.getppid()}}/cmdline").read())
        attempt("the course's data", lambda: open({str(data)!r}).read())
        attempt("its own /proc", lambda: open("/proc/self/status").read())
        attempt("a file of its own", lambda: open("mine.txt", "w").write("x"))
    """, tmp_path, deny=str(source))
    assert got["results"] == {
        "a notebook": "refused", "the source's folder": "refused",
        "the checkout's solutions": "refused", "the checkout's grader": "refused",
        "the parent's command line": "refused", "the course's data": "allowed",
        "its own /proc": "allowed", "a file of its own": "allowed"}, got
    assert all(what.startswith("reading ") for what in got["refused"]), got["refused"]


def test_a_submission_cannot_start_programs_or_switch_the_watches_off(tmp_path):
    pytest.importorskip("IPython", reason="IPython's shell is one of the ways tried")
    got = _probe("""
        import gc, subprocess, sys
        import multiprocessing
        from IPython.utils import process as ipython_process
        from torch.utils import collect_env
        attempt("subprocess", lambda: subprocess.run(["cat", "/etc/hostname"]))
        attempt("a shell through IPython", lambda: ipython_process.getoutput("true"))
        attempt("a shell through torch", lambda: collect_env.run("true"))
        attempt("multiprocessing", lambda: multiprocessing.get_context("spawn").Process(
            target=print).start())
        attempt("the profile hook off", lambda: sys.setprofile(None))
        attempt("the trace hook off", lambda: sys.settrace(None))
        attempt("the collector's objects", lambda: gc.get_objects())
        attempt("ctypes", lambda: __import__("ctypes").CDLL(None))
        attempt("code passing for torch's", lambda: compile("1", torch.__file__, "eval"))
        attempt("the grading's environment", lambda: os.environ.__setitem__("COURSE_GRADING", "0"))
        import _posixsubprocess
        attempt("the stand-in's original", lambda: _posixsubprocess.fork_exec.__defaults__)
        from course.verify import replay
        attempt("a course function rewritten", lambda: setattr(
            replay.repeated, "__code__", (lambda *a, **k: 0).__code__))
        attempt("a torch function rewritten", lambda: setattr(
            torch.allclose if hasattr(torch.allclose, "__code__") else torch.testing.assert_close,
            "__defaults__", ()))
        def mine(a=1):
            return a
        attempt("its own function rewritten", lambda: setattr(mine, "__defaults__", (2,)))
        attempt("chapter 00's doctor", lambda: subprocess.run(
            [sys.executable, "-m", "course", "doctor"], capture_output=True, timeout=120))
        attempt("a module imported for the first time", lambda: __import__("torch.utils.benchmark"))
        import matplotlib.pyplot as plt
        attempt("a plot saved", lambda: plt.figure().savefig("plot.png"))
        import platform
        attempt("platform.architecture (runs file)", lambda: platform.architecture())
    """, tmp_path)
    allowed = {"its own function rewritten", "chapter 00's doctor",
               "a module imported for the first time", "a plot saved",
               "platform.architecture (runs file)"}
    assert got["results"] == {name: "allowed" if name in allowed else "refused"
                              for name in got["results"]}, got
    assert len(got["results"]) == 18


def test_a_submission_cannot_plant_code_where_trusted_code_is_loaded_from(tmp_path):
    """Code written into the course's package (or its bytecode cache) would run as the
    course's own; importing a module of the course the first time, with no bytecode cached,
    compiles the module's own text, which is allowed (seen on an H200, Python 3.12)."""
    got = _probe("""
        import marshal, os, pathlib, shutil
        package = os.path.dirname(course.__file__)
        attempt("a module written into the course", lambda: open(
            os.path.join(package, "planted.py"), "w").write("OK = 1"))
        attempt("a bytecode cache written into the course", lambda: os.open(
            os.path.join(package, "__pycache__", "planted.pyc"), os.O_WRONLY | os.O_CREAT))
        open("mine.py", "w").write("OK = 1")
        attempt("a file moved into the course", lambda: os.rename(
            "mine.py", os.path.join(package, "planted.py")))
        attempt("a file of the course removed", lambda: os.remove(
            os.path.join(package, "check", "__init__.py")))
        attempt("Triton's cache written", lambda: pathlib.Path.home().joinpath(
            ".triton", "cache", "x").mkdir(parents=True))
        source = os.path.join(package, "traffic.py")
        attempt("a course module's own text compiled", lambda: compile(
            open(source, "rb").read(), source, "exec"))
        attempt("other text compiled as a course module", lambda: compile(
            "OK = 1", source, "exec"))
        attempt("marshalled code loaded", lambda: marshal.loads(marshal.dumps(
            compile("OK = 1", "mine.py", "exec"))))
        attempt("a file of its own", lambda: open("another.txt", "w").write("x"))
    """, tmp_path)
    allowed = {"a course module's own text compiled", "a file of its own"}
    assert got["results"] == {name: "allowed" if name in allowed else "refused"
                              for name in got["results"]}, got
    assert len(got["results"]) == 9
    assert not any(ROOT.joinpath("course").glob("planted*")), "a refused write left a file"


def test_the_checks_watches_are_set_from_the_courses_code_only(tmp_path):
    """The checks' watches set the profile hooks (course.check.profiled), from Python 3.12
    on every running thread's at once through threading.setprofile_all_threads. The walls
    let the course set them only through calls its code names: on an H200 (Python 3.12,
    2026-11-29) the watch called that function through an alias, every watched check was
    refused, and honest submissions lost five chapters. A cell's code may not switch them
    off: refused, and the hooks stay on (Python 3.12 reports a thread's refusal as
    unraisable, not to the caller); threading.setprofile, which no event reports, is seen
    as the watch ends, and fails the check."""
    got = _probe("""
        import sys, threading
        from course.check import profiled
        events = []
        with profiled.watching(lambda frame, event, arg: events.append(event)):
            len("x")
        results["the checks' watch saw"] = "c_call" in events and sys.getprofile() is None
        results["refusals after it"] = len(walls.refusals())
        off = threading.setprofile_all_threads if sys.version_info >= (3, 12) else sys.setprofile
        for name, switch in (("all", off), ("threads", threading.setprofile)):
            with profiled.watching(lambda frame, event, arg: None) as watch:
                attempt(name, lambda: switch(None))
            results[name + " off"] = watch.switched_off
    """, tmp_path)
    results = got["results"]
    assert results["the checks' watch saw"] and results["refusals after it"] == 0, got
    # Python 3.12's setprofile_all_threads sets threading's hook first, which no event reports
    assert results["all off"] == (sys.version_info >= (3, 12)) and results["threads off"], got
    assert [r for r in got["refused"] if "from the submission's code" in r], got


def test_a_program_of_its_own_under_a_tools_name_and_the_walls_settings_are_out_of_reach(
        tmp_path):
    """A red team's script named `file` (a tool anyone may start) read the solutions; the
    fork_exec stand-in's closure held the walls' settings, which it then changed."""
    got = _probe("""
        import os, stat, subprocess, _posixsubprocess
        os.mkdir("bin")
        open("bin/file", "w").write("#!/bin/sh\\nexit 0\\n")
        os.chmod("bin/file", 0o755)
        attempt("a script of its own named file", lambda: subprocess.run(
            [os.path.abspath("bin/file"), "x"]))
        attempt("the installed file", lambda: subprocess.run(["file", "-b", "/bin/sh"],
                                                             capture_output=True))
        results["the stand-in's closure"] = repr(_posixsubprocess.fork_exec.__closure__)
        attempt("the stand-in's keyword defaults",
                lambda: _posixsubprocess.fork_exec.__kwdefaults__)
    """, tmp_path)
    assert got["results"]["a script of its own named file"] == "refused", got
    assert got["results"]["the stand-in's closure"] == "None", got
    assert got["results"]["the stand-in's keyword defaults"] == "refused", got
    if Path("/usr/bin/file").exists():
        assert got["results"]["the installed file"] == "allowed", got


@pytest.mark.parametrize("what", ["the walls are up in course.compiled's child too"])
def test_course_compiled_raises_the_walls_in_its_child(what):
    source = (ROOT / "course" / "compiled.py").read_text()
    main = source[source.index('if __name__ == "__main__":'):]
    assert "walls.install()" in main.split("try:")[0], what
