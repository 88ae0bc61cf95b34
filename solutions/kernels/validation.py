"""Input checks shared by the reference kernels' wrappers.

The checks every wrapper makes (dtype, shape, strides, eps) are the learners' own,
`course.validation`, re-exported here; this module adds the one check that only the
reference kernels need: whether a launch plan's path can run on the device in hand.
"""

from __future__ import annotations

from course.validation import (
    SUPPORTED_DTYPES,
    as_rows,
    check_eps,
    check_param,
    check_same_rows,
    row_statistic,
)

import torch

from solutions.kernels.gpus import multiprocessors
from solutions.kernels.sibling_sync import split_fits


def check_path_runs_here(path: str, device: torch.device, split: int = 1) -> None:
    """The split path's programs wait for each other, which only a GPU can run: Triton's
    interpreter runs programs one after another, and the first to wait would wait forever.
    On a GPU the `split` programs of a row must all be running at once (`split_fits`)."""
    if path != "split":
        return
    if device.type != "cuda":
        raise ValueError("the split path needs a GPU (its programs wait for each other, "
                         "which the interpreter cannot run)")
    sms = multiprocessors(device)
    if not split_fits(split, sms):
        raise ValueError(f"a split of {split} programs a row is more than this GPU's {sms} "
                         f"SMs can run at once, and its programs wait for each other: "
                         f"use the loop path for rows this long")


__all__ = ["SUPPORTED_DTYPES", "as_rows", "check_eps", "check_param", "check_path_runs_here",
           "check_same_rows", "row_statistic"]
