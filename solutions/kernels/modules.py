"""`nn.Module` drop-ins for torch.nn.RMSNorm and torch.nn.LayerNorm, on the reference kernels.

Same constructor arguments, parameters and state-dict keys as PyTorch's modules, so a model's
weights load unchanged. Only the last dimension is normalised: a normalized_shape of several
dimensions is refused rather than silently treated differently.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from solutions.kernels.layernorm import layernorm
from solutions.kernels.rmsnorm import rmsnorm


def _last_dim(normalized_shape) -> int:
    shape = ((normalized_shape,) if isinstance(normalized_shape, numbers.Integral)
             else tuple(normalized_shape))
    if len(shape) != 1:
        raise ValueError(f"only the last dimension can be normalised: normalized_shape must "
                         f"be one int, got {normalized_shape!r}")
    return int(shape[0])


class RMSNorm(nn.Module):
    """Drop-in for torch.nn.RMSNorm (eps=None means torch.finfo(x.dtype).eps, as there)."""

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (_last_dim(normalized_shape),)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device,
                                                  dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rmsnorm(x, self.weight, eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class LayerNorm(nn.Module):
    """Drop-in for torch.nn.LayerNorm."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (_last_dim(normalized_shape),)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device,
                                                  dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.zeros(self.normalized_shape, device=device,
                                                     dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
