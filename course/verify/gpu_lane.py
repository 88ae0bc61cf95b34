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
checks whatever a reply says. The processes the learner's code started end with its
process, before the mailbox is freed (course.verify.strays), so that none keeps it mapped.

How messages use it (each GPU tensor a dense run of bytes in the mailbox, named by a table
of layouts, copied out by the reader before it looks at it) is course.verify.protocol's.
A message that does not fit, or a GPU or system without interprocess handles, goes through
the host as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

# The largest mailbox the verifier allocates.
MAX_BYTES = 4 << 30


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
