"""Time one message of N MB (a uint8 tensor) from this process to another and back, through
the pipe and through a file in shared memory (course.verify.protocol).

    python scripts/message_bench.py [MB]     (default 256)
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from course.verify import protocol

import torch

ROUNDS = 3


def echo(read_fd: int, write_fd: int, shared_dir: str | None) -> None:
    """The other process: send every message back as it came."""
    while True:
        try:
            message = protocol.read_message(read_fd, shared_dir=shared_dir)
        except protocol.ChannelClosed:
            os._exit(0)
        protocol.write_message(write_fd, message, shared_dir=shared_dir)


def round_trips(megabytes: int, shared_dir: str | None) -> list[float]:
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(from_parent)
        os.close(to_parent)
        echo(to_child, from_child, shared_dir)
    os.close(to_child)
    os.close(from_child)
    message = {"x": torch.randint(0, 256, (megabytes << 20,), dtype=torch.uint8)}
    seconds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        protocol.write_message(from_parent, message, shared_dir=shared_dir)
        back = protocol.read_message(to_parent, shared_dir=shared_dir)
        seconds.append(time.perf_counter() - start)
        assert torch.equal(back["x"], message["x"])
    os.close(from_parent)
    os.close(to_parent)
    os.waitpid(pid, 0)
    return seconds


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    shared_dir = tempfile.mkdtemp(dir="/dev/shm", prefix="message-bench-")
    try:
        for way, where in (("pipe", None), ("shared memory", shared_dir)):
            seconds = round_trips(megabytes, where)
            print(f"{megabytes} MB there and back, {way:>13}: "
                  + ", ".join(f"{s:.2f}" for s in seconds) + " s")
        assert not os.listdir(shared_dir), "a message file was left behind"
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
