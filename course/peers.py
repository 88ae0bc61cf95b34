"""The implementations `course bench` puts side by side, one adapter per (op, implementation).

Every adapter has the same shape: `prepare(inputs) -> call`, where `inputs` holds the op's
tensors and `call()` runs the implementation once and returns what it computed (the output,
or for a backward op the gradients). Preparing does the untimed work: a backward op runs its
forward once there, and each `call()` is then one backward through the saved graph.

Peers that are not installed (Liger-Kernel, Quack) or that refuse a shape (Liger above
N = 65536) are reported as such, never silently dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from course import baselines, runtime

import torch
import torch.nn.functional as F

OPS = ("rmsnorm_fwd", "layernorm_fwd", "add_rmsnorm_fwd", "rmsnorm_bwd", "layernorm_bwd")

Inputs = dict[str, torch.Tensor]
Prepare = Callable[[Inputs, float], Callable[[], object]]


class Unavailable(Exception):
    """This implementation cannot run here (not installed, or refuses the shape)."""


@dataclass(frozen=True)
class Impl:
    name: str
    op: str
    prepare: Prepare


# ------------------------------------------------------------------ the functions compared


def _eager_layernorm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _eager_add_rmsnorm(x, residual, w, eps):
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), w, eps), h


def _eager_chain_add_rmsnorm(x, residual, w, eps):
    h = x + residual
    return baselines.eager_rmsnorm(h, w, eps), h


def _f_rms_norm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


@functools.cache
def _compiled(fn: Callable) -> Callable:
    # Static shapes: one specialised graph per shape, torch.compile at its best.
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    return torch.compile(fn, dynamic=False)


@functools.cache
def _ours():
    """The course's reference kernels, imported only when `course bench` runs them: they come
    with a checkout of the repository (solutions/kernels/), not with the learners' package."""
    try:
        from solutions import kernels
    except ModuleNotFoundError as exc:
        if exc.name not in ("solutions", "solutions.kernels"):
            raise
        raise Unavailable(
            "the course's reference kernels (solutions/kernels/) come with a checkout of the "
            "repository, not with the learners' package: run `course bench` from a checkout, "
            f"installed with `pip install -e .` (what `make lab` and `make test` do) ({exc})"
        ) from exc
    if runtime.on_gpu():  # the backward nodes in C++ built before anything is timed
        from solutions.kernels import kept_backward
        kept_backward.module(wait=True)
    return kernels


def _liger(module: str, cls: str):
    try:
        mod = __import__(f"liger_kernel.ops.{module}", fromlist=[cls])
    except ImportError as exc:
        raise Unavailable(f"Liger-Kernel is not installed ({exc})") from exc
    return getattr(mod, cls)


def _quack():
    try:
        import quack
    except ImportError as exc:
        raise Unavailable(f"Quack is not installed ({exc})") from exc
    return quack


def _liger_rmsnorm(x, w, eps):
    if x.shape[-1] > 65536:
        raise Unavailable("Liger-Kernel refuses N above 65536")
    return _liger("rms_norm", "LigerRMSNormFunction").apply(x, w, eps)


def _liger_layernorm(x, w, b, eps):
    if x.shape[-1] > 65536:
        raise Unavailable("Liger-Kernel refuses N above 65536")
    return _liger("layer_norm", "LigerLayerNormFunction").apply(x, w, b, eps)


def _quack_rmsnorm(x, w, eps):
    return _quack().rmsnorm(x, w, eps=eps)


def _quack_layernorm(x, w, b, eps):
    from quack.rmsnorm import layernorm_fwd

    out = layernorm_fwd(x, w.float(), b.float(), eps=eps)
    return out[0] if isinstance(out, tuple) else out


def _quack_add_rmsnorm(x, residual, w, eps):
    from quack.rmsnorm import rmsnorm_fwd

    # Returns (y, residual_out, rstd); rstd is None without store_rstd.
    y, residual_out, _ = rmsnorm_fwd(x, w, residual=residual, eps=eps, store_rstd=False)
    return y, residual_out


# ------------------------------------------------------------------ forward and backward


def _forward(fn: Callable, names: tuple[str, ...]) -> Prepare:
    def prepare(t: Inputs, eps: float):
        args = [t[n] for n in names]

        def call():
            with torch.no_grad():
                return fn(*args, eps)
        call()  # raises Unavailable here, before any timing
        return call
    return prepare


def _backward(fn: Callable, names: tuple[str, ...]) -> Prepare:
    """Run fn forward once with grads on; each call is one backward of dy through it. A
    first forward and backward run before, as a training loop's first step: what compiles,
    or keeps its launches for later steps (ours: a backward node in C++), has done so."""
    def prepare(t: Inputs, eps: float):
        leaves = [t[n].detach().requires_grad_(True) for n in names]
        # (retain_graph as below: torch.compile's backward refuses it after a first without)
        torch.autograd.grad(fn(*leaves, eps), leaves, t["dy"].clone(), retain_graph=True)
        y = fn(*leaves, eps)
        # A private dy: Liger's RMSNorm backward (in_place=True, its default) writes dx
        # into dy, which would hand every later implementation a wrong dy.
        dy = t["dy"].clone()

        def call():
            return torch.autograd.grad(y, leaves, dy, retain_graph=True)
        return call
    return prepare


def _ours_fn(name: str) -> Callable:
    def run(*args):
        return getattr(_ours(), name)(*args)
    return run


RMS = ("x", "weight")
LN = ("x", "weight", "bias")
ADD = ("x", "residual", "weight")


def implementations(op: str) -> list[Impl]:
    """Every implementation of `op`, ours first."""
    if op == "rmsnorm_fwd":
        fns = [("ours", _ours_fn("rmsnorm")), ("torch eager (op by op)", baselines.eager_rmsnorm),
               ("torch F.rms_norm", _f_rms_norm),
               ("torch.compile", _compiled(baselines.eager_rmsnorm)),
               ("Liger", _liger_rmsnorm), ("Quack", _quack_rmsnorm)]
        return [Impl(n, op, _forward(f, RMS)) for n, f in fns]
    if op == "layernorm_fwd":
        fns = [("ours", _ours_fn("layernorm")), ("torch F.layer_norm", _eager_layernorm),
               ("torch.compile", _compiled(_eager_layernorm)),
               ("Liger", _liger_layernorm), ("Quack", _quack_layernorm)]
        return [Impl(n, op, _forward(f, LN)) for n, f in fns]
    if op == "add_rmsnorm_fwd":
        fns = [("ours", _ours_fn("add_rmsnorm")),
               ("torch eager (op by op)", _eager_chain_add_rmsnorm),
               ("torch add + F.rms_norm", _eager_add_rmsnorm),
               ("torch.compile", _compiled(_eager_chain_add_rmsnorm)),
               ("Quack", _quack_add_rmsnorm)]
        return [Impl(n, op, _forward(f, ADD)) for n, f in fns]
    if op == "rmsnorm_bwd":
        fns = [("ours", _ours_fn("rmsnorm")), ("torch eager (op by op)", baselines.eager_rmsnorm),
               ("torch F.rms_norm", _f_rms_norm),
               ("torch.compile", _compiled(baselines.eager_rmsnorm)),
               ("Liger", _liger_rmsnorm), ("Quack", _quack_rmsnorm)]
        return [Impl(n, op, _backward(f, RMS)) for n, f in fns]
    if op == "layernorm_bwd":
        fns = [("ours", _ours_fn("layernorm")), ("torch F.layer_norm", _eager_layernorm),
               ("torch.compile", _compiled(_eager_layernorm)), ("Liger", _liger_layernorm)]
        return [Impl(n, op, _backward(f, LN)) for n, f in fns]
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
