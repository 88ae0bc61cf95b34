"""Input checks for a kernel's wrapper: the learner's, and the reference kernels'.

A wrapper validates before it launches, so that a wrong device, dtype, shape or stride is
named in a Python error instead of surfacing as a crash or a wrong answer in a kernel.
Chapter 03 introduces them; the exercises' starter code imports them
(`from course import validation`).
"""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def as_rows(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """`x` viewed as (M, N) rows of its last dimension, without a copy where possible.

    Kernels index rows through a row stride but assume each row's elements are adjacent,
    so the last dimension must have stride 1; the leading dimensions may be anything that
    flattens into one (a transposed batch, for instance, is copied once with a warning-free
    `reshape`).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (the one normalised)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; the kernels take float32, float16 or "
                        "bfloat16")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} has an empty last dimension: nothing to normalise")
    if x.stride(-1) != 1:
        raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got stride "
                         f"{x.stride(-1)}: call .contiguous() first")
    return x.reshape(-1, x.shape[-1])


def check_same_rows(x: torch.Tensor, other: torch.Tensor, name: str) -> torch.Tensor:
    """`other` as rows, after checking it matches x in shape, dtype and device."""
    if not isinstance(other, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(other).__name__}")
    if other.shape != x.shape:
        raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got "
                         f"{tuple(other.shape)}")
    if other.dtype != x.dtype:
        raise TypeError(f"{name} must have x's dtype {x.dtype}, got {other.dtype}")
    if other.device != x.device:
        raise ValueError(f"{name} is on {other.device} but x is on {x.device}")
    return as_rows(other, name)


def check_param(x: torch.Tensor, p: torch.Tensor | None, name: str) -> None:
    """A per-column parameter (weight, bias): 1-D, length N, contiguous, on x's device."""
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
    if p.dim() != 1 or p.shape[0] != x.shape[-1]:
        raise ValueError(f"{name} must be 1-D with one entry per column of x (length "
                         f"{x.shape[-1]}), got shape {tuple(p.shape)}")
    if p.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {p.dtype}; use float32, float16 or bfloat16")
    if p.device != x.device:
        raise ValueError(f"{name} is on {p.device} but x is on {x.device}")
    if p.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {p.stride(0)}")


def check_eps(eps: float) -> float:
    eps = float(eps)
    if not eps >= 0.0:  # also rejects NaN
        raise ValueError(f"eps must be a non-negative number, got {eps}")
    return eps


def row_statistic(stat: torch.Tensor, n_rows: int, name: str) -> torch.Tensor:
    """A statistic the forward saved (rstd, the mean): float32, one value per row, returned
    as a contiguous vector of n_rows."""
    if not isinstance(stat, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(stat).__name__}")
    if stat.dtype != torch.float32 or stat.numel() != n_rows:
        raise ValueError(f"{name} must be float32 with one value per row ({n_rows}), got "
                         f"{stat.dtype} with {stat.numel()} values")
    return stat.reshape(n_rows).contiguous()


__all__ = ["SUPPORTED_DTYPES", "as_rows", "check_eps", "check_param", "check_same_rows",
           "row_statistic"]
