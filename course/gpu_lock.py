"""A lock per GPU that a timed measurement holds alone, so that chapters can be graded side
by side on one GPU (grader/instructor.py) and no kernel is timed with a neighbour running.

Every other use of the GPU shares it: the verifier holds it shared for each cell it runs
(its own test cells, and the learner's cells and calls it asks for, which run only then).
`bench` takes it alone around every timing: it waits until every other chapter's cell has
ended or gives way (`give_way`, before each request to its learner's process), and holds
new ones off until the timing ends. A gate before the lock keeps a
measurement from waiting forever behind a stream of new cells: whoever wants the lock,
shared or alone, passes the gate first, and a measurement keeps the gate closed while it
waits.

Off unless COURSE_GPU_LOCK names the lock's file (the grader sets it for its verifiers, and
never for a learner's process). Linux `flock`: the lock goes with the process that holds it,
even a killed one. The learner's process runs as the same user and can find the file and
hold it: no wait here lasts longer than `patience` (the verifier sets its cell time limit),
and the grader gives each student a lock file of their own, so such a holder only stalls
its own chapters, and only until their cells time out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator

ENV = "COURSE_GPU_LOCK"

_files: dict[str, int] = {}  # lock path (and its gate's) -> this process's descriptor
_held = {"shared": 0, "alone": 0}  # how deep each kind is nested here
# Seconds this process has waited for the lock, by kind: where side-by-side time goes.
waited = {"shared": 0.0, "alone": 0.0}
# Called with the seconds a timing waited for the lock, or a cell giving way to one (the
# verifier moves the learner's deadline on by as much: a cell is not charged for its
# neighbours).
on_wait: list[Callable[[float], None]] = []


# The longest one wait for the lock may last, in seconds: then LockTimeout.
patience = 600.0


class LockTimeout(TimeoutError):
    """The GPU lock was not free within `patience` seconds."""


def _path() -> str | None:
    return os.environ.get(ENV) or None


def _fd(path: str) -> int:
    if path not in _files:
        _files[path] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return _files[path]


def _flock(fd: int, kind: int, deadline: float) -> None:
    """flock(2) of `kind`, waiting until `deadline` at most (LockTimeout): a poll, short
    pauses growing to 20 ms."""
    pause = 0.0005
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(f"the GPU lock was not free within {patience:.0f} s (held "
                                  "by something other than a verifier?)") from None
            time.sleep(pause)
            pause = min(2 * pause, 0.02)


def _through_gate(path: str, kind: int) -> None:
    deadline = time.monotonic() + patience
    gate = _fd(path + ".gate")
    _flock(gate, fcntl.LOCK_EX, deadline)
    try:
        _flock(_fd(path), kind, deadline)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)


def _waited_through_gate(path: str, kind: int, counted_as: str) -> float:
    """`_through_gate`; the seconds it waited, added to `waited[counted_as]`."""
    began = time.monotonic()
    _through_gate(path, kind)
    seconds = time.monotonic() - began
    waited[counted_as] += seconds
    return seconds


def _tell(seconds: float) -> None:
    for listener in list(on_wait):
        listener(seconds)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Use the GPU beside others, never beside a timing."""
    path = _path()
    if path is None or _held["shared"] or _held["alone"]:
        _held["shared"] += 1
        try:
            yield
        finally:
            _held["shared"] -= 1
        return
    _waited_through_gate(path, fcntl.LOCK_SH, "shared")
    _held["shared"] += 1
    try:
        yield
    finally:
        _held["shared"] -= 1
        fcntl.flock(_fd(path), fcntl.LOCK_UN)


def give_way(settle: Callable[[], None]) -> None:
    """Inside `shared`, between two pieces of GPU work: when a timing waits at the gate,
    let it go now rather than at the end of this cell, and take the share again after it
    (`settle()` first lets this process's queued GPU work end). The verifier does this
    before each request to the learner's process, so that a timing waits for the calls in
    flight, not for whole cells. Nothing happens when no one waits."""
    path = _path()
    if path is None or not _held["shared"] or _held["alone"]:
        return
    gate = _fd(path + ".gate")
    try:
        fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # held: someone is waiting for the lock
    else:
        fcntl.flock(gate, fcntl.LOCK_UN)
        return
    settle()
    fcntl.flock(_fd(path), fcntl.LOCK_UN)
    _tell(_waited_through_gate(path, fcntl.LOCK_SH, "shared"))


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Have the GPU to this process alone (a timing); inside `shared`, its share is given
    up while it waits (two holders each waiting for the other would wait forever) and taken
    again after. The caller lets its queued GPU work finish first: it would run beside the
    timing that goes while this one waits."""
    path = _path()
    if path is None or _held["alone"]:
        _held["alone"] += 1
        try:
            yield
        finally:
            _held["alone"] -= 1
        return
    lock = _fd(path)
    if _held["shared"]:
        fcntl.flock(lock, fcntl.LOCK_UN)
    seconds = _waited_through_gate(path, fcntl.LOCK_EX, "alone")
    _held["alone"] += 1
    try:
        _tell(seconds)
        yield
    finally:
        _held["alone"] -= 1
        if _held["shared"]:  # a timing waiting at the gate may go first
            _flock(lock, fcntl.LOCK_SH, time.monotonic() + patience)
        else:
            fcntl.flock(lock, fcntl.LOCK_UN)
