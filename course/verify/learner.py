"""The learner's process: it runs a submission's cells and calls its functions for the
verifier (`course.verify.verifier`), which never runs the learner's code itself.

    python -m course.verify.learner READ_FD WRITE_FD INTERRUPT_FD [SHARED_DIR]

The verifier starts it with the autograder's environment (COURSE_GRADING=1), and a
directory in shared memory for large messages (`course.verify.protocol`). It imports
the course, keeps a snapshot of what the checks rely on (`course.verify.tamper`), and then
answers one request at a time:

    mailbox   {grant}                         map the verifier's buffer on the GPU for large
                                              tensors (course.verify.gpu_lane)
    run_cell  {source, label}                 one of the notebook's cells, in an IPython shell
    describe  {name}                          what the notebook binds to `name`
    call      {name, args, kwargs, storages, guards, trace}
                                              one call of a function of the notebook, watched
                                              (and traced, for the verifier to replay)
    forward   {name, args, storages, guards}  `apply` of an autograd.Function, watched
    backward  {token, args, storages}         backward of an earlier forward (args: the
                                              gradients of its outputs), watched
    exit

A function runs inside `course.check.sandbox.watch()`, as it does under a checker in one
process; the reply carries what the watch saw, the outputs, and every byte of the argument
storages afterwards. Every reply also carries the tampering found since the previous one.
Only the verifier judges any of it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import itertools
import os
import signal
import struct
import sys
import traceback
from collections.abc import Callable

# `course` first: importing it picks the mode (GPU or Triton's interpreter).
import course.check  # noqa: F401  (every checker module, in the snapshot below)
from course import bench, hardware, lab_sweeps, reference, runtime, traffic  # noqa: F401
from course.check import guards, sandbox
from course.check.roofline import _traffic_calls
from course.check.runner import explain_error
from course.check.torch_reference import _RefuseBuiltInRMSNorm
from course.verify import gpu_lane, protocol, replay, tamper, walls

import torch

# Bytes of argument storages kept between calls (so that a key seen again is the same
# buffer, refilled); past this the oldest go.
KEEP_STORAGE_BYTES = 1 << 30
# Earlier outputs watched for later changes (one buffer returned twice), and forwards kept
# for their backward.
KEEP_OUTPUTS = 8
KEEP_FORWARDS = 64
# Plain values a `describe` may send back.
PLAIN = (bool, int, float, str, type(None), torch.dtype)


def _plain_fields(value: object) -> dict | None:
    """A dataclass instance's fields, when every one is a plain value (chapter 08's Launch):
    the values travel, never the class or its methods."""
    if isinstance(value, type) or not dataclasses.is_dataclass(value):
        return None
    fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
    return fields if all(isinstance(v, PLAIN) for v in fields.values()) else None


class _Forward:
    def __init__(self, inputs: list, outputs: tuple, returned: list):
        self.inputs, self.outputs, self.returned = inputs, outputs, returned


def _probe(function_class: type, returned: list) -> type:
    """A subclass of the learner's Function that notes what its backward returns, before
    autograd checks and drops anything (the verifier's own checker makes the same count)."""
    original = function_class.backward

    def backward(ctx, *grads):
        out = original(ctx, *grads)
        returned.append(out if isinstance(out, tuple) else (out,))
        return out

    return type(function_class.__name__, (function_class,), {"backward": staticmethod(backward)})


def _error(exc: BaseException) -> dict:
    """The learner's exception as the verifier rebuilds it: its type's name, its message,
    the line of the learner's code that raised it, whether it left the GPU unusable, and
    its built-in base classes (so that `except RuntimeError` there catches it too)."""
    if isinstance(exc, Exception):
        text, fatal = explain_error(exc)
    else:
        text, fatal = f"{type(exc).__name__}: {exc}", False
    head = f"{type(exc).__name__}: {exc}".strip()
    frame = text[len(head):] if text.startswith(head) else ""
    bases = [c.__name__ for c in type(exc).__mro__
             if c.__module__ == "builtins" and issubclass(c, Exception)]
    return {"type": type(exc).__name__, "message": str(exc), "frame": frame, "fatal": fatal,
            "bases": bases}


class Server:
    """Answers the verifier's requests (see the module's text)."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False
        self.shell = InteractiveShell.instance(config=config)
        # A cell's error travels in the reply (run_cell): the shell prints no traceback.
        self.shell.showtraceback = self.shell.showsyntaxerror = lambda *args, **kwargs: None
        self.storages: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()
        self.outputs: collections.deque = collections.deque(maxlen=KEEP_OUTPUTS)
        self.forwards: collections.OrderedDict[int, _Forward] = collections.OrderedDict()
        self.handles = itertools.count(1)
        self.lane: gpu_lane.MappedMailbox | None = None
        self.reply_lane = False  # the request in hand may be answered through the lane
        self.traced_for_repeat: replay.TracedCall | None = None  # `repeat`, for `repeat_traced`
        self.snapshot = tamper.Snapshot.take()  # last: after everything the course imports
        walls.install()  # before any of the submission's code

    def handle(self, message: dict) -> dict:
        requests = {"run_cell": self.run_cell, "describe": self.describe, "call": self.call,
                    "repeat": self.repeat, "repeat_traced": self.repeat_traced,
                    "forward": self.forward, "backward": self.backward,
                    "mailbox": self.mailbox, "unreadable": self.unreadable}
        op = message.get("op")
        if op not in requests:
            raise ValueError(f"unknown request {op!r}")
        self.reply_lane = bool(message.get("reply_lane")) and self.lane is not None
        return requests[op](message)

    def mailbox(self, message: dict) -> dict:
        """Map the verifier's new mailbox, in place of the old one."""
        old, self.lane = self.lane, None
        if old is not None:
            with contextlib.suppress(RuntimeError):
                old.close()
        try:
            self.lane = gpu_lane.MappedMailbox(message["grant"])
        except RuntimeError as exc:  # LaneError among them
            return {"error": _error(exc)}
        return {}

    def unreadable(self, message: dict) -> dict:
        """A request read whole but not usable here (its GPU tensors could not be copied
        out: a GPU this process faulted): said, and the next one is read as usual."""
        return {"error": _error(RuntimeError(f"the request could not be read here: "
                                             f"{message['why']}"))}

    def _sent(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor as a reply carries it: on the GPU where the lane takes it (the message's
        writer copies it), else a plain CPU copy."""
        return t.detach() if self.reply_lane and t.is_cuda else protocol.plain_tensor(t)

    # ------------------------------------------------------------ cells and names

    def run_cell(self, message: dict) -> dict:
        """Run one cell; the reply carries its error and the end of what it printed (for
        the feedback page), without the shell's traceback: the error says it."""
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            result = self.shell.run_cell(message["source"], store_history=False)
        exc = result.error_before_exec or result.error_in_exec
        try:  # the cell's GPU work ends with it: another chapter's timing may follow
            runtime.synchronize()
        except Exception as fault:  # a fault the cell left on the GPU is the cell's
            exc = exc or fault
        return {"error": _error(exc) if exc is not None else None,
                "output": printed.getvalue()[-protocol.OUTPUT_LIMIT:]}

    def describe(self, message: dict) -> dict:
        name = message["name"]
        if name not in self.shell.user_ns:
            return {"kind": "missing"}
        value = self.shell.user_ns[name]
        if isinstance(value, type) and issubclass(value, torch.autograd.Function):
            return {"kind": "autograd", "type": value.__name__}
        if isinstance(value, type(os)):
            return {"kind": "module", "module": value.__name__}
        if callable(value):
            return {"kind": "callable", "type": type(value).__name__}
        packed = self._plain(value)
        if packed is not None:
            return {"kind": "value", "value": packed}
        return {"kind": "other", "type": type(value).__name__}

    def _plain(self, value: object, depth: int = 0) -> dict | None:
        if isinstance(value, PLAIN):
            return {"plain": value}
        if type(value) is torch.Tensor:
            return {"tensor": protocol.plain_tensor(value), "device": value.device.type}
        if isinstance(value, (tuple, list)) and depth < 3 and len(value) < 64:
            items = [self._plain(v, depth + 1) for v in value]
            if all(i is not None for i in items):
                return {"sequence": items, "tuple": isinstance(value, tuple)}
        return None

    # ------------------------------------------------------------ arguments and outputs

    def _take_storages(self, message: dict) -> None:
        """Bring each argument storage in: a key seen before lands in the same buffer,
        refilled in place."""
        incoming, devices = message.get("storages", {}), message.get("devices", {})
        for key, data in incoming.items():
            device = torch.device(devices[key])
            kept = self.storages.get(key)
            if kept is not None and kept.numel() == data.numel() and \
                    kept.device.type == device.type:
                kept.copy_(data)
                self.storages.move_to_end(key)
            else:
                self.storages[key] = data.to(device)  # the message's own copy
        total = sum(t.numel() for t in self.storages.values())
        while total > KEEP_STORAGE_BYTES and len(self.storages) > len(incoming):
            _, dropped = self.storages.popitem(last=False)
            total -= dropped.numel()

    def _unpack(self, value: object) -> object:
        if isinstance(value, dict) and value.get("kind") == "tensor":
            return protocol.view_on(self.storages[value["key"]], value)
        if isinstance(value, (tuple, list)):
            return type(value)(self._unpack(v) for v in value)
        if isinstance(value, dict):
            return {k: self._unpack(v) for k, v in value.items()}
        return value

    def _arguments(self, message: dict) -> tuple[list, dict]:
        self._take_storages(message)
        args = [self._unpack(a) for a in message.get("args", [])]
        kwargs = {k: self._unpack(v) for k, v in message.get("kwargs", {}).items()}
        return args, kwargs

    def _output(self, value: object, record: sandbox.CallRecord | None) -> dict:
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                # A subclass can compute when it is read: only plain values travel.
                return {"kind": "object", "type": type(value).__name__}
            facts = record.output_facts(value) if record is not None else (True, True, False)
            handle = next(self.handles)
            self.outputs.append((handle, value, value.detach().clone()))
            return {"kind": "tensor", "values": self._sent(value),
                    "device": value.device.type, "facts": facts,
                    "requires_grad": bool(value.requires_grad), "handle": handle}
        if isinstance(value, (tuple, list)):
            return {"kind": "sequence", "tuple": isinstance(value, tuple),
                    "items": [self._output(v, record) for v in value]}
        if isinstance(value, PLAIN):
            return {"kind": "plain", "value": value}
        record = _plain_fields(value)
        if record is not None:
            return {"kind": "record", "type": type(value).__name__, "fields": record}
        return {"kind": "object", "type": type(value).__name__}

    def _changed_outputs(self, before: int) -> dict[int, torch.Tensor]:
        """Outputs sent before handle `before` whose values have changed since (the same
        memory returned again and overwritten): their values now, by handle."""
        changed = {}
        for index, (handle, tensor, sent) in enumerate(list(self.outputs)):
            if handle >= before:
                continue
            now = tensor.detach()
            if now.is_floating_point():
                same = bool(torch.isclose(now, sent, rtol=0, atol=0, equal_nan=True).all())
            else:
                same = torch.equal(now, sent)
            if not same:
                changed[handle] = self._sent(now)
                self.outputs[index] = (handle, tensor, now.clone())
        return changed

    def _watched(self, message: dict, body: Callable[[], object]) -> tuple[dict, object]:
        """Run `body()` watched, inside the wrappers the verifier's check had active;
        the reply, and what `body` returned."""
        first_handle = next(self.handles)
        record, result, error = None, None, None
        sinks: dict[str, list] = {}
        tracer = None
        # What the argument storages held before the call, to send back only those it
        # changed (a copy on the device costs far less than sending every one back).
        before = {key: self.storages[key].clone() for key in message.get("storages", {})
                  if key in self.storages}
        if message.get("trace"):  # the verifier will replay this call's GPU work
            tracer = replay.Tracer({self.storages[key].untyped_storage().data_ptr(): key
                                    for key in message.get("storages", {})})
        try:
            with contextlib.ExitStack() as stack:
                for name in message.get("guards", []):
                    if name == guards.REFUSE_BUILT_IN_RMSNORM:
                        stack.enter_context(_RefuseBuiltInRMSNorm())
                    elif name == guards.TRAFFIC_CALLS:
                        sinks[name] = stack.enter_context(_traffic_calls())
                    elif name == guards.READS_RECORDS:
                        sinks[name] = stack.enter_context(lab_sweeps.reads_watched())
                record = stack.enter_context(sandbox.watch(
                    track_changes=message.get("track_changes", True), tracer=tracer))
                record.note_arguments([self.storages[key] for key in before])
                result = body()
            runtime.synchronize()  # a GPU fault surfaces here, inside the try
        except BaseException as exc:  # the learner's code (its exit() too): reported
            error = _error(exc)
        reply = {"error": error, "record": record.summary() if record is not None else None,
                 "sinks": {name: list(found) for name, found in sinks.items()},
                 "outputs": self._output(result, record) if error is None else None,
                 "storages_after": {key: self._sent(self.storages[key])
                                    for key, held in before.items()
                                    if not torch.equal(self.storages[key], held)},
                 "changed_outputs": self._changed_outputs(first_handle)}
        if tracer is not None and error is None:
            reply["trace"] = tracer.finish(result)
        return reply, result

    # ------------------------------------------------------------ calls

    def call(self, message: dict) -> dict:
        fn = self.shell.user_ns.get(message["name"])
        if fn is None:
            return {"error": _error(NameError(f"name {message['name']!r} is not defined"))}
        args, kwargs = self._arguments(message)
        return self._watched(message, lambda: fn(*args, **kwargs))[0]

    def repeat(self, message: dict) -> dict:
        """The function called on the message's arguments with its GPU work traced, kept
        for `repeat_traced` (course.verify.replay.repeated, in two requests: the new
        inputs arrive only once the learner's function has returned, so it cannot find them
        and plant an answer there). In Triton's interpreter this is where the verifier
        checks that an answer came from the kernels, since it cannot run a kernel's body
        itself without running the learner's Python."""
        self.traced_for_repeat = None
        fn = self.shell.user_ns.get(message["name"])
        if fn is None:
            return {"error": _error(NameError(f"name {message['name']!r} is not defined"))}
        if message.get("autograd_eps") is not None:  # a Function: forward and backward
            if not (isinstance(fn, type) and issubclass(fn, torch.autograd.Function)):
                return {"error": _error(TypeError(f"{message['name']!r} is not a "
                                                  "torch.autograd.Function"))}
            fn = replay.autograd_step(fn, message["autograd_eps"])
        args, kwargs = self._arguments(message)
        try:
            _, self.traced_for_repeat = replay.trace_call(fn, tuple(args), kwargs)
        except replay.NotReplayable as why:
            return {"error": None, "not_replayable": str(why)}
        except BaseException as exc:  # the learner's code: reported
            return {"error": _error(exc)}
        return {"error": None}

    def repeat_traced(self, message: dict) -> dict:
        """The GPU work `repeat` traced, and none of its Python, repeated on the message's
        arguments: what that returned, and the arguments as they are after it (the verifier
        checks that nothing changed them)."""
        call, self.traced_for_repeat = self.traced_for_repeat, None
        if call is None:
            return {"error": _error(RuntimeError("no traced call to repeat"))}
        again, _ = self._arguments(message)
        try:
            result = call.replay(poison=True)(*again)
        except replay.NotReplayable as why:
            return {"error": None, "not_replayable": str(why)}
        except BaseException as exc:  # a kernel of the learner's, compiled or interpreted
            return {"error": _error(exc)}
        return {"error": None, "outputs": self._output((result, tuple(again)), None)}

    def forward(self, message: dict) -> dict:
        function_class = self.shell.user_ns.get(message["name"])
        if not (isinstance(function_class, type)
                and issubclass(function_class, torch.autograd.Function)):
            return {"error": _error(NameError(f"{message['name']!r} is not an "
                                              "autograd.Function here"))}
        args, _ = self._arguments(message)
        # Leaves of their own (sharing the buffers), as the checker's inputs are.
        args = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and need else a
                for a, need in zip(args, message["needs_grad"], strict=True)]
        returned: list = []
        probe = _probe(function_class, returned)
        reply, result = self._watched(message, lambda: probe.apply(*args))
        if reply["error"] is None:
            token = next(self.handles)
            outputs = result if isinstance(result, tuple) else (result,)
            self.forwards[token] = _Forward(args, outputs, returned)
            while len(self.forwards) > KEEP_FORWARDS:
                self.forwards.popitem(last=False)
            reply["token"] = token
        return reply

    def backward(self, message: dict) -> dict:
        """Autograd's backward through the learner's Function for the gradients given; the
        reply's outputs are what the learner's backward returned, as it returned them (the
        verifier's autograd then makes its own checks of them)."""
        state = self.forwards.get(message["token"])
        if state is None:
            return {"error": _error(RuntimeError("a backward for a forward this process no "
                                                 "longer holds"))}
        grads, _ = self._arguments(message)
        pairs = [(o, g) for o, g in zip(state.outputs, grads, strict=False)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        before = len(state.returned)

        def run() -> object:
            try:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            except RuntimeError:
                if len(state.returned) == before:
                    raise  # the learner's backward itself failed
                # else autograd refused what it returned: the verifier's autograd will too
            return state.returned[-1] if len(state.returned) > before else None

        return self._watched(message, run)[0]


class _Interrupts:
    """SIGINT stops a request only if the verifier meant that request: it writes the
    request's number on the interrupt pipe before signalling (and signals again until the
    reply comes), so an interrupt that lands between requests, or before this one began,
    is ignored rather than lost or turned against the next one."""

    def __init__(self, fd: int):
        self.fd, self.wanted, self.running = fd, 0, 0
        os.set_blocking(fd, False)
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            data = os.read(self.fd, 4096)
            for k in range(0, len(data) - 7, 8):
                self.wanted = max(self.wanted, struct.unpack(">Q", data[k:k + 8])[0])
        if self.running and self.wanted == self.running:
            raise KeyboardInterrupt


def _tampering(snapshot: tamper.Snapshot, seal: tuple, changes, refusals) -> list[str]:
    """Every change since the snapshot and every refusal, sent with each reply: the verifier
    tells the new ones (a record of what was reported, kept here, could be filled in ahead)."""
    return [str(c) for c in changes(snapshot, seal)] + \
        [f"tried {what}, which was refused" for what in refusals()]


def serve(read_fd: int, write_fd: int, interrupt_fd: int, shared_dir: str | None) -> None:
    server = Server()
    # Held by this frame, whose locals the submission's code cannot rebind, before any of it
    # runs: the snapshot, its seal, and the functions that compare and report (a class's or
    # module's attribute replaced later is not what is called).
    watch = (server.snapshot, server.snapshot.seal, tamper.Snapshot.changes, walls.refusals)
    tampering = _tampering
    interrupts = _Interrupts(interrupt_fd)
    protocol.write_message(write_fd, {"ready": True, "mode": runtime.MODE,
                                      "snapshot": len(server.snapshot)}, shared_dir)
    number = 0
    while True:
        try:
            message = protocol.read_message(read_fd, shared_dir=shared_dir, lane=server.lane)
        except protocol.ChannelClosed:
            return
        except protocol.MessageRefused as exc:  # read whole, but not usable (a faulted GPU)
            message = {"op": "unreadable", "why": str(exc)}
        number += 1
        if message.get("op") == "exit":
            return
        try:
            interrupts.running = number
            reply = server.handle(message)
        except KeyboardInterrupt:
            reply = {"error": _error(KeyboardInterrupt("interrupted"))}
        except Exception:  # a fault of ours: said, and the verifier decides
            reply = {"error": {"type": "VerifierError", "message": traceback.format_exc(),
                               "frame": "", "fatal": False, "bases": []}}
        finally:
            interrupts.running = 0
        try:
            reply["tampering"] = tampering(*watch)
        except Exception as exc:  # made to fail: reported as a change itself
            reply["tampering"] = [f"the tamper check could not run ({type(exc).__name__})"]
        try:
            protocol.write_message(write_fd, reply, shared_dir,
                                   server.lane if server.reply_lane else None)
        except RuntimeError as exc:  # the lane's copies (a faulted GPU): nothing was sent
            protocol.write_message(write_fd, {"error": _error(exc), "tampering": []},
                                   shared_dir)
        server.reply_lane = False


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    read_fd, write_fd, interrupt_fd = int(args[0]), int(args[1]), int(args[2])
    shared_dir = args[3] if len(args) > 3 else None
    protocol.die_with_parent()  # even in the middle of the learner's code
    serve(read_fd, write_fd, interrupt_fd, shared_dir)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: the learner's atexit hooks and threads stay out


if __name__ == "__main__":
    main()
