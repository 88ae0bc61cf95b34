"""A launch prepared once and run again: what keeps the reference wrappers' per-call cost low.

A wrapper's first call for an input layout checks the inputs, makes the launch plan, and lets
Triton bind the arguments, specialise on them and compile. All of that depends only on the
layout (`layout`: shape, strides, dtype, device, 16-byte alignment), so the wrappers keep
the result, a `ReadyLaunch`, in a dict keyed by the layouts of their inputs. A later call
with the same layouts allocates its outputs and launches through the compiled kernel's own
launcher, as torch.compile's generated wrappers do (1 x 4096 RMSNorm, back to back on an
H100 host: 114 us a call before, 21 and 37 in two runs after;
docs/sweeps/benchmarks-history.md, "Host overhead per call").

Triton's launcher still parses every argument and asks the driver about every pointer on
each call. Where the driver can confirm the kernel's parameter layout, a ReadyLaunch packs
the fixed arguments once in `kept_launch.c` (built with Triton's own C toolchain) and each
call fills in only the tensors and eps before cuLaunchKernel (1 x 4096 RMSNorm on an H200
host: 23 us a call through Triton's launcher, 17 through kept_launch.c, F.rms_norm's 17;
docs/sweeps/2026-11-29-kept-launch). A profiler's launch hook, or a kernel needing what
cuLaunchKernel cannot give (clusters, scratch memory), keeps Triton's.

GPU only: in Triton's interpreter a launch returns no compiled kernel, and the wrappers take
their full path every call.
"""

from __future__ import annotations

import inspect
import struct
import subprocess
import warnings
from pathlib import Path

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
    key = [torch._C._cuda_getDevice(), x.shape, x.stride(), x.dtype, x.get_device(),
           x.data_ptr() % 16 == 0]
    for t in others:  # what layout(t) gives, the common cases written out: this runs every call
        key.append((t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0)
                   if isinstance(t, torch.Tensor) else
                   t if t is None or t is True or t is False else layout(t))
    return tuple(key)


def hooked(hook) -> bool:
    """Whether a launch hook of Triton's is set (a profiler's): a callable or None up to
    Triton 3.4, a chain of callables after (never None there)."""
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


# Bytes a kernel parameter of each Triton type takes, and how it is packed into its cell
_PARAMETER_PACKING = {"i1": "b", "i8": "b", "u1": "B", "u8": "B", "i16": "h", "u16": "H",
                      "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "fp32": "f", "f32": "f",
                      "fp64": "d"}
_kept_launch_module = None  # kept_launch.c built; False where that failed


def _kept_launch_type():
    """kept_launch.Launch, built on first use (Triton caches the build); None, with one
    warning, where no C compiler is found."""
    global _kept_launch_module
    if _kept_launch_module is None:
        from triton.runtime.build import compile_module_from_src
        try:
            source = (Path(__file__).with_name("kept_launch.c")).read_text()
            _kept_launch_module = compile_module_from_src(source, "kept_launch")
        except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as error:
            warnings.warn(f"kept_launch.c could not be built ({error}); the reference kernels "
                          f"launch through Triton's launcher instead", stacklevel=3)
            _kept_launch_module = False
    return _kept_launch_module.Launch if _kept_launch_module else None


def kept_launch(compiled, names: list[str], args: list, slots: list[int], grid: tuple,
                stream_of, device: int):
    """A kept_launch.Launch of `compiled` with `args` packed (the `slots` left to fill per
    call), launching on `stream_of(device)`; or None where the launch needs more than
    cuLaunchKernel gives, or has a parameter type it does not pack. The parameters are what
    Triton's launcher passes: every argument that is not a constexpr, then the global and
    profile scratch pointers."""
    meta = compiled.metadata
    if (getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_pdl", False)
            or getattr(meta, "launch_cooperative_grid", False)
            or getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0)):
        return None
    signature = getattr(compiled.src, "signature", None)
    if not isinstance(signature, dict) or list(signature) != list(names):
        return None
    cells, sizes, kinds, parameter = [], [], {}, {}
    for position, kind in enumerate(signature.values()):
        if kind == "constexpr":
            continue
        parameter[position] = len(cells)
        if kind.startswith("*"):
            code, kinds[position] = "Q", "p"
        elif kind in _PARAMETER_PACKING:
            code = _PARAMETER_PACKING[kind]
            kinds[position] = "f" if code == "f" else None
        else:
            return None
        value = 0 if position in slots else args[position]
        if not isinstance(value, (int, float)):
            return None  # a fixed pointer or value it cannot pack
        try:
            cells.append(struct.pack("<" + code, value).ljust(8, b"\0"))
        except struct.error:  # out of the parameter's range: Triton's launcher says so
            return None
        sizes.append(struct.calcsize(code))
    cells += [bytes(8)] * 2  # the scratch pointers: none needed (checked above)
    sizes += [8, 8]
    if any(slot not in parameter or kinds[slot] is None for slot in slots):
        return None
    launch = _kept_launch_type()
    if launch is None:
        return None
    try:
        return launch(compiled.function, grid, 32 * meta.num_warps, meta.shared, b"".join(cells),
                      tuple(sizes), tuple(parameter[slot] for slot in slots),
                      "".join(kinds[slot] for slot in slots), stream_of, device)
    except ValueError:  # the driver lays the parameters out otherwise: Triton's path
        return None


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
        self.kept = kept_launch(compiled, names, self.args, self.slots, self.grid,
                                self.current_stream, self.device)

    def run(self, *values) -> None:
        hooks = knobs.runtime
        enter = hooks.launch_enter_hook
        if self.kept is not None and not hooked(enter):
            self.kept.run(*values)
            return
        args = self.args.copy()
        for slot, value in zip(self.slots, values):  # noqa: B905 (as many, by construction)
            args[slot] = value
        stream = self.current_stream(self.device)
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

