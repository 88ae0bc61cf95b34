"""Programs that share a row: publish a partial sum, wait for the row's other programs.

A row too long for one program's registers is split over SPLIT programs. Each publishes its
partial sums with atomics (which go to L2, where every program sees them), counts itself in
with a release, and spins until the count reaches SPLIT. This relies on the GPU starting
programs in order of their index, so the SPLIT programs of a row (adjacent indices) are
resident together and none waits on a sibling that cannot start. GPU only: Triton's
interpreter runs programs one after another, and the first to wait would wait forever.
The partials are then read back in a fixed order, so results do not vary from run to run.

Each program then counts itself out, and the last of a row's SPLIT programs to leave sets
the row's counter back to zero. The counters are therefore at zero between launches, and one
buffer per device and stream (`arrival_counters`) serves every launch without a memset:
that memset cost about 1 % of a 180 us launch.
"""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
import triton
import triton.language as tl


@triton.jit
def publish(slot_ptr, value):
    tl.atomic_xchg(slot_ptr, value, sem="relaxed")


@triton.jit
def arrive(arrived_ptr):
    """Count this program in, after (release) the partial sums it has published."""
    tl.atomic_add(arrived_ptr, 1, sem="release")


@triton.jit
def arrive_and_wait(arrived_ptr, SPLIT: tl.constexpr):
    arrive(arrived_ptr)
    wait_for_siblings(arrived_ptr, SPLIT)


@triton.jit
def wait_for_siblings(arrived_ptr, SPLIT: tl.constexpr):
    """Spin until SPLIT programs have counted themselves in at `arrived_ptr`."""
    # Polling with an atomic (one thread, acquire) measured faster on an H100 than polling
    # with volatile loads, which every thread of the program issues.
    arrived = tl.atomic_add(arrived_ptr, 0, sem="acquire")
    while arrived < SPLIT:
        arrived = tl.atomic_add(arrived_ptr, 0, sem="acquire")


@triton.jit
def leave(arrived_ptr, SPLIT: tl.constexpr):
    """Count this program out, once it has read the row's partials; the last of the SPLIT
    programs to leave returns the counter to zero, ready for the next launch."""
    if tl.atomic_add(arrived_ptr, 1, sem="relaxed") == 2 * SPLIT - 1:
        tl.atomic_xchg(arrived_ptr, 0, sem="relaxed")


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
    """`rows` int32 counters at zero, from a buffer kept per device and stream: the kernels
    leave every counter they use at zero (`leave`), so it is zeroed only when it is made.
    Launches on one stream run one after another, so they never share a counter at the same
    time. A launch being captured into a CUDA graph gets a fresh buffer, zeroed in the graph."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(rows, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch.cuda.current_stream(index).cuda_stream)
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < rows:
        counters = torch.zeros(triton.next_power_of_2(rows), dtype=torch.int32, device=device)
        _COUNTERS[key] = counters
    return counters[:rows]
