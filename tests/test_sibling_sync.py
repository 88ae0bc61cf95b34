"""The host side of solutions/kernels/sibling_sync.py: launch tags and their slots.

A split kernel's program waits until every slot of its row carries its launch's tag. Fresh
slots hold 0, so a tag of 0 would find them "full" at once; a tag an earlier launch still has
in its slots would read that launch's sums. (The kernels' side runs on a GPU only.)
"""

import course  # noqa: F401  (mode first)

import torch

from solutions.kernels.sibling_sync import LAST_TAG, _Slots

CPU = torch.device("cpu")


def test_tags_count_up_from_one():
    slots = _Slots(5, CPU)
    assert [slots.next_tag() for _ in range(3)] == [1, 2, 3]


def test_after_the_last_tag_comes_one_never_zero():
    slots = _Slots(5, CPU)
    slots.tag = LAST_TAG - 1
    assert [slots.next_tag() for _ in range(3)] == [LAST_TAG, 1, 2]
    assert LAST_TAG < 2**31  # the tag fills the high half of a signed 64-bit word


def test_a_new_buffer_starts_at_zero_and_covers_the_request():
    slots = _Slots(5, CPU)
    assert slots.buffer.dtype == torch.int64 and slots.buffer.numel() >= 5
    assert int(slots.buffer.count_nonzero()) == 0
