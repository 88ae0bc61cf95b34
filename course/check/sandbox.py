"""Watching one call of a learner's wrapper: what it launched, what torch ops it ran,
and what memory it was handed.

While a call runs inside `watch()`:

- every Triton launch (`kernel[grid](...)`) is counted, by name, and launches that ran
  atomics are noted (the interpreter's atomic operations are watched as they run; on a
  GPU the compiled kernel's IR is read, so an atomic in a branch a constexpr removed does
  not count);
- every torch op the wrapper runs is seen through a TorchDispatchMode. Allocations,
  views, fills and copies are allowed (copies are noted, since they cost bandwidth);
  anything that computes (mul, pow, mean, rms_norm, ...) is recorded as a violation,
  with the line of the learner's code that ran it;
- every tensor the wrapper allocates is *poisoned*: filled with NaN and placed inside a
  larger buffer whose margins are poisoned too. A kernel that never writes its output
  returns NaN instead of whatever an earlier call left in recycled memory (PyTorch's
  caching allocator hands freed blocks back with their contents intact), and a kernel
  that writes past either end of its output lands in the margins, where we see it
  instead of corrupting a neighbour or crashing the process.

Ops that Triton itself runs during a launch (the interpreter copies arguments to and
from the host) are not the learner's: interception pauses inside a launch.
"""

from __future__ import annotations

import contextlib
import traceback
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
        # Jupyter compiles each cell to a temporary file named after a hash.
        place = "a notebook cell" if "ipykernel_" in path else Path(path).name
        return f"{place}, line {frame.lineno}{code}"
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
        return int((~_is_poison(before)).sum()), int((~_is_poison(after)).sum())


_INT_POISON = -0x5A5A5A5A


def _poison_(t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif t.dtype == torch.uint8:
        t.fill_(0xA5)
    else:
        t.fill_(_INT_POISON if t.dtype in (torch.int32, torch.int64) else 0x5A)


def _is_poison(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    probe = torch.empty(1, dtype=t.dtype, device=t.device)
    _poison_(probe)
    return t == probe


def _span(size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(size, stride, strict=True))


@dataclass
class CallRecord:
    """What one call did."""

    launches: list[str] = field(default_factory=list)
    atomic_kernels: list[str] = field(default_factory=list)  # launched kernels using atomics
    launched_storages: set[int] = field(default_factory=set)  # storages passed to kernels
    forbidden_ops: list[OpUse] = field(default_factory=list)
    copies: list[OpUse] = field(default_factory=list)
    allocations: list[PoisonedAllocation] = field(default_factory=list)
    _in_launch: int = 0
    _atomic_ran: bool = False

    def margin_writes(self) -> list[tuple[PoisonedAllocation, int, int]]:
        hits = []
        for alloc in self.allocations:
            before, after = alloc.margin_writes()
            if before or after:
                hits.append((alloc, before, after))
        return hits


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
        if packet in _ALLOCATIONS:
            return self._poisoned(func(*args, **kwargs))
        if func.is_view or packet in _METADATA or packet in _FILLS:
            return func(*args, **kwargs)
        if packet in _COPIES:
            record.copies.append(OpUse(str(func), _learner_site()))
            return func(*args, **kwargs)
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
        return view


def _kernel_name(kernel: object) -> str:
    obj = kernel
    for _ in range(4):  # Autotuner -> Heuristics -> JITFunction -> python function
        fn = getattr(obj, "fn", None)
        if fn is None:
            break
        obj = fn
    return getattr(obj, "__name__", type(kernel).__name__)


@contextlib.contextmanager
def _count_launches(record: CallRecord) -> Iterator[None]:
    from triton.runtime.jit import KernelInterface

    original = KernelInterface.__getitem__

    def counting_getitem(self, grid):
        launcher = original(self, grid)

        def launch(*args, **kwargs):
            name = _kernel_name(self)
            record.launches.append(name)
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, torch.Tensor):
                    record.launched_storages.add(arg.untyped_storage().data_ptr())
            record._in_launch += 1
            record._atomic_ran = False
            try:
                compiled = launcher(*args, **kwargs)
            finally:
                record._in_launch -= 1
            if record._atomic_ran or _compiled_uses_atomics(compiled):
                record.atomic_kernels.append(name)
            return compiled

        return launch

    KernelInterface.__getitem__ = counting_getitem
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original


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


@contextlib.contextmanager
def watch() -> Iterator[CallRecord]:
    """Run the body with launches counted, torch ops intercepted and allocations poisoned."""
    record = CallRecord()
    with _count_launches(record), _watch_interpreter_atomics(record), _Interceptor(record):
        yield record
