"""What a learner sees from a check: when it fails, the checker's message under their own
cell, not a screen of the checker's frames above it; and never the warnings Triton's
interpreter raises about its own code."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TypeVar

from course.hardware import NeedsGPU

F = TypeVar("F", bound=Callable)

# A failed check (AssertionError) or a missing GPU: the message says everything. Any other
# exception is a misuse or a bug of ours, and keeps its full traceback.
EXPECTED = (AssertionError, NeedsGPU)

# Triton 3.6's interpreter with NumPy 2.3 warns of its own int() of an array at every loop,
# in the checker's launches as in the learner's (sandbox.collect_warnings drops them there).
INTERPRETER_MODULE = r"triton\.runtime\.interpreter\Z"


def learner_facing(check: F) -> F:
    """Raise `check`'s expected failures with the traceback cut at this call: a notebook
    shows the learner's cell, this one frame (IPython always shows the frame that raised),
    and the message, instead of every frame of the checker. The interpreter's deprecations
    of its own code are dropped, whatever filters the caller set."""

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841  (pytest hides the frame; read by it, not us)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=DeprecationWarning,
                                        module=INTERPRETER_MODULE)
                return check(*args, **kwargs)
        except EXPECTED as failure:
            # The check failed, and its message below says why and what to change.
            raise failure.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]
