"""The reference wrappers' kept launches with grads on, in C++ (`kept_backward.cpp`).

Through `torch.autograd`, a `torch.autograd.Function`'s backward runs as Python on autograd's
worker thread: launching nothing, that alone costs 56 to 80 us a call on an H200 host, where
`F.rms_norm`'s whole backward costs 72 to 97 (docs/sweeps/2026-11-29-backward-host). Once a
layout's backward has run through the Function and kept its launches (`ready_launch.py`),
the wrappers keep a `Plan` for that layout (`keep_node`) in their `KeptPlans`. A later
forward with grads on then runs `plans.forward`: it finds the plan of x's layout, allocates
y and the row statistics, launches the kept forward and gives y a node of
`kept_backward.cpp`, all in C++. The node allocates and launches the
kept backward and column sums from C++ (`kept_launch.c`'s launch_raw), and hands a
gradient of any other layout, or any gradient while a profiler hooks launches, to the Python
backward. docs/sweeps/2026-11-29-backward-node and 2026-11-29-hook-check.

The module is built against the installed torch's headers with the C++ compiler, in a
thread of its own on first use (tens of seconds), and kept in a cache folder; until it is
built, or where it cannot be (no compiler, no headers), the wrappers keep the Function.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings
from pathlib import Path

import torch
from torch.autograd import forward_ad

from solutions.kernels import ready_launch

SOURCE = Path(__file__).with_name("kept_backward.cpp")


class Source(enum.IntEnum):
    """Where a per-call argument of a kept launch comes from (kept_backward.cpp's values): an
    input (where it is None, the launch's stand-in: y, or dx), an output, a statistic."""
    X, WEIGHT, BIAS = 0, 1, 2
    Y, GRAD, DX, PARTIALS = -1, -2, -3, -4
    STAT0, STAT1 = -10, -11  # the first and second statistic a row (rstd; or mean, rstd)
    EPS = -20


_module = None  # the built module; False where the build failed
_builder: threading.Thread | None = None
_lock = threading.Lock()


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.environ.get("NORM_KERNELS_CACHE") or os.path.join(root, "norm-kernels"))


def build_command(source: Path, target: Path) -> list[str]:
    """The compiler call that builds `source` into the extension `target` for this torch."""
    from torch.utils import cpp_extension
    includes = [sysconfig.get_paths()["include"], *cpp_extension.include_paths()]
    libraries = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [os.environ.get("CXX") or "c++", "-O2", "-std=c++20", "-shared", "-fPIC",
            "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{path}" for path in includes), str(source), "-o", str(target),
            *(f"-L{path}" for path in libraries), *(f"-Wl,-rpath,{path}" for path in libraries),
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def build(folder: Path | None = None):
    """Build (or find already built) and import kept_backward.cpp's module."""
    source = SOURCE.read_text()
    tag = hashlib.sha256("\n".join(
        (source, torch.__version__, str(torch.version.git_version), sys.version,
         str(torch._C._GLIBCXX_USE_CXX11_ABI))).encode()).hexdigest()[:16]
    folder = folder or cache_dir()
    target = folder / f"kept_backward-{tag}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not target.exists():
        if shutil.which(os.environ.get("CXX") or "c++") is None:
            raise RuntimeError("no C++ compiler (c++, or $CXX) was found")
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")  # another process
        result = subprocess.run(build_command(SOURCE, partial), capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"c++ failed:\n{result.stderr[-3000:]}")
        os.replace(partial, target)  # may build it too: each renames a whole file
    spec = importlib.util.spec_from_file_location("kept_backward", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.check_launch_hooks_with(launch_hooked)
    return module


def _build_in_background() -> None:
    global _module
    try:
        module = build()
    except Exception as error:  # noqa: BLE001  (whatever it is, the Functions stay)
        warnings.warn(f"kept_backward.cpp could not be built ({error}); the reference "
                      f"kernels' backwards stay torch.autograd.Functions", stacklevel=2)
        module = False
    _module = module


def module(wait: bool = False):
    """The built module, or None while it is being built (the first call starts that) or
    where it could not be; `wait` waits for the build."""
    global _builder
    if _module is None:
        with _lock:
            if _builder is None:
                _builder = threading.Thread(target=_build_in_background, daemon=True,
                                            name="kept_backward build")
                _builder.start()
        if wait:
            _builder.join()
    return _module or None


def launch_hooked() -> bool:
    """Whether a profiler hooks Triton's launches now: the C++ launches do not call its
    hooks, so the forward and the node's backward then take the Python paths."""
    return ready_launch.hooked(ready_launch.knobs.runtime.launch_enter_hook)


def usable() -> bool:
    """Whether a forward may take a plan's C++ path now: not while a profiler hooks Triton's
    launches (`launch_hooked`), nor under forward-mode AD (the node has no tangent) or
    compiled autograd (the node cannot be traced)."""
    if launch_hooked() or forward_ad._current_level >= 0:
        return False
    compiled = sys.modules.get("torch._dynamo.compiled_autograd")
    return compiled is None or not (getattr(compiled, "compiled_autograd_enabled", False)
                                    or torch._dynamo.config.compiled_autograd)


class KeptPlans:
    """A wrapper's plans, by the layouts of x and its parameters and the current device.
    `forward(x, weight, bias, eps)`: y from the plan kept for these layouts, its grad_fn a
    C++ node; None where none is kept. Until the first plan, no C++ module is needed."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.plans = None
        self.forward = lambda x, weight, bias, eps: None

    def add(self, plan) -> None:
        if self.plans is None:
            self.plans = module().Plans()  # built: the plan is one of its own
            self.forward = self.plans.forward  # called as it is: no Python between
        self.plans.add(plan)

    def has(self, x, weight, bias) -> bool:
        return self.plans is not None and self.plans.has(x, weight, bias)

    def __len__(self) -> int:
        return 0 if self.plans is None else len(self.plans)


def keep_node(plans: KeptPlans, *, inputs: tuple, forward, backward, saved: tuple,
              dy: torch.Tensor, sources: tuple[tuple[int, ...], tuple[int, ...]],
              sums_dtype: torch.dtype, fallback, name: str) -> None:
    """After a backward through a wrapper's Function: keep in `plans` the Plan that later
    forwards of these layouts run, where the forward's launch (`forward`, a ReadyLaunch)
    and this backward's (`backward`, the wrapper's kept entry: the ReadyLaunch, the partial
    rows' shape and dtype, what sums them) were kept in C.
    - `inputs`: x and its parameters (None where there is none), the layouts the forward
      was made for and the node's edges;
    - `saved` and `dy`: what the Function saved (x, the weight, the statistics) and the
      gradient, the layouts the kept backward was made for;
    - `sources`: where the forward's and the backward's per-call arguments come from;
    - `fallback(*saved, dy)`: the Python backward, for a gradient or saved tensors of
      another layout, giving one gradient per input."""
    if forward is None or backward is None:
        return
    ready, partials_shape, partials_dtype, sums = backward
    sums_ready = getattr(sums, "ready", None)
    # partial rows to sum (three dimensions) need the sums' launch, unless nothing is summed
    unsummed = len(partials_shape) == 3 and sums is not None and (
        sums_ready is None or sums_ready.kept is None)
    built = module()
    if built is None or forward.kept is None or ready.kept is None or unsummed:
        return
    plans.add(built.Plan(forward, ready, sums_ready, ready_launch._kept_launch_module.launch_raw,
                         list(sources[0]), list(sources[1]), list(inputs), list(saved), dy,
                         list(partials_shape), partials_dtype, sums_dtype, fallback, name))
