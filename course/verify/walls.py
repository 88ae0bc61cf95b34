"""What a submission's code may not do in the learner's process, refused as it is tried.

An audit hook (PEP 578: nothing in Python removes one once it is added) refuses:

- reading the grading's files, whoever asks: any notebook (`*.ipynb`: the course's sources,
  every student's submissions), the checkout's folders besides the course package
  (solutions/, grader/, tests/, ...), the folder of the source notebook being graded, and
  another process's /proc entries;
- unless the course, torch or triton asks: writing, moving, linking or removing files where
  code that is trusted lives or is loaded from (the checkout, the installed packages,
  Python's own library, Triton's and torch.compile's caches): code found there would run as
  theirs (Python writes no bytecode caches in this process);
- starting a program, unless the course, torch or triton asks for Python, the core or a
  library for a compiler's tool (ptxas, a C compiler, ldconfig), anyone for `file` or the
  font lister, or it is a command a notebook's own cell runs;
- from a submission's code: switching the profile or trace hooks off (the checks' watches
  use them), rewriting the code or defaults of a function of the course, torch, triton or
  the standard library, calling native code through ctypes, walking the garbage
  collector's objects (where this hook's data could be found), compiling code under a file
  name of the course, torch or triton (to pass for theirs: importing one of their modules
  compiles its file's own text, which is allowed) or of any trusted folder, or as
  importlib's "<frozen ...>" (file names decide who asks), loading marshalled code other than a
  trusted package's bytecode cache, changing the environment the
  checks run under.

Who asks is the first frame on the stack outside the standard library (a library at most
where there is none: a thread whose target is the standard library's). "The course, torch
or triton": a file of those packages, when every call from that frame to the action is one
its caller's code names (a library at most otherwise: a finalizer, a `partial`, a `map` or
a `__del__` of the standard library's, handed over by the submission and called later on
top of the course's frames). A library: any other installed package but those that run
commands for their caller (IPython, pip, ...). A submission's code: a cell, and whatever it
compiled. Each refusal raises PermissionError and is kept where no Python code
reaches it (`refusals()` gives a copy); the learner's process reports it as tampering, so
the test cells from then on score 0, whether or not the submission caught the error.

What the hook keeps, and what the course hides from the submission, is in keyword defaults
of functions whose code and defaults the hook refuses to show to anyone but the course,
torch or triton: the walls' own functions, and those the course names with `guard` (chapter
03's simulated GPU). A refusal's traceback holds the hook's frame, so reading a frame of
the walls' code from a traceback is refused too.

A tripwire with a high bar, not a wall: native code (a shared library the submission
writes and has a trusted package load) is beyond it. An operating-system sandbox is the
wall; `grader/README.md` says what is left open.
"""

from __future__ import annotations

import getpass
import inspect
import os
import pathlib
import shutil
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

DENIED_ENV = "COURSE_WALLS_DENY"  # folders to deny besides the checkout's, os.pathsep-separated
# The checkout's folders besides the course package (and a virtual environment in it).
CHECKOUT_DENIED = ("solutions", "notebooks", "grader", "tests", "docs", "scripts", ".git")
CORE = ("course", "torch", "triton")  # the packages whose code may start programs
# Installed packages that run commands or code for their caller: not trusted as a library.
COMMAND_RUNNERS = ("IPython", "ipykernel", "pip", "setuptools", "_distutils_hack",
                   "pexpect", "ptyprocess", "jupyter_client", "jupyter_core", "nbclient",
                   "nbconvert", "nbgrader")
# Programs the core packages start: Triton's assembler and C compiler, torch's compilers and
# workers, ldconfig and objdump (ctypes.util finds libraries with them), asked for by the core
# or a library; and, whoever asks, matplotlib's font lister and `file`, which
# platform.architecture() runs (seen on an H200: torch's profiler asked, in chapter 03).
TOOLS = ("ptxas", "gcc", "g++", "cc", "c++", "clang", "ld", "ldconfig", "objdump", "nvcc",
         "cuobjdump", "nvdisasm", "nvidia-smi", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc")
ANYONES_TOOLS = ("fc-list", "fc-match", "file")  # by exact name, installed (_installed)
# Where the system's programs are installed (a tool must resolve to one of these or to a
# trusted package's folder: Triton's ptxas is in its package).
SYSTEM_PROGRAMS = ("/usr/", "/bin/", "/sbin/", "/opt/", "/etc/alternatives/")
# Programs a notebook's own cells start while graded: chapter 00's `python -m course doctor`.
ALLOWED_COMMANDS = (("-m", "course", "doctor"),)
# Refused unless a library or the core asks.
LIBRARY_EVENTS = frozenset({
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata",
    "ctypes.cdata/buffer", "ctypes.addressof", "ctypes.call_function", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.get_errno", "ctypes.set_errno", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
})
# Refused unless the core asks (the checks' own watches set these hooks).
CORE_EVENTS = frozenset({"sys.setprofile", "sys.settrace", "sys._setprofileallthreads",
                         "sys._settraceallthreads"})
# Refused unless a library or the core asks, or Python's import machinery loads a trusted
# package's bytecode cache (`_trusted_bytecode`).
MARSHAL_EVENTS = frozenset({"marshal.loads", "marshal.load"})
PROGRAM_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
                            "os.spawn", "os.startfile", "pty.spawn"})
ARGV_AT = {"subprocess.Popen": 1, "os.exec": 1, "os.posix_spawn": 1, "os.spawn": 2}
REWRITES = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
# Events that change a file or folder: the positions of their paths in the event's args.
FILE_CHANGES = {"os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,), "os.mkdir": (0,),
                "os.remove": (0,), "os.rmdir": (0,), "os.truncate": (0,), "os.chmod": (0,),
                "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,)}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Modules whose functions a submission may not rewrite, besides the core packages'.
GUARDED_MODULES = ("builtins", "time", "os", "io", "sys", "warnings", "traceback",
                   "threading", "contextlib", "functools", "pickle", "inspect", "subprocess")
WATCHED_ENV_PREFIXES = ("COURSE_", "PYTHON", "TRITON_", "CUDA_", "NBGRADER", "LD_")
# The built-in functions that raise each event the core may be asked about, by the names a
# caller's code calls them by (an event a Python frame raises itself comes through
# sys.audit; object.__setattr__ and __getattr__ also through the attribute's own name).
EVENT_CALLS = {
    "open": ("open", "FileIO"), "sqlite3.connect": ("connect",),
    "os.rename": ("rename", "replace"), "os.link": ("link",), "os.symlink": ("symlink",),
    "os.mkdir": ("mkdir",), "os.remove": ("remove", "unlink"), "os.rmdir": ("rmdir",),
    "os.truncate": ("truncate", "ftruncate"), "os.chmod": ("chmod", "lchmod", "fchmod"),
    "os.chown": ("chown", "lchown", "fchown"), "os.utime": ("utime",),
    "os.system": ("system",), "os.exec": ("execv", "execve"),
    "os.posix_spawn": ("posix_spawn", "posix_spawnp"), "os.spawn": ("spawnv", "spawnve"),
    "os.startfile": ("startfile",), "sys.setprofile": ("setprofile",),
    "sys.settrace": ("settrace",), "sys._setprofileallthreads": ("_setprofileallthreads",),
    "sys._settraceallthreads": ("_settraceallthreads",),
    "object.__setattr__": ("setattr", "__setattr__"),
    "object.__getattr__": ("getattr", "__getattribute__"),
}
# Code entered without a call naming it: a generator's frame resumes where its consumer
# iterates (the call that made it named it).
RESUMED = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
           | inspect.CO_ASYNC_GENERATOR)

NONE, LIBRARY, TRUSTED = 0, 1, 2  # who asked


class _Places:
    """Resolved folder prefixes: the standard library, installed packages, the core
    packages, the command runners, and the denied folders."""

    def __init__(self) -> None:
        paths = sysconfig.get_paths()
        self.stdlib = tuple({_folder(paths[k]) for k in ("stdlib", "platstdlib")})
        self.site = tuple({_folder(paths[k]) for k in ("purelib", "platlib")})
        import course

        import torch
        import triton

        package = Path(course.__file__).resolve().parent
        self.core = tuple(_folder(Path(m.__file__).parent) for m in (course, torch, triton))
        self.runners = tuple(s + name + os.sep for s in self.site for name in COMMAND_RUNNERS)
        denied = set()
        checkout = package.parent
        if (checkout / "solutions").is_dir():  # a checkout, not an installed package
            denied |= {_folder(checkout / name) for name in CHECKOUT_DENIED}
        denied |= {_folder(p) for p in os.environ.get(DENIED_ENV, "").split(os.pathsep) if p}
        self.denied = tuple(denied)
        # Where trusted code is: these, and folders on the import path besides (packages
        # installed with PYTHONPATH), less the one the submission runs in and any holding it.
        here = _folder(os.getcwd())
        on_path = {_folder(p) for p in sys.path if p and os.path.isdir(p)}
        on_path = {p for p in on_path if not (here.startswith(p) or p.startswith(here))}
        self.trusted_code = (*self.stdlib, *self.site, *self.core, *on_path)
        # Not to be changed: where trusted code is, or is loaded from (the compilers' caches).
        caches = {_folder(Path.home() / ".triton"),
                  _folder(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")}
        caches |= {_folder(os.environ[k]) for k in ("TRITON_CACHE_DIR", "TRITON_HOME",
                                                    "TORCHINDUCTOR_CACHE_DIR") if os.environ.get(k)}
        if (checkout / "solutions").is_dir():
            caches.add(_folder(checkout))
        self.kept = (*self.trusted_code, *caches)

    def asker(self, action: tuple[str, ...] | None = None) -> int:
        """Who asked: the first frame outside the standard library. Where there is none (a
        thread whose target is the standard library's, an exit handler), a library at most:
        a submission can start `threading.Thread(target=subprocess.run, ...)` itself.

        The course, torch or triton asks only for what its code calls by name: each call
        from its frame to the action (`action`: the names of the built-in function that
        raised the event; None: not asked), through the standard library, must be one its
        caller's code names. A call no code names is of a value handed in (a finalizer's
        function, a `functools.partial`, a `map`, a `__del__` or `__len__` that is the
        standard library's, called from C), whose registrar is unknown: a library at
        most."""
        frame = sys._getframe(2)  # asker, the hook (or fork_exec's stand-in), who asked
        called = None if action is None else (*action, "audit")  # what the next frame calls
        named = True  # every call so far was named by its caller
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if name == __file__:  # the walls' own: the hook, or a stand-in of that name
                if code.co_name == "fork_exec" and action is not None:
                    called = ("fork_exec",)
            elif name.startswith("<frozen "):  # an import: what it runs, the import's own
                called = None
            else:
                if named and called is not None:
                    named = _names_any(code, called)
                path = os.path.realpath(name) if os.path.isabs(name) else name
                if not path.startswith(self.stdlib) or path.startswith(self.site):
                    if path.startswith(self.core):
                        return TRUSTED if named else LIBRARY
                    if path.startswith(self.site) and not path.startswith(self.runners):
                        return LIBRARY
                    return NONE
                if named and action is not None:  # asked: what its caller must name
                    called = None if code.co_flags & RESUMED else \
                        tuple(getattr(code, "co_qualname", code.co_name).split("."))  # 3.10
            frame = frame.f_back
        return LIBRARY


def _names_any(code: types.CodeType, names: tuple[str, ...]) -> bool:
    """Whether `code` names any of `names` (a global, an attribute or a local variable)."""
    return any(n in code.co_names or n in code.co_varnames or n in code.co_freevars or
               n in code.co_cellvars for n in names)


def _folder(path: str | Path) -> str:
    return os.path.realpath(path).rstrip(os.sep) + os.sep


# Path objects whose __fspath__ is the standard library's (exact types: a subclass's is not).
# Types here are compared by identity alone: `==`, `in` and hashing can run a metaclass's.
_PATH_TYPES = (pathlib.PurePath, pathlib.PurePosixPath, pathlib.PureWindowsPath,
               pathlib.Path, pathlib.PosixPath, pathlib.WindowsPath)


def _one_of(kind: type, types_: tuple) -> bool:
    return any(kind is t for t in types_)


OWN_OBJECT = "<an object of the submission's own>"  # plain_text's answer: unreadable


def plain_text(value: object) -> str | None:
    """A name or path as a plain str, read without running code of the value's own (the hook
    would run it with the hook's frame one step up: a str subclass's methods, a
    __fspath__): None for what is neither text nor a path, OWN_OBJECT for an object whose
    text only its own code could give. For any audit hook of the course (course.lab_sweeps
    reads names with it too)."""
    kind = type(value)  # never isinstance: it reads the value's own __class__
    if kind is str or kind is bytes:
        return os.fsdecode(value)
    if _one_of(kind, _PATH_TYPES):
        return os.fspath(value)
    mro = type.__getattribute__(kind, "__mro__")  # not through a metaclass of its own
    for base in (str, bytes):
        if _one_of(base, mro):  # a subclass: its characters, through the base's own slot
            return os.fsdecode(base.__getitem__(value, slice(None)))
    own = any("__fspath__" in type.__getattribute__(k, "__dict__") for k in mro)
    return OWN_OBJECT if own else None


def _path_of(value: object) -> str | None:
    """The real path `value` names (OWN_OBJECT kept as it is), or None."""
    path = plain_text(value)
    if path is None or path == OWN_OBJECT:
        return path
    try:
        return os.path.realpath(path) if path not in ("", ":memory:") else None
    except ValueError:  # a NUL byte: the call itself fails
        return None


def _denied_path(path: str, denied: tuple[str, ...]) -> str | None:
    """Why reading `path` is refused, or None."""
    if path.endswith(".ipynb"):
        return "a notebook"
    if (path + os.sep).startswith(denied):
        return "a folder of the course's grading"
    parts = path.split(os.sep)
    if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and \
            int(parts[2]) != os.getpid():
        return "another process's files"
    return None


def _writes(args: tuple) -> bool:
    """Whether an "open" event's (path, mode, flags) opens for writing."""
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else 0
    if type(mode) is str:
        return any(c in mode for c in "wax+")
    return type(flags) is int and bool(flags & WRITE_FLAGS)


def _same_as_file(data: object, path: str | None, skip: int = 0) -> bool:
    """Whether `data` (source or bytecode) is the text of the file at `path` (past `skip`
    bytes of header)."""
    if path is None or path == OWN_OBJECT or \
            not _one_of(type(data), (bytes, bytearray, memoryview, str)):
        return False
    want = data.encode() if type(data) is str else bytes(data)
    try:
        with open(path, "rb") as f:  # a trusted folder's file: reading it is not refused
            return f.read()[skip:] == want
    except OSError:
        return False


def _trusted_bytecode(places: _Places, data: object) -> bool:
    """Whether marshalled `data` is being loaded by Python's import machinery from a
    bytecode cache in a trusted folder, and is that file's code."""
    frame = sys._getframe(2)  # _trusted_bytecode, the hook, who asked
    if frame.f_code.co_name != "_compile_bytecode" or \
            not frame.f_code.co_filename.startswith("<frozen importlib"):
        return False
    path = _path_of(frame.f_locals.get("bytecode_path"))
    return bool(path) and path.startswith(places.trusted_code) and \
        _same_as_file(data, path, skip=16)


def _program(argv: object) -> list[str] | None:
    """The program's arguments as plain text; None where any is not text or a path."""
    if not _one_of(type(argv), (list, tuple)):
        argv = [argv]
    texts = [plain_text(a) for a in argv]
    return None if any(t is None or t == OWN_OBJECT for t in texts) else texts


def _installed(program: str, places: _Places) -> bool:
    """Whether `program` resolves to a file the system or a trusted package installed (not
    one the submission wrote, under a tool's name, in a folder of its own)."""
    found = program if os.sep in program else shutil.which(program)
    if not found:
        return False
    path = os.path.realpath(found)
    return path.startswith(SYSTEM_PROGRAMS) or path.startswith(places.trusted_code)


def _program_allowed(argv: list[str] | None, asker: int, places: _Places) -> bool:
    """Whether a program may start: a notebook's own command, matplotlib's font lister,
    or a tool of the core packages (Python among them) that they asked for."""
    if not argv:
        return False
    python = os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
    if python and tuple(argv[1:]) in ALLOWED_COMMANDS:
        return True
    name = os.path.basename(argv[0])
    if name in ANYONES_TOOLS:
        return _installed(argv[0], places)
    if asker == TRUSTED and python:
        return True
    return asker != NONE and name.startswith(TOOLS) and _installed(argv[0], places)


def _guarded_function(target: object) -> bool:
    if type(target) is not types.FunctionType:  # nothing else has code to rewrite
        return False
    module = target.__module__ or ""
    return module.split(".")[0] in CORE or module in GUARDED_MODULES


# What was refused, and what the hook guards, live in these functions' keyword defaults: the
# hook refuses to show those (a module's list the submission could clear or fill).
def refusals(*, _refused: list[str] = []) -> list[str]:  # noqa: B006
    """What was refused in this process, in order: a copy."""
    return list(_refused)


def guard(*functions: object, _guarded: dict[int, object] = {}) -> None:  # noqa: B006
    """Have the hook refuse to show `functions`' code and defaults to the submission: what a
    course function keeps in its keyword defaults is then out of Python's reach while the
    walls stand (without them, it is one attribute away)."""
    for function in functions:
        _guarded[id(function)] = function  # kept: an id is never reused while it lives


def install() -> None:
    """Add the hook (once a process). Call it before any of the submission's code runs."""
    if getattr(install, "done", False):
        return
    install.done = True
    sys.dont_write_bytecode = True  # imports write nothing where trusted code is kept
    places = _Places()
    # Read before the hook stands (it refuses anyone outside the core, as the caller may be).
    refused = refusals.__kwdefaults__["_refused"]
    guarded = guard.__kwdefaults__["_guarded"]
    mine = os.getpid()

    def refuse(what: str) -> None:
        if os.getpid() == mine:  # a forked child's refusals are its own
            refused.append(what)
        raise PermissionError(f"refused while grading: {what}")

    def judge(argv: list[str] | None, what: str, calls: tuple[str, ...] = ()) -> None:
        """Refuse starting the program `argv` (`what` when it is not known) unless allowed
        (`calls`: the names of the built-in function that raised the event)."""
        if not _program_allowed(argv, places.asker(calls), places):
            refuse(f"starting {' '.join(argv or [what])[:200]}")

    def hook(event: str, args: tuple) -> None:
        calls = EVENT_CALLS.get(event, ())  # what the core's code calls to raise it
        if event in ("open", "sqlite3.connect"):
            path = _path_of(args[0]) if args else None
            if path == OWN_OBJECT:
                refuse(f"opening a path given as {type(args[0]).__name__}, {path}")
            why = _denied_path(path, places.denied) if path else None
            if why:
                refuse(f"reading {path} ({why})")
            if path and event == "open" and path.startswith(places.kept) and _writes(args) \
                    and places.asker(calls) != TRUSTED:
                refuse(f"writing {path} (where trusted code is kept)")
        elif event in FILE_CHANGES:
            for at in FILE_CHANGES[event]:
                path = _path_of(args[at]) if len(args) > at else None
                if path == OWN_OBJECT:
                    refuse(f"{event} on a path given as {path}")
                if path and path.startswith(places.kept) and places.asker(calls) != TRUSTED:
                    refuse(f"{event} on {path} (where trusted code is kept)")
        elif event in PROGRAM_EVENTS:
            at = ARGV_AT.get(event)  # os.system's command line goes through a shell
            judge(_program(args[at]) if at is not None and len(args) > at else None, event,
                  calls)
        elif event in CORE_EVENTS:
            if places.asker(calls) != TRUSTED:
                refuse(f"{event} from the submission's code")
        elif event in LIBRARY_EVENTS:
            if places.asker() == NONE:
                refuse(f"{event} from the submission's code")
        elif event in MARSHAL_EVENTS:
            if places.asker() == NONE and not _trusted_bytecode(places, args[0] if args else None):
                refuse(f"{event} from the submission's code")
        elif event == "object.__setattr__" and len(args) > 1 and type(args[1]) is str and \
                args[1] in REWRITES:
            if _guarded_function(args[0]) and places.asker((*calls, args[1])) != TRUSTED:
                refuse(f"rewriting {getattr(args[0], '__qualname__', args[0])!s}.{args[1]}")
        elif event == "object.__getattr__" and len(args) > 1 and type(args[1]) is str and \
                args[1] in REWRITES:
            if (id(args[0]) in guarded or type(args[0]) is types.FunctionType and
                    args[0].__module__ == __name__) and \
                    places.asker((*calls, args[1])) != TRUSTED:
                refuse(f"reading {args[1]} of the grading's {args[0].__qualname__}")
        elif event == "object.__getattr__" and len(args) > 1 and type(args[1]) is str and \
                args[1] == "tb_frame":
            # A refusal's traceback holds this hook's frame, whose locals are what it keeps.
            # (Its own read, just below, comes back here from its own frame: let through.)
            if sys._getframe(1).f_code is not own_code and \
                    args[0].tb_frame.f_code.co_filename == __file__ and \
                    places.asker((*calls, "tb_frame")) != TRUSTED:
                refuse("reading a frame of the walls' code from a traceback")
        elif event in ("compile", "code.__new__") and len(args) > 1:
            name = plain_text(args[1]) or ""
            path = _path_of(name) if name != OWN_OBJECT and os.path.isabs(name) else None
            # Code compiled under a trusted file's name would pass for that file's (the
            # asker is known by file names); under "<frozen ...>", be skipped as importlib's.
            # (Not asked whether the core named the call: Python's own traceback printer
            # compiles a line under its file's name, from C, to point at the error in it.)
            if path and (path + os.sep).startswith(places.core) and \
                    places.asker() != TRUSTED and not _same_as_file(args[0], path):
                refuse(f"compiling code as {path}, a file of the course, torch or triton")
            if (name.startswith("<frozen") or path and path.startswith(places.trusted_code)
                    and not _same_as_file(args[0], path)) and places.asker() == NONE:
                refuse(f"compiling code as {name[:200]}, a name of trusted code")
        elif event in ("os.putenv", "os.unsetenv") and args:
            key = plain_text(args[0]) or ""
            if key.startswith(WATCHED_ENV_PREFIXES) and places.asker() == NONE:
                refuse(f"changing the environment variable {key}")

    own_code = hook.__code__
    sys.addaudithook(hook)
    _guard_fork_exec(judge)


def _guard_fork_exec(judge) -> None:
    """`_posixsubprocess.fork_exec` starts programs without an audit event (multiprocessing
    calls it directly): the same rule, through a stand-in whose defaults, where the original
    is kept, the hook refuses to show."""
    try:
        import _posixsubprocess
    except ImportError:  # not POSIX
        return

    # No closure: what the stand-in keeps (the original, and the judge that holds the
    # walls' settings) is in its keyword defaults, which the hook refuses to show.
    def fork_exec(*args, _original=_posixsubprocess.fork_exec, _judge=judge, **kwargs):
        _judge(_program(args[0]) if args and args[0] else None, "a program")
        return _original(*args, **kwargs)

    _posixsubprocess.fork_exec = fork_exec
