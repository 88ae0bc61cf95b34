"""The GPU lock (course.gpu_lock): chapters verified side by side share the GPU, and a
timing has it alone. Processes here stand for verifiers: each takes the lock as told and
prints when it got it and when it let go (CLOCK_MONOTONIC, one clock for all processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from course import gpu_lock

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock, as the grader uses it")


def _holder(lock: Path, script: str) -> subprocess.Popen:
    """A process that runs `script` with `held(release)`: say when it got the lock, hold it
    until the file `release` exists, say when it let go."""
    code = ("import os, time\nfrom course import gpu_lock\n"
            "print('ready', time.monotonic(), flush=True)\n"
            "def held(release):\n"
            "    print('in', time.monotonic(), flush=True)\n"
            "    while not os.path.exists(release):\n"
            "        time.sleep(0.01)\n"
            "    print('out', time.monotonic(), flush=True)\n" + script)
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ, **{gpu_lock.ENV: str(lock)}))
    assert _said(process, "ready")
    return process


def _said(process: subprocess.Popen, word: str) -> float:
    said, when = process.stdout.readline().split()
    assert said == word
    return float(when)


def test_cells_share_the_gpu_and_a_timing_waits_for_them_and_holds_new_ones_off(tmp_path):
    lock = tmp_path / "gpu.lock"
    first = _holder(lock, f"with gpu_lock.shared():\n    held({str(tmp_path / 'a')!r})\n")
    _said(first, "in")
    beside = _holder(lock, f"with gpu_lock.shared():\n    held({str(tmp_path / 'b')!r})\n")
    _said(beside, "in")  # a second cell runs beside the first
    (tmp_path / "b").touch()
    timing = _holder(lock, f"with gpu_lock.alone():\n    held({str(tmp_path / 't')!r})\n")
    time.sleep(0.5)  # the timing waits at the lock, the gate closed behind it
    late = _holder(lock, f"with gpu_lock.shared():\n    held({str(tmp_path / 'l')!r})\n")
    time.sleep(0.5)
    (tmp_path / "a").touch()
    first_out = _said(first, "out")
    timing_in = _said(timing, "in")
    (tmp_path / "t").touch()
    timing_out = _said(timing, "out")
    (tmp_path / "l").touch()
    late_in = _said(late, "in")
    for process in (first, beside, timing, late):
        process.communicate(timeout=60)
        assert process.returncode == 0
    assert timing_in >= first_out  # not while a cell ran
    assert late_in >= timing_out   # a cell that came while the timing waited went after it


def test_a_timing_inside_a_cell_gives_up_its_share_while_it_waits(tmp_path):
    # Two cells, each timing inside: each would wait for the other's share if it kept its
    # own, for ever.
    lock, release = tmp_path / "gpu.lock", tmp_path / "go"
    script = ("with gpu_lock.shared():\n    time.sleep(0.3)\n"
              f"    with gpu_lock.alone():\n        held({str(release)!r})\n"
              "    time.sleep(0.1)\n")
    one, two = _holder(lock, script), _holder(lock, script)
    release.touch()
    spans = []
    for process in (one, two):
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        spans.append([float(line.split()[1]) for line in out.splitlines()])
    a, b = sorted(spans)
    assert a[1] <= b[0]  # the timings took turns


def test_a_cell_gives_way_to_a_waiting_timing_between_two_requests(tmp_path):
    # The verifier gives way before each request to the learner's process: a timing waits
    # for the call in flight, not for the rest of the cell.
    lock, between = tmp_path / "gpu.lock", tmp_path / "between"
    cell = _holder(lock, "with gpu_lock.shared():\n"
                         "    print('in', time.monotonic(), flush=True)\n"
                         f"    while not os.path.exists({str(between)!r}):\n"
                         "        time.sleep(0.01)\n"
                         "    gpu_lock.give_way(lambda: print('settled', time.monotonic(), "
                         "flush=True))\n"
                         f"    held({str(tmp_path / 'c')!r})\n")
    _said(cell, "in")
    timing = _holder(lock, f"with gpu_lock.alone():\n    held({str(tmp_path / 't')!r})\n")
    time.sleep(0.5)  # the timing waits at the lock
    between.touch()
    settled = _said(cell, "settled")
    timing_in = _said(timing, "in")
    (tmp_path / "t").touch()
    timing_out = _said(timing, "out")
    back = _said(cell, "in")  # the rest of the cell, its share taken again
    (tmp_path / "c").touch()
    for process in (cell, timing):
        process.communicate(timeout=60)
        assert process.returncode == 0
    assert settled <= timing_in  # the cell's GPU work ended before the timing went
    assert back >= timing_out    # and it went on only after the timing


def test_giving_way_with_no_timing_waiting_keeps_the_share(tmp_path, monkeypatch):
    import fcntl

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    monkeypatch.setattr(gpu_lock, "_files", {})  # this test's own descriptors, closed after
    settled = []
    with gpu_lock.shared():
        gpu_lock.give_way(lambda: settled.append(True))
        fd = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # still held: a timing would wait
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert settled == []  # no one waited: nothing to let end first
    gpu_lock.give_way(lambda: settled.append(True))  # outside a cell: nothing to give
    assert settled == []
    for fd in gpu_lock._files.values():
        os.close(fd)


def test_without_a_lock_file_nothing_is_locked(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_lock.ENV, raising=False)
    with gpu_lock.shared(), gpu_lock.alone(), gpu_lock.shared():
        pass
    assert list(tmp_path.iterdir()) == [] and gpu_lock._files == {}


def test_the_learners_process_never_gets_the_lock_file(monkeypatch):
    from course.verify.verifier import _grading_env

    monkeypatch.setenv(gpu_lock.ENV, "/tmp/some.lock")
    assert gpu_lock.ENV not in _grading_env(Path("solutions/ch04_fused/ch04_fused.ipynb"))


def test_the_grader_names_the_same_variable():
    from grader_submissions import load_instructor

    assert load_instructor(ROOT, "instructor_for_the_lock").GPU_LOCK_ENV == gpu_lock.ENV


def test_every_timing_of_the_course_holds_the_gpu_alone(tmp_path, monkeypatch):
    import fcntl

    from course import bench

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    seen = []

    def probe():  # another open file of the lock, as another verifier has
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            seen.append("free")
        except BlockingIOError:
            seen.append("held alone")
        finally:
            os.close(fd)

    bench.time_fn(probe, warmup=1, reps=2)
    bench.time_back_to_back([probe], warmup=1, reps=1)
    assert seen and set(seen) == {"held alone"}
    probe()
    assert seen[-1] == "free"  # and let go after


def test_a_lock_held_by_something_else_fails_the_wait_after_patience(tmp_path, monkeypatch):
    # A submission's process runs as the grading user and can find the file and hold it:
    # the verifier's wait ends with LockTimeout (its cell fails), never hangs.
    import fcntl

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    monkeypatch.setattr(gpu_lock, "_files", {})
    monkeypatch.setattr(gpu_lock, "patience", 0.3)
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        for wait in (gpu_lock.shared, gpu_lock.alone):
            began = time.monotonic()
            with pytest.raises(gpu_lock.LockTimeout, match="not free within"):
                with wait():
                    pass
            assert 0.3 <= time.monotonic() - began < 5
    finally:
        os.close(holder)
        for fd in gpu_lock._files.values():
            os.close(fd)


def test_each_student_has_a_lock_file_of_their_own():
    from grader_submissions import load_instructor

    instructor = load_instructor(ROOT, "instructor_for_the_lock_files")
    alice, bob = instructor.gpu_lock_file("alice"), instructor.gpu_lock_file("bob")
    assert alice != bob and instructor.gpu_lock_file("alice") == alice
    assert Path(alice).parent == Path(bob).parent and Path(alice).parent.is_dir()
