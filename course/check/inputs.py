"""Inputs for the checkers: fresh random tensors placed inside guarded buffers.

Each input lives in a larger buffer: margins before and after it, and optionally padding
between rows (so rows are not contiguous). Margins and padding hold a distinctive finite
value. A kernel that reads past a row (a missing load mask) picks that value up and gets
a visibly wrong answer without touching unowned memory; a kernel that writes outside its
output changes bytes we compare afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GUARD_VALUE = 100.0


def guard_margin(n: int) -> int:
    """Guard elements before and after an input whose rows are `n` long (by default)."""
    return max(256, 2 * n)


@dataclass
class GuardedInput:
    buffer: torch.Tensor   # flat storage, margins included
    tensor: torch.Tensor   # the view handed to the learner
    snapshot: torch.Tensor  # bytes of `buffer` before the call

    def writes(self) -> tuple[int, int]:
        """How many elements the call changed (inside the tensor, outside it in the margins
        and row padding), compared byte for byte with the snapshot."""
        now = self.buffer.view(torch.uint8).reshape(self.buffer.numel(), -1)
        before = self.snapshot.reshape(self.buffer.numel(), -1)
        changed = (now != before).any(dim=1)
        inside = torch.zeros_like(changed)
        inside[_element_indices(self.tensor, self.buffer)] = True
        return int((changed & inside).sum()), int((changed & ~inside).sum())

    def refill(self, values: GuardedInput) -> None:
        """Give this input the values of `values` (a fresh input laid out the same way) in
        place: the same tensor objects, storage and address, new values. The whole buffer
        is copied, so the margins and row padding hold the guard value as in a fresh input;
        the snapshot is taken again, so `writes` counts what the next call changes."""
        mine, theirs = self.tensor, values.tensor
        if (self.buffer.shape != values.buffer.shape or self.buffer.dtype != values.buffer.dtype
                or mine.shape != theirs.shape or mine.stride() != theirs.stride()
                or mine.storage_offset() != theirs.storage_offset()):
            raise ValueError(f"cannot refill an input of shape {tuple(mine.shape)}, strides "
                             f"{mine.stride()} from one of shape {tuple(theirs.shape)}, "
                             f"strides {theirs.stride()}: lay both out the same way")
        with torch.no_grad():  # the view may require grad (the autograd checker's inputs)
            self.buffer.copy_(values.buffer.to(self.buffer.device))
        self.snapshot = self.buffer.view(torch.uint8).clone()


def _element_indices(view: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """Flat indices into `buffer` of every element of `view` (a strided view of it)."""
    idx = torch.arange(buffer.numel(), device=buffer.device)
    return idx.as_strided(view.shape, view.stride(), view.storage_offset()).reshape(-1)


def guarded(values: torch.Tensor, *, row_padding: int = 0, margin: int | None = None
            ) -> GuardedInput:
    """Copy `values` (any shape, last dim = row) into a guarded buffer and return the view.

    row_padding > 0 leaves that many guard elements after every row, so the row stride is
    N + row_padding instead of N.
    """
    shape = tuple(values.shape)
    n = shape[-1] if shape else 1
    rows = values.numel() // max(n, 1)
    row_stride = n + row_padding
    if margin is None:
        margin = guard_margin(n)
    buffer = torch.full((2 * margin + rows * row_stride,), GUARD_VALUE,
                        dtype=values.dtype, device=values.device)
    strides = []
    step = row_stride
    strides.append(1)
    for dim in reversed(shape[:-1]):
        strides.append(step)
        step *= dim
    strides = tuple(reversed(strides)) if shape else ()
    view = buffer.as_strided(shape, strides, margin)
    view.copy_(values)
    snapshot = buffer.view(torch.uint8).clone()
    return GuardedInput(buffer, view, snapshot)
