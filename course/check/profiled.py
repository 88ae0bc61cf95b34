"""A profile hook around one call of a learner's function, for the checks that must see what
the call runs: chapter 01's refusal of PyTorch's own RMSNorm, and the calls into the course's
models that chapters 02, 03 and 07 refuse (`course.check.roofline._traffic_calls`).

    with watching(hook) as watch:   # hook(frame, event, arg), as sys.setprofile calls it
        fn(*args)
    watch.switched_off              # the call switched the hook off (or replaced it)

The hook sees every event `sys.setprofile` reports: "call" for a Python function (its own
frame), "c_call" for a builtin (the caller's frame; `arg` is the builtin). Each event then
goes on to the profile function installed before (a debugger's, another check's), which is
put back at the end; threads the call starts get the hook too (`threading.setprofile`), and
on Python 3.12 and later so do threads already running (`threading.setprofile_all_threads`:
a worker started before the call, handed work during it).
A call that switched the hook off (`sys.setprofile(None)`, or `threading.setprofile(None)`
for the threads it starts) or put another in its place left the check blind to part of
what it ran: `switched_off` says so, and the checks refuse it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

Hook = Callable[[FrameType, str, object], None]
# Python 3.12 and later: the profile function of every running thread, set at once. Called
# by its own name below: the walls trust a course call to set hooks only where the course's
# code names the function (course.verify.walls `asker`).
_SETS_EVERY_THREAD = hasattr(threading, "setprofile_all_threads")


@dataclass
class Watch:
    switched_off: bool = False  # at the end, sys.getprofile() was no longer the hook


@contextlib.contextmanager
def watching(hook: Hook) -> Iterator[Watch]:
    """Run the body with `hook` called on every profile event (see the module's text)."""
    previous = sys.getprofile()
    previous_for_threads = threading.getprofile()
    watch = Watch()

    def chained(frame: FrameType, event: str, arg: object) -> None:
        try:
            hook(frame, event, arg)
        finally:
            previous(frame, event, arg)

    # A profile function runs on every call and return: no wrapper where none is needed.
    profile = hook if previous is None else chained

    sys.setprofile(profile)
    threading.setprofile(profile)
    if _SETS_EVERY_THREAD:
        threading.setprofile_all_threads(profile)
    try:
        yield watch
    finally:
        # threading's: a thread the call starts after switching it off runs unwatched
        watch.switched_off = sys.getprofile() is not profile or \
            threading.getprofile() is not profile
        if _SETS_EVERY_THREAD:
            threading.setprofile_all_threads(None)  # this thread's too: put back below
        sys.setprofile(previous)
        threading.setprofile(previous_for_threads)
