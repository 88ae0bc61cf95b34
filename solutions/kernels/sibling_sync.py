"""Programs that share a row: publish a partial sum, wait for the row's other programs' sums.

A row too long for one program's registers is split over SPLIT programs. Each publishes its
partial sum into its own slot with one 64-bit atomic write: the launch's tag (`epoch`) in the
high 32 bits, the float32 sum's bits in the low 32. A program that needs the row's total
reads the row's SPLIT slots (atomics, so the reads go to L2, where the writes landed) until
every one carries this launch's tag, and adds the values in slot order, so results do not
vary from run to run. Value and tag arrive in one word, so no fence or counter is needed:
publishing costs no wait, and when the siblings have published, one read brings everything.
(The first version published, counted itself in on a counter with acquire-release, polled
the counter and then read the sums back: about four round trips to L2 where this takes one.
On an H100 the split RMSNorm forward went from 91 to 99 % of copy bandwidth.)

This relies on the GPU starting programs in order of their index, so the SPLIT programs of a
row (adjacent indices) are resident together and none waits on a sibling that cannot start,
and on SPLIT being no more than the programs the GPU can hold at once (`split_fits`: one an
SM; the launch plans keep to it, and a split launch that does not is refused).
GPU only: Triton's interpreter runs programs one after another, and the first to wait would
wait forever.

The slots are never cleared. Each launch takes the next tag from a counter kept beside its
buffer (one buffer per device and stream, `exchange_slots`), so a slot still holding an
earlier launch's sum never carries the current tag. Tags run from 1 to 2**31 - 1 and then
start again; a slot would have to sit unused for 2**31 - 1 launches to be mistaken.
"""

from __future__ import annotations

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch
import triton
import triton.language as tl

LAST_TAG = 2**31 - 1


@triton.jit
def publish(slot_ptr, value, epoch):
    """Write this program's float32 `value`, tagged with the launch's `epoch`, to its slot."""
    bits = value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    tl.atomic_xchg(slot_ptr, (epoch.to(tl.int64) << 32) | bits, sem="relaxed")


@triton.jit
def wait_for_partials(slots_ptr, epoch, COUNT: tl.constexpr):
    """The COUNT float32 values published in consecutive slots, once all carry `epoch`."""
    # Polling with atomics (issued once per slot, answered by L2) measured faster on an H100
    # than polling with volatile loads (99.3 against 88.5 % of copy for the split forward).
    slots = slots_ptr + tl.arange(0, COUNT)
    zero = tl.zeros([COUNT], dtype=tl.int64)
    words = tl.atomic_add(slots, zero, sem="relaxed")
    while tl.sum(((words >> 32) != epoch).to(tl.int32), axis=0) > 0:
        words = tl.atomic_add(slots, zero, sem="relaxed")
    return (words & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def wait_for_pairs(slots_ptr, epoch, SPLIT: tl.constexpr):
    """Two sums a program, published in slots 2 * part and 2 * part + 1: both totals."""
    first, second = tl.split(tl.reshape(wait_for_partials(slots_ptr, epoch, 2 * SPLIT),
                                        [SPLIT, 2]))
    return tl.sum(first, axis=0), tl.sum(second, axis=0)


def split_fits(split: int, sms: int) -> bool:
    """Whether a row split over `split` programs can have them all running at once, as the
    protocol needs: a row whose last programs cannot start until its first have finished
    never finishes. One program an SM is what every launch is sure of (RMSNorm's rows of
    2**23 columns, 512 programs a row of which 264 fit an H100, hung there)."""
    return split <= sms


def next_power_of_2_split(n_cols: int, block: int) -> int:
    """Programs per row: a power of two (tl.arange needs one) covering n_cols in blocks."""
    return triton.next_power_of_2(triton.cdiv(n_cols, block))


class _Slots:
    """A stream's buffer of tagged slots and the tag its last launch used."""

    def __init__(self, count: int, device: torch.device):
        self.buffer = torch.zeros(triton.next_power_of_2(count), dtype=torch.int64,
                                  device=device)
        self.tag = 0

    def next_tag(self) -> int:
        self.tag = self.tag % LAST_TAG + 1
        return self.tag


_SLOTS: dict[tuple[int, int], _Slots] = {}


def exchange_slots(count: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """`count` slots and the tag for the launch about to use them. Launches on one stream run
    one after another, so they never share a slot at the same time; a bigger buffer, when
    needed, starts at zero, which no launch's tag equals. A launch being captured into a CUDA
    graph gets a buffer of its own, zeroed inside the graph, and tag 1: each replay then
    starts from zeroed slots."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(count, dtype=torch.int64, device=device), 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch.cuda.current_stream(index).cuda_stream)
    slots = _SLOTS.get(key)
    if slots is None or slots.buffer.numel() < count:
        slots = _Slots(count, device)
        _SLOTS[key] = slots
    return slots.buffer[:count], slots.next_tag()
