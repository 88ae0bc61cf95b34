"""The ground truth: RMSNorm and LayerNorm computed in float64, forward and backward.

Every function upcasts its inputs to float64, normalises over the last dimension of `x`
(any number of leading dimensions), and returns float64 tensors on the input's device.
A checker compares a learner's output with these after casting both to float64; the
tolerance reflects the learner's dtype, never the reference's.

Definitions (N is the length of the last dimension, statistics are per row):

    RMSNorm:    rstd = 1 / sqrt(mean(x**2) + eps)               y = x * rstd * w
    LayerNorm:  mean = mean(x)   var = mean((x - mean)**2)      (biased, as torch)
                rstd = 1 / sqrt(var + eps)                       y = (x - mean) * rstd * w + b
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

F64 = torch.float64

__all__ = [
    "add_rmsnorm",
    "autograd_backward",
    "layernorm",
    "layernorm_backward",
    "layernorm_backward_from_stats",
    "layernorm_stats",
    "rmsnorm",
    "rmsnorm_backward",
    "rmsnorm_rstd",
]


# --------------------------------------------------------------------------- validation

def _check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (the one that is normalised), "
                         "got a 0-d tensor")
    if not (x.is_floating_point()):
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")


def _check_param(x: torch.Tensor, p: torch.Tensor, name: str) -> None:
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
    if p.dim() != 1:
        raise ValueError(f"{name} must be 1-D with one entry per normalised column, got "
                         f"{name}.shape={tuple(p.shape)}")
    if p.shape[0] != x.shape[-1]:
        raise ValueError(f"the last dimension of x must equal the length of {name}: "
                         f"x.shape={tuple(x.shape)}, {name}.shape={tuple(p.shape)}")


def _check_same_shape(x: torch.Tensor, other: torch.Tensor, name: str) -> None:
    if not isinstance(other, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(other).__name__}")
    if other.shape != x.shape:
        raise ValueError(f"{name} must have the shape of x: x.shape={tuple(x.shape)}, "
                         f"{name}.shape={tuple(other.shape)}")


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    """Sum over every dimension but the last (the parameter gradients)."""
    return t.reshape(-1, t.shape[-1]).sum(dim=0)


# --------------------------------------------------------------------------- RMSNorm

def rmsnorm_rstd(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """1 / sqrt(mean(x**2) + eps) per row, shape x.shape[:-1], float64."""
    _check_x(x)
    x64 = x.to(F64)
    return torch.rsqrt(x64.square().mean(dim=-1) + eps)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x**2) + eps) * weight, over the last dimension, in float64."""
    _check_x(x)
    _check_param(x, weight, "weight")
    rstd = rmsnorm_rstd(x, eps)
    return x.to(F64) * rstd.unsqueeze(-1) * weight.to(F64)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm, as in a transformer block: returns (y, new_residual).

    new_residual = x + residual, rounded once to x.dtype (exactly what a kernel that adds in
    float32 and stores the sum in x.dtype produces), returned as float64. y is RMSNorm of
    that *rounded* sum: the kernel that writes the residual back and the next layer that
    reads it both see the rounded value, so normalising it keeps y and new_residual
    consistent. For float64 inputs nothing is rounded.
    """
    _check_x(x)
    _check_same_shape(x, residual, "residual")
    _check_param(x, weight, "weight")
    total = (x.to(F64) + residual.to(F64)).to(x.dtype).to(F64)
    return rmsnorm(total, weight, eps), total


def rmsnorm_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor,
                     eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of y = rmsnorm(x, weight) for an upstream gradient dy: (dx, dw), float64.

    Per row, with x_hat = x * rstd and g = w * dy, y = x_hat * w. Since
    d(rstd)/dx_j = -rstd**3 * x_j / N,

        dx_j = rstd * g_j + sum_k g_k x_k * (-rstd**3 x_j / N)
             = rstd * (g_j - x_hat_j * mean_k(x_hat_k * g_k))

    dw is summed over every row: dw = sum_rows(dy * x_hat).
    """
    _check_x(x)
    _check_param(x, weight, "weight")
    _check_same_shape(x, dy, "dy")
    x64, w64, dy64 = x.to(F64), weight.to(F64), dy.to(F64)
    rstd = rmsnorm_rstd(x64, eps).unsqueeze(-1)
    x_hat = x64 * rstd
    g = dy64 * w64
    dx = rstd * (g - x_hat * (x_hat * g).mean(dim=-1, keepdim=True))
    dw = _sum_rows(dy64 * x_hat)
    return dx, dw


# --------------------------------------------------------------------------- LayerNorm

def layernorm_stats(x: torch.Tensor, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, rstd) per row, each of shape x.shape[:-1], float64.

    The variance is the biased one (divided by N, as torch.nn.functional.layer_norm) and is
    computed from x - mean (two passes), which float64 makes exact enough even for inputs
    whose mean dwarfs their spread.
    """
    _check_x(x)
    x64 = x.to(F64)
    mean = x64.mean(dim=-1)
    var = (x64 - mean.unsqueeze(-1)).square().mean(dim=-1)
    return mean, torch.rsqrt(var + eps)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              eps: float = 1e-5) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dimension, float64."""
    _check_x(x)
    _check_param(x, weight, "weight")
    _check_param(x, bias, "bias")
    mean, rstd = layernorm_stats(x, eps)
    x_hat = (x.to(F64) - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    return x_hat * weight.to(F64) + bias.to(F64)


def layernorm_backward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       dy: torch.Tensor, eps: float = 1e-5
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of y = layernorm(x, weight, bias) for an upstream gradient dy:
    (dx, dw, db), float64. `bias` does not enter the gradients; it is validated only.

    Per row, with x_hat = (x - mean) * rstd and g = w * dy, y = x_hat * w + b. Because
    d(x_hat_k)/dx_j = rstd * (delta_jk - 1/N - x_hat_j * x_hat_k / N),

        dx_j = rstd * (g_j - mean_k(g_k) - x_hat_j * mean_k(x_hat_k * g_k))

    The parameter gradients are summed over every row: dw = sum_rows(dy * x_hat),
    db = sum_rows(dy).
    """
    _check_x(x)
    _check_param(x, weight, "weight")
    _check_param(x, bias, "bias")
    _check_same_shape(x, dy, "dy")
    x64, w64, dy64 = x.to(F64), weight.to(F64), dy.to(F64)
    mean, rstd = layernorm_stats(x64, eps)
    rstd = rstd.unsqueeze(-1)
    x_hat = (x64 - mean.unsqueeze(-1)) * rstd
    g = dy64 * w64
    dx = rstd * (g - g.mean(dim=-1, keepdim=True)
                 - x_hat * (x_hat * g).mean(dim=-1, keepdim=True))
    dw = _sum_rows(dy64 * x_hat)
    db = _sum_rows(dy64)
    return dx, dw, db


def layernorm_backward_from_stats(x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                                  rstd: torch.Tensor, dy: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`layernorm_backward` from the statistics a forward saved (mean and rstd per row,
    shape x.shape[:-1], float32 as a kernel stores them), in float64: what a backward
    kernel that reads them computes, without its rounding. Saved in float32, the mean of a
    row whose mean dwarfs its spread is off by up to half a unit in its last place, and
    every x - mean with it; this reference carries that shift, so that a kernel is judged
    on what it does with the statistics it is given."""
    _check_x(x)
    _check_param(x, weight, "weight")
    _check_same_shape(x, dy, "dy")
    for name, stat in (("mean", mean), ("rstd", rstd)):
        if not isinstance(stat, torch.Tensor) or stat.shape != x.shape[:-1]:
            got = tuple(stat.shape) if isinstance(stat, torch.Tensor) else type(stat).__name__
            raise ValueError(f"{name} must hold one value per row, shape "
                             f"{tuple(x.shape[:-1])}; got {got}")
    x64, w64, dy64 = x.to(F64), weight.to(F64), dy.to(F64)
    rstd64 = rstd.to(F64).unsqueeze(-1)
    x_hat = (x64 - mean.to(F64).unsqueeze(-1)) * rstd64
    g = dy64 * w64
    dx = rstd64 * (g - g.mean(dim=-1, keepdim=True)
                   - x_hat * (x_hat * g).mean(dim=-1, keepdim=True))
    return dx, _sum_rows(dy64 * x_hat), _sum_rows(dy64)


# --------------------------------------------------------------------------- autograd

def autograd_backward(fn: Callable[..., Any], *inputs: Any,
                      dy: torch.Tensor | Sequence[torch.Tensor]
                      ) -> tuple[torch.Tensor | None, ...]:
    """The gradients of `fn(*inputs)` by torch.autograd in float64, one per input.

    Every floating-point tensor input is copied to a float64 leaf that requires grad; other
    inputs (eps, for instance) are passed as they are and get None. `dy` is the upstream
    gradient: one tensor, or one per output when `fn` returns a tuple. Used to check the
    closed forms above, e.g.

        dx, dw, _ = autograd_backward(rmsnorm, x, w, 1e-6, dy=dy)
    """
    leaves: list[Any] = []
    for inp in inputs:
        if isinstance(inp, torch.Tensor) and inp.is_floating_point():
            leaves.append(inp.detach().to(F64).requires_grad_(True))
        else:
            leaves.append(inp)
    with torch.enable_grad():
        out = fn(*leaves)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    grads_out = tuple(dy) if isinstance(dy, (tuple, list)) else (dy,)
    if len(grads_out) != len(outs):
        raise ValueError(f"fn returned {len(outs)} output(s) but dy has {len(grads_out)}")
    for o, g in zip(outs, grads_out, strict=True):
        if o.shape != g.shape:
            raise ValueError(f"dy must match the output's shape: output {tuple(o.shape)}, "
                             f"dy {tuple(g.shape)}")
    wanted = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    grads = torch.autograd.grad(outs, wanted, [g.to(F64) for g in grads_out],
                                allow_unused=True)
    by_id = {id(leaf): grad for leaf, grad in zip(wanted, grads, strict=True)}
    return tuple(by_id.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None
                 for leaf in leaves)
