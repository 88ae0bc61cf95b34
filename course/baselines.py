"""The PyTorch implementations the course measures its kernels against."""

from __future__ import annotations

import torch


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm written op by op, as model code commonly does (Hugging Face's Llama, for one).

    Every line is at least one kernel launch with a full round trip through HBM, and the
    upcast makes the temporaries float32: `course.traffic.eager_rmsnorm` counts the bytes.
    (torch.nn.functional.rms_norm is a single fused kernel on recent PyTorch versions.)
    """
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(x.dtype)
