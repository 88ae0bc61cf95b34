"""The execution mode, chosen once when `course` is first imported.

With a CUDA GPU visible, kernels compile and run on it. Without one, Triton's interpreter
runs them on the CPU with NumPy. Triton decides which of the two a kernel gets when the
`@triton.jit` decorator runs, so the mode must be set before any kernel is defined:
every notebook imports `course` first.

Override with the environment variable COURSE_DEVICE=cpu (interpreter even on a GPU
machine) or COURSE_DEVICE=cuda (fail loudly if no GPU is usable). COURSE_DEVICE=compile runs
nothing: kernels stay compiled-mode Triton functions, which `scripts/kernel_ptx.py` compiles
for a GPU that need not be there (to read their PTX on a machine without one).
"""

from __future__ import annotations

import os
import re
import sys

import torch


def interpreter_mismatch(triton_version: str | None = None,
                         numpy_version: str | None = None) -> str | None:
    """Why the course cannot run kernels in Triton's interpreter with these versions, or
    None. The checks know the interpreter of Triton 3.6 and later (in 3.5 a launch does not
    go through `InterpretedFunction.run`, and every check saw no kernel launched). Before
    Triton 3.7 the interpreter turns a scalar (a one-element array) into a Python int with
    int(), which NumPy 2.4 and later refuse: every `range` over a kernel argument fails
    with "only 0-dimensional arrays can be converted to Python scalars"."""
    from importlib import metadata

    import numpy

    try:
        triton_version = triton_version or metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None
    numpy_version = numpy_version or numpy.__version__
    triton_release = _release(triton_version)
    if triton_release < (3, 6):
        return (f"the course's checks need Triton 3.6 or later to run kernels on the CPU, "
                f"and this is Triton {triton_version}: pip install 'triton>=3.7', then "
                f"restart the Python kernel (on a GPU, kernels run without the interpreter)")
    if triton_release < (3, 7) and _release(numpy_version) >= (2, 4):
        return (f"Triton {triton_version}'s CPU interpreter cannot run kernels with NumPy "
                f"{numpy_version} (its loops fail with 'only 0-dimensional arrays can be "
                f"converted to Python scalars'): pip install 'triton>=3.7', or 'numpy<2.4', "
                f"then restart the Python kernel")
    return None


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as '3.6.0', '2.4.0rc1' or '3.7.0+git1a2b'."""
    major, minor = (re.match(r"\d*", part).group() or "0"
                    for part in (version.split(".") + ["0"])[:2])
    return int(major), int(minor)


_requested = os.environ.get("COURSE_DEVICE", "").strip().lower()
if _requested not in ("", "cpu", "cuda", "compile"):
    raise RuntimeError(f"COURSE_DEVICE must be 'cpu', 'cuda' or 'compile', not {_requested!r}")
if _requested == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("COURSE_DEVICE=cuda, but torch sees no CUDA GPU (torch.cuda.is_available()"
                       " is False). Unset COURSE_DEVICE to use Triton's interpreter on the CPU.")

_interpret_already = os.environ.get("TRITON_INTERPRET", "0") == "1"
if _requested == "compile" and _interpret_already:
    raise RuntimeError("COURSE_DEVICE=compile needs compiled-mode Triton, but TRITON_INTERPRET=1")
_use_gpu = (torch.cuda.is_available() and _requested not in ("cpu", "compile")
            and not _interpret_already)

if _use_gpu:
    MODE = "gpu"
    DEVICE = torch.device("cuda")
elif _requested == "compile":
    MODE = "compile"
    DEVICE = torch.device("cpu")
else:
    MODE = "interpreter"
    DEVICE = torch.device("cpu")
    # Before any @triton.jit runs (Triton reads it when a kernel is decorated).
    os.environ["TRITON_INTERPRET"] = "1"
    # triton.language's own functions (tl.sum, ...) are decorated when it is imported: if
    # that happened before this line, they were compiled-mode functions and every kernel
    # that calls one fails inside the interpreter with a baffling message. Say so now.
    _tl = sys.modules.get("triton.language")
    if _tl is not None and type(getattr(_tl, "sum", None)).__name__ == "JITFunction":
        raise ImportError(
            "triton was imported before course. Without a GPU, course switches Triton to its "
            "CPU interpreter, which only works if that happens before triton is imported: "
            "restart the Python kernel and put `import course` first.")
    _mismatch = interpreter_mismatch()
    if _mismatch:
        raise ImportError(_mismatch)


def on_gpu() -> bool:
    """True when kernels run on a CUDA GPU, False under Triton's CPU interpreter."""
    return MODE == "gpu"


# Set to "1" by the autograder (`make autograde`, `course grade`) for the notebooks it runs.
GRADING_ENV = "COURSE_GRADING"


def grading() -> bool:
    """True inside a notebook the autograder is running."""
    return os.environ.get(GRADING_ENV) == "1"


def timing_demos() -> bool:
    """Whether the notebooks' ungraded measurements run: on a GPU, but not while grading,
    where only the graded cells time kernels (a chapter's demonstration sweeps would
    otherwise add half a minute to every submission)."""
    return on_gpu() and not grading()


def interpreted() -> bool:
    return MODE == "interpreter"


def supports_bf16() -> bool:
    """Whether bfloat16 kernels can run here: Triton needs compute capability 8.0 for them."""
    if not on_gpu():
        return True
    return torch.cuda.get_device_capability() >= (8, 0)


def float_dtypes() -> tuple[torch.dtype, ...]:
    """The input dtypes exercised on this device."""
    base = (torch.float32, torch.float16)
    return base + ((torch.bfloat16,) if supports_bf16() else ())


def synchronize() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def banner() -> str:
    """One line saying where kernels will run."""
    if on_gpu():
        name = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        return f"course: kernels run on the GPU ({name}, sm_{major}{minor})"
    if MODE == "compile":
        return ("course: COURSE_DEVICE=compile, kernels can be compiled for a GPU but nothing "
                "runs")
    return ("course: no GPU visible, kernels run in Triton's interpreter on the CPU "
            "(correct results, no meaningful timings; bandwidth checks are skipped)")
