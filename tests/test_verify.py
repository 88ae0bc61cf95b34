"""The verifier (course.verify): the learner's code in a process of its own, the test cells
and the points in another.

The pieces first (the message format, the tamper check, the stand-ins for the learner's
functions), then `verify` end to end on a small made-up chapter of two exercises, whose
test cells need no Triton, so that each way a submission can misbehave costs seconds.
The real chapters and the cheats that target them go through the autograder in
tests/test_grader_trust.py.
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import course  # picks the mode before triton is imported
from course import check
from course.check import sandbox
from course.verify import protocol, proxy, tamper
from course.verify.proxy import CellTimedOut, Learner, LearnerLost, LearnerProcess
from course.verify.verifier import Verdict, course_imports, free_names, summary, verify

import pytest
import torch
import triton.runtime.jit as _jit

nbformat = pytest.importorskip("nbformat", reason="the verifier reads notebooks")


# ---------------------------------------------------------------- messages


def test_a_message_round_trips_tensors_dtypes_and_plain_values():
    message = {"a": [1, 2.5, "x", None, (torch.arange(6).view(2, 3), True)],
               "dtype": torch.bfloat16, "nested": {"k": torch.ones(2, dtype=torch.float16)}}
    back = protocol.decode(protocol.encode(message)[8:])
    assert back["a"][:4] == [1, 2.5, "x", None] and back["dtype"] is torch.bfloat16
    assert torch.equal(back["a"][4][0], torch.arange(6).view(2, 3))
    assert back["nested"]["k"].dtype == torch.float16


def test_a_message_is_written_without_checksums_and_leaves_the_setting_as_it_was():
    crc32 = getattr(torch.serialization, "get_crc32_options", None)
    if crc32 is None:
        pytest.skip("torch before 2.6 always writes the checksums")
    payload = torch.arange(1 << 16, dtype=torch.int32)
    default = io.BytesIO()
    torch.save({"x": payload}, default)
    message = protocol.encode({"x": payload})
    assert crc32() is True  # torch.save elsewhere in the process still writes them

    def checksums(archive: bytes) -> list[int]:
        return [record.CRC for record in zipfile.ZipFile(io.BytesIO(archive)).infolist()]
    assert all(checksums(default.getvalue())) and not any(checksums(message[8:]))
    assert torch.equal(protocol.decode(message[8:])["x"], payload)


class _Payload:
    def __reduce__(self):
        return (os.getpid, ())


def test_a_message_that_would_run_code_when_read_is_refused():
    buffer = io.BytesIO()
    torch.save({"evil": _Payload()}, buffer)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        protocol.decode(buffer.getvalue())


def test_a_view_travels_with_its_whole_storage_and_layout():
    base = torch.arange(40, dtype=torch.float32)
    view = base.as_strided((3, 4), (10, 1), 5)  # rows padded in memory
    key = protocol.key_of(view)
    field = protocol.describe_view(view, key)
    rebuilt = protocol.view_on(protocol.storage_bytes(view).clone(), field)
    assert torch.equal(rebuilt, view) and rebuilt.stride() == (10, 1)
    assert rebuilt.storage_offset() == 5


def _pipe_holds(fd: int) -> int:
    """Bytes waiting to be read on a pipe."""
    import fcntl
    import termios
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def _shared_dir(tmp_path: Path) -> str:
    path = tmp_path / "shared"
    path.mkdir()
    return str(path)


def test_a_large_message_travels_in_a_file_and_the_file_is_removed(tmp_path, pipe):
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    message = {"x": torch.randn(1 << 20), "note": "four megabytes"}
    os.set_blocking(write_fd, False)  # 4 MB would not fit the pipe: it must not go there
    protocol.write_message(write_fd, message, shared)
    assert len(os.listdir(shared)) == 1 and _pipe_holds(read_fd) < 512
    back = protocol.read_message(read_fd, time.monotonic() + 10, shared)
    assert torch.equal(back["x"], message["x"]) and back["note"] == "four megabytes"
    assert os.listdir(shared) == [] and _pipe_holds(read_fd) == 0


def test_a_small_message_goes_through_the_pipe(tmp_path, pipe):
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    protocol.write_message(write_fd, {"x": torch.arange(10)}, shared)
    assert os.listdir(shared) == [] and _pipe_holds(read_fd) > 100
    assert torch.equal(protocol.read_message(read_fd, None, shared)["x"], torch.arange(10))


def _frame_naming(name: bytes, nbytes: int) -> bytes:
    header = protocol._FILE_SIZE.pack(nbytes) + name
    return protocol._LENGTH.pack(protocol._IN_FILE | len(header)) + header


@pytest.mark.parametrize("name", [b"../outside", b"..", b"", b"sub/../../outside",
                                  b"/outside", b"link"])
def test_a_frame_naming_a_file_outside_the_shared_directory_is_refused(tmp_path, pipe, name):
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(protocol.encode({"x": 1})[8:])
    os.symlink(outside, Path(shared) / "link")
    if name == b"/outside":
        name = str(outside).encode()
    os.write(write_fd, _frame_naming(name, outside.stat().st_size))
    with pytest.raises(protocol.MessageRefused, match="plain file"):
        protocol.read_message(read_fd, time.monotonic() + 10, shared)
    assert outside.exists()


def test_a_frame_naming_a_file_is_refused_where_no_directory_was_agreed(pipe):
    read_fd, write_fd = pipe
    os.write(write_fd, _frame_naming(b"message-x", 100))
    with pytest.raises(protocol.MessageRefused, match="no shared directory"):
        protocol.read_message(read_fd, time.monotonic() + 10, None)


@pytest.mark.parametrize("where", ["none", "missing", "full"])
def test_a_large_message_goes_through_the_pipe_where_the_directory_cannot_take_it(
        tmp_path, pipe, monkeypatch, where):
    read_fd, write_fd = pipe
    shared = {"none": None, "missing": str(tmp_path / "missing"),
              "full": _shared_dir(tmp_path)}[where]
    if where == "full":
        real = os.statvfs

        def full(path):
            found = real(path)
            return os.statvfs_result((found.f_bsize, found.f_frsize, found.f_blocks, 0, 0,
                                      *found[5:]))
        monkeypatch.setattr(os, "statvfs", full)
    files = []
    monkeypatch.setattr(protocol, "_read_file", lambda *args: files.append(args))
    message = {"x": torch.randn(1 << 20)}
    writer = threading.Thread(target=protocol.write_message, args=(write_fd, message, shared))
    writer.start()
    back = protocol.read_message(read_fd, time.monotonic() + 30, shared)
    writer.join()
    assert torch.equal(back["x"], message["x"]) and files == []  # the pipe carried it
    if where == "full":
        assert os.listdir(shared) == []


@pytest.mark.parametrize("kind", ["sparse", "shorter than it says", "fifo", "directory"])
def test_a_frame_naming_something_other_than_the_file_it_says_is_refused(tmp_path, pipe, kind):
    # A sparse file would make the reader allocate what the writer never stored; a FIFO
    # opened without O_NONBLOCK would hang it.
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    target = Path(shared) / "message-x"
    nbytes = 1 << 20
    if kind == "sparse":
        target.touch()
        os.truncate(target, nbytes)
    elif kind == "shorter than it says":
        target.write_bytes(b"x" * 100)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    os.write(write_fd, _frame_naming(b"message-x", nbytes))
    with pytest.raises(protocol.MessageRefused, match="plain file"):
        protocol.read_message(read_fd, time.monotonic() + 10, shared)
    if kind != "directory":
        assert not target.exists()  # removed as soon as it was opened


def test_a_message_file_holds_raw_tensor_bytes_after_the_message(tmp_path, pipe):
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    padded = torch.arange(40, dtype=torch.bfloat16).as_strided((3, 4), (10, 1), 5)
    message = {"a": [padded, (torch.ones(1 << 19, dtype=torch.int64), "x")], "n": 3}
    protocol.write_message(write_fd, message, shared)
    (name,) = os.listdir(shared)
    data = (Path(shared) / name).read_bytes()
    assert data.endswith(torch.ones(1 << 19, dtype=torch.int64).numpy().tobytes())
    back = protocol.read_message(read_fd, time.monotonic() + 10, shared)
    assert back["n"] == 3 and back["a"][1][1] == "x" and torch.equal(back["a"][0], padded)
    assert back["a"][0].stride() == (10, 1) and back["a"][0].storage_offset() == 5
    assert torch.equal(back["a"][1][0], torch.ones(1 << 19, dtype=torch.int64))


@pytest.mark.parametrize("lie", ["more bytes than the file", "a view past its bytes",
                                 "a marker past the table", "a table that is not one",
                                 "more tensors than markers", "a marker used twice",
                                 "a shape past any size", "a list inside itself, deep"])
def test_a_message_file_whose_parts_disagree_is_refused(tmp_path, pipe, lie):
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    raw = torch.zeros(64, dtype=torch.uint8)
    table = [(torch.float32, (4, 4), (4, 1), 0, 64)]
    marker = protocol._marker(0)
    if lie == "more bytes than the file":
        table = [(torch.float32, (4, 4), (4, 1), 0, 128)]
    elif lie == "a view past its bytes":
        table = [(torch.float32, (4, 4), (8, 1), 0, 64)]
    elif lie == "a marker past the table":
        marker = protocol._marker(1)
    elif lie == "a table that is not one":
        table = [(torch.float32, (4, 4), (4, 1), 0, "64")]
    elif lie == "more tensors than markers":  # a million of these would cost a GB to read
        table += [(torch.uint8, (0,), (1,), 0, 0)] * 1000
    elif lie == "a marker used twice":
        marker = [marker, marker]
    elif lie == "a shape past any size":
        table = [(torch.float32, (1 << 70, 4), (4, 1), 0, 64)]
    elif lie == "a list inside itself, deep":
        for _ in range(1200):  # past the reader's limit, inside Python 3.12's for pickling
            marker = [marker]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))  # for torch.save of it; the reader keeps its own
    try:
        data = protocol.encode({"message": {"x": marker}, "tensors": table}) + \
            raw.numpy().tobytes()
    finally:
        sys.setrecursionlimit(limit)
    (Path(shared) / "message-x").write_bytes(data)
    os.write(write_fd, _frame_naming(b"message-x", len(data)))
    with pytest.raises(protocol.MessageRefused, match="message file"):
        protocol.read_message(read_fd, time.monotonic() + 10, shared)
    assert os.listdir(shared) == []


def test_a_message_file_that_refers_to_one_list_many_times_is_read_at_once(tmp_path, pipe):
    # 40 levels of [x, x] pickle to a few hundred bytes: rebuilt as a tree, 2**40 lists.
    read_fd, write_fd = pipe
    shared = _shared_dir(tmp_path)
    nested = [protocol._marker(0)]
    for _ in range(40):
        nested = [nested, nested]
    raw = torch.arange(16, dtype=torch.float32)
    data = protocol.encode({"message": {"x": nested},
                            "tensors": [(torch.float32, (16,), (1,), 0, 64)]}) \
        + raw.numpy().tobytes()
    (Path(shared) / "message-x").write_bytes(data)
    os.write(write_fd, _frame_naming(b"message-x", len(data)))
    started = time.monotonic()
    back = protocol.read_message(read_fd, time.monotonic() + 10, shared)
    assert time.monotonic() - started < 5
    inner = back["x"]
    for _ in range(40):
        assert inner[0] is inner[1]
        inner = inner[0]
    assert torch.equal(inner[0], raw)


def test_outputs_a_reply_refers_to_many_times_are_built_once():
    field = {"kind": "plain", "value": 1}
    for _ in range(40):  # rebuilt as a tree: 2**40 sequences
        field = {"kind": "sequence", "items": [field, field], "tuple": False}
    started = time.monotonic()
    built = proxy._Outputs().build(field, [])
    assert time.monotonic() - started < 5
    for _ in range(40):
        assert built[0] is built[1]
        built = built[0]
    assert built == 1


def test_a_shared_directory_swapped_for_a_link_is_refused(tmp_path, pipe):
    read_fd, write_fd = pipe
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "message-x").write_bytes(protocol.encode({"x": 1})[8:])
    os.symlink(elsewhere, tmp_path / "shared")
    os.write(write_fd, _frame_naming(b"message-x", (elsewhere / "message-x").stat().st_size))
    with pytest.raises(protocol.MessageRefused, match="cannot be opened"):
        protocol.read_message(read_fd, time.monotonic() + 10, str(tmp_path / "shared"))
    assert (elsewhere / "message-x").exists()


def test_shared_directories_of_verifiers_that_are_gone_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(proxy, "SHARED_ROOT", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    orphaned = tmp_path / f"{proxy.SHARED_PREFIX}{ended.pid}-abc"
    alive = tmp_path / f"{proxy.SHARED_PREFIX}{os.getppid()}-abc"
    # A verifier in another PID namespace: its pid means nothing here, its lock is held.
    elsewhere = tmp_path / f"{proxy.SHARED_PREFIX}{ended.pid}-def"
    # Just made elsewhere, not locked yet: too young to be taken for an orphan.
    young = tmp_path / f"{proxy.SHARED_PREFIX}{ended.pid}-ghi"
    other = tmp_path / "someone-elses"
    for path in (orphaned, alive, elsewhere, young, other):
        path.mkdir()
        (path / "message-1").write_bytes(b"x")
    old = time.time() - 10 * proxy.ORPHAN_AGE_S
    for path in (orphaned, alive, elsewhere):
        os.utime(path, (old, old))
    held = os.open(elsewhere, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    made = proxy.make_shared_dir()
    try:
        assert made is not None and Path(made).parent == tmp_path
        assert Path(made).name.startswith(f"{proxy.SHARED_PREFIX}{os.getpid()}-")
        assert not orphaned.exists()
        assert alive.exists() and elsewhere.exists() and young.exists() and other.exists()
        assert proxy._lock(made) is None  # locked while this process may use it
        os.close(held)  # that verifier is gone now: its directory goes at the next sweep
        proxy._remove_orphaned_shared_dirs()
        assert not elsewhere.exists() and young.exists() and Path(made).exists()
    finally:
        proxy.remove_shared_dir(made)
    assert not Path(made).exists()


# ---------------------------------------------------------------- the tamper check


def test_the_snapshot_sees_nothing_after_an_honest_check():
    import rmsnorm_variants as kernels

    snapshot = tamper.Snapshot.take()
    check.rmsnorm_forward(kernels.correct, quiet=True)
    assert snapshot.changes() == []


@pytest.mark.parametrize("what, patch", [
    ("course.check.rmsnorm_forward",
     lambda m: m.setattr(check, "rmsnorm_forward", lambda *a, **k: None)),
    ("sys.modules['course.check']",
     lambda m: m.setitem(sys.modules, "course.check", type(sys)("course.check"))),
    ("torch.allclose", lambda m: m.setattr(torch, "allclose", lambda *a, **k: True)),
    ("torch.testing.assert_close",
     lambda m: m.setattr(torch.testing, "assert_close", lambda *a, **k: None)),
    ("time.perf_counter", lambda m: m.setattr(time, "perf_counter", lambda: 0.0)),
    ("torch.cuda.Event.elapsed_time",
     lambda m: m.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 1.0)),
    ("builtins.pow", lambda m: m.setattr("builtins.pow", lambda *a: 0)),
    ("course.check.sandbox.CallRecord.merge_remote",
     lambda m: m.setattr(sandbox.CallRecord, "merge_remote", lambda *a: None)),
    ("COURSE_GRADING", lambda m: m.setenv("COURSE_GRADING", "0")),
    # Each object is looked up again where the snapshot found it: a watched class by its
    # name, a course class in its module, a method in its class, a module in sys.modules.
    ("class triton.runtime.jit:JITFunction was replaced", lambda m: m.setattr(
        "triton.runtime.jit.JITFunction", type("JITFunction", (_jit.JITFunction,), {}))),
    ("class course.check.sandbox:CallRecord was replaced", lambda m: m.setattr(
        sandbox, "CallRecord", type("CallRecord", (sandbox.CallRecord,), {}))),
    ("course.check.sandbox.CallRecord.merge_remote was replaced or deleted",
     lambda m: m.delattr(sandbox.CallRecord, "merge_remote")),
    ("sys.modules['course.check.sandbox'] was replaced or deleted",
     lambda m: m.delitem(sys.modules, "course.check.sandbox")),
    ("sys.modules was replaced", lambda m: m.setattr(sys, "modules", dict(sys.modules))),
    ("course.verify.tamper.describe was rewritten",
     lambda m: m.setattr(tamper.describe, "__code__", (lambda changes, limit=5: "").__code__)),
])
def test_the_snapshot_names_what_was_replaced(monkeypatch, what, patch):
    snapshot = tamper.Snapshot.take()
    patch(monkeypatch)
    found = [str(c) for c in snapshot.changes()]
    assert any(what in c for c in found), found


def test_the_snapshot_names_a_course_class_renamed_in_place():
    snapshot = tamper.Snapshot.take()
    kept = sandbox.CallRecord.__qualname__
    sandbox.CallRecord.__qualname__ = "SomethingElse"  # not in the class's dict: set back
    try:
        found = [str(c) for c in snapshot.changes()]
    finally:
        sandbox.CallRecord.__qualname__ = kept
    assert "class course.check.sandbox:CallRecord was renamed (its __qualname__ changed)" \
        in found, found
    assert snapshot.changes() == []


def test_additions_and_plain_settings_are_not_tampering(monkeypatch):
    snapshot = tamper.Snapshot.take()
    monkeypatch.setattr(torch, "my_new_helper", lambda: 1, raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    torch.manual_seed(3)
    assert snapshot.changes() == []


# ---------------------------------------------------------------- the learner's process


def started_learner(where: Path, source: str) -> Learner:
    """A learner's process in `where`, as the autograder starts it, that ran `source`."""
    process = LearnerProcess(cwd=where, env=dict(os.environ, COURSE_GRADING="1"),
                             log_path=where / "learner.log")
    process.start()
    found = Learner(process)
    found.run_cell(source, "setup")
    return found


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    found = started_learner(tmp_path_factory.mktemp("learner"), textwrap.dedent('''
        import os, time, torch

        def scale(x, factor=2.0):
            return x * factor

        def address(x):
            return x.data_ptr()

        def writes_in_place(x):
            x.add_(1)
            return x.sum()

        _kept = torch.ones(3)

        def kept(x):
            return _kept

        def same(x):
            return x

        def picky(x):
            raise ValueError("no thank you")

        def spins():
            while True:
                time.sleep(0.01)

        class Double(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, dy):
                return dy * 2
        '''))
    yield found
    found.process.close()


def test_a_remote_function_returns_values_and_its_torch_ops_reach_the_watch(learner):
    fn = learner.function("scale")
    x = torch.arange(4.0)
    with sandbox.watch() as record:
        y = fn(x, factor=3.0)
    assert torch.equal(y, x * 3)
    assert [u.op for u in record.forbidden_ops] == ["aten.mul.Tensor"]
    assert not record.launches


def test_the_watch_here_learns_which_outputs_existed_before_the_call(learner):
    """Held before the call and not given to it: a result kept from an earlier call (an
    input returned, or a tensor an op made, is neither)."""
    x = torch.arange(3.0)
    for name, held in (("kept", True), ("same", False), ("scale", False)):
        with sandbox.watch() as record:
            record.note_arguments((x,))
            y = learner.function(name)(x)
        assert record.held_before(y) is held, name


def test_the_learners_exception_keeps_its_name_and_its_built_in_base(learner):
    with pytest.raises(ValueError, match="no thank you") as caught:
        learner.function("picky")(torch.ones(1))
    assert type(caught.value).__name__ == "ValueError"


def test_writes_into_an_argument_come_back_into_it(learner):
    x = torch.zeros(3)
    total = learner.function("writes_in_place")(x)
    assert torch.equal(x, torch.ones(3)) and float(total) == 3.0


def test_only_the_argument_storages_a_call_changed_come_back(learner):
    learner.run_cell("def writes_first(a, b):\n    a.add_(1)\n    return b * 1", "first")
    x, y = torch.zeros(3), torch.zeros(5)
    reply, _ = learner.ask({"op": "call", "name": "writes_first"}, (x, y[1:]))
    assert list(reply["storages_after"]) == [protocol.key_of(x).text()]
    assert torch.equal(x, torch.ones(3)) and torch.equal(y, torch.zeros(5))
    reply, _ = learner.ask({"op": "call", "name": "scale"}, (y,))
    assert reply["storages_after"] == {}


def test_the_same_tensor_reaches_the_same_buffer_refilled(learner):
    fn = learner.function("address")
    x = torch.zeros(8)
    first = fn(x)
    x.copy_(torch.arange(8.0))
    assert fn(x) == first
    assert fn(torch.zeros(16)) != first


def test_a_remote_autograd_function_differentiates(learner):
    double = learner.autograd_class("Double")
    x = torch.arange(3.0, requires_grad=True)
    double.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_a_request_past_its_deadline_is_interrupted_and_the_process_carries_on(learner):
    learner.process.deadline = time.monotonic() + 1.0
    with pytest.raises(CellTimedOut):
        learner.function("spins")()
    learner.process.deadline = None
    assert torch.equal(learner.function("scale")(torch.ones(2)), torch.full((2,), 2.0))


def test_an_interrupt_that_lands_before_the_request_begins_still_stops_it(learner):
    """A deadline that runs out while the learner's process has not yet read the request (a
    loaded machine: here it is stopped, and resumed once the interrupt is sent): the
    interrupt is sent again until it stops the request, and the process carries on."""
    pid = learner.process.process.pid
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
    learner.process.deadline = time.monotonic() + 1.0
    with pytest.raises(CellTimedOut):
        learner.function("spins")()
    learner.process.deadline = None
    assert learner.process.lost is None
    assert torch.equal(learner.function("scale")(torch.ones(2)), torch.full((2,), 2.0))


def test_names_are_described_by_kind(learner):
    assert learner.describe("scale")["kind"] == "callable"
    assert learner.describe("Double")["kind"] == "autograd"
    assert learner.describe("os")["kind"] == "module"
    assert learner.describe("nothing_here")["kind"] == "missing"


def test_a_process_that_exits_is_reported_lost(tmp_path):
    process = LearnerProcess(cwd=tmp_path, env=dict(os.environ), log_path=tmp_path / "log")
    process.start()
    learner = Learner(process)
    with pytest.raises(LearnerLost, match="died"):
        learner.run_cell("import os\nos._exit(3)", "exit")
    with pytest.raises(LearnerLost):
        learner.describe("x")


def test_large_arguments_and_outputs_travel_in_files_that_are_removed(learner, monkeypatch):
    shared = learner.process.shared_dir
    if shared is None:
        pytest.skip("no shared memory here: every message goes through the pipes")
    read_files = []
    read_file = protocol._read_file
    monkeypatch.setattr(protocol, "_read_file",
                        lambda *args: read_files.append(args) or read_file(*args))
    x = torch.randn(1 << 20)
    assert torch.equal(learner.function("scale")(x), x * 2)
    assert len(read_files) == 1 and os.listdir(shared) == []  # the reply came in a file


def test_a_learners_shared_directory_goes_with_its_process(tmp_path):
    process = LearnerProcess(cwd=tmp_path, env=dict(os.environ), log_path=tmp_path / "log")
    process.start()
    shared = process.shared_dir
    if shared is None:
        process.close()
        pytest.skip("no shared memory here: every message goes through the pipes")
    assert os.path.isdir(shared) and Path(shared).parent == Path(proxy.SHARED_ROOT)
    process.close()
    assert process.shared_dir is None and not os.path.exists(shared)


# ---------------------------------------------------------------- verify, end to end


def test_free_names_are_the_names_a_cell_reads_without_binding():
    source = "from course import check\n_x = f(2)\nfor i in range(3):\n    g(i, _x, h)\n"
    assert free_names(source) == ["f", "range", "g", "h"]


def _cell(source: str, grade_id: str | None = None, *, solution: bool = False,
          points: int | None = None):
    cell = nbformat.v4.new_code_cell(source)
    if grade_id is not None:
        cell.metadata["nbgrader"] = {"grade_id": grade_id, "grade": points is not None,
                                     "solution": solution, "locked": not solution,
                                     "schema_version": 3, **({"points": points} if points
                                                              else {})}
    return cell


def _chapter(add_code: str, mul_code: str):
    """A source notebook (answers given) of two exercises, and a learner's notebook."""
    cells = [
        _cell("import torch\nfrom course import check\nimport course"),
        _cell(add_code, "ex01_add_code", solution=True),
        _cell("assert add(2, 3) == 5\nassert torch.equal(add(torch.ones(2), torch.ones(2)), "
              "torch.full((2,), 2.0))", "ex01_add", points=2),
        _cell(mul_code, "ex02_mul_code", solution=True),
        _cell("assert mul(2, 3) == 6\n_g = torch.Generator().manual_seed(7)\n"
              "_x = torch.randn(4, generator=_g)\nassert torch.equal(mul(_x, 1.0), _x)",
              "ex02_mul", points=3),
    ]
    return nbformat.v4.new_notebook(cells=cells)


ADD = "def add(a, b):\n    return a + b\n"
MUL = "def mul(a, b):\n    return a * b\n"


@pytest.fixture(scope="module")
def source_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "ch99_small.ipynb"
    nbformat.write(_chapter(ADD, MUL), path)
    return path


def _verify(tmp_path, source_path, add_code=ADD, mul_code=MUL, timeout=60) -> Verdict:
    submitted = tmp_path / "submitted.ipynb"
    nbformat.write(_chapter(add_code, mul_code), submitted)
    verdict = verify(submitted, source_path, cell_timeout_s=timeout)
    Verdict.from_json(verdict.to_json())  # it round-trips
    return verdict


def _points(verdict: Verdict) -> dict[str, float]:
    return {c.grade_id: c.points for c in verdict.cells}


@pytest.mark.slow
def test_a_correct_submission_gets_every_point(tmp_path, source_path):
    verdict = _verify(tmp_path, source_path)
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 3}, verdict.to_json()
    assert verdict.tampering == [] and verdict.lost == []
    # Every code cell's time, in notebook order (the unnamed first cell by its place).
    assert [cell for cell, _ in verdict.cell_seconds] == \
        ["cell 1", "ex01_add_code", "ex01_add", "ex02_mul_code", "ex02_mul"]
    assert 0 < sum(s for _, s in verdict.cell_seconds) <= verdict.seconds
    assert "slowest cells: " in summary(verdict)


@pytest.mark.slow
def test_a_verifier_started_ahead_waits_for_go_and_verifies_none_without_it(tmp_path,
                                                                            source_path):
    # The grader starts it while nbgrader runs the chapter (grader/instructor.py): it may
    # run nothing of the submission before "go", and nothing at all if the grader gives up.
    submitted, ran = tmp_path / "submitted.ipynb", tmp_path / "ran"
    nbformat.write(_chapter(ADD, f"import pathlib\npathlib.Path({str(ran)!r}).touch()\n" + MUL),
                   submitted)
    command = [sys.executable, "-m", "course.verify", str(source_path), "--after-go",
               "--submission", str(submitted), str(tmp_path / "verdict.json")]
    waiting = subprocess.Popen(command, stdin=subprocess.PIPE, cwd=tmp_path)
    time.sleep(3)  # long enough to have run the cell, had it not waited
    assert waiting.poll() is None and not ran.exists()
    waiting.stdin.close()  # the grader gave up: no verdict, no submission code run
    assert waiting.wait(timeout=120) == 0
    assert not (tmp_path / "verdict.json").exists() and not ran.exists()
    done = subprocess.run(command, input=b"go\n", cwd=tmp_path, timeout=300)
    assert done.returncode == 0
    verdict = Verdict.from_json((tmp_path / "verdict.json").read_text())
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 3} and ran.exists()


@pytest.mark.slow
def test_a_wrong_answer_loses_its_own_cell_with_the_reason(tmp_path, source_path):
    verdict = _verify(tmp_path, source_path, mul_code="def mul(a, b):\n    return a + b\n")
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 0}
    assert verdict.cells[1].reason.startswith("AssertionError")


@pytest.mark.slow
def test_tampering_costs_every_cell_from_where_it_happened(tmp_path, source_path):
    patch = "\nimport course.check\ncourse.check.rmsnorm_forward = lambda *a, **k: None\n"
    verdict = _verify(tmp_path, source_path, mul_code=MUL + patch)
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 0}
    assert verdict.cells[1].status == "tampering"
    assert "course.check.rmsnorm_forward was replaced" in verdict.cells[1].reason
    assert verdict.tampering[0]["cell"] == "ex02_mul_code"


@pytest.mark.slow
def test_hiding_every_error_in_the_notebook_changes_nothing(tmp_path, source_path):
    hide = "\nget_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n"
    verdict = _verify(tmp_path, source_path, add_code="def add(a, b):\n    return 0\n" + hide)
    assert _points(verdict) == {"ex01_add": 0, "ex02_mul": 3}


@pytest.mark.slow
@pytest.mark.parametrize("add_code, reason", [
    ("def add(a, b):\n    return a +\n", "name 'add' is not defined"),       # a syntax error
    ("def plus(a, b):\n    return a + b\n", "name 'add' is not defined"),    # a wrong name
])
def test_a_cell_that_defines_nothing_costs_its_own_exercise_only(tmp_path, source_path,
                                                                   add_code, reason):
    verdict = _verify(tmp_path, source_path, add_code=add_code)
    assert _points(verdict) == {"ex01_add": 0, "ex02_mul": 3}
    assert reason in verdict.cells[0].reason


@pytest.mark.slow
def test_a_cell_that_kills_its_process_costs_its_own_exercise_only(tmp_path, source_path):
    verdict = _verify(tmp_path, source_path, add_code="import os\nos._exit(7)\n" + ADD)
    assert _points(verdict) == {"ex01_add": 0, "ex02_mul": 3}, verdict.to_json()
    assert any("died" in why for why in verdict.lost)


@pytest.mark.slow
def test_what_a_learners_cell_printed_comes_back_without_the_traceback(tmp_path, source_path):
    code = 'print("defining add")\n' + ADD + "print(1 / 0)\n"
    verdict = _verify(tmp_path, source_path, add_code=code)
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 3}
    assert verdict.learner_output == [{"cell": "ex01_add_code", "output": "defining add\n"}]
    assert [e["cell"] for e in verdict.learner_errors] == ["ex01_add_code"]
    assert verdict.learner_errors[0]["error"].startswith("ZeroDivisionError: division by zero")


@pytest.mark.slow
def test_a_test_cell_after_a_lost_process_calls_the_new_one(tmp_path):
    """The second test cell reads `add` too, whose stand-in the first made: it must call
    the process started after the first one died, not report the dead one as lost."""
    nb = _chapter(ADD, MUL)
    nb.cells[4].source = "assert mul(add(1, 1), 3) == 6"
    source = tmp_path / "ch99_small.ipynb"
    nbformat.write(nb, source)
    nb.cells[1].source = ("import os\ndef add(a, b):\n    if (a, b) == (2, 3):\n"
                          "        os._exit(7)\n    return a + b\n")
    submitted = tmp_path / "submitted.ipynb"
    nbformat.write(nb, submitted)
    verdict = verify(submitted, source, cell_timeout_s=60)
    assert _points(verdict) == {"ex01_add": 0, "ex02_mul": 3}, verdict.to_json()
    assert verdict.cells[0].status == "lost" and "died" in verdict.cells[0].reason


@pytest.mark.slow
def test_a_function_that_hangs_is_stopped_at_the_time_limit(tmp_path, source_path):
    hang = "def mul(a, b):\n    while True:\n        pass\n"
    verdict = _verify(tmp_path, source_path, mul_code=hang, timeout=5)
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 0}
    assert "CellTimeoutError" in verdict.cells[1].reason


@pytest.mark.slow
def test_a_learners_cell_that_hangs_is_stopped_and_says_so(tmp_path, source_path):
    verdict = _verify(tmp_path, source_path, add_code="while True:\n    pass\n" + ADD, timeout=5)
    assert _points(verdict) == {"ex01_add": 0, "ex02_mul": 3}
    assert verdict.learner_errors[0] == {"cell": "ex01_add_code",
                                         "error": "CellTimeoutError: stopped after 5 s"}


@pytest.mark.slow
def test_a_fixed_seed_in_a_test_cell_cannot_be_predicted(tmp_path, source_path):
    guess = ("import torch\n_known = torch.randn(4, generator=torch.Generator().manual_seed(7))"
             "\ndef mul(a, b):\n    return _known if isinstance(a, torch.Tensor) else a * b\n")
    verdict = _verify(tmp_path, source_path, mul_code=guess)
    assert _points(verdict) == {"ex01_add": 2, "ex02_mul": 0}


def test_course_imports_come_from_the_source_only(source_path):
    source = nbformat.read(source_path, as_version=4)
    assert course_imports(source) == "import torch\nfrom course import check\nimport course"


# ---------------------------------------------------------------- timing by replay

# A wrapper as learners write them: a kernel calling a helper kernel, a global constexpr,
# a workspace it zeroes, a launch option, a grid given as a function of the launch's
# arguments. (Interpreter mode here: the replay runs the kernel's body in this process,
# which the verifier never does; on a GPU the replay compiles it.)
REPLAYED = '''
import torch
import triton
import triton.language as tl

SCALE = tl.constexpr(2.0)


@triton.jit
def _twice(v):
    return v * SCALE


@triton.jit
def scaled_sum_kernel(x_ptr, y_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = _twice(tl.load(x_ptr + offs, mask=mask, other=0.0))
    tl.store(y_ptr + offs, y, mask=mask)
    tl.atomic_add(total_ptr, tl.sum(y, axis=0))


def scaled_sum(x):
    y = torch.empty_like(x)
    total = torch.zeros(1, dtype=torch.float32, device=x.device)
    grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731
    scaled_sum_kernel[grid](x, y, total, x.numel(), BLOCK=64, num_warps=2)
    return y, total
'''


def test_a_traced_call_replays_here_on_new_inputs(learner):
    from course.verify.replay import Replay

    learner.run_cell(REPLAYED, "replayed")
    fn = learner.function("scaled_sum")
    replay = fn.replayed((torch.randn(300, device=course.DEVICE),))
    assert isinstance(replay, Replay)
    x = torch.randn(300, device=course.DEVICE)
    y, total = replay(x)
    assert torch.allclose(y, 2 * x) and torch.allclose(total, (2 * x).sum(), atol=1e-4)


def test_a_call_that_launches_nothing_has_nothing_to_replay(learner):
    from course.verify.replay import NotReplayable

    with pytest.raises(NotReplayable, match="launched no kernel"):
        learner.function("scale").replayed((torch.ones(4),))


def test_a_speed_check_times_the_replay_not_the_learners_process(learner):
    from course.check.bandwidth import timed_here

    learner.run_cell(REPLAYED, "replayed")
    fn = learner.function("scaled_sum")
    here = timed_here("scaled_sum", fn, lambda: (torch.randn(128, device=course.DEVICE),))
    assert not isinstance(here, type(fn))
    assert timed_here("plain", len, lambda: ()) is len


ADDRESS_CACHE = '''
_by_address = {}


def cached_by_address(x, w, eps=1e-6):
    key = (x.data_ptr(), w.data_ptr(), tuple(x.shape))
    if key not in _by_address:
        _by_address[key] = correct(x, w, eps)
    return _by_address[key]
'''


@pytest.fixture
def variants(learner):
    from pathlib import Path

    learner.run_cell((Path(__file__).parent / "rmsnorm_variants.py").read_text(), "variants")
    learner.run_cell(ADDRESS_CACHE, "address cache")
    return learner


@pytest.fixture
def fake_timer(monkeypatch):
    """bench.measure runs the real rotation of calls, and reports 90 % of a pretend copy
    bandwidth (there is no GPU clock here)."""
    from course import bench, hardware

    timed: list = []

    def measure(label, fn, make_args, nbytes, *, reps=100, warmup=10, hide_launch=False):
        timed.append(label)
        bench.time_rotating(fn, make_args, nbytes, warmup=2, reps=reps)
        return bench.Measurement(label, nbytes / (0.9 * 2e12), nbytes, 2e12)

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(hardware, "copy_bandwidth", lambda nbytes=None: 2e12)
    return timed


def _speed_check(fn):
    from course import reference
    from course.check.bandwidth import CallSpec, timed_bandwidth_check

    spec = CallSpec(("y",), lambda x, w: reference.rmsnorm(x, w, eps=1e-6), (torch.float32,))

    def make_args():
        return (torch.randn(64, 256, device=course.DEVICE),
                torch.rand(256, device=course.DEVICE) + 0.5)

    return timed_bandwidth_check("remote", fn, make_args, 10**6, spec, target=0.75, reps=4)


def test_a_speed_check_of_a_learners_function_times_its_replay_here(variants, fake_timer,
                                                                      monkeypatch):
    requests = []
    ask = variants.process.request
    monkeypatch.setattr(variants.process, "request", lambda message: requests.append(
        (message.get("op"), bool(message.get("trace")))) or ask(message))
    in_timing = []
    from course import bench

    measure = bench.measure
    monkeypatch.setattr(bench, "measure", lambda *a, **k: (
        in_timing.append(len(requests)), measure(*a, **k), in_timing.append(len(requests)))[1])
    result = _speed_check(variants.function("correct"))
    assert result.passed and fake_timer == ["remote"]
    assert in_timing[0] == in_timing[1], "the learner's process was asked while timing"
    # before: a watched call, traced (the call checked is the call timed), then the same
    # tensors refilled; after: one call
    assert requests == [("call", True), ("call", False), ("call", False)]


def test_a_learners_address_cache_is_refused_at_the_timing_shape(variants, fake_timer):
    with pytest.raises(AssertionError, match="cached by the input's address"):
        _speed_check(variants.function("cached_by_address"))


def test_a_trace_naming_a_reference_kernel_is_not_replayed():
    """The learner's process reports the kernels a call launched: one that is the course's
    own is refused by the verifier itself, whatever the learner's process let through."""
    import inspect as _inspect

    from course.verify.replay import NotReplayable, Replay

    from solutions.kernels import column_sums

    source = _inspect.getsource(column_sums.column_sums_kernel.fn)
    bundle = {"name": "column_sums_kernel", "source": source.replace("@triton.jit\n", ""),
              "globals": {}, "options": {}}
    trace = {"steps": [{"op": "launch", "kernel": "k", "grid": (1,), "args": {},
                        "options": {}}], "kernels": {"k": bundle}, "outputs": {"plain": None},
             "refused": None}
    with pytest.raises(NotReplayable, match="a copy of `solutions.kernels.column_sums"):
        Replay(trace, [])


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_verifier_ends_with_the_grading_process_that_started_it():
    # The verifier runs in a session of its own; a grading worker killed for running past
    # its limit must not leave it measuring on the GPU (the learner's process likewise ends
    # with its verifier). A stand-in parent starts a child that asks for it, and is killed.
    child = ("from course.verify.protocol import die_with_parent; die_with_parent(); "
             "print('ready', flush=True); import time; time.sleep(120)")
    parent = (f"import subprocess, sys, time\n"
              f"c = subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True,"
              f" stdout=subprocess.PIPE, text=True)\n"
              f"assert c.stdout.readline().strip() == 'ready'\n"
              f"print(c.pid, flush=True)\n"
              f"time.sleep(120)\n")
    started = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    child_pid = int(started.stdout.readline())
    assert _running(child_pid)
    started.kill()
    started.wait()
    deadline = time.monotonic() + 10
    while _running(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child_pid), "the child outlived the process that started it"


def test_a_described_value_a_reply_refers_to_many_times_is_built_once():
    from course.verify.verifier import _value

    field = {"plain": 1}
    for _ in range(40):  # rebuilt as a tree: 2**40 sequences
        field = {"sequence": [field, field], "tuple": False}
    started = time.monotonic()
    built = _value(field)
    assert time.monotonic() - started < 5
    for _ in range(40):
        assert built[0] is built[1]
        built = built[0]
    assert built == 1
