"""Processes a submission's code leaves running, ended with the learner's process.

The learner's code may start processes (a fork, a daemon that detaches with `setsid`) that
would outlive its process: running on the GPU while a later submission is timed, or holding
a mapping of the GPU lane's mailbox after the verifier freed it. On Linux the verifier makes
itself their "child subreaper" (`adopt_strays`): a descendant whose parent ends becomes the
verifier's child, not init's, however it detached. Its own children (the learner's
processes, each started in a session of its own) are the only ones it starts outside its
session, and no process can join a session it did not create; so once a learner's process
has ended, every child of the verifier in another session, other than the learner's
processes still in use, is that code's leftover, and `end_strays` kills it.

What this cannot reach: processes the learner's code has another running program start
for it (a service manager, `at`), which a container of the grading run's own keeps out
(grader/README.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Collection

PR_SET_CHILD_SUBREAPER = 36
# A killed process that holds a GPU context takes a moment to go (the driver tears it
# down); this long at most is waited for each.
REAP_WAIT_S = 10.0
# Each round kills the strays it sees; their own children then come to this process. A
# process that forks without end is stopped by the kill of its parent, so rounds end.
MAX_ROUNDS = 100

_adopting = False


def adopt_strays() -> bool:
    """Linux: this process becomes the parent of every descendant orphaned below it, so
    that `end_strays` can find it. False where that cannot be had (no effect then)."""
    global _adopting
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _adopting = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _adopting = False
    return _adopting


def _children() -> list[tuple[int, int]]:
    """(pid, session) of each child of this process, from /proc."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                # pid (comm) state ppid pgrp session ...; comm may hold spaces and ')'
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == me:
            found.append((int(name), int(fields[3])))
    return found


def _reap(pid: int) -> None:
    deadline = time.monotonic() + REAP_WAIT_S
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # reaped already (not ours to wait for after all)
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def end_strays(keep: Collection[int] = ()) -> list[int]:
    """Kill and reap every child of this process outside its session but those in `keep`,
    round after round until none is left; their pids. Nothing where `adopt_strays` was
    not had: the strays are then not this process's children."""
    if not _adopting:
        return []
    own_session = os.getsid(0)
    ended: list[int] = []
    for _ in range(MAX_ROUNDS):
        strays = [pid for pid, session in _children()
                  if session != own_session and pid not in keep]
        if not strays:
            break
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in strays:
            _reap(pid)
        ended += strays
    return ended
