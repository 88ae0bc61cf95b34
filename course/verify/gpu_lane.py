"""Large GPU tensors between the verifier and the learner's process without the host.

A tensor argument at a timing shape is hundreds of MB. Through the host it costs each
side a device-to-host copy, a file in shared memory written and read, and a host-to-device
copy: about 20 s of chapter 08's launch-rule cell on an H100 (docs/grading-time.md). The
lane is a buffer of the learner's process on the GPU, its mailbox, that the verifier maps
into its own address space with CUDA's interprocess handles. Only the verifier ever maps
the other's memory: the learner's process never holds a mapping of the verifier's, so it
can change nothing the verifier goes on using.

A message's CUDA tensors are packed into the mailbox, each as a dense run of bytes, and
replaced in the message by a marker naming their place in a table of layouts; the reader
copies each run into a tensor of its own before it looks at it. The verifier asks for the
mailbox (`Mailbox.grant`, the learner's `mailbox` request), sized for its largest request;
a message that does not fit, or a GPU or system without interprocess handles, goes
through the host as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

# Where in a message the table of its lane tensors is, and what stands for each.
TABLE_KEY = "__gpu_lane__"
MARK = "__gpu_lane_tensor__"
# The largest mailbox the verifier maps, and the most tensors one message may hold there.
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
        lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), u64]
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(u64), _Handle, ctypes.c_uint]
        lib.cuIpcCloseMemHandle.argtypes = [u64]
        lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(u64),
                                                ctypes.POINTER(ctypes.c_size_t), u64]
        _driver_lib = lib
    return _driver_lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise LaneError(f"{what} failed (CUDA driver error {result})")


def _allocation(address: int) -> tuple[int, int]:
    """The base address and size of the device allocation that holds `address`."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), address),
           "cuMemGetAddressRange")
    return base.value, size.value


class _Raw:
    """Device memory as an object torch.as_tensor can view (CUDA array interface)."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 3,
                                         "strides": None}


# ---------------------------------------------------------------- the learner's side


class OwnMailbox:
    """The learner's process: its mailbox, and the handle the verifier maps it by."""

    def __init__(self, nbytes: int):
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.device = self.buffer.device
        torch.cuda.synchronize()
        base, _ = _allocation(self.buffer.data_ptr())
        handle = _Handle()
        _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
        self.grant = {"handle": bytes(handle), "offset": self.buffer.data_ptr() - base,
                      "bytes": nbytes}

    def region(self, nbytes: int) -> torch.Tensor | None:
        return self.buffer if nbytes <= self.buffer.numel() else None


# ---------------------------------------------------------------- the verifier's side


class MappedMailbox:
    """The verifier: the learner's mailbox mapped here, from the grant its process sent.
    The grant is the other process's word: its size is checked against the mapping."""

    def __init__(self, grant: object, device: torch.device):
        if not (isinstance(grant, dict) and isinstance(grant.get("handle"), bytes)
                and len(grant["handle"]) == 64
                and all(type(grant.get(k)) is int and grant[k] >= 0 for k in ("offset", "bytes"))
                and 0 < grant["bytes"] <= MAX_BYTES):
            raise LaneError(f"the learner's process granted no usable mailbox ({grant!r:.200})")
        handle = _Handle.from_buffer_copy(grant["handle"])  # every byte, NULs too
        with torch.cuda.device(device):
            base = ctypes.c_uint64()
            _check(_driver().cuIpcOpenMemHandle_v2(ctypes.byref(base), handle, 1),
                   "cuIpcOpenMemHandle")
            self.base = base.value
            try:
                _, size = _allocation(self.base)
                if grant["offset"] + grant["bytes"] > size:
                    raise LaneError(f"the mailbox granted ({grant['bytes']} bytes at "
                                    f"{grant['offset']}) runs past its allocation ({size})")
                raw = _Raw(self.base + grant["offset"], grant["bytes"])
                self.buffer = torch.as_tensor(raw, device=device)
            except BaseException:
                _driver().cuIpcCloseMemHandle(self.base)
                raise
        self.device = device
        self.nbytes = grant["bytes"]

    def region(self, nbytes: int) -> torch.Tensor | None:
        return self.buffer if self.buffer is not None and nbytes <= self.nbytes else None

    def close(self) -> None:
        if self.buffer is not None:
            torch.cuda.synchronize(self.device)
            self.buffer = None
            _driver().cuIpcCloseMemHandle(self.base)


# ---------------------------------------------------------------- messages


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it, whose storage is exactly its elements (the bytes to send)."""
    t = t.detach()
    if t.is_contiguous() and t.storage_offset() == 0 and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone()  # strides kept where t is dense, contiguous otherwise


def device_bytes(message: object, device: torch.device) -> int:
    """Bytes the lane would carry of `message` (its tensors on `device`), alignment in."""
    total, todo, seen = 0, [message], set()
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            if value.device == device:
                total += -(-value.numel() * value.element_size() // _ALIGN) * _ALIGN
        elif isinstance(value, (dict, list, tuple)) and id(value) not in seen:
            seen.add(id(value))
            todo.extend(value.values() if isinstance(value, dict) else value)
    return total


def pack(message: dict, device: torch.device,
         region: Callable[[int], torch.Tensor | None]) -> dict | None:
    """`message` with each tensor on `device` copied into the mailbox (`region(nbytes)`
    gives it) and replaced by a marker, the table under TABLE_KEY; None where the mailbox
    is too small or there are too many tensors (then the host carries the message)."""
    need = device_bytes(message, device)
    buffer = region(need) if need else None
    if buffer is None:
        return None
    table: list[tuple] = []
    at = 0

    def strip(value: object) -> object:
        nonlocal at
        if isinstance(value, torch.Tensor) and value.device == device:
            if len(table) >= MAX_TENSORS:
                raise OverflowError
            dense = _dense(value)
            nbytes = dense.numel() * dense.element_size()
            buffer[at:at + nbytes].copy_(_bytes_of(dense))
            table.append((dense.dtype, tuple(dense.shape), tuple(dense.stride()), at, nbytes))
            at += -(-nbytes // _ALIGN) * _ALIGN
            return {MARK: len(table) - 1}
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(strip(v) for v in value)
        return value

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
