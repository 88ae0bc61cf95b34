"""The verifier's side of the learner's process: starting it, asking it things, and
standing in for the functions it holds.

`LearnerProcess` starts `course.verify.learner` with two pipes and sends it requests with
a deadline. `RemoteFunction(process, "rmsnorm")` is called like the learner's `rmsnorm`:
it ships the arguments (each tensor with its whole storage), the learner's process calls
the function watched, and what comes back is put in place here: the outputs as tensors of
this process, the bytes the call left in each argument's storage written back into it,
what the watch saw added to every `sandbox.watch()` running here, what the check's
wrappers found (`course.check.guards`) added to their lists, and the learner's exception,
if any, raised again under its own name. A checker that calls it cannot tell it from the
function itself, except that nothing the function does can reach the checker.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from course import gpu_lock, runtime
from course.check import guards, sandbox
from course.verify import gpu_lane, protocol, strays
from course.verify.replay import NotReplayable, Replay, TracedCall

import torch

# After an interrupt, how long the learner's process has to answer before it is killed (a
# GPU kernel that never returns holds it where Python's interrupt cannot run).
INTERRUPT_GRACE_S = 10.0
START_TIMEOUT_S = 300.0
# Large messages travel through files in shared memory (course.verify.protocol), in a
# directory per learner's process, named with this process's pid and locked (flock) by it
# while it lives: a later verifier removes those whose verifier is gone (killed, so it could
# not remove them itself). The lock tells where the pid cannot: a verifier in another PID
# namespace sharing /dev/shm (containers) holds its directories' locks all the same.
SHARED_ROOT = "/dev/shm"
SHARED_PREFIX = "course-verify-"
# A directory this young is left alone even unlocked: its maker may not have locked it yet.
ORPHAN_AGE_S = 10.0
# A request with more GPU tensor bytes than this asks the learner's process for a mailbox
# (course.verify.gpu_lane) of twice the request's bytes, in steps of LANE_MIN_BYTES: a
# call's outputs come back through it too.
LANE_FROM_BYTES = protocol.IN_FILE_BYTES
LANE_MIN_BYTES = 64 << 20
_shared_dirs: dict[str, int] = {}  # made by this process and not yet removed -> its lock


def _lock(path: str) -> int | None:
    """An exclusive lock on the directory at `path`, taken without waiting: its descriptor,
    or None where another process holds it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_orphaned_shared_dirs() -> None:
    try:
        names = os.listdir(SHARED_ROOT)
    except OSError:
        return
    for name in names:
        if not name.startswith(SHARED_PREFIX):
            continue
        pid = name[len(SHARED_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its verifier is alive here
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):  # alive (another user's), or no pid
            continue
        path = os.path.join(SHARED_ROOT, name)
        fd = _lock(path)
        if fd is None:  # locked: its verifier lives, in another PID namespace
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime > ORPHAN_AGE_S:
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def make_shared_dir() -> str | None:
    """A new directory in shared memory for one learner's process's message files, locked
    by this process until `remove_shared_dir`; None where there is none to be had (every
    message then goes through the pipes)."""
    _remove_orphaned_shared_dirs()
    try:
        path = tempfile.mkdtemp(dir=SHARED_ROOT, prefix=f"{SHARED_PREFIX}{os.getpid()}-")
    except OSError:
        return None
    fd = _lock(path)
    if fd is None:
        shutil.rmtree(path, ignore_errors=True)
        return None
    _shared_dirs[path] = fd
    return path


def remove_shared_dir(path: str | None) -> None:
    if path is not None:
        fd = _shared_dirs.pop(path, None)
        shutil.rmtree(path, ignore_errors=True)
        if fd is not None:
            os.close(fd)  # the lock goes with it


def _refused(exc: protocol.MessageRefused) -> str:
    return f"the learner's process sent a message that was refused ({exc})"


@atexit.register
def _remove_shared_dirs() -> None:
    for path in list(_shared_dirs):
        remove_shared_dir(path)


class LearnerLost(BaseException):
    """The learner's process died or stopped answering: nothing more can be asked of it.
    (A BaseException: the checkers turn a learner's Exception into a report line, and this
    must stop the test cell instead.)"""


class CellTimedOut(BaseException):
    """A test cell ran past its time limit; its current request was interrupted."""


class LearnerException(Exception):
    """An exception the learner's code raised in its own process, raised again here."""

    learner_frame = ""


def settle() -> None:
    """Let this process's queued GPU work end (before another chapter's timing goes)."""
    with contextlib.suppress(Exception):  # a GPU that faulted says so in the next cell
        runtime.synchronize()


def rebuild_error(error: dict) -> LearnerException:
    """The learner's exception under its own name, deriving from the first built-in class
    it derived from (so that `except RuntimeError` catches a RuntimeError)."""
    base = next((getattr(builtins, name) for name in error.get("bases", [])
                 if isinstance(getattr(builtins, name, None), type)
                 and issubclass(getattr(builtins, name), Exception)
                 and getattr(builtins, name) is not Exception), None)
    try:
        cls = type(error["type"], (LearnerException, base) if base else (LearnerException,), {})
    except TypeError:  # a built-in base whose layout does not mix
        cls = type(error["type"], (LearnerException,), {})
    exc = cls(error["message"])
    exc.learner_frame = error.get("frame", "")
    return exc


# The pids of the learner's processes started and not yet ended: children of the verifier
# in sessions of their own that are not strays (course.verify.strays).
_running_learners: set[int] = set()


class LearnerProcess:
    """The learner's process, and one request at a time to it."""

    def __init__(self, *, cwd: Path, env: dict[str, str], log_path: Path):
        self.cwd, self.env, self.log_path = Path(cwd), dict(env), Path(log_path)
        self.process: subprocess.Popen | None = None
        self.deadline: float | None = None   # time.monotonic() by which a request must end
        self.lost: str | None = None         # why nothing more can be asked
        self.tampering: list[str] = []       # every change reported so far, in order
        self.new_tampering: list[str] = []   # reported since the verifier last noted them
        self.shared_dir: str | None = None   # its message files (None: the pipes only)
        self.lane: gpu_lane.Mailbox | None = None  # the GPU mailbox its process maps now
        self.mailboxes: list[gpu_lane.Mailbox] = []  # every one it may map: freed once it ends
        self.lane_off: str | None = None     # why the lane is not used (None: it may be)

    def start(self) -> dict:
        """Start the process (unless `launch` did) and wait until it is ready."""
        if self.process is None:
            self.launch()
        try:
            return protocol.read_message(self._read, time.monotonic() + START_TIMEOUT_S,
                                         self.shared_dir)
        except (protocol.ChannelClosed, protocol.ChannelTimeout, protocol.MessageRefused) as exc:
            self._kill(f"the learner's process did not start ({exc}); its log: "
                       f"{self.log_tail()}")
            raise LearnerLost(self.lost) from None

    def launch(self) -> None:
        """Start the process without waiting for it (it imports torch and the course
        meanwhile): the verifier starts the next submission's while it grades one."""
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        interrupts_in, self._interrupts = os.pipe()  # which request an interrupt is for
        self.shared_dir = make_shared_dir()  # removed by _kill, with the process
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "course.verify.learner", str(to_child), str(from_child),
                 str(interrupts_in), *([self.shared_dir] if self.shared_dir else [])],
                pass_fds=(to_child, from_child, interrupts_in), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env,
                start_new_session=True)
        _running_learners.add(self.process.pid)
        for fd in (to_child, from_child, interrupts_in):
            os.close(fd)
        self._write, self._read = from_parent, to_parent
        self.requests = 0
        self.lost = None
        self.lane_off = None if runtime.on_gpu() else "no GPU"

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def request(self, message: dict) -> dict:
        if self.lost is not None:
            raise LearnerLost(self.lost)
        # A timing of another chapter waiting for the GPU goes before this request, not
        # after the whole cell (course.gpu_lock).
        gpu_lock.give_way(settle)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise CellTimedOut("the cell's time limit ran out")
        lane = self._lane_for(message)
        if lane is not None:
            message = dict(message, reply_lane=True)
        self.requests += 1
        try:
            protocol.write_message(self._write, message, self.shared_dir, lane)
        except OSError:
            self._kill("the learner's process is gone (its pipe is closed)")
            raise LearnerLost(self.lost) from None
        try:
            reply = protocol.read_message(self._read, self.deadline, self.shared_dir, lane)
        except protocol.ChannelTimeout:
            self._interrupt()
            raise CellTimedOut("the cell's time limit ran out while the learner's code "
                               "was running") from None
        except protocol.ChannelClosed:
            code = self.process.wait(timeout=30) if self.process else None
            self._kill(f"the learner's process died while running its code (exit status "
                       f"{code}: a crash, os._exit, or the system killed it)")
            raise LearnerLost(self.lost) from None
        except protocol.MessageRefused as exc:  # the pipe may be out of step: no more asking
            self._kill(_refused(exc))
            raise LearnerLost(self.lost) from None
        except BaseException:
            self._interrupt()
            raise
        # Every change the learner's process sees now: which are new is decided here, where
        # its code cannot mark one as already reported.
        # They add up until the verifier notes them at the end of a cell (a refusal reported
        # by a reply before a cell's last must still score).
        now = [str(c) for c in reply.get("tampering", [])]
        new = [c for c in dict.fromkeys(now) if c not in self.tampering]
        self.new_tampering += new
        self.tampering += new
        return reply

    def _lane_for(self, message: dict) -> gpu_lane.Mailbox | None:
        """The mailbox `message` and its reply go through (None: the host carries them): a
        new, larger one, mapped by the learner's process, where the message has more than
        LANE_FROM_BYTES on the GPU. Where the lane cannot be had, it is not tried again."""
        if self.lane_off is not None or message.get("op") == "mailbox":
            return None
        device = torch.device("cuda", torch.cuda.current_device())
        need = protocol.lane_bytes(message, device)
        if need <= LANE_FROM_BYTES or (self.lane is not None and self.lane.nbytes >= need):
            return self.lane
        size = -(-2 * need // LANE_MIN_BYTES) * LANE_MIN_BYTES
        if size > gpu_lane.MAX_BYTES:
            return None
        try:
            mailbox = gpu_lane.Mailbox(size, device)
        except (gpu_lane.LaneError, RuntimeError) as exc:
            self.lane_off = f"no GPU lane: {exc}"
            return None
        self.mailboxes.append(mailbox)  # from here on its process may map it
        self.lane = None  # its process lets go of the old one first
        reply = self.request({"op": "mailbox", "grant": mailbox.grant})
        if reply.get("error") is not None:
            self.lane_off = f"no GPU lane: {rebuild_error(reply['error'])}"
            return None
        self.lane = mailbox
        return mailbox

    def _interrupt(self) -> None:
        """Stop the request in flight: an interrupt, then the reply it leads to is read and
        dropped; if none comes in time, the process is killed."""
        if self.process is None or self.process.poll() is not None:
            self._kill("the learner's process ended")
            return
        # The interrupt names its request, and is sent again until the reply comes: one
        # that lands before the learner's process has begun the request (it is still
        # reading it) is ignored there, and the next one stops the request.
        with contextlib.suppress(OSError):
            os.write(self._interrupts, struct.pack(">Q", self.requests))
        give_up = time.monotonic() + INTERRUPT_GRACE_S
        while True:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGINT)
            try:
                protocol.read_message(self._read, min(give_up, time.monotonic() + 0.5),
                                      self.shared_dir, self.lane)
                return
            except protocol.ChannelTimeout:
                if time.monotonic() < give_up:
                    continue
            except protocol.ChannelClosed:
                pass
            except protocol.MessageRefused as exc:
                self._kill(_refused(exc))
                return
            self._kill(f"the learner's code did not stop within {INTERRUPT_GRACE_S:.0f} s of "
                       "being interrupted (on a GPU, a kernel that never returns), so its "
                       "process was killed")
            return

    def _kill(self, why: str) -> None:
        self.lost = why
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process is not None:
            _running_learners.discard(self.process.pid)
            # What its code left running goes too, before the mailboxes it could map.
            ended = strays.end_strays(keep=_running_learners)
            if ended:
                with contextlib.suppress(OSError), open(self.log_path, "a") as log:
                    log.write(f"[verifier] the learner's code left {len(ended)} process(es) "
                              f"running after its process ended: killed ({ended})\n")
        for fd in (getattr(self, "_read", None), getattr(self, "_write", None),
                   getattr(self, "_interrupts", None)):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read = self._write = self._interrupts = None
        # The process has ended (killed and waited for, or gone): nothing maps these now.
        for mailbox in self.mailboxes:
            with contextlib.suppress(RuntimeError):
                mailbox.free()
        self.mailboxes, self.lane = [], None
        remove_shared_dir(self.shared_dir)
        self.shared_dir = None

    def close(self) -> None:
        if self.lost is None and self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError):
                protocol.write_message(self._write, {"op": "exit"}, self.shared_dir)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._kill(self.lost or "closed")


# ---------------------------------------------------------------- calls


@contextlib.contextmanager
def _paused(records: list[sandbox.CallRecord]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for record in records:
            stack.enter_context(record.paused())
        yield


class _Packer:
    """Arguments as message fields, and the storages they live in."""

    def __init__(self) -> None:
        self.storages: dict[str, torch.Tensor] = {}   # key -> this process's bytes
        self.devices: dict[str, str] = {}

    def pack(self, value: object) -> object:
        if isinstance(value, torch.Tensor):
            key = protocol.key_of(value)
            self.storages.setdefault(key.text(), protocol.storage_bytes(value))
            self.devices[key.text()] = str(value.device)
            return protocol.describe_view(value, key)
        if isinstance(value, (tuple, list)):
            return type(value)(self.pack(v) for v in value)
        if isinstance(value, dict):
            return {k: self.pack(v) for k, v in value.items()}
        if isinstance(value, (bool, int, float, str, type(None), torch.dtype)):
            return value
        raise TypeError(f"the checker cannot pass a {type(value).__name__} to the learner's "
                        "function in its own process")

    def fields(self) -> dict:
        """The storages as they travel: GPU ones as they are (the message's writer copies
        them into the GPU lane or to the host as it sends), CPU ones copied."""
        return {"storages": {k: v if v.is_cuda else v.clone() for k, v in self.storages.items()},
                "devices": dict(self.devices)}

    def write_back(self, after: dict[str, torch.Tensor]) -> None:
        """Every byte the call left in the argument storages it changed (the learner's
        process sends only those), into this process's ones."""
        for key, data in after.items():
            mine = self.storages.get(key)
            if mine is not None and mine.numel() == data.numel():
                mine.copy_(data)


class LearnerObject:
    """Stands for a value of the learner's process that does not travel (a tensor subclass,
    an object of their own): only its type's name does."""


class LearnerRecord:
    """Stands for a dataclass instance of the learner's process whose fields are plain
    values: its fields, read-only, under their names (a Launch's rows_per_tile, ...)."""

    def __init__(self, type_name: str, fields: dict):
        object.__setattr__(self, "_type_name", type_name)
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name: str) -> object:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"{self._type_name} has no field {name!r}") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{self._type_name} is read-only here")

    def __repr__(self) -> str:
        return f"{self._type_name}({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


class _Outputs:
    """Outputs of the learner's process as tensors here, each kept by its handle there so
    that a later change of that memory (the same buffer returned again) reaches it."""

    def __init__(self) -> None:
        self.by_handle: weakref.WeakValueDictionary[int, torch.Tensor] = \
            weakref.WeakValueDictionary()

    def build(self, field: dict | None, records: list[sandbox.CallRecord],
              memo: dict[int, object] | None = None) -> object:
        """The outputs a reply's field describes; a field the reply refers to twice is
        built once (a few bytes of pickle can nest one list in itself 2^40 times over)."""
        if field is None:
            return None
        memo = {} if memo is None else memo
        if id(field) in memo:
            return memo[id(field)]
        kind = field["kind"]
        if kind == "tensor":
            t = field["values"].to(torch.device(field["device"]))
            self.by_handle[field["handle"]] = t
            for record in records:
                record.note_remote_output(t, *field["facts"])
            memo[id(field)] = t
            return t
        if kind == "sequence":
            items = [self.build(item, records, memo) for item in field["items"]]
            memo[id(field)] = built = tuple(items) if field["tuple"] else items
            return built
        if kind == "plain":
            return field["value"]
        if kind == "record":
            return LearnerRecord(field["type"], field["fields"])
        return type(field["type"], (LearnerObject,), {})()

    def refresh(self, changed: dict[int, torch.Tensor]) -> None:
        for handle, values in changed.items():
            t = self.by_handle.get(handle)
            if t is not None and t.shape == values.shape:
                t.copy_(values)


class Learner:
    """The learner's process and what stands for its functions here."""

    def __init__(self, process: LearnerProcess):
        self.process = process
        self.outputs = _Outputs()

    def describe(self, name: str) -> dict:
        return self.process.request({"op": "describe", "name": name})

    def run_cell(self, source: str, label: str) -> dict:
        return self.process.request({"op": "run_cell", "source": source, "label": label})

    def ask(self, message: dict, args: tuple, kwargs: dict | None = None) -> tuple[dict, object]:
        """Send a watched request; the reply, and its outputs put in place here."""
        records = sandbox.active_records()
        with _paused(records):
            packer = _Packer()
            message = dict({"track_changes": all(r.track_changes for r in records)},
                           **message, args=[packer.pack(a) for a in args],
                           kwargs={k: packer.pack(v) for k, v in (kwargs or {}).items()},
                           guards=[name for name, _ in guards.active()], **packer.fields())
            reply = self.process.request(message)
            if reply.get("record") is not None:
                for record in records:
                    record.merge_remote(reply["record"])
            for name, sink in guards.active():
                if sink is not None:
                    sink.extend(reply.get("sinks", {}).get(name, []))
            packer.write_back(reply.get("storages_after", {}))
            self.outputs.refresh(reply.get("changed_outputs", {}))
            if reply.get("error") is not None:
                raise rebuild_error(reply["error"])
            return reply, self.outputs.build(reply.get("outputs"), records)

    def repeat(self, message: dict, args: tuple, kwargs: dict, again: tuple) -> object:
        """What the learner's process returned repeating a call's GPU work on `again`
        (its request `repeat`; `message` names what to call); NotReplayable where it could
        not."""
        # Two requests: the call, traced; then its work on `again`, which the learner's
        # process is sent only after the call returned (a call that could see the new
        # inputs could plant their answer in them for a copy kernel to fetch).
        reply, _ = self.ask({"op": "repeat", **message}, args, kwargs)
        if reply.get("not_replayable") is None:
            reply, out = self.ask({"op": "repeat_traced"}, again)
        if reply.get("not_replayable") is not None:
            raise NotReplayable(reply["not_replayable"])
        out, after = out
        for i, (sent, now) in enumerate(zip(again, after, strict=True)):
            if isinstance(sent, torch.Tensor) and not torch.equal(sent, now.to(sent.device)):
                raise NotReplayable(f"argument {i} changed while the work was repeated on "
                                    "it: a kernel may not write its inputs, and nothing but "
                                    "the kernels may run there")
        return out

    def function(self, name: str) -> RemoteFunction:
        return RemoteFunction(self, name)

    def autograd_class(self, name: str) -> type:
        return remote_autograd_class(self, name)


class RemoteFunction:
    """Calls the learner's function `name` in its process (see the module's text)."""

    def __init__(self, learner: Learner, name: str):
        self.learner, self.name = learner, name
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.learner.ask({"op": "call", "name": self.name}, args, kwargs)[1]

    def traced(self, *args: object) -> tuple[object, TracedCall]:
        """Call it as above, its GPU work traced too: what it returned, and the trace of
        that very call, whose Replay (`TracedCall.replay`, which raises NotReplayable where
        there is none) is compiled here from the kernels' source, to be timed in this
        process (course.verify.replay): called with new arguments of the same layout, it
        does that work again. The changes each launch makes are not tracked: at the timing
        shape that copies every argument before each launch."""
        reply, out = self.learner.ask({"op": "call", "name": self.name, "trace": True,
                                       "track_changes": False}, args)
        keys = [protocol.key_of(a).text() if isinstance(a, torch.Tensor) else None
                for a in args]
        return out, TracedCall(reply["trace"], keys)

    def repeated(self, args: tuple, kwargs: dict, again: tuple) -> object:
        """Call it on `args` and `kwargs` with its GPU work traced, then have that work, and
        none of its Python, repeated on `again` in its process, with its kernels rebuilt
        from their source there (course.verify.replay.repeated): in Triton's interpreter a
        kernel's body runs as Python, and a kernel not yet known to be correct must not
        fault this process's GPU context. Return what the repeat returned. Raise
        NotReplayable where the work cannot be repeated."""
        return self.learner.repeat({"name": self.name}, args, kwargs, again)

    def replayed(self, args: tuple) -> Replay:
        """The Replay of one traced call on `args` (`traced`)."""
        return self.traced(*args)[1].replay()

    def __repr__(self) -> str:
        return f"<the learner's {self.name}, in its own process>"


def remote_autograd_class(learner: Learner, name: str) -> type:
    """A torch.autograd.Function here whose forward and backward run the learner's
    Function `name` in its process: forward by its `apply` (with inputs that require grad
    where these do), backward by autograd there, returning what the learner's backward
    returned, as it returned it."""

    def forward(ctx, *args):
        needs = [bool(n) for n in ctx.needs_input_grad]
        reply, out = learner.ask({"op": "forward", "name": name, "needs_grad": needs}, args)
        ctx.token = reply["token"]
        outs = out if isinstance(out, tuple) else (out,)
        fields = reply["outputs"]["items"] if reply["outputs"]["kind"] == "sequence" \
            else [reply["outputs"]]
        frozen = [t for t, f in zip(outs, fields, strict=False)
                  if isinstance(t, torch.Tensor) and not f.get("requires_grad", True)]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return out

    def backward(ctx, *grads):
        _, returned = learner.ask({"op": "backward", "token": ctx.token}, grads)
        return returned

    def repeated_step(args: tuple, again: tuple, eps: float) -> object:
        """`course.verify.replay.autograd_step` of the learner's Function, repeated in its
        process as `RemoteFunction.repeated` repeats a function."""
        return learner.repeat({"name": name, "autograd_eps": eps}, args, {}, again)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
        "repeated_step": staticmethod(repeated_step),
        "__doc__": f"The learner's {name}, run in its own process."})
