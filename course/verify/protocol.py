"""Messages between the verifier and the learner's process, and how tensors travel in them.

A message is a dict of plain values (str, int, float, bool, None, lists, tuples, dicts,
torch dtypes) and CPU tensors, written with `torch.save` behind an 8-byte length. The
verifier reads with `torch.load(weights_only=True)`, which rebuilds only such values: a
message from the learner's process can carry wrong numbers, never code that runs in the
verifier.

A tensor argument travels as its whole storage (bytes) and its view on it (dtype, offset,
shape, strides), so that the function sees the layout the checker built (rows padded in
memory, margins around the input) and the checker sees every byte the function wrote,
inside the view or around it. Each storage carries a key: the same key arrives in the
same buffer of the learner's process, refilled in place, so a result cached by address is
caught the way it would be in one process.

A large message goes through a file in shared memory instead of the pipe, which moves only
about 0.4 GB/s (docs/grading-time.md): the writer writes it into a fresh file of a directory
both processes know and sends on the pipe a short frame naming the file; the reader removes
the file and reads it into its own memory, never a mapping the writer could still change.
In the file, the message comes first with each tensor replaced by a marker (saved and
loaded as above), then every tensor's storage as raw bytes, which the reader reads straight
into tensors of its own. Where the directory cannot take the message, it goes through the
pipe.

On a GPU, a message's CUDA tensors go through the GPU lane where the verifier has lent
one (course.verify.gpu_lane): copied into the verifier's mailbox on the GPU, which the
learner's process maps, named in the message by a table of layouts, and copied out by the
reader. The table is checked as a file's is; what no mailbox holds takes the ways above.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import stat
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

_LENGTH = struct.Struct("<Q")
# The most characters of printed text a reply or a verdict keeps of one cell.
OUTPUT_LIMIT = 4000
# Messages with more tensor bytes than this go through a file when they can. There and
# back on 2 cores: 256 KB 2.0 ms by the pipe, 2.3 ms by files; 1 MB 6.6 ms and 4.4 ms.
IN_FILE_BYTES = 1 << 20
# Set in the length word: the frame's payload names a file, it is not the message.
_IN_FILE = 1 << 63
_FILE_SIZE = struct.Struct("<Q")  # the frame naming a file: the file's size, then its name
_MAX_NAME = 255
_FILE_CHUNK = 256 << 20  # a message file is read this much at a time, the deadline between
# The most lists, tuples and dicts a message file's message may hold.
MAX_NODES = 1 << 20
# A message through the GPU lane: where its table of lane tensors is, what stands for each
# in the message, the most it may hold, and the alignment of each in the mailbox.
LANE_TABLE = "__gpu_lane__"
LANE_MARK = "__gpu_lane_tensor__"
LANE_MAX_TENSORS = 1 << 14
_LANE_ALIGN = 256


@contextlib.contextmanager
def _without_checksums():
    """torch.save without the CRC-32 of each record (torch 2.6 and later): the message goes
    into a pipe or a file in shared memory read once, never to a disk, and torch.load does
    not check it. On the H100 host measured, a 512 MB tensor saved in 0.41 to 0.48 s
    without it, 0.68 to 0.73 s with (docs/grading-time.md)."""
    crc32 = getattr(torch.serialization, "get_crc32_options", None)
    if crc32 is None:
        yield
        return
    before = crc32()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


class ChannelClosed(EOFError):
    """The other end closed its pipe (its process ended)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class MessageRefused(ValueError):
    """A frame named a file this end will not read (outside the shared directory, not a
    plain file, not the size it said)."""


def encode(message: dict) -> bytes:
    buffer = io.BytesIO()
    with _without_checksums():
        torch.save(message, buffer)
    payload = buffer.getvalue()
    return _LENGTH.pack(len(payload)) + payload


def decode(payload: bytes) -> dict:
    message = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    if not isinstance(message, dict):
        raise ValueError(f"a message must be a dict, not {type(message).__name__}")
    return message


def _tensor_bytes(message: object) -> int:
    """Bytes of the storages under the tensors in `message` (what its file will hold,
    nearly)."""
    sizes, todo = {}, [message]
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            sizes[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, (list, tuple)):
            todo.extend(value)
    return sum(sizes.values())


def _marker(index: int) -> torch.Tensor:
    """Stands for the message's tensor `index` in a message file (a meta tensor holds no
    bytes, and no message carries one otherwise)."""
    return torch.empty((index,), dtype=torch.uint8, device="meta")


def _without_tensors(message: dict) -> tuple[dict, list[torch.Tensor]]:
    """`message` with each tensor replaced by a marker, with the table of their layouts,
    and their storages' bytes (CPU, uint8) in the table's order."""
    table, storages = [], []

    def strip(value: object) -> object:
        if isinstance(value, torch.Tensor):
            if not _bytes_are_values(value):
                raise TypeError("only a plain strided tensor travels as raw bytes")
            t = value.detach()
            if t.device.type != "cpu":
                t = t.to("cpu")
            table.append((t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                          t.untyped_storage().nbytes()))
            storages.append(storage_bytes(t))
            return _marker(len(table) - 1)
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(strip(v) for v in value)
        return value

    return {"message": strip(message), "tensors": table}, storages


def _bytes_are_values(t: torch.Tensor) -> bool:
    """A plain strided tensor, whose bytes alone give its values (a conjugated or negated
    view's do not)."""
    return (t.layout == torch.strided and not t.is_quantized and not t.is_conj()
            and not t.is_neg())


def _layouts(skeleton: dict) -> list[tuple[torch.dtype, tuple, tuple, int, int]]:
    """The table of tensor layouts a message file's first part gives, each checked to be
    plain values (the other process wrote it)."""
    table = skeleton.get("tensors")
    if not isinstance(table, list) or not isinstance(skeleton.get("message"), dict):
        raise MessageRefused("a message file does not begin with a message and its tensors")
    for entry in table:
        if not _is_layout(entry):
            raise MessageRefused(f"a message file describes a tensor as {entry!r}")
    return table


def _is_layout(entry: object) -> bool:
    """(dtype, shape, strides, offset, bytes), each a plain value of its kind."""
    return (isinstance(entry, tuple) and len(entry) == 5 and isinstance(entry[0], torch.dtype)
            and all(isinstance(part, tuple) and all(type(v) is int for v in part)
                    for part in entry[1:3])
            and all(type(v) is int and v >= 0 for v in entry[3:]))


def _lane_layouts(table: object, capacity: int) -> list[tuple]:
    """The table of a message's GPU lane tensors, each entry plain values lying inside the
    mailbox (`capacity` bytes), their bytes together at most its size (each costs the
    reader a copy)."""
    if not isinstance(table, list) or len(table) > LANE_MAX_TENSORS:
        raise MessageRefused(f"a message's GPU lane table is not a list of at most "
                             f"{LANE_MAX_TENSORS} entries")
    for entry in table:
        if not _is_layout(entry) or entry[3] + entry[4] > capacity:
            raise MessageRefused(f"a message's GPU lane table describes a tensor as "
                                 f"{entry!r:.200}")
    total = sum(entry[4] for entry in table)
    if total > capacity:
        raise MessageRefused(f"a message's GPU lane tensors add up to {total} bytes, more "
                             f"than the mailbox's {capacity}")
    return table


def _rebuilt(value: object, marker: Callable[[int], object] | None, deadline: float | None,
             lane: list[torch.Tensor] | None = None) -> object:
    """`value` with each marker (a meta tensor of shape (index,)) replaced by
    `marker(index)` (None: tensors stay as they are), and each GPU lane marker by its tensor
    of `lane`. Each container is rebuilt once, however often the other process's pickle
    refers to it (a few bytes can nest one list in itself a million times over), and at
    most MAX_NODES of them."""
    memo: dict[int, object] = {}
    lane_used: set[int] = set()

    def rebuild(value: object) -> object:
        if isinstance(value, torch.Tensor):
            if marker is None:
                return value
            if value.device.type != "meta" or value.dim() != 1:
                raise MessageRefused("a message file holds a tensor outside its raw part")
            return marker(value.shape[0])
        if not isinstance(value, (dict, list, tuple)):
            return value
        if id(value) in memo:
            return memo[id(value)]
        if lane is not None and isinstance(value, dict) and LANE_MARK in value:
            index = value[LANE_MARK]
            # Each of the table's tensors by one marker (referred to as often as the
            # message likes): two that alias would reach the checks as two tensors.
            if len(value) != 1 or type(index) is not int or not 0 <= index < len(lane) \
                    or index in lane_used:
                raise MessageRefused("a message's GPU lane markers and its table disagree")
            lane_used.add(index)
            memo[id(value)] = lane[index]
            return lane[index]
        if len(memo) >= MAX_NODES or (len(memo) % 4096 == 0 and deadline is not None
                                      and time.monotonic() > deadline):
            raise MessageRefused("a message file's message is too large to rebuild in time")
        if isinstance(value, dict):
            memo[id(value)] = out = {}
            out.update((k, rebuild(v)) for k, v in value.items())
        elif isinstance(value, list):
            memo[id(value)] = out = []
            out.extend(rebuild(v) for v in value)
        else:
            memo[id(value)] = out = type(value)(rebuild(v) for v in value)
        return out

    try:
        return rebuild(value)
    except RecursionError:
        raise MessageRefused("a message file's message is nested too deep") from None


def _markers_once_each(message: object, count: int, deadline: float | None) -> None:
    """Refuse a message whose markers are not each of the table's `count` tensors once (a
    table of a million empty tensors would cost the reader far more than the file)."""
    seen = [0] * count

    def note(index: int) -> None:
        if not 0 <= index < count or seen[index]:
            raise MessageRefused("a message file's markers and its table of tensors disagree")
        seen[index] = 1

    _rebuilt(message, note, deadline)
    if sum(seen) != count:
        raise MessageRefused("a message file's markers and its table of tensors disagree")


def _read_into(fd: int, buffer: memoryview, deadline: float | None) -> int:
    """Fill `buffer` from the file `fd`, a chunk at a time (one read(2) returns at most
    about 2 GiB), the deadline between chunks; the bytes read (fewer at the file's end)."""
    done = 0
    while done < len(buffer):
        if deadline is not None and time.monotonic() > deadline:
            raise ChannelTimeout("the message's file was not read within the time limit")
        got = os.readv(fd, [buffer[done:done + _FILE_CHUNK]])
        if not got:
            break
        done += got
    return done


def _load_file(fd: int, nbytes: int, deadline: float | None, lane=None) -> dict:
    """The message in a message file of `nbytes` bytes, read from `fd`."""
    word = bytearray(_LENGTH.size)
    if _read_into(fd, memoryview(word), deadline) != len(word):
        raise MessageRefused("a message file ends before its first part")
    (head,) = _LENGTH.unpack(word)
    if head > nbytes - len(word):
        raise MessageRefused(f"a message file's first part is {head} bytes long")
    first = bytearray(head)
    if _read_into(fd, memoryview(first), deadline) != head:
        raise MessageRefused("a message file ends inside its first part")
    skeleton = decode(bytes(first))
    table = _layouts(skeleton)
    if len(word) + head + sum(entry[4] for entry in table) != nbytes:
        raise MessageRefused("a message file's tensors do not add up to its size")
    _markers_once_each(skeleton["message"], len(table), deadline)
    tensors = []
    for dtype, shape, stride, offset, size in table:
        if deadline is not None and time.monotonic() > deadline:
            raise ChannelTimeout("the message's file was not read within the time limit")
        storage = torch.empty(size, dtype=torch.uint8)
        if _read_into(fd, memoryview(storage.numpy()), deadline) != size:
            raise MessageRefused("a message file ends inside a tensor")
        try:
            tensors.append(view_on(storage, {"dtype": dtype, "shape": shape,
                                             "stride": stride, "offset": offset}))
        except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
            raise MessageRefused(f"a message file describes a tensor its bytes cannot hold "
                                 f"({exc})") from None
    return _rebuilt(skeleton["message"], tensors.__getitem__, deadline,
                    _lane_tensors(skeleton["message"], lane))


def _save_in_file(shared_dir: str, message: dict, size: int) -> tuple[bytes, str] | None:
    """Save `message` into a new file of `shared_dir`: the frame that names it, and its
    path; None where the directory cannot take it (missing, not writable, too full). The
    file is written and measured through its own descriptor, never looked up by name again,
    so a name the other process swapped for a link leads nowhere."""
    try:
        space = os.statvfs(shared_dir)
        if space.f_bavail * space.f_frsize < size + size // 16 + (1 << 20):
            return None
        fd, path = tempfile.mkstemp(dir=shared_dir, prefix="message-")
    except OSError:
        return None
    try:
        skeleton, storages = _without_tensors(message)
        _write_all(fd, encode(skeleton))
        for storage in storages:
            _write_all(fd, storage.numpy())
        nbytes = os.fstat(fd).st_size
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        if isinstance(exc, Exception):  # full after all (another writer): the pipe
            return None
        raise
    finally:
        os.close(fd)
    header = _FILE_SIZE.pack(nbytes) + os.path.basename(path).encode()
    return _LENGTH.pack(_IN_FILE | len(header)) + header, path


def _write_all(fd: int, frame) -> None:
    data = memoryview(frame).cast("B")
    while data:
        written = os.write(fd, data)
        data = data[written:]


def write_message(fd: int, message: dict, shared_dir: str | None = None, lane=None) -> None:
    """Write `message` on `fd`; its tensors on the GPU through `lane`'s mailbox where it
    has one that holds them (course.verify.gpu_lane); one with more than IN_FILE_BYTES
    of other tensors through a file of `shared_dir` (None: always the pipe)."""
    if lane is not None and (packed := _lane_packed(message, lane)):
        message = packed
    saved = None
    if shared_dir is not None and (size := _tensor_bytes(message)) > IN_FILE_BYTES:
        saved = _save_in_file(shared_dir, message, size)
    if saved is None:
        _write_all(fd, encode(message))
        return
    frame, path = saved
    try:
        _write_all(fd, frame)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise ChannelTimeout(f"no message within the time limit ({left} bytes missing)")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ChannelClosed("the other process closed its end of the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_file(shared_dir: str | None, header: bytes, deadline: float | None,
               lane=None) -> dict:
    """The message in the file a frame names, read into this process's memory; the file is
    removed. The name comes from the other process: only a plain name inside
    `shared_dir`, a regular file of the size the frame said with every byte stored (a
    sparse file would cost this process its memory and the other nothing), is read, a
    chunk at a time, within the deadline."""
    if len(header) < _FILE_SIZE.size:
        raise MessageRefused("a frame naming a file is too short")
    (nbytes,) = _FILE_SIZE.unpack_from(header)
    raw = header[_FILE_SIZE.size:]
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        name = ""
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise MessageRefused(f"a message named the file {raw!r}: only a plain file name "
                             "inside the shared directory is read")
    if shared_dir is None:
        raise MessageRefused(f"a message came in the file {name!r}, but this end has no "
                             "shared directory")
    try:  # the directory and then the file, each opened once and never through a link
        folder = os.open(shared_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise MessageRefused(f"the shared directory cannot be opened ({exc.strerror})") \
            from None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY,
                     dir_fd=folder)
    except OSError as exc:
        os.close(folder)
        raise MessageRefused(f"the message's file {name!r} is not a plain file of the "
                             f"shared directory ({exc.strerror})") from None
    try:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)  # now: nothing is left behind, whatever follows
        info = os.fstat(fd)
        if (not stat.S_ISREG(info.st_mode) or info.st_size != nbytes
                or info.st_blocks * 512 < nbytes):
            raise MessageRefused(f"the message's file {name!r} is not a plain file of "
                                 f"{nbytes} bytes, every one stored")
        try:
            message = _load_file(fd, nbytes, deadline, lane)
        except (MessageRefused, ChannelTimeout):
            raise
        except Exception as exc:  # whatever else the other process's bytes broke
            raise MessageRefused(f"the message's file {name!r} could not be read "
                                 f"({type(exc).__name__}: {exc})") from None
        if os.read(fd, 1):
            raise MessageRefused(f"the message's file {name!r} changed while it was read")
    finally:
        os.close(fd)
        os.close(folder)
    return message


def read_message(fd: int, deadline: float | None = None, shared_dir: str | None = None,
                 lane=None) -> dict:
    """The next message on `fd`; `deadline` is a time.monotonic() value (None: wait). A
    message sent through a file is read from `shared_dir`, its GPU tensors from `lane`'s
    mailbox (course.verify.gpu_lane)."""
    (word,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
    if not word & _IN_FILE:
        message = decode(_read_exactly(fd, word, deadline))
        if LANE_TABLE not in message:
            return message
        return _rebuilt(message, None, deadline, _lane_tensors(message, lane))
    size = word & ~_IN_FILE
    if size > _FILE_SIZE.size + _MAX_NAME:
        raise MessageRefused(f"a frame naming a file is {size} bytes long")
    return _read_file(shared_dir, _read_exactly(fd, size, deadline), deadline, lane)


def _lane_tensors(message: dict, lane) -> list[torch.Tensor] | None:
    """The tensors a message sent through the GPU lane (its table taken out of it), copied
    into this process's memory; None for a message without."""
    if not isinstance(message, dict) or LANE_TABLE not in message:
        return None
    table = message.pop(LANE_TABLE)
    buffer = lane.region(0) if lane is not None else None
    if buffer is None:
        raise MessageRefused("a message came through the GPU lane, but this end has none")
    table = _lane_layouts(table, buffer.numel())
    try:
        return _lane_taken(table, buffer)
    except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
        raise MessageRefused(f"a message's GPU lane tensors could not be read ({exc})") \
            from None


# ---------------------------------------------------------------- the GPU lane


def _lane_run(nbytes: int) -> int:
    return -(-nbytes // _LANE_ALIGN) * _LANE_ALIGN


def _on_lane(value: object, device: torch.device) -> bool:
    return isinstance(value, torch.Tensor) and value.device == device \
        and _bytes_are_values(value)


def lane_bytes(message: object, device: torch.device) -> int:
    """Bytes the GPU lane would carry of `message` (its tensors on `device`), alignment in:
    each tensor once, however often the message refers to it, as `_lane_packed` packs it."""
    total, todo, seen = 0, [message], set()
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if _on_lane(value, device):
            total += _lane_run(value.numel() * value.element_size())
        elif isinstance(value, (dict, list, tuple)):
            todo.extend(value.values() if isinstance(value, dict) else value)
    return total


def _lane_packed(message: dict, lane) -> dict | None:
    """`message` with each tensor the lane carries copied into `lane`'s mailbox, as the
    bytes of a dense copy (strides kept where it is dense), and replaced by a marker, the
    table under LANE_TABLE; None where the mailbox is too small or there are too many
    tensors (then the host carries the message). A tensor or container the message refers
    to twice is packed once, its marker referred to twice."""
    need = lane_bytes(message, lane.device)
    buffer = lane.region(need) if need else None
    if buffer is None:
        return None
    table: list[tuple] = []
    memo: dict[int, object] = {}
    at = 0

    def strip(value: object) -> object:
        nonlocal at
        if id(value) in memo:
            return memo[id(value)]
        if _on_lane(value, lane.device):
            if len(table) >= LANE_MAX_TENSORS:
                raise OverflowError
            dense = value.detach()
            if not (dense.is_contiguous() and dense.storage_offset() == 0 and
                    dense.untyped_storage().nbytes() == dense.numel() * dense.element_size()):
                dense = dense.clone()  # its storage exactly its elements
            nbytes = dense.numel() * dense.element_size()
            buffer[at:at + nbytes].copy_(storage_bytes(dense))
            table.append((dense.dtype, tuple(dense.shape), tuple(dense.stride()), at, nbytes))
            at += _lane_run(nbytes)
            out: object = {LANE_MARK: len(table) - 1}
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
    if buffer.is_cuda:  # every byte in place before the other process looks
        torch.cuda.synchronize(buffer.device)
    stripped[LANE_TABLE] = table
    return stripped


def _lane_taken(table: list[tuple], buffer: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor of a checked lane table, copied out of the mailbox into memory of this
    process, as the view the table gives."""
    tensors = []
    for dtype, shape, stride, at, nbytes in table:
        own = torch.empty(nbytes, dtype=torch.uint8, device=buffer.device)
        own.copy_(buffer[at:at + nbytes])
        tensors.append(view_on(own, {"dtype": dtype, "shape": shape, "stride": stride,
                                     "offset": 0}))
    if buffer.is_cuda:  # copied out before the mailbox is written again
        torch.cuda.synchronize(buffer.device)
    return tensors


# ---------------------------------------------------------------- tensors


@dataclass(frozen=True)
class StorageKey:
    """Names a storage of the verifier's process while it is alive: its address, size and
    device. A later storage at the same address is, to the learner's process, the same
    buffer refilled, which is what a freed and reused buffer is."""

    address: int
    nbytes: int
    device: str

    def text(self) -> str:
        return f"{self.device}:{self.address:x}:{self.nbytes}"


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage under `t`, as a uint8 tensor sharing its memory."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        storage, 0, (storage.nbytes(),), (1,))


def key_of(t: torch.Tensor) -> StorageKey:
    storage = t.untyped_storage()
    return StorageKey(storage.data_ptr(), storage.nbytes(), str(t.device))


def describe_view(t: torch.Tensor, key: StorageKey) -> dict:
    """A tensor argument as a message field: which storage, and the view on it."""
    return {"kind": "tensor", "key": key.text(), "dtype": t.dtype, "offset": t.storage_offset(),
            "shape": tuple(t.shape), "stride": tuple(t.stride()), "device": t.device.type,
            "requires_grad": bool(t.requires_grad)}


def view_on(buffer: torch.Tensor, field: dict) -> torch.Tensor:
    """The view a `describe_view` field names, on `buffer` (uint8, the whole storage)."""
    dtype = field["dtype"]
    size = torch.empty(0, dtype=dtype).element_size()
    if buffer.numel() % size:
        typed = buffer[: buffer.numel() - buffer.numel() % size].view(dtype)
    else:
        typed = buffer.view(dtype)
    return typed.as_strided(field["shape"], field["stride"], field["offset"])


def plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values as a plain CPU tensor of its dtype, shape and strides (for a message)."""
    return t.detach().to("cpu", copy=True)


def die_with_parent() -> None:
    """Linux: this process ends (SIGKILL) when the one that started it ends. The learner's
    process ends with its verifier; the verifier with the grading process that started it,
    so that a worker killed for running past its limit leaves nothing measuring on its GPU.
    Elsewhere nothing happens."""
    parent = os.getppid()
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(1)
