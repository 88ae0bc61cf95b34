"""Programs that share a row: publish a partial sum, wait for the row's other programs.

A row too long for one program's registers is split over SPLIT programs. Each publishes its
partial sums with atomics (which go to L2, where every program sees them), counts itself in
with a release, and spins until the count reaches SPLIT. This relies on the GPU starting
programs in order of their index, so the SPLIT programs of a row (adjacent indices) are
resident together and none waits on a sibling that cannot start. GPU only: Triton's
interpreter runs programs one after another, and the first to wait would wait forever.
The partials are then read back in a fixed order, so results do not vary from run to run.
"""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

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
def read_partials(slots_ptr, SPLIT: tl.constexpr):
    """The SPLIT published values, read where the atomics left them (adding 0.0 reads L2)."""
    return tl.atomic_add(slots_ptr + tl.arange(0, SPLIT), tl.zeros([SPLIT], dtype=tl.float32),
                         sem="relaxed")


def next_power_of_2_split(n_cols: int, block: int) -> int:
    """Programs per row: a power of two (tl.arange needs one) covering n_cols in blocks."""
    return triton.next_power_of_2(triton.cdiv(n_cols, block))
