"""Large GPU tensors between the verifier and the learner's process without the host.

A tensor argument at a timing shape is hundreds of MB. Through the host it costs each
side a device-to-host copy, a file in shared memory written and read, and a host-to-device
copy: about 20 s of chapter 08's launch-rule cell on an H100 (docs/grading-time.md). The
lane is a buffer on the GPU, the mailbox, that the verifier allocates and the learner's
process maps with CUDA's interprocess handles.

The verifier owns it: a device allocation of its own (`cuMemAlloc`, outside torch's
allocator, so that nothing else of the verifier's lives in it), freed only once the
learner's process has ended, so that no mapping of it outlives the process, nor reaches
memory the verifier uses for anything else. What the learner's code writes into it at any
time reaches only the copies the verifier makes of a reply, which it then checks, as it
checks whatever a reply says. (A process the learner's code leaves running past the kill
could keep the mailbox mapped after it is freed, which CUDA leaves undefined; such a process
runs as the grading user, with every power over the verifier already: grader/README.md.)

A message's CUDA tensors are packed into the mailbox, each as a dense run of bytes, and
replaced in the message by a marker naming their place in a table of layouts; the reader
copies each run into a tensor of its own before it looks at it (protocol checks the table).
A message that does not fit, a tensor whose bytes alone do not give its values, or a GPU
or system without interprocess handles goes through the host as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

# Where in a message the table of its lane tensors is, and what stands for each.
TABLE_KEY = "__gpu_lane__"
MARK = "__gpu_lane_tensor__"
# The largest mailbox the verifier allocates, and the most tensors one message may hold.
MAX_BYTES = 4 << 30
MAX_TENSORS = 1 << 14
_ALIGN = 256


class LaneError(RuntimeError):
    """The lane cannot be used (no driver, no interprocess handles): use the host."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


_driver_lib = None


def _driver() -> ctypes.CDLL:
    global _driver_lib
    if _driver_lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise LaneError(f"no CUDA driver library ({exc})") from None
        u64 = ctypes.c_uint64
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [u64]
        lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), u64]
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(u64), _Handle, ctypes.c_uint]
        lib.cuIpcCloseMemHandle.argtypes = [u64]
        _driver_lib = lib
    return _driver_lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise LaneError(f"{what} failed (CUDA driver error {result})")


class _Raw:
    """Device memory as an object torch.as_tensor can view (CUDA array interface)."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 3,
                                         "strides": None}


class _Lane:
    """A mailbox as either side sees it: `buffer` (uint8, on `device`) of `nbytes`."""

    buffer: torch.Tensor | None
    nbytes: int
    device: torch.device

    def region(self, nbytes: int) -> torch.Tensor | None:
        """The mailbox, where `nbytes` fit in it."""
        return self.buffer if self.buffer is not None and nbytes <= self.nbytes else None

    def _let_go(self, release: Callable[[], object]) -> None:
        """No more copies here: the queued ones end, then `release` (once)."""
        if self.buffer is None:
            return
        self.buffer = None
        try:
            torch.cuda.synchronize(self.device)
        finally:
            release()


class Mailbox(_Lane):
    """The verifier's mailbox: `nbytes` of device memory of its own allocation, and the
    grant (its interprocess handle) that the learner's process maps it by. `free` it only
    once that process has ended."""

    def __init__(self, nbytes: int, device: torch.device):
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)  # torch's primary context made, and current here
            address = ctypes.c_uint64()
            _check(_driver().cuMemAlloc_v2(ctypes.byref(address), nbytes), "cuMemAlloc")
            self.address, self.nbytes, self.device = address.value, nbytes, device
            try:
                handle = _Handle()
                _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), self.address),
                       "cuIpcGetMemHandle")
                self.buffer = torch.as_tensor(_Raw(self.address, nbytes), device=device)
            except BaseException:
                _driver().cuMemFree_v2(self.address)
                raise
        self.grant = {"handle": bytes(handle), "bytes": nbytes}

    def free(self) -> None:
        self._let_go(lambda: _driver().cuMemFree_v2(self.address))


class MappedMailbox(_Lane):
    """The learner's process: the verifier's mailbox, mapped here from its grant."""

    def __init__(self, grant: dict):
        handle = _Handle.from_buffer_copy(grant["handle"])  # every byte, NULs too
        self.device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.synchronize(self.device)  # torch's primary context made, and current here
        base = ctypes.c_uint64()
        _check(_driver().cuIpcOpenMemHandle_v2(ctypes.byref(base), handle, 1),
               "cuIpcOpenMemHandle")
        self.base, self.nbytes = base.value, grant["bytes"]
        self.buffer = torch.as_tensor(_Raw(self.base, self.nbytes), device=self.device)

    def close(self) -> None:
        self._let_go(lambda: _driver().cuIpcCloseMemHandle(self.base))


# ---------------------------------------------------------------- messages


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it, whose storage is exactly its elements (the bytes to send)."""
    t = t.detach()
    if t.is_contiguous() and t.storage_offset() == 0 and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone()  # strides kept where t is dense, contiguous otherwise


def _travels(value: object, device: torch.device) -> bool:
    """A tensor the lane carries: on `device`, plain strided, its bytes alone its values (a
    conjugated or negated view's are not)."""
    return (isinstance(value, torch.Tensor) and value.device == device
            and value.layout == torch.strided and not value.is_quantized
            and not value.is_conj() and not value.is_neg())


def _run(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def device_bytes(message: object, device: torch.device) -> int:
    """Bytes the lane would carry of `message`, alignment in: each tensor it carries once,
    however often the message refers to it, as `pack` packs it."""
    total, todo, seen = 0, [message], set()
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if _travels(value, device):
            total += _run(value.numel() * value.element_size())
        elif isinstance(value, (dict, list, tuple)):
            todo.extend(value.values() if isinstance(value, dict) else value)
    return total


def pack(message: dict, device: torch.device,
         region: Callable[[int], torch.Tensor | None]) -> dict | None:
    """`message` with each tensor the lane carries copied into the mailbox (`region(nbytes)`
    gives it) and replaced by a marker, the table under TABLE_KEY; None where the mailbox
    is too small or there are too many tensors (then the host carries the message). A tensor
    or container the message refers to twice is packed once, its marker referred to twice."""
    need = device_bytes(message, device)
    buffer = region(need) if need else None
    if buffer is None:
        return None
    table: list[tuple] = []
    memo: dict[int, object] = {}
    at = 0

    def strip(value: object) -> object:
        nonlocal at
        if id(value) in memo:
            return memo[id(value)]
        if _travels(value, device):
            if len(table) >= MAX_TENSORS:
                raise OverflowError
            dense = _dense(value)
            nbytes = dense.numel() * dense.element_size()
            buffer[at:at + nbytes].copy_(_bytes_of(dense))
            table.append((dense.dtype, tuple(dense.shape), tuple(dense.stride()), at, nbytes))
            at += _run(nbytes)
            out: object = {MARK: len(table) - 1}
        elif isinstance(value, dict):
            out = {k: strip(v) for k, v in value.items()}
        elif isinstance(value, (list, tuple)):
            out = type(value)(strip(v) for v in value)
        else:
            return value
        memo[id(value)] = out
        return out

    try:
        stripped = strip(message)
    except OverflowError:
        return None
    if device.type == "cuda":  # every byte in place before the other process looks
        torch.cuda.synchronize(device)
    stripped[TABLE_KEY] = table
    return stripped


def _bytes_of(dense: torch.Tensor) -> torch.Tensor:
    """The bytes of `dense`'s storage (exactly its elements, `_dense`) as uint8."""
    storage = dense.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=dense.device).set_(
        storage, 0, (storage.nbytes(),), (1,))


def take(table: list[tuple], buffer: torch.Tensor,
         view_on: Callable[[torch.Tensor, dict], torch.Tensor]) -> list[torch.Tensor]:
    """Each lane tensor of a checked table (protocol: every entry plain values inside the
    mailbox), copied out of the mailbox into memory of this process, as the view the table
    gives."""
    tensors = []
    for dtype, shape, stride, at, nbytes in table:
        own = torch.empty(nbytes, dtype=torch.uint8, device=buffer.device)
        own.copy_(buffer[at:at + nbytes])
        tensors.append(view_on(own, {"dtype": dtype, "shape": shape, "stride": stride,
                                     "offset": 0}))
    if buffer.is_cuda:  # copied out before the mailbox is written again
        torch.cuda.synchronize(buffer.device)
    return tensors
