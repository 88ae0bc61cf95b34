"""Watching one call of a learner's wrapper: what it launched, what torch ops it ran,
what the launches changed, and what memory it was handed.

While a call runs inside `watch()`:

- every Triton launch is counted, by name, at the one step every way of launching ends
  in (`JITFunction.run` on a GPU, `InterpretedFunction.run` in the interpreter), so
  `kernel[grid](...)`, `kernel.run(..., grid=..., warmup=False)` and launches through
  `@triton.autotune` or `@triton.heuristics` all count. Launches that ran atomics are
  noted (the interpreter's atomic operations are watched as they run; on a GPU the
  compiled kernel's IR is read, so an atomic in a branch a constexpr removed does not
  count). A launch of a kernel the course ships (defined in `solutions.*` or `course.*`,
  or a copy of a reference kernel, known by its fingerprint) is refused: the exercises ask
  for the learner's own kernel;
- every torch op the wrapper runs is seen through a TorchDispatchMode. Allocations,
  views, fills and copies are allowed (copies are noted, since they cost bandwidth);
  anything that computes (mul, pow, mean, rms_norm, ...) is recorded as a violation,
  with the line of the learner's code that ran it. Autotuner pre-hooks, heuristics
  functions, pre-run hooks and grid functions are the learner's code too, and are watched
  the same way (what a grid function writes does not count as the kernel's). A launch
  argument or grid entry that only passes for a number or a tensor (a subclass, an object
  with `data_ptr`) is refused: Triton reads it inside the launch step, unwatched;
- every tensor passed to a launch is snapshotted just before it, and the bytes the launch
  changed are recorded, so a checker can tell an output a kernel wrote from one that was
  already final when it reached a kernel (computed with NumPy, in another thread, or with
  dispatch modes disabled, then handed to a kernel that leaves it alone);
- every tensor the wrapper allocates is *poisoned*: filled with NaN and placed inside a
  larger buffer whose margins are poisoned too. The NaN has a payload of its own, which
  tells it apart from a NaN that arithmetic produced (`poison_mask`). A kernel that never
  writes its output returns NaN instead of whatever an earlier call left in recycled
  memory (PyTorch's caching allocator hands freed blocks back with their contents
  intact), and a kernel that writes past either end of its output lands in the margins,
  where we see it instead of corrupting a neighbour or crashing the process;
- in Triton's interpreter, a load or store lane that falls outside every tensor its launch
  was given, beyond any margin (a grid of one program per column instead of per row), is
  switched off and noted, and a store there stops the launch (`course.accesses.fence`):
  unfenced, the interpreter writes into Python's own memory and the process aborts;
- Python warnings are collected instead of printed: under nbgrader, anything a graded
  cell writes to stderr costs the cell its points.

Ops that Triton itself runs inside the launch step (a compiled launch's, and the
interpreter's copies of the arguments to and from the host, but not an interpreted kernel's
body, which is the learner's Python) and while the autotuner times its configurations are
not the learner's: interception pauses there, and only there, and only in the thread that
launches (a launch in a helper thread opens no window for the wrapper's own ops). A
configuration's pre-hook also runs, unwatched, while it is timed, but the chosen one runs
again before the real launch, watched.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import traceback
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ALLOCATIONS = {
    torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided,
}
# Allocations whose contents are defined, and in-place fills of fresh memory.
_FILLS = {
    torch.ops.aten.zeros, torch.ops.aten.zeros_like, torch.ops.aten.ones,
    torch.ops.aten.ones_like, torch.ops.aten.full, torch.ops.aten.full_like,
    torch.ops.aten.new_zeros, torch.ops.aten.new_ones, torch.ops.aten.new_full,
    torch.ops.aten.zero_, torch.ops.aten.fill_, torch.ops.aten.arange,
}
# Data movement without arithmetic: allowed, but each one is an extra trip through memory.
_COPIES = {
    torch.ops.aten.clone, torch.ops.aten.copy_, torch.ops.aten._to_copy,
    torch.ops.aten.contiguous,
}
# Metadata queries that reach the dispatcher on some versions.
_METADATA = {torch.ops.aten.detach, torch.ops.aten.lift_fresh, torch.ops.aten.sym_size,
             torch.ops.aten.sym_stride, torch.ops.aten.sym_numel, torch.ops.aten.is_same_size}

_HERE = Path(__file__).resolve().parent
_SKIP_FRAMES = ("/torch/", "/triton/", "/contextlib.py", "<frozen")


def _learner_site() -> str:
    """file:line of the innermost frame outside torch, triton and this package."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename
        if any(s in path for s in _SKIP_FRAMES) or Path(path).resolve().parent == _HERE:
            continue
        code = f": {frame.line.strip()}" if frame.line else ""
        return f"{_place(path, frame.lineno)}{code}"
    return "unknown location"


@dataclass(frozen=True)
class OpUse:
    op: str
    site: str
    dtype: str = ""  # the dtype the op computes in: its dtype= argument, else its first tensor's

    def __str__(self) -> str:
        return f"{self.op} ({self.site})"


def _compute_dtype(args: tuple, kwargs: dict) -> str:
    requested = kwargs.get("dtype")
    if isinstance(requested, torch.dtype):
        return str(requested).replace("torch.", "")
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return str(arg.dtype).replace("torch.", "")
    return ""


@dataclass
class PoisonedAllocation:
    """A tensor handed to the wrapper: `view` sits in `buffer` between two poisoned margins."""

    buffer: torch.Tensor
    margin: int      # elements of poison before the view
    span: int        # elements the view covers
    view_shape: tuple[int, ...]

    def margin_writes(self) -> tuple[int, int]:
        """How many poisoned margin elements (before, after) something overwrote."""
        before = self.buffer[: self.margin]
        after = self.buffer[self.margin + self.span:]
        return int((~poison_mask(before)).sum()), int((~poison_mask(after)).sum())


_INT_POISON = -0x5A5A5A5A

# Floating-point poison: a quiet NaN with payload A5A5..., as the integers of its bits. The
# NaN that arithmetic makes (0 / 0, inf - inf) has another pattern on every processor
# (0x7FC00000 or 0xFFC00000 on a CPU, 0x7FFFFFFF on NVIDIA GPUs, and the conversions to
# 16 bits keep them apart), so a NaN with this one in an output is memory never written.
_NAN_POISON_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FFC_A5A5_A5A5_A5A5),
    torch.float32: (torch.int32, 0x7FE5_A5A5),
    torch.float16: (torch.int16, 0x7EA5),
    torch.bfloat16: (torch.int16, 0x7FE5),
}


def _poison_(t: torch.Tensor) -> None:
    if t.dtype in _NAN_POISON_BITS:
        bits_dtype, bits = _NAN_POISON_BITS[t.dtype]
        t.view(bits_dtype).fill_(bits)
    elif t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif t.dtype == torch.uint8:
        t.fill_(0xA5)
    else:
        t.fill_(_INT_POISON if t.dtype in (torch.int32, torch.int64) else 0x5A)


def poison_mask(t: torch.Tensor) -> torch.Tensor:
    """True where an element of `t` still holds the poison fresh allocations are filled
    with; a NaN that arithmetic produced is not poison."""
    if t.dtype in _NAN_POISON_BITS:
        bits_dtype, bits = _NAN_POISON_BITS[t.dtype]
        return t.view(bits_dtype) == bits
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    probe = torch.empty(1, dtype=t.dtype, device=t.device)
    _poison_(probe)
    return t == probe


def _span(size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(size, stride, strict=True))


def is_poison(t: torch.Tensor) -> bool:
    """Whether every element of `t` still holds the poison fresh allocations are filled with
    (a tensor no kernel wrote)."""
    return t.numel() > 0 and bool(poison_mask(t.detach()).all())


def _storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The bytes of a whole storage, as a uint8 tensor sharing its memory."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,))


def _tensors_in(values: object) -> Iterator[torch.Tensor]:
    """The tensors among a launch's arguments: plain, reinterpreted (triton.reinterpret
    wraps a tensor in an object with .base), or inside a tuple or list."""
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, (tuple, list)):
        for value in values:
            yield from _tensors_in(value)
    elif isinstance(getattr(values, "base", None), torch.Tensor):
        yield values.base


def _storages(values: object) -> Iterator[int]:
    """The storage addresses of the tensors among `values` (as `_tensors_in` finds them);
    a tensor without memory of its own (a wrapper subclass) has none."""
    for t in _tensors_in(values):
        address = _storage_address(t)
        if address is not None:
            yield address


def _storage_address(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage: a wrapper subclass, say
        return None


@dataclass
class CallRecord:
    """What one call did."""

    launches: list[str] = field(default_factory=list)
    atomic_kernels: list[str] = field(default_factory=list)  # launched kernels using atomics
    launched_storages: set[int] = field(default_factory=set)  # storages passed to kernels
    # Storage address -> (the storage, kept alive so that its address is not reused during
    # the call; a mask of its bytes that some launch changed).
    changed_bytes: dict[int, tuple[torch.UntypedStorage, torch.Tensor]] = field(
        default_factory=dict, repr=False)
    course_kernels: list[str] = field(default_factory=list)  # refused launches (see watch)
    refused_arguments: list[str] = field(default_factory=list)  # launches refused for them
    # launches refused for a kernel object whose own attributes stand in for its class's
    # methods (a `run` of its own computes unwatched, see _shadowed_methods)
    refused_kernels: list[str] = field(default_factory=list)
    forbidden_ops: list[OpUse] = field(default_factory=list)
    copies: list[OpUse] = field(default_factory=list)
    allocations: list[PoisonedAllocation] = field(default_factory=list)
    # Storages the call's torch ops made (allocations, fills, copies, results), and those
    # of the tensors it was given: an output in neither existed before the call (kept).
    made_storages: set[int] = field(default_factory=set)
    argument_storages: set[int] = field(default_factory=set)
    # In the interpreter: what each launch tried to load or store outside every tensor it
    # was given (switched off, see _fenced).
    outside: list[OutsideAccesses] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # "Category: message (place)"
    track_changes: bool = True
    # Notified of the call's allocations, fills, copies and launches, so that the call can
    # be repeated elsewhere (course.verify.replay.Tracer), when set.
    tracer: object | None = None
    _atomic_ran: bool = False
    # Per thread: a launch in one thread must not pause interception in another.
    _thread: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def _in_launch(self) -> int:
        """How deep this thread is inside launch steps (interception pauses when > 0)."""
        return getattr(self._thread, "in_launch", 0)

    @_in_launch.setter
    def _in_launch(self, depth: int) -> None:
        self._thread.in_launch = depth

    @property
    def _timing(self) -> int:
        """How deep this thread is inside the autotuner's timing of its configurations."""
        return getattr(self._thread, "timing", 0)

    @_timing.setter
    def _timing(self, depth: int) -> None:
        self._thread.timing = depth

    def margin_writes(self) -> list[tuple[PoisonedAllocation, int, int]]:
        hits = []
        for alloc in self.allocations:
            before, after = alloc.margin_writes()
            if before or after:
                hits.append((alloc, before, after))
        return hits

    def passed_to_launch(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.launched_storages

    def note_arguments(self, values: object) -> None:
        """The tensors (in a tuple, list or dict's values) that the watched call is given."""
        if isinstance(values, dict):
            values = tuple(values.values())
        self.argument_storages.update(_storages(values))

    def held_before(self, t: torch.Tensor) -> bool:
        """Whether `t` is memory that existed before the call and that the call was not
        given: a result kept from an earlier call (no torch op of this call made it)."""
        storage = _storage_address(t)
        return (storage is not None and storage not in self.made_storages
                and storage not in self.argument_storages)

    def changed_by_launch(self, t: torch.Tensor) -> bool:
        """Whether some launch changed at least one byte of the memory `t` covers (always
        True when changes were not tracked, or `t` is empty)."""
        if not self.track_changes or t.numel() == 0:
            return True
        entry = self.changed_bytes.get(t.untyped_storage().data_ptr())
        if entry is None:
            return False
        mask = entry[1]
        start = t.storage_offset() * t.element_size()
        stop = start + _span(tuple(t.shape), tuple(t.stride())) * t.element_size()
        return bool(mask[start:stop].any())

    def _snapshot(self, args: tuple, kwargs: dict) -> list[tuple[torch.UntypedStorage,
                                                                  torch.Tensor]]:
        """Copies of the storages of every tensor among the arguments (call while paused)."""
        seen: dict[int, tuple[torch.UntypedStorage, torch.Tensor]] = {}
        for t in _tensors_in((args, tuple(kwargs.values()))):
            storage = t.untyped_storage()
            self.launched_storages.add(storage.data_ptr())
            if self.track_changes and storage.nbytes() and storage.data_ptr() not in seen:
                seen[storage.data_ptr()] = (storage, _storage_bytes(storage).clone())
        return list(seen.values())

    def _note_changes(self, snapshots: list[tuple[torch.UntypedStorage, torch.Tensor]]
                      ) -> None:
        """Record which bytes differ from the snapshots (call while paused)."""
        for storage, before in snapshots:
            changed = _storage_bytes(storage) != before
            entry = self.changed_bytes.get(storage.data_ptr())
            if entry is not None and entry[1].shape == changed.shape:
                changed |= entry[1]
            self.changed_bytes[storage.data_ptr()] = (storage, changed)

    # ------------------------------------------------------------ a call in another process
    # The verifier (course.verify) runs the learner's function in a process of its own and
    # watches it there; what that watch saw comes back as `summary()` and is added here, so
    # that the checkers read one record whichever process the function ran in.

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Interception off in this thread for the body: shipping tensors to the learner's
        process and back is the course's own work, not the learner's."""
        self._in_launch += 1
        try:
            yield
        finally:
            self._in_launch -= 1

    def summary(self) -> dict:
        """What this record saw, as plain values (see `merge_remote`)."""
        return {
            "launches": list(self.launches), "atomic_kernels": list(self.atomic_kernels),
            "course_kernels": list(self.course_kernels),
            "refused_arguments": list(self.refused_arguments),
            "refused_kernels": list(self.refused_kernels),
            "forbidden_ops": [(u.op, u.site, u.dtype) for u in self.forbidden_ops],
            "copies": [(u.op, u.site, u.dtype) for u in self.copies],
            "warnings": list(self.warnings),
            "margin_writes": [(list(a.view_shape), before, after)
                              for a, before, after in self.margin_writes()],
            "outside": [(o.kernel, list(o.grid), o.loads, o.stores, list(o.programs))
                        for o in self.outside],
        }

    def output_facts(self, t: torch.Tensor) -> tuple[bool, bool, bool]:
        """(passed to a launch, changed by a launch, held before the call) for an output of
        the watched call."""
        return self.passed_to_launch(t), self.changed_by_launch(t), self.held_before(t)

    def merge_remote(self, summary: dict) -> None:
        """Add what a watched call in another process did (that record's `summary()`)."""
        self.launches += summary["launches"]
        self.atomic_kernels += summary["atomic_kernels"]
        self.course_kernels += summary["course_kernels"]
        self.refused_arguments += summary["refused_arguments"]
        self.refused_kernels += summary["refused_kernels"]
        self.forbidden_ops += [OpUse(*use) for use in summary["forbidden_ops"]]
        self.copies += [OpUse(*use) for use in summary["copies"]]
        self.warnings += [w for w in summary["warnings"] if w not in self.warnings]
        self.allocations += [RemoteAllocation(tuple(shape), before, after)
                             for shape, before, after in summary["margin_writes"]]
        self.outside += [OutsideAccesses(kernel, tuple(grid), loads, stores, tuple(programs))
                         for kernel, grid, loads, stores, programs
                         in summary.get("outside", ())]

    def note_remote_output(self, t: torch.Tensor, passed: bool, changed: bool,
                           held: bool = False) -> None:
        """`t` holds an output that the other process's record judged: (passed to a launch,
        changed by a launch, held before the call) there, for `passed_to_launch`,
        `changed_by_launch` and `held_before` here."""
        storage = t.untyped_storage()
        if passed:
            self.launched_storages.add(storage.data_ptr())
        if not held:
            self.made_storages.add(storage.data_ptr())
        mask = torch.full((storage.nbytes(),), changed, dtype=torch.bool, device=t.device)
        self.changed_bytes[storage.data_ptr()] = (storage, mask)


@dataclass(frozen=True)
class OutsideAccesses:
    """The lanes of one interpreted launch that fell outside every tensor it was given, and
    were switched off: how many loads and stores, and which programs (linear indices)."""

    kernel: str
    grid: tuple[int, ...]
    loads: int
    stores: int
    programs: tuple[int, ...]

    def describe(self, rows: int | None = None) -> str:
        """One line; with `rows`, the number of rows of the call's input, it says when the
        grid has more programs than rows and only programs past the last row went out."""
        programs = self.programs
        span = (f"program {programs[0]}" if len(programs) == 1 else
                f"{len(programs)} programs ({programs[0]} to {programs[-1]})")
        what = " and ".join(f"{kind} {count} element(s)" for kind, count
                            in (("loaded", self.loads), ("stored", self.stores)) if count)
        total = 1
        for g in self.grid:
            total *= g
        line = (f"{span} of {self.kernel}'s grid of {total} programs {what} outside every "
                "tensor the launch was given")
        if rows is not None and total > rows and programs and programs[0] >= rows:
            line += (f". The input has {rows} rows: a grid of {total} programs leaves "
                     f"programs {rows} to {total - 1} without a row (is the grid (N,) or "
                     "(M * N,) instead of (M,)?)")
        return line


@dataclass(frozen=True)
class RemoteAllocation:
    """A tensor the learner's function allocated in another process whose poisoned margins
    it overwrote: what `PoisonedAllocation` reports, without the buffer."""

    view_shape: tuple[int, ...]
    before: int
    after: int

    def margin_writes(self) -> tuple[int, int]:
        return self.before, self.after


# The records of the watches active in this process, innermost last (see `watch`).
_ACTIVE: list[CallRecord] = []


def active_records() -> list[CallRecord]:
    """The records of every `watch()` running now, innermost last."""
    return list(_ACTIVE)


class _Interceptor(TorchDispatchMode):
    def __init__(self, record: CallRecord):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        record = self.record
        if record._in_launch:
            return func(*args, **kwargs)
        packet = func.overloadpacket
        if func.is_view or packet in _METADATA:
            return func(*args, **kwargs)
        if packet in _ALLOCATIONS:
            result = self._poisoned(func(*args, **kwargs))
        else:
            result = self._dispatched(func, packet, args, kwargs)
        # What the op made, not the memory it was given (an op in place returns that).
        given = set(_storages((args, tuple(kwargs.values()))))
        record.made_storages.update(s for s in _storages(result) if s not in given)
        return result

    def _dispatched(self, func, packet, args: tuple, kwargs: dict) -> object:
        record = self.record
        if packet in _FILLS:
            result = func(*args, **kwargs)
            if record.tracer is not None:
                _trace_fill(record.tracer, packet, args, kwargs, result)
            return result
        if packet in _COPIES:
            record.copies.append(OpUse(str(func), _learner_site()))
            result = func(*args, **kwargs)
            if record.tracer is not None:
                if packet is not torch.ops.aten.copy_:
                    record.tracer.allocated(result)
                record.tracer.copied(result if packet is not torch.ops.aten.copy_ else args[0],
                                     args[1] if packet is torch.ops.aten.copy_ else args[0])
            return result
        record.forbidden_ops.append(OpUse(str(func), _learner_site(),
                                          _compute_dtype(args, kwargs)))
        return func(*args, **kwargs)

    def _poisoned(self, plain: torch.Tensor) -> torch.Tensor:
        span = _span(tuple(plain.shape), tuple(plain.stride()))
        if span == 0:
            return plain
        # Margins as large as the tensor itself (at least 1024 elements): a missing store
        # mask overruns by less than one row, a wrong row offset by up to the whole tensor.
        margin = max(1024, span)
        buffer = torch.empty(span + 2 * margin, dtype=plain.dtype, device=plain.device)
        _poison_(buffer)
        view = buffer.as_strided(plain.shape, plain.stride(), margin)
        self.record.allocations.append(
            PoisonedAllocation(buffer, margin, span, tuple(plain.shape)))
        if self.record.tracer is not None:
            self.record.tracer.allocated(view)
        return view


# What each fill op writes: the value, or where in its arguments to find it.
_FILL_VALUES = {torch.ops.aten.zeros: 0, torch.ops.aten.zeros_like: 0, torch.ops.aten.zero_: 0,
                torch.ops.aten.new_zeros: 0, torch.ops.aten.ones: 1, torch.ops.aten.ones_like: 1,
                torch.ops.aten.new_ones: 1}
_FILL_ARGUMENT = {torch.ops.aten.full: 1, torch.ops.aten.full_like: 1,
                  torch.ops.aten.new_full: 2, torch.ops.aten.fill_: 1}


def _trace_fill(tracer, packet, args: tuple, kwargs: dict, result: torch.Tensor) -> None:
    if packet in _FILL_VALUES:
        value = _FILL_VALUES[packet]
    elif packet in _FILL_ARGUMENT:
        at = _FILL_ARGUMENT[packet]
        value = args[at] if len(args) > at else kwargs.get("fill_value", kwargs.get("value"))
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
    else:
        tracer.refuse(f"{packet} cannot be repeated")
        return
    if packet not in (torch.ops.aten.zero_, torch.ops.aten.fill_):
        tracer.allocated(result)
    tracer.filled(result, value)


def _kernel_name(kernel: object) -> str:
    return getattr(_python_function(kernel), "__name__", type(kernel).__name__)


def _python_function(kernel: object) -> object:
    obj = kernel
    for _ in range(4):  # Autotuner -> Heuristics -> JITFunction -> python function
        fn = getattr(obj, "fn", None)
        if fn is None:
            break
        obj = fn
    return obj


# Kernels defined in these packages are the course's own (reference kernels, helpers).
COURSE_PACKAGES = ("solutions", "course")


class LaunchRefused(RuntimeError):
    """A watched call's launch that is not run (the record says why)."""


class CourseKernelRefused(LaunchRefused):
    """A watched call launched a kernel that the course ships instead of the learner's."""


# What a launch takes as is. Anything else that passes for a number, a string or a tensor
# (a subclass, an object with `data_ptr`) is refused: Triton converts it inside the launch
# step, where interception pauses, so its methods could compute unseen.
_PLAIN_ARGUMENTS = (int, float, bool, str, type(None), torch.dtype, torch.Tensor,
                    torch.nn.Parameter)


def odd_argument(value: object) -> str | None:
    """The type's name of a launch argument (or grid entry) that only passes for a number,
    string or tensor; None for a plain one, or anything else (Triton says what it cannot
    take)."""
    if type(value) in _PLAIN_ARGUMENTS:
        return None
    if isinstance(value, (int, float, str, torch.Tensor)) or hasattr(value, "data_ptr"):
        return type(value).__name__
    return None


def odd_arguments_message(name: str, found: list[tuple[str, str]]) -> str:
    listed = ", ".join(f"`{where}` is a {kind}" for where, kind in found)
    return (f"launched `{name}` with {listed}: pass a launch plain Python numbers (int, "
            "float, bool) and plain tensors, as the Triton tutorials do; a subclass can run "
            "code while Triton reads it")


def _odd(named: Iterator[tuple[str, object]]) -> list[tuple[str, str]]:
    return [(where, kind) for where, value in named if (kind := odd_argument(value)) is not None]


def _grid_entries(grid: object) -> Iterator[tuple[str, object]]:
    return ((f"grid[{i}]", g) for i, g in enumerate(
        grid if isinstance(grid, (tuple, list)) else (grid,)))


def _refuse_if_odd(record: CallRecord, name: str, odd: list[tuple[str, str]]) -> None:
    if odd:
        refusal = odd_arguments_message(name, odd)
        record.refused_arguments.append(refusal)
        raise LaunchRefused(refusal)


def _shadowed_methods(kernel: object) -> list[str]:
    """The methods of a kernel's class that the kernel object's own attributes hide (a
    `run` of its own is called in place of the launch step that watches it)."""
    own = getattr(kernel, "__dict__", {})
    return sorted(name for name in own if any(
        isinstance(vars(c).get(name), (types.FunctionType, staticmethod, classmethod))
        for c in type(kernel).__mro__))


def shadowed_methods_message(name: str, shadowed: list[str]) -> str:
    listed = ", ".join(f"`{m}`" for m in shadowed)
    return (f"launched `{name}`, a kernel object whose own attributes replace its class's "
            f"{listed}: launch the @triton.jit kernel as it is, `kernel[grid](...)`, "
            "without assigning to its methods")


def _course_module(kernel: object) -> str | None:
    """Where a kernel the course ships comes from, for the refusal ("from `module`", or "a
    copy of `solutions.kernels.x.y`"); None for the learner's own. A copy of a reference
    kernel is known by its fingerprint: the learner's package has the fingerprints, not the
    kernels (`course.kernel_records`)."""
    from course import kernel_records

    function = _python_function(kernel)
    module = getattr(function, "__module__", None) or ""
    if any(module == p or module.startswith(p + ".") for p in COURSE_PACKAGES):
        return f"from `{module}`"
    copied = kernel_records.copied_from(function)
    return None if copied is None else f"a copy of `{copied}`"


def course_kernel_message(name: str, where: str) -> str:
    return (f"launched `{name}` ({where}), a kernel the course ships: the exercise asks "
            "for your own kernel, not the reference solution. Write the @triton.jit kernel "
            "in your notebook and launch that one.")


def _unpaused(hook, record: CallRecord):
    """A pre-run hook (the learner's code, though Triton calls it inside the launch step)
    that runs with interception on."""
    def run_hook(*args, **kwargs):
        paused, record._in_launch = record._in_launch, 0
        try:
            return hook(*args, **kwargs)
        finally:
            record._in_launch = paused
    return run_hook


def _watched_grid(grid, name: str, args: tuple, kwargs: dict, record: CallRecord,
                  snapshots: list):
    """A grid function (the learner's code, though Triton calls it inside the launch step)
    run watched; the arguments are snapshotted again after it, so that what it wrote into
    them counts as its own, not as the kernel's."""
    def run_grid(meta):
        found = _unpaused(grid, record)(meta)
        _refuse_if_odd(record, name, _odd(_grid_entries(found)))
        with record.paused():
            snapshots[:] = record._snapshot(args, kwargs)
        return found
    return run_grid


def _learner_hooks(kernel: object) -> bool:
    hooks = getattr(kernel, "pre_run_hooks", None)
    return bool(hooks) and isinstance(hooks, list)


def _watched_launch_step(original, record: CallRecord):
    """`original` (a launch step: JITFunction.run or InterpretedFunction.run) counting the
    launch, pausing interception for Triton's own ops and recording what it changed."""

    def run(self, *args, grid, warmup, **kwargs):
        if warmup or record._timing:  # compiling, or the autotuner timing configurations
            record._in_launch += 1
            try:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                record._in_launch -= 1
        name = _kernel_name(self)
        shadowed = _shadowed_methods(self)
        if shadowed:
            refusal = shadowed_methods_message(name, shadowed)
            record.refused_kernels.append(refusal)
            raise LaunchRefused(refusal)
        if record.tracer is not None:
            record.tracer.launched(self, args, kwargs, grid)
        module = _course_module(self)
        if module is not None:
            refusal = course_kernel_message(name, module)
            record.course_kernels.append(refusal)
            raise CourseKernelRefused(refusal)
        _refuse_if_odd(record, name, _odd(itertools.chain(
            ((f"argument {i}", a) for i, a in enumerate(args)), kwargs.items(),
            () if callable(grid) else _grid_entries(grid))))
        record.launches.append(name)
        hooks = getattr(self, "pre_run_hooks", None) if _learner_hooks(self) else None
        snapshots: list = []
        if callable(grid):
            grid = _watched_grid(grid, name, args, kwargs, record, snapshots)
        # In the interpreter the kernel's body runs here as Python: interception pauses only
        # for the interpreter's copies of the arguments (_interpreter_copies), so a torch op
        # in the body is seen. A compiled launch runs no Python of the learner's.
        step_paused = 0 if _interpreted(self) else 1
        with record.paused():
            snapshots[:] = record._snapshot(args, kwargs)
        record._in_launch += step_paused
        try:
            record._atomic_ran = False
            if hooks is not None:
                self.pre_run_hooks = [
                    h if getattr(h, "__module__", "").startswith("triton")
                    else _unpaused(h, record) for h in hooks]
            try:
                compiled = original(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                if hooks is not None:
                    self.pre_run_hooks = hooks
        finally:
            record._in_launch -= step_paused
        with record.paused():
            record._note_changes(snapshots)
        if record._atomic_ran or _compiled_uses_atomics(compiled):
            record.atomic_kernels.append(name)
        return compiled

    return run


def _timed_configurations(original, record: CallRecord):
    """Autotuner._bench: Triton timing one configuration, launching it many times. Those
    launches are not counted and Triton's own ops there are not the learner's; what they
    change in the arguments is still recorded (a later launch may rewrite the same values)."""

    def bench(self, *args, **kwargs):
        record._timing += 1
        record._in_launch += 1
        try:
            snapshots = record._snapshot(args, kwargs)
            result = original(self, *args, **kwargs)
            record._note_changes(snapshots)
            return result
        finally:
            record._in_launch -= 1
            record._timing -= 1

    return bench


def _interpreted(kernel: object) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(kernel, InterpretedFunction)


def _interpreter_copies(record: CallRecord) -> list[tuple[type, str, object, object]]:
    """Patches pausing interception in the interpreter's copies of a launch's arguments to
    the host and back (Triton's own torch ops), the only part of an interpreted launch step
    that is not the learner's."""
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:
        return []

    def paused(original):
        def run(self, *args, **kwargs):
            with record.paused():
                return original(self, *args, **kwargs)
        return run

    return [(GridExecutor, name, GridExecutor.__dict__[name],
             paused(GridExecutor.__dict__[name]))
            for name in ("_init_args_hst", "_restore_args_dev") if name in GridExecutor.__dict__]


def _launch_steps() -> list[tuple[type, str]]:
    """(class, method) of every launch step this Triton has: the compiled path's and the
    interpreter's. Guarded, since their homes move between Triton versions."""
    steps = []
    try:
        from triton.runtime.jit import JITFunction
        if hasattr(JITFunction, "run"):
            steps.append((JITFunction, "run"))
    except ImportError:
        pass
    try:
        from triton.runtime.interpreter import InterpretedFunction
        if hasattr(InterpretedFunction, "run"):
            steps.append((InterpretedFunction, "run"))
    except ImportError:
        pass
    return steps


@contextlib.contextmanager
def _count_launches(record: CallRecord) -> Iterator[None]:
    patches = [(cls, name, cls.__dict__[name], _watched_launch_step(cls.__dict__[name], record))
               for cls, name in _launch_steps() if name in cls.__dict__]
    patches += _interpreter_copies(record)
    try:
        from triton.runtime.autotuner import Autotuner
        if "_bench" in Autotuner.__dict__:
            original = Autotuner.__dict__["_bench"]
            patches.append((Autotuner, "_bench", original,
                            _timed_configurations(original, record)))
    except ImportError:
        pass
    for cls, name, _, patched in patches:
        setattr(cls, name, patched)
    try:
        yield
    finally:
        for cls, name, original, _ in reversed(patches):
            setattr(cls, name, original)


def _compiled_uses_atomics(compiled: object) -> bool:
    """Whether a compiled GPU kernel (what a launch returns) contains atomic operations."""
    asm = getattr(compiled, "asm", None)
    ttir = asm.get("ttir", "") if isinstance(asm, dict) else ""
    return isinstance(ttir, str) and ("tt.atomic_rmw" in ttir or "tt.atomic_cas" in ttir)


_INTERPRETER_ATOMICS = ("create_atomic_rmw", "create_atomic_cas")


@contextlib.contextmanager
def _watch_interpreter_atomics(record: CallRecord) -> Iterator[None]:
    """In the interpreter, note every atomic operation a kernel performs."""
    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:  # a Triton without the interpreter: GPU kernels are read instead
        yield
        return
    originals = {name: getattr(InterpreterBuilder, name) for name in _INTERPRETER_ATOMICS
                 if hasattr(InterpreterBuilder, name)}

    def noting(original):
        def create(self, *args, **kwargs):
            record._atomic_ran = True
            return original(self, *args, **kwargs)
        return create

    for name, original in originals.items():
        setattr(InterpreterBuilder, name, noting(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(InterpreterBuilder, name, original)


def _place(filename: str, lineno: int) -> str:
    # Jupyter compiles each cell to a temporary file named after a hash.
    where = "a notebook cell" if "ipykernel_" in filename else Path(filename).name
    return f"{where}, line {lineno}"


def _in_interpreter(filename: str) -> bool:
    """Whether `filename` is Triton's interpreter (triton/runtime/interpreter.py)."""
    return Path(filename).parts[-3:] == ("triton", "runtime", "interpreter.py")


@contextlib.contextmanager
def collect_warnings() -> Iterator[list[str]]:
    """Warnings raised in the body go to the list yielded ("Category: message (place)",
    once each) instead of stderr. The filters stay as they are: an ignored warning stays
    ignored, one turned into an error still raises. Left out: deprecations raised in
    Triton's interpreter itself, which are about its own code, not the learner's (Triton
    3.6's with NumPy 2.3: "Conversion of an array with ndim > 0 to a scalar")."""
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        try:
            yield texts
        finally:
            for w in caught:
                if issubclass(w.category, DeprecationWarning) and _in_interpreter(w.filename):
                    continue
                text = (f"{w.category.__name__}: {str(w.message).strip()} "
                        f"({_place(w.filename, w.lineno)})")
                if text not in texts:
                    texts.append(text)


@contextlib.contextmanager
def watch(track_changes: bool = True, tracer: object | None = None) -> Iterator[CallRecord]:
    """Run the body with launches counted, torch ops intercepted, allocations poisoned,
    warnings collected and, if `track_changes`, what each launch changed recorded (a copy
    of every tensor argument before each launch: meant for small correctness shapes).
    `tracer` is told of every allocation, fill, copy and launch (see CallRecord.tracer)."""
    record = CallRecord(track_changes=track_changes, tracer=tracer)
    with collect_warnings() as record.warnings, _count_launches(record), \
            _watch_interpreter_atomics(record), _fenced(record), _Interceptor(record):
        _ACTIVE.append(record)
        try:
            yield record
        finally:
            _ACTIVE.remove(record)


@contextlib.contextmanager
def _fenced(record: CallRecord) -> Iterator[None]:
    """In Triton's interpreter, the body's loads and stores kept inside the tensors each
    launch was given (`course.accesses.fence`), and what was kept out noted in `record`.
    Without it, a kernel that reaches far past its tensors (a grid of one program per column
    instead of per row) writes into Python's own memory, and the process aborts with no
    message. On a GPU nothing runs through the interpreter: there it is an illegal memory
    access, which the checkers report."""
    from course import runtime

    if not runtime.interpreted():
        yield
        return
    from course import accesses

    with accesses.fence() as fenced:
        before = len(fenced.launches)  # a watch inside another shares its fence
        try:
            yield
        finally:
            record.outside += [OutsideAccesses(launch.kernel, launch.grid,
                                               launch.loads_refused, launch.stores_refused,
                                               tuple(sorted(launch.programs_refused)))
                               for launch in fenced.launches[before:] if launch.refused]
