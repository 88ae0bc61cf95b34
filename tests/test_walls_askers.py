"""Who asks, as the walls judge it (course.verify.walls `asker`), where a submission passes
its requests through the standard library or under borrowed file names (a red team,
2026-11-29): a thread whose target is the standard library's, code compiled under a
trusted file's name or as importlib's "<frozen ...>"."""

from __future__ import annotations

from test_walls import _probe

THREAD_OF_THE_STANDARD_LIBRARY = '''
import os, subprocess, sys, threading


def start_python_in_a_thread():
    child = [sys.executable, "-c", "open('child-ran', 'w')"]
    done = threading.Thread(target=subprocess.run, args=(child,))
    done.start()
    done.join()
    if not os.path.exists("child-ran"):  # the thread's PermissionError is its own
        raise PermissionError("refused in the thread")


attempt("python from a thread of subprocess.run", start_python_in_a_thread)
'''

BORROWED_NAMES = '''
import os, sysconfig
site = sysconfig.get_paths()["purelib"]
stdlib = sysconfig.get_paths()["stdlib"]
code = "import ctypes\\nctypes.CDLL(None)\\n"
attempt("compile as a site package's file",
        lambda: compile(code, os.path.join(site, "six.py"), "exec"))
attempt("compile as the standard library's",
        lambda: compile(code, os.path.join(stdlib, "json", "decoder.py"), "exec"))
attempt("compile as importlib's", lambda: compile(code, "<frozen importlib._x>", "exec"))
attempt("compile as a cell", lambda: compile(code, "<ipython-input-2-0>", "exec"))
attempt("a standard-library module's own text",
        lambda: compile(open(os.path.join(stdlib, "json", "decoder.py")).read(),
                        os.path.join(stdlib, "json", "decoder.py"), "exec"))
'''


def test_a_thread_whose_target_is_the_standard_librarys_is_not_trusted(tmp_path):
    found = _probe(THREAD_OF_THE_STANDARD_LIBRARY, tmp_path)
    assert found["results"] == {"python from a thread of subprocess.run": "refused"}, found


def test_code_compiled_under_a_trusted_name_is_refused(tmp_path):
    found = _probe(BORROWED_NAMES, tmp_path)
    assert found["results"] == {
        "compile as a site package's file": "refused",
        "compile as the standard library's": "refused",
        "compile as importlib's": "refused",
        "compile as a cell": "allowed",
        "a standard-library module's own text": "allowed",
    }, found


OBJECTS_OF_ITS_OWN = '''
import os, sys
called = []


def note(what):  # only where the walls' own code is the caller
    if sys._getframe(2).f_code.co_filename.endswith("walls.py"):
        called.append(what)


class Text(str):
    def __hash__(self):
        note("hash")
        return str.__hash__(self)

    def __eq__(self, other):
        note("eq")
        return str.__eq__(self, other)

    def startswith(self, *args):
        note("startswith")
        return str.startswith(self, *args)


class OwnPath:
    def __fspath__(self):
        note("fspath")
        return os.devnull


def set_code_by_a_text_name():
    def f():
        pass
    setattr(f, Text("__code__"), (lambda: None).__code__)


attempt("open a path object of its own", lambda: open(OwnPath()).close())
planted = os.path.join(__import__("sysconfig").get_paths()["purelib"], "course-test-own.pth")
attempt("write a setting's file named by a str subclass", lambda: open(Text(planted), "w"))
if os.path.exists(planted):  # written: the test fails, and leaves nothing behind
    os.remove(planted)
attempt("a plain path object", lambda: open(__import__("pathlib").Path(os.devnull)).close())
set_code_by_a_text_name()
results["the submission's methods run inside the hook"] = sorted(set(called))
'''


def test_the_hook_runs_no_method_of_the_submissions_objects(tmp_path):
    """An object's own methods (a str subclass's __hash__ or startswith, a __fspath__) would
    run inside the hook, one frame from what it keeps: it reads their text without them."""
    found = _probe(OBJECTS_OF_ITS_OWN, tmp_path)
    assert found["results"] == {
        "open a path object of its own": "allowed",  # open converts it: the hook sees text
        "write a setting's file named by a str subclass": "refused",
        "a plain path object": "allowed",
        "the submission's methods run inside the hook": [],
    }, found
