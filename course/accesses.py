"""Which program of a launch loaded or stored which elements: a recorder for Triton's
interpreter.

    with accesses.record() as recording:
        y = rmsnorm(x, weight)
    placed = recording.place({"x": x, "weight": weight}, {"y": y})
    placed["x"].by_program("load")      # {program: {(row, col), ...}}

In the interpreter every `tl.load` and `tl.store` ends in the builder's masked load or
store, called with the lanes' byte addresses and the mask, while the grid runs program by
program. `record()` wraps those two and the launch step for the body of the `with` only,
so that a launch outside it runs exactly as before. A launch notes the tensors it was
given; each access notes its program, its lanes' addresses and which lanes the mask left
on. A lane outside every tensor the launch was given is noted and not performed (the
interpreter would read or write whatever memory lies there, or crash the process), so
recording a broken kernel is safe. A launch that raises keeps what it did before.

`Recording.place` then names each access by the caller's tensors: which tensor, and the
element offset from its first element, read as (row, col) of its rows of the last
dimension. On a GPU there is nothing to record: kernels compiled for it never run
through the interpreter (COURSE_DEVICE=cpu runs them there on any machine).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from course import runtime

import numpy as np
import torch

LOAD, STORE = "load", "store"
FAR = "far outside every tensor"   # where accesses far from every operand are placed

NEEDS_INTERPRETER = (
    "Recording a kernel's memory accesses needs Triton's interpreter, and here kernels run "
    "on the GPU. To see them, restart the notebook's kernel with the environment variable "
    "COURSE_DEVICE=cpu set before `import course` (os.environ['COURSE_DEVICE'] = 'cpu').")


@dataclass(frozen=True)
class Operand:
    """A tensor a launch was given: where its storage is, as the kernel's pointers see it
    (the interpreter may run on a host copy), and which storage it is in the caller's
    process."""

    name: str       # the kernel's parameter
    start: int      # address of the storage's first byte, in the kernel's pointers
    nbytes: int
    tensor: torch.Tensor = field(compare=False, repr=False)  # the tensor passed

    @property
    def storage(self) -> int:
        """data_ptr() of the passed tensor's storage, in the caller's process."""
        return self.tensor.untyped_storage().data_ptr()

    def holds(self, addresses: np.ndarray, size: int) -> np.ndarray:
        return (addresses >= self.start) & (addresses + size <= self.start + self.nbytes)


@dataclass
class Access:
    """One tl.load or tl.store of one program, as the interpreter ran it."""

    program: int             # linear index: pid0 + grid0 * (pid1 + grid1 * pid2)
    kind: str                # LOAD or STORE
    addresses: np.ndarray    # every lane's byte address, in the block's shape
    on: np.ndarray           # the lanes the kernel's mask left on
    element_size: int
    performed: np.ndarray    # on, and inside a tensor the launch was given


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, int, int] = (1, 1, 1)
    operands: list[Operand] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    error: str | None = None            # what the launch raised, if it did
    failed_program: int | None = None   # the program running when it did

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def note(self, grid_idx: tuple[int, int, int], kind: str, addresses: np.ndarray,
             mask: np.ndarray, size: int) -> np.ndarray:
        """Record one access; return the lanes to perform (on, and inside an operand)."""
        program = _linear(grid_idx, self.grid)
        addresses, on = _lanes(addresses, mask)
        performed = on & self.inside(addresses, size)
        self.accesses.append(Access(program, kind, addresses, on, size, performed))
        return performed

    def inside(self, addresses: np.ndarray, size: int) -> np.ndarray:
        """The lanes whose `size` bytes lie within one of the launch's operands."""
        inside = np.zeros(addresses.shape, dtype=bool)
        for operand in self.operands:
            inside |= operand.holds(addresses, size)
        return inside


def _lanes(addresses: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An access's byte addresses as an array, and its mask as one of the same shape."""
    addresses = np.array(addresses, dtype=np.uint64, ndmin=1)
    return addresses, np.broadcast_to(np.asarray(mask, dtype=bool), addresses.shape).copy()


def _linear(grid_idx: tuple[int, int, int], grid: tuple[int, int, int]) -> int:
    x, y, z = grid_idx
    return int(x + grid[0] * (y + grid[1] * z))


# ---------------------------------------------------------------- the caller's tensors


@dataclass(frozen=True)
class Layout:
    """A tensor as rows of its last dimension, each `row_stride` elements after the last."""

    rows: int
    cols: int
    row_stride: int

    @property
    def padding(self) -> int:
        """Elements between the end of one row and the start of the next."""
        return self.row_stride - self.cols if self.rows > 1 else 0

    def cell(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) of element offsets from the first element; a column at or past
        `cols` is in a row's padding, a row outside 0..rows-1 outside the tensor."""
        return np.divmod(offsets, self.row_stride)

    def is_element(self, offsets: np.ndarray) -> np.ndarray:
        rows, cols = self.cell(offsets)
        return (rows >= 0) & (rows < self.rows) & (cols < self.cols)


def layout(t: torch.Tensor) -> Layout | None:
    """`t` as evenly spaced rows of its last dimension (contiguous within a row), or None
    when it is not laid out that way."""
    if t.dim() == 0 or t.numel() == 0 or (t.stride(-1) != 1 and t.shape[-1] > 1):
        return None
    cols = t.shape[-1]
    rows = t.numel() // cols
    if t.dim() == 1:
        return Layout(1, cols, cols)
    row_stride = t.stride(-2)
    for d in range(t.dim() - 2):  # leading dimensions must flatten into one
        if t.shape[d] > 1 and t.stride(d) != t.stride(d + 1) * t.shape[d + 1]:
            return None
    return Layout(rows, cols, row_stride if rows > 1 else cols)


@dataclass
class Placed:
    """One access placed in a tensor: element offsets from the tensor's first element."""

    launch: int
    program: int
    kind: str
    pointer: str            # the kernel's parameter the access went through
    offsets: np.ndarray     # in the block's shape
    on: np.ndarray
    performed: np.ndarray


@dataclass
class TensorAccesses:
    """Every access a recording placed in one tensor."""

    name: str
    role: str                    # "input" or "output" ("" for FAR)
    layout: Layout | None
    strides: tuple[int, ...] = ()  # the caller's tensor's strides, in elements
    near: str = ""               # for FAR: the tensor its offsets are counted from
    accesses: list[Placed] = field(default_factory=list)

    @property
    def dims(self) -> int:
        return len(self.strides)

    def _of(self, kind: str) -> list[Placed]:
        return [a for a in self.accesses if a.kind == kind]

    def by_program(self, kind: str) -> dict[int, set[tuple[int, int]]]:
        """program -> the (row, col) elements it accessed (lanes on and performed)."""
        found: dict[int, set[tuple[int, int]]] = {}
        if self.layout is None:
            return found
        for a in self._of(kind):
            offsets = a.offsets[a.performed & self.layout.is_element(a.offsets)]
            rows, cols = self.layout.cell(offsets)
            found.setdefault(a.program, set()).update(zip(rows.tolist(), cols.tolist(),
                                                          strict=True))
        return found

    def beyond(self, kind: str) -> dict[int, set[int]]:
        """program -> offsets its lanes (on) reached outside the tensor's elements: in a
        row's padding, before its first element or past its last; performed or not."""
        found: dict[int, set[int]] = {}
        for a in self._of(kind):
            outside = a.on & ~self._elements(a.offsets)
            if outside.any():
                found.setdefault(a.program, set()).update(a.offsets[outside].tolist())
        return found

    def refused(self, kind: str) -> dict[int, set[int]]:
        """program -> offsets of lanes that were on but lay outside every tensor the launch
        was given: recorded, not performed."""
        found: dict[int, set[int]] = {}
        for a in self._of(kind):
            lanes = a.on & ~a.performed
            if lanes.any():
                found.setdefault(a.program, set()).update(a.offsets[lanes].tolist())
        return found

    def masked(self, kind: str) -> dict[int, set[int]]:
        """program -> offsets its masked-off lanes pointed at (nothing was accessed)."""
        found: dict[int, set[int]] = {}
        for a in self._of(kind):
            if (~a.on).any():
                found.setdefault(a.program, set()).update(a.offsets[~a.on].tolist())
        return found

    def _elements(self, offsets: np.ndarray) -> np.ndarray:
        if self.layout is None:
            return np.zeros(offsets.shape, dtype=bool)
        return self.layout.is_element(offsets)


@dataclass
class Recording:
    launches: list[Launch] = field(default_factory=list)
    current: Launch | None = None
    launch_type: ClassVar[type[Launch]] = Launch  # what _launching makes for each launch

    def place(self, inputs: Mapping[str, object], outputs: Mapping[str, object]
              ) -> dict[str, TensorAccesses]:
        """Every access of every launch, named by the caller's tensors (inputs first, then
        outputs; non-tensors are left out). An access belongs to the operand most of its
        lanes fall in, and within that storage to the caller's tensor of the right role
        (loads read inputs, stores write outputs) that holds most of them. An operand no
        caller's tensor shares a storage with (a buffer the function allocated, or its
        output when it raised before returning one) is placed in the tensor the launch was
        given, under the kernel's parameter name, as an output if anything stored into it.

        Addresses do not say which pointer they came from: an access none of whose lanes
        falls in an operand belongs to the nearest one when it is within that operand's
        size of it (a near miss), and otherwise to FAR, with offsets from the nearest
        tensor (named in `TensorAccesses.near`)."""
        callers = [(name, t, "input") for name, t in inputs.items()
                   if isinstance(t, torch.Tensor)]
        callers += [(name, t, "output") for name, t in outputs.items()
                    if isinstance(t, torch.Tensor)]
        placed = {name: TensorAccesses(name, role, layout(t), t.stride())
                  for name, t, role in callers}
        for number, launch in enumerate(self.launches):
            for access in launch.accesses:
                if not launch.operands:
                    continue
                operand, near = _operand_of(access, launch.operands)
                name, offsets = _in_caller_tensor(access, operand, callers)
                if not near:
                    placed.setdefault(FAR, TensorAccesses(FAR, "", None, near=name))
                    name = FAR
                if name not in placed:
                    placed[name] = TensorAccesses(name, "input", layout(operand.tensor),
                                                  operand.tensor.stride())
                if access.kind == STORE and name == operand.name:
                    placed[name].role = "output"
                placed[name].accesses.append(Placed(number, access.program, access.kind,
                                                    operand.name, offsets, access.on,
                                                    access.performed))
        return placed


def _operand_of(access: Access, operands: list[Operand]) -> tuple[Operand, bool]:
    """The operand an access belongs to, and whether any of its lanes is in or near it."""
    counts = [int(o.holds(access.addresses, access.element_size).sum()) for o in operands]
    if max(counts) > 0:
        return operands[counts.index(max(counts))], True
    first = int(access.addresses.reshape(-1)[0])

    def distance(o: Operand) -> int:
        return min(abs(first - o.start), abs(first - (o.start + o.nbytes)))

    nearest = min(operands, key=distance)
    return nearest, distance(nearest) <= nearest.nbytes


def _in_caller_tensor(access: Access, operand: Operand,
                      callers: list[tuple[str, torch.Tensor, str]]) -> tuple[str, np.ndarray]:
    """(name, element offsets) of the access in the caller's tensor it belongs to."""
    byte_offsets = access.addresses.astype(np.int64) - np.int64(operand.start)
    sharing = [(name, t, role) for name, t, role in callers
               if t.untyped_storage().data_ptr() == operand.storage]
    if not sharing:
        sharing = [(operand.name, operand.tensor, "")]
    wanted = "input" if access.kind == LOAD else "output"
    best = None
    for name, t, role in sharing:
        offsets = byte_offsets // t.element_size() - t.storage_offset()
        shape = layout(t)
        held = int(shape.is_element(offsets).sum()) if shape is not None else 0
        key = (role == wanted, held)
        if best is None or key > best[0]:
            best = (key, name, offsets)
    return best[1], best[2]


# ---------------------------------------------------------------- recording


@contextlib.contextmanager
def record() -> Iterator[Recording]:
    """Record every interpreted launch in the body (see the module's docstring)."""
    recording = Recording()
    with _patched(recording, "recording", "the access recorder"):
        yield recording


class OutsideEveryTensor(RuntimeError):
    """Raised by `fence()` in a program that stored outside every tensor of its launch: the
    launch stops there (a grid far too large would otherwise run on, program after program,
    for nothing)."""


@dataclass
class FencedLaunch(Launch):
    """A launch under `fence()`: it keeps no accesses, only the lanes it switched off."""

    loads_refused: int = 0
    stores_refused: int = 0
    programs_refused: set[int] = field(default_factory=set)

    @property
    def refused(self) -> bool:
        return bool(self.loads_refused or self.stores_refused)

    def note(self, grid_idx: tuple[int, int, int], kind: str, addresses: np.ndarray,
             mask: np.ndarray, size: int) -> np.ndarray:
        addresses, on = _lanes(addresses, mask)
        if not on.any():
            return on
        lanes = addresses[on]
        low, high = int(lanes.min()), int(lanes.max()) + size
        if any(o.start <= low and high <= o.start + o.nbytes for o in self.operands):
            return on  # every lane in one tensor: the usual case, checked cheaply
        inside = self.inside(addresses, size)
        refused = int((on & ~inside).sum())
        if refused:
            program = _linear(grid_idx, self.grid)
            self.programs_refused.add(program)
            if kind == LOAD:
                self.loads_refused += refused
            else:
                self.stores_refused += refused
                raise OutsideEveryTensor(
                    f"program {program} of {self.kernel} stored {refused} element(s) outside "
                    "every tensor the launch was given: the launch was stopped there")
        return on & inside


@dataclass
class Fence:
    """The launches of a `fence()` body, each with the lanes it switched off."""

    launches: list[FencedLaunch] = field(default_factory=list)
    current: FencedLaunch | None = None
    launch_type: ClassVar[type[Launch]] = FencedLaunch


@contextlib.contextmanager
def fence() -> Iterator[Fence]:
    """In the body, every lane of an interpreted tl.load or tl.store that falls outside all
    the tensors its launch was given is switched off and counted, not performed: the
    interpreter would read or write whatever memory lies there, and a write far from every
    tensor (a grid of N programs for M rows, say) corrupts Python's own memory or aborts the
    process. A store there also stops the launch (OutsideEveryTensor, raised in the program
    that made it): such a grid would go on for thousands of programs. A correct kernel never
    reaches such a lane, so it runs as before. The checkers run every interpreted call of a
    learner's function inside one (`sandbox.watch`). Nests with `record()` either way
    round; inside another fence, it is that fence (its launches go on from the ones before)."""
    global _FENCE
    if _FENCE is not None:
        yield _FENCE
        return
    _FENCE = Fence()
    try:
        with _patched(_FENCE, "fence", "the fence"):
            yield _FENCE
    finally:
        _FENCE = None


_FENCE: Fence | None = None  # the fence active in this process, if one is


@contextlib.contextmanager
def _patched(recording: Recording | Fence, attribute: str, what: str) -> Iterator[None]:
    """The interpreter's launch, argument copies, grid and masked loads and stores wrapped
    to note into `recording` for the body (each wrapper marked with `attribute`)."""
    if not runtime.interpreted():
        raise RuntimeError(NEEDS_INTERPRETER)
    from triton.runtime import interpreter

    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    patches = [(executor, "__call__", _launching), (executor, "_init_args_hst", _operands),
               (builder, "set_grid_dim", _grid), (builder, "create_masked_load", _load),
               (builder, "create_masked_store", _store)]
    missing = [name for cls, name, _ in patches if name not in cls.__dict__]
    if missing:
        raise RuntimeError(f"this Triton's interpreter has no {', '.join(missing)}: {what} "
                           "knows Triton 3.x's")
    originals = [(cls, name, cls.__dict__[name]) for cls, name, _ in patches]
    if any(getattr(original, attribute, None) is not None for _, _, original in originals):
        raise RuntimeError(f"already active: {what} does not nest with itself")
    for (cls, name, wrap), (_, _, original) in zip(patches, originals, strict=True):
        wrapped = wrap(original, recording, interpreter)
        setattr(wrapped, attribute, recording)
        setattr(cls, name, wrapped)
    try:
        yield
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def _launching(original, recording: Recording, interpreter):
    def call(self, *args, **kwargs):
        launch = recording.launch_type(getattr(self.fn, "__name__", "kernel"))
        recording.launches.append(launch)
        recording.current = launch
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            cause = exc.__cause__ or exc  # the interpreter wraps the kernel's own error
            launch.error = f"{type(cause).__name__}: {cause}"
            grid_idx = getattr(interpreter.interpreter_builder, "grid_idx", None)
            if grid_idx is not None:
                launch.failed_program = _linear(grid_idx, launch.grid)
            raise
        finally:
            recording.current = None
    return call


def _operands(original, recording: Recording, interpreter):
    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = original(self, args_dev, kwargs)
        launch = recording.current
        if launch is not None:
            pairs = list(zip(self.arg_names, args_dev, args_hst, strict=False))
            pairs += [(key, kwargs[key], kwargs_hst[key]) for key in kwargs]
            for name, dev, host in pairs:
                dev, host = _tensor(dev), _tensor(host)
                if dev is None or host is None:
                    continue
                storage = host.untyped_storage()
                launch.operands.append(Operand(name, storage.data_ptr(), storage.nbytes(), dev))
        return args_hst, kwargs_hst
    return init_args


def _tensor(arg: object) -> torch.Tensor | None:
    """The tensor of a launch argument: itself, or the base of a reinterpreted one."""
    if isinstance(arg, torch.Tensor):
        return arg
    base = getattr(arg, "base", None)
    return base if isinstance(base, torch.Tensor) else None


def _grid(original, recording: Recording, interpreter):
    def set_grid_dim(self, nx, ny, nz):
        if recording.current is not None:
            recording.current.grid = (int(nx), int(ny), int(nz))
        return original(self, nx, ny, nz)
    return set_grid_dim


def _element_size(ptrs) -> int:
    return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)


# The masked load's and store's arguments after the mask differ between Triton versions
# (3.6: cache_modifier, eviction_policy; 3.9: cache_policy): passed on as they come.
def _load(original, recording: Recording, interpreter):
    def load(self, ptrs, mask, *rest, **options):
        launch = recording.current
        if launch is None:
            return original(self, ptrs, mask, *rest, **options)
        performed = launch.note(self.grid_idx, LOAD, ptrs.data, mask.data, _element_size(ptrs))
        mask = interpreter.TensorHandle(performed.reshape(np.shape(ptrs.data)), mask.dtype)
        return original(self, ptrs, mask, *rest, **options)
    return load


def _store(original, recording: Recording, interpreter):
    def store(self, ptrs, value, mask, *rest, **options):
        launch = recording.current
        if launch is None:
            return original(self, ptrs, value, mask, *rest, **options)
        performed = launch.note(self.grid_idx, STORE, ptrs.data, mask.data,
                                _element_size(ptrs))
        mask = interpreter.TensorHandle(performed.reshape(np.shape(ptrs.data)), mask.dtype)
        return original(self, ptrs, value, mask, *rest, **options)
    return store
