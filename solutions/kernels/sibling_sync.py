"""Programs that share a row: publish a partial sum, wait for the row's other programs.

A row too long for one program's registers is split over SPLIT programs. Each publishes its
partial sums with atomics (which go to L2, where every program sees them), counts itself in
with a release, and spins until the count reaches SPLIT. This relies on the GPU starting
programs in order of their index, so the SPLIT programs of a row (adjacent indices) are
resident together and none waits on a sibling that cannot start. GPU only: Triton's
interpreter runs programs one after another, and the first to wait would wait forever.
The partials are then read back in a fixed order, so results do not vary from run to run.

The counters are never reset. Each launch adds exactly QUANTUM to every counter it uses
(each of a row's SPLIT programs adds QUANTUM / SPLIT), so between launches every counter is
a multiple of QUANTUM, and a program finds where its launch started by rounding down what
it saw when it arrived. One buffer per device and stream (`arrival_counters`) therefore
serves every launch with no memset before it and no extra atomic after the wait. Counters
wrap around at 2**32 harmlessly: only differences under QUANTUM are compared.
"""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
import triton
import triton.language as tl

QUANTUM = tl.constexpr(1 << 16)  # a launch's total per counter; SPLIT must divide it


@triton.jit
def publish(slot_ptr, value):
    tl.atomic_xchg(slot_ptr, value, sem="relaxed")


@triton.jit
def arrive(arrived_ptr, SPLIT: tl.constexpr):
    """Count this program in, after (release) the partial sums it has published. Returns
    the counter's value when this launch began and the value this program left."""
    before = tl.atomic_add(arrived_ptr, QUANTUM // SPLIT, sem="acq_rel")
    return before & -QUANTUM, before + QUANTUM // SPLIT


@triton.jit
def wait_for_siblings(arrived_ptr, start, seen):
    """Spin until the counter has risen by QUANTUM since `start`: every program is in. The
    last to arrive saw that already (`seen`) and never polls."""
    # Polling with an atomic (one thread, acquire) measured faster on an H100 than polling
    # with volatile loads, which every thread of the program issues.
    while seen - start < QUANTUM:
        seen = tl.atomic_add(arrived_ptr, 0, sem="acquire")


@triton.jit
def arrive_and_wait(arrived_ptr, SPLIT: tl.constexpr):
    start, seen = arrive(arrived_ptr, SPLIT)
    wait_for_siblings(arrived_ptr, start, seen)


@triton.jit
def read_partials(slots_ptr, SPLIT: tl.constexpr):
    """The SPLIT published values, read where the atomics left them (adding 0.0 reads L2)."""
    return tl.atomic_add(slots_ptr + tl.arange(0, SPLIT), tl.zeros([SPLIT], dtype=tl.float32),
                         sem="relaxed")


def next_power_of_2_split(n_cols: int, block: int) -> int:
    """Programs per row: a power of two (tl.arange needs one) covering n_cols in blocks."""
    return triton.next_power_of_2(triton.cdiv(n_cols, block))


_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def arrival_counters(rows: int, device: torch.device) -> torch.Tensor:
    """`rows` arrival counters from a buffer kept per device and stream, zeroed only when it
    is made (see the module docstring). Launches on one stream run one after another, so
    they never share a counter at the same time. A launch being captured into a CUDA graph
    gets a buffer of its own, zeroed inside the graph."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(rows, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch.cuda.current_stream(index).cuda_stream)
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < rows:
        counters = torch.zeros(triton.next_power_of_2(rows), dtype=torch.int32, device=device)
        _COUNTERS[key] = counters
    return counters[:rows]
