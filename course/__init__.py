"""Norm Kernels: helpers shared by every notebook and by the grader.

Import this before defining any Triton kernel: it picks the execution mode
(see `course.runtime`).
"""

try:
    from course.runtime import DEVICE, MODE, banner, on_gpu
except ModuleNotFoundError as exc:  # say what is missing instead of a deep traceback
    raise ModuleNotFoundError(
        f"the course needs {exc.name!r}, which is not installed in this Python "
        f"({exc}). Run `make test` (it builds .venv) or `pip install -e .`.") from exc

from course.access_picture import show_accesses

__all__ = ["DEVICE", "MODE", "banner", "on_gpu", "show_accesses"]
__version__ = "0.1.0"
