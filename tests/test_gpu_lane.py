"""The GPU lane (course.verify.gpu_lane): large GPU tensors between the verifier and the
learner's process through a mailbox of the learner's that the verifier maps.

The packing, the table and its refusals work on any device, so most tests here run them
on a mailbox in host memory; the mapping itself, and a learner's process using it, need a
GPU and are marked so.
"""

from __future__ import annotations

import os
import time

from course import runtime
from course.verify import gpu_lane, protocol

import pytest
import torch
from test_verify import _pipe_holds, started_learner


class HostMailbox:
    """The lane's interface over host memory: what Mailbox and MappedMailbox give."""

    def __init__(self, nbytes: int):
        self.buffer = torch.full((nbytes,), 0xAB, dtype=torch.uint8)
        self.device = self.buffer.device

    def region(self, nbytes: int) -> torch.Tensor | None:
        return self.buffer if nbytes <= self.buffer.numel() else None


def _layouts_alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a, b))


def test_tensors_of_every_layout_travel_through_the_mailbox_and_arrive_as_copies(pipe):
    read_fd, write_fd = pipe
    lane = HostMailbox(1 << 16)
    base = torch.randn(16, 24)
    message = {"op": "call", "contiguous": torch.arange(12.0).reshape(3, 4),
               "transposed": base.t(), "offset view": base[3:7, 5:9],
               "expanded": torch.randn(5, 1).expand(5, 6), "empty": torch.zeros(0, 3),
               "bytes": torch.arange(256, dtype=torch.uint8),
               "nested": [(torch.ones(2, dtype=torch.bfloat16), 7)], "plain": "text"}
    protocol.write_message(write_fd, message, None, lane)
    assert _pipe_holds(read_fd) < 2000  # the tensors' 2 KB went through the mailbox
    back = protocol.read_message(read_fd, time.monotonic() + 10, None, lane)
    assert protocol.LANE_TABLE not in back and back["plain"] == "text"
    assert _layouts_alike(back["contiguous"], message["contiguous"])
    assert _layouts_alike(back["transposed"], message["transposed"])  # strides kept
    assert torch.equal(back["offset view"], message["offset view"])
    assert torch.equal(back["expanded"], message["expanded"])
    assert back["empty"].shape == (0, 3) and torch.equal(back["bytes"], message["bytes"])
    assert back["nested"][0][1] == 7 and torch.equal(back["nested"][0][0], torch.ones(2))
    lane.buffer.fill_(0)  # what arrived is the reader's own, not the mailbox
    assert torch.equal(back["contiguous"], torch.arange(12.0).reshape(3, 4))


def test_a_message_the_mailbox_cannot_hold_goes_through_the_host(tmp_path, pipe):
    read_fd, write_fd = pipe
    shared = tmp_path / "shared"
    shared.mkdir()
    lane = HostMailbox(1024)
    x = torch.randn(1 << 19)
    protocol.write_message(write_fd, {"x": x}, str(shared), lane)
    assert len(os.listdir(shared)) == 1  # the file, not the lane
    back = protocol.read_message(read_fd, time.monotonic() + 10, str(shared), lane)
    assert torch.equal(back["x"], x)


def test_a_message_with_tensors_for_the_lane_and_for_a_file_uses_both(tmp_path, pipe):
    read_fd, write_fd = pipe
    shared = tmp_path / "shared"
    shared.mkdir()
    lane = HostMailbox(1 << 12)
    big, small = torch.randn(1 << 19), torch.randn(64)
    protocol.write_message(write_fd, {"big": big, "small": small}, str(shared), lane)
    back = protocol.read_message(read_fd, time.monotonic() + 10, str(shared), lane)
    assert torch.equal(back["big"], big) and torch.equal(back["small"], small)
    assert os.listdir(shared) == []


def _lane_message(table: list, marker: object) -> dict:
    return {"op": "call", "x": marker, protocol.LANE_TABLE: table}


@pytest.mark.parametrize("lie", ["past the mailbox", "more than the mailbox in all",
                                 "a marker past the table", "a marker with more keys",
                                 "an entry that is not plain values", "a view past its bytes",
                                 "a table that is not a list"])
def test_a_lane_table_that_lies_is_refused(pipe, lie):
    read_fd, write_fd = pipe
    lane = HostMailbox(256)
    table, marker = [(torch.float32, (4, 4), (4, 1), 0, 64)], {protocol.LANE_MARK: 0}
    if lie == "past the mailbox":
        table = [(torch.float32, (4, 4), (4, 1), 224, 64)]
    elif lie == "more than the mailbox in all":  # each copy would cost the reader memory
        table = [(torch.uint8, (200,), (1,), 0, 200)] * 2
    elif lie == "a marker past the table":
        marker = {protocol.LANE_MARK: 1}
    elif lie == "a marker with more keys":
        marker = {protocol.LANE_MARK: 0, "also": 1}
    elif lie == "an entry that is not plain values":
        table = [(torch.float32, (4, 4), (4, 1), 0, "64")]
    elif lie == "a view past its bytes":
        table = [(torch.float32, (4, 4), (8, 1), 0, 64)]
    elif lie == "a table that is not a list":
        table = {"entries": 1}
    os.write(write_fd, protocol.encode(_lane_message(table, marker)))
    with pytest.raises(protocol.MessageRefused, match="GPU lane"):
        protocol.read_message(read_fd, time.monotonic() + 10, None, lane)


def test_a_lane_message_to_an_end_without_a_lane_is_refused(pipe):
    read_fd, write_fd = pipe
    table = [(torch.float32, (4,), (1,), 0, 16)]
    os.write(write_fd, protocol.encode(_lane_message(table, {protocol.LANE_MARK: 0})))
    with pytest.raises(protocol.MessageRefused, match="this end has none"):
        protocol.read_message(read_fd, time.monotonic() + 10, None, None)


def test_a_lane_message_that_refers_to_one_list_many_times_is_read_at_once(pipe):
    read_fd, write_fd = pipe
    lane = HostMailbox(256)
    lane.buffer[:16].copy_(torch.arange(4, dtype=torch.float32).view(torch.uint8))
    nested = [{protocol.LANE_MARK: 0}]
    for _ in range(40):  # rebuilt as a tree: 2**40 lists
        nested = [nested, nested]
    os.write(write_fd, protocol.encode(_lane_message([(torch.float32, (4,), (1,), 0, 16)],
                                                     nested)))
    started = time.monotonic()
    back = protocol.read_message(read_fd, time.monotonic() + 10, None, lane)
    assert time.monotonic() - started < 5
    inner = back["x"]
    for _ in range(40):
        assert inner[0] is inner[1]
        inner = inner[0]
    assert torch.equal(inner[0], torch.arange(4.0))


def test_a_handle_keeps_all_64_bytes_nuls_included():
    # The driver's handles hold NUL bytes: a c_char array's value stops at the first.
    raw = bytes([7, 0, 0, 9] + [0] * 59 + [5])
    assert bytes(gpu_lane._Handle.from_buffer_copy(raw)) == raw


def test_a_tensor_the_message_refers_to_twice_travels_once_and_arrives_once(pipe):
    read_fd, write_fd = pipe
    lane = HostMailbox(1 << 12)
    x = torch.randn(16)
    shared = [x, torch.ones(3)]
    protocol.write_message(write_fd, {"a": x, "b": x, "c": shared, "d": shared}, None, lane)
    back = protocol.read_message(read_fd, time.monotonic() + 10, None, lane)
    assert back["a"] is back["b"] and back["c"] is back["d"] and back["c"][0] is back["a"]
    assert torch.equal(back["a"], x) and torch.equal(back["c"][1], torch.ones(3))


def test_two_markers_naming_one_tensor_of_the_table_are_refused(pipe):
    read_fd, write_fd = pipe
    lane = HostMailbox(256)
    message = _lane_message([(torch.float32, (4,), (1,), 0, 16)],
                            [{protocol.LANE_MARK: 0}, {protocol.LANE_MARK: 0}])
    os.write(write_fd, protocol.encode(message))
    with pytest.raises(protocol.MessageRefused, match="markers and its table disagree"):
        protocol.read_message(read_fd, time.monotonic() + 10, None, lane)


def test_a_view_whose_bytes_are_not_its_values_goes_through_the_host(pipe):
    read_fd, write_fd = pipe
    lane = HostMailbox(1 << 12)
    z = torch.randn(8, dtype=torch.complex64)
    message = {"conj": z.conj(), "neg": torch._neg_view(torch.randn(4))}
    protocol.write_message(write_fd, message, None, lane)
    back = protocol.read_message(read_fd, time.monotonic() + 10, None, lane)
    assert torch.equal(back["conj"].resolve_conj(), z.conj().resolve_conj())
    assert torch.equal(back["neg"].resolve_neg(), message["neg"].resolve_neg())


def test_a_request_the_learners_process_cannot_read_is_answered_and_the_next_one_runs(
        tmp_path):
    # A lane table where the learner's process has no lane (or its GPU faulted): an error
    # for that request, where the process used to die with it.
    learner = started_learner(tmp_path, "def scale(x):\n    return x * 2\n")
    try:
        reply = learner.process.request({"op": "call", "name": "scale", "args": [],
                                         protocol.LANE_TABLE: []})
        assert "could not be read here" in reply["error"]["message"]
        assert torch.equal(learner.function("scale")(torch.ones(3)), torch.full((3,), 2.0))
    finally:
        learner.process.close()


def test_cpu_storages_are_copied_as_they_are_packed_for_a_request():
    from course.verify.proxy import _Packer

    packer = _Packer()
    x = torch.zeros(4)
    packer.pack(x)
    (sent,) = packer.fields()["storages"].values()
    x.fill_(1)  # the message holds what x held when it was packed
    assert torch.equal(sent, torch.zeros(16, dtype=torch.uint8))


# ---------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def gpu_learner(tmp_path_factory):
    learner = started_learner(tmp_path_factory.mktemp("lane"), (
        "import torch\n"
        "def scale(x, factor=2.0):\n    return x * factor\n"
        "def bump(x):\n    x.add_(1)\n    return x[:4].clone()\n"
        "def address(x):\n    return x.data_ptr()\n"))
    yield learner
    learner.process.close()


@pytest.mark.gpu
def test_large_gpu_arguments_and_outputs_go_through_the_lane_not_files(gpu_learner,
                                                                       monkeypatch):
    files = []
    read_file = protocol._read_file
    monkeypatch.setattr(protocol, "_read_file",
                        lambda *args: files.append(args) or read_file(*args))
    x = torch.randn(1 << 22, device=runtime.DEVICE)  # 16 MB
    y = gpu_learner.function("scale")(x, factor=3.0)
    assert gpu_learner.process.lane is not None, gpu_learner.process.lane_off
    assert files == [] and y.is_cuda and torch.equal(y, x * 3)
    before = x.clone()
    head = gpu_learner.function("bump")(x)
    assert torch.equal(x, before + 1) and torch.equal(head, before[:4] + 1)  # written back


@pytest.mark.gpu
def test_the_same_gpu_tensor_reaches_the_same_buffer_through_the_lane(gpu_learner):
    fn = gpu_learner.function("address")
    x = torch.zeros(1 << 22, device=runtime.DEVICE)
    first = fn(x)
    x.fill_(1)
    assert fn(x) == first and gpu_learner.process.lane is not None


@pytest.mark.gpu
def test_a_request_larger_than_the_mailbox_gets_a_larger_one(gpu_learner):
    gpu_learner.function("scale")(torch.ones(1 << 22, device=runtime.DEVICE))
    small = gpu_learner.process.lane.nbytes
    x = torch.randn(small // 2, device=runtime.DEVICE)  # twice the mailbox in bytes
    assert torch.equal(gpu_learner.function("scale")(x), x * 2)
    assert gpu_learner.process.lane.nbytes >= 2 * x.numel() * 4 > small


@pytest.mark.gpu
def test_the_verifiers_mailboxes_are_freed_once_the_learners_process_has_ended(tmp_path):
    learner = started_learner(tmp_path, "def scale(x):\n    return x * 2\n")
    x = torch.randn(1 << 22, device=runtime.DEVICE)
    assert torch.equal(learner.function("scale")(x), x * 2)
    mailboxes = list(learner.process.mailboxes)
    assert mailboxes and all(m.buffer is not None for m in mailboxes)
    learner.process.close()
    assert learner.process.mailboxes == [] and all(m.buffer is None for m in mailboxes)
