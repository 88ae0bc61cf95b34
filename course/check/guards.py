"""Named wrappers around a call of the learner's function.

Some checks wrap the call itself: chapter 01 refuses PyTorch's own RMSNorm inside it,
chapter 02 notes any `course.traffic` function it runs, chapter 08 any read of the recorded
sweeps (`course.lab_sweeps.reads_watched`). When the function runs in another
process (course.verify), that process must wrap the call the same way. A check says which
wrapper is active with `guarded(name)`; the verifier reads `active()` when it ships a call,
and the learner's process applies the wrapper of that name (`course.verify.learner`).
What the wrapper found there comes back into `sink`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

REFUSE_BUILT_IN_RMSNORM = "refuse_built_in_rmsnorm"
TRAFFIC_CALLS = "traffic_calls"
READS_RECORDS = "reads_records"
NAMES = (REFUSE_BUILT_IN_RMSNORM, TRAFFIC_CALLS, READS_RECORDS)

_ACTIVE: list[tuple[str, list | None]] = []


@contextlib.contextmanager
def guarded(name: str, sink: list | None = None) -> Iterator[None]:
    """Mark the body as wrapped by the check `name`; a remote call appends what the
    wrapper found in the other process to `sink`."""
    if name not in NAMES:
        raise ValueError(f"unknown guard {name!r}; known: {', '.join(NAMES)}")
    _ACTIVE.append((name, sink))
    try:
        yield
    finally:
        _ACTIVE.pop()


def active() -> list[tuple[str, list | None]]:
    return list(_ACTIVE)
