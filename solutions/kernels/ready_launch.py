"""A launch prepared once and run again: what keeps the reference wrappers' per-call cost low.

A wrapper's first call for an input layout checks the inputs, makes the launch plan, and lets
Triton bind the arguments, specialise on them and compile. All of that depends only on the
layout (`layout`: shape, strides, dtype, device, 16-byte alignment), so the wrappers keep
the result, a `ReadyLaunch`, in a dict keyed by the layouts of their inputs. A later call
with the same layouts allocates its outputs and launches through the compiled kernel's own
launcher, as torch.compile's generated wrappers do (1 x 4096 RMSNorm, back to back on an
H100 host: 114 us a call before, 21 and 37 in two runs after;
docs/sweeps/benchmarks-history.md, "Host overhead per call"). What is left is mostly the
launch itself: torch's static CUDA launcher, tried in its place, measured within 1 us of it.

GPU only: in Triton's interpreter a launch returns no compiled kernel, and the wrappers take
their full path every call.
"""

from __future__ import annotations

import inspect

from course import runtime  # noqa: F401  (picks GPU or interpreter before triton loads)

import torch

try:  # Triton 3.4 and later; without them the wrappers take their full path every call
    from triton import knobs
    from triton.runtime import driver
except ImportError:  # pragma: no cover
    knobs = driver = None


def layout(t) -> tuple | None:
    """What a compiled launch depends on in a tensor argument: Triton specialises on the
    integer arguments made from its shape and strides, and on its pointer's 16-byte
    alignment. None, a bool and a dtype stand for themselves (flags); anything else gets a
    key no launch is kept under, so the full path runs and names the problem."""
    if isinstance(t, torch.Tensor):  # the device as its index (-1 off CUDA): cheaper to make
        return t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0
    return t if t is None or isinstance(t, (bool, torch.dtype)) else ("not a tensor", id(t))


def launch_key(x, *others) -> tuple | None:
    """The key a wrapper keeps its ReadyLaunch under: the layouts of its arguments (x first;
    flags may follow) and the current device, which Triton compiles and launches for. None
    off the GPU, where nothing is kept."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda) or knobs is None:
        return None
    return (torch._C._cuda_getDevice(), x.shape, x.stride(), x.dtype, x.get_device(),
            x.data_ptr() % 16 == 0, *map(layout, others))


def hooked(hook) -> bool:
    """Whether a launch hook of Triton's is set (a profiler's): a callable or None up to
    Triton 3.4, a chain of callables after (never None there)."""
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


class ReadyLaunch:
    """One compiled kernel, its grid and every argument that stays the same from call to
    call; `run(*values)` fills in the `per_call` arguments (the tensors and eps) and
    launches on the current stream."""

    def __init__(self, compiled, kernel, grid: tuple[int, ...], args: tuple, kwargs: dict,
                 per_call: tuple[str, ...]):
        names = kernel.arg_names
        defaults = {name: p.default for name, p in inspect.signature(kernel.fn).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        given = defaults | dict(zip(names, args, strict=False)) | kwargs
        self.args = [given[name] for name in names]  # every parameter, constexprs included
        self.slots = [names.index(name) for name in per_call]
        for slot in self.slots:  # the first call's tensors are not kept alive
            self.args[slot] = None
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.device = torch.cuda.current_device()  # a key holds it (launch_key)
        self.compiled = compiled
        # what Triton's own launch looks up every call, looked up once
        self.launch, self.function = compiled.run, compiled.function
        self.metadata = compiled.packed_metadata
        self.current_stream = driver.active.get_current_stream

    def run(self, *values) -> None:
        args = self.args.copy()
        for slot, value in zip(self.slots, values):  # noqa: B905 (as many, by construction)
            args[slot] = value
        stream = self.current_stream(self.device)
        hooks = knobs.runtime
        enter = hooks.launch_enter_hook
        # what a profiler hooked on launches is told (Triton makes it only for a hook)
        about = self.compiled.launch_metadata(self.grid, stream, *args) if hooked(enter) else None
        self.launch(*self.grid, stream, self.function, self.metadata, about, enter,
                    hooks.launch_exit_hook, *args)

def ready_launch(compiled, kernel, grid, args: tuple, kwargs: dict, per_call: tuple[str, ...]
                 ) -> ReadyLaunch | None:
    """A ReadyLaunch of the launch `kernel[grid](*args, **kwargs)` that returned `compiled`,
    or None where there is nothing to keep (the interpreter, or a Triton without `knobs`)."""
    if knobs is None or not hasattr(compiled, "packed_metadata"):
        return None
    kwargs = {k: v for k, v in kwargs.items() if k in kernel.arg_names}  # not num_warps...
    ready = ReadyLaunch(compiled, kernel, grid, args, kwargs, per_call)
    if any(isinstance(arg, torch.Tensor) for arg in ready.args):
        raise ValueError(f"{kernel.__name__}: every tensor argument must be filled in per "
                         f"call (per_call = {per_call})")
    return ready

