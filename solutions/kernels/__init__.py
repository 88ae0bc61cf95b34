"""The course's reference kernels (Triton only), tuned on an H100.

    from solutions.kernels import rmsnorm, add_rmsnorm, layernorm, RMSNorm, LayerNorm

Each op module holds its kernels, its launch wrapper and its `torch.autograd.Function`;
`modules.py` holds the `nn.Module` drop-ins, `launch.py` the per-shape launch choices
(the rules measured on each GPU in `plans/`, why in docs/launch-rules.md), and
`ready_launch.py` (with `kept_launch.c`) what a later call with the same layouts runs, and
`kept_backward.py` (with `kept_backward.cpp`) the C++ autograd node such a call's backward gets.
"""

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

from solutions.kernels.layernorm import LayerNormFunction, layernorm, layernorm_backward
from solutions.kernels.modules import LayerNorm, RMSNorm
from solutions.kernels.rmsnorm import RMSNormFunction, add_rmsnorm, rmsnorm, rmsnorm_backward

__all__ = ["LayerNorm", "LayerNormFunction", "RMSNorm", "RMSNormFunction", "add_rmsnorm",
           "layernorm", "layernorm_backward", "rmsnorm", "rmsnorm_backward"]
