"""Noticing, in the learner's process, that code replaced what the checks rely on.

Before any of the learner's code runs, `Snapshot.take()` keeps every function, class and
module that the course's modules hold, and those of the torch, triton and standard-library
modules the checks and the timer use (for classes, their methods too), and which module
object `sys.modules` gives for each name. `Snapshot.changes()` lists what is no longer the
same object: a checker replaced with `setattr` or by assignment, a module swapped in
`sys.modules`, `torch.allclose` or `torch.testing.assert_close` replaced,
`time.perf_counter` or `torch.cuda.Event.elapsed_time` patched, a builtin replaced.
Attributes added later, and values that are not functions, classes or modules (a cached
number, a setting), are not compared: honest code and the libraries themselves change those.

This runs in the process the learner's code runs in, so it is a tripwire, not a wall: code
written to find and rewrite the snapshot itself can hide from it. What decides the points
(the inputs, the references, the comparison) never runs there.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass

# Imported at its first use, torch._dynamo replaces torch.manual_seed with a wrapper of
# its own: imported here, before any snapshot, so that it is not taken for tampering.
import torch._dynamo  # noqa: F401

# Modules whose functions, classes and submodules are kept (those loaded at snapshot time).
WATCHED_MODULES = (
    "builtins", "time", "os", "io", "sys", "warnings", "traceback", "threading",
    "contextlib", "functools", "pickle", "inspect",
    "torch", "torch.cuda", "torch.testing", "torch.testing._comparison",
    "torch.nn.functional", "torch.overrides", "torch.autograd", "torch.autograd.function",
    "torch.utils._python_dispatch", "torch.serialization",
    "triton", "triton.runtime", "triton.runtime.jit", "triton.runtime.interpreter",
    "triton.runtime.autotuner", "triton.testing",
)
# Packages all of whose loaded modules are kept: the course itself.
WATCHED_PACKAGES = ("course",)
# Classes whose own methods are kept, by "module:qualified name" (classes defined in the
# course's modules are added to these).
WATCHED_CLASSES = (
    "torch:Tensor", "torch.cuda:Event", "torch.autograd:Function",
    "torch.utils._python_dispatch:TorchDispatchMode", "torch.overrides:TorchFunctionMode",
    "triton.runtime.jit:JITFunction", "triton.runtime.jit:KernelInterface",
    "triton.runtime.interpreter:InterpretedFunction", "triton.runtime.interpreter:GridExecutor",
    "triton.runtime.autotuner:Autotuner", "triton.runtime.autotuner:Heuristics",
)
# Environment variables that decide how the checks run.
WATCHED_ENVIRONMENT = ("COURSE_GRADING", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")


def _kept(value: object) -> bool:
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                              types.ModuleType, type, staticmethod, classmethod, property,
                              types.MethodDescriptorType, types.WrapperDescriptorType,
                              types.GetSetDescriptorType, types.MemberDescriptorType)) \
        or callable(value) and type(value).__module__.startswith(("torch", "triton", "course"))


def _modules() -> dict[str, types.ModuleType]:
    found = {name: sys.modules[name] for name in WATCHED_MODULES if name in sys.modules}
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and any(
                name == p or name.startswith(p + ".") for p in WATCHED_PACKAGES):
            found[name] = module
    return found


def _resolve(spec: str) -> type | None:
    module_name, _, qualname = spec.partition(":")
    module = sys.modules.get(module_name)
    obj: object = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj if isinstance(obj, type) else None


@dataclass(frozen=True)
class Change:
    what: str     # "course.check.rmsnorm_forward", "sys.modules['course.check']", ...
    how: str      # "replaced", "deleted"

    def __str__(self) -> str:
        return f"{self.what} was {self.how}"


def _insides(value: object) -> tuple | None:
    """What a function runs (its code, defaults and keyword defaults), which assignment
    changes without replacing the function; None for what is not a Python function."""
    function = getattr(value, "__func__", value)  # a staticmethod's or classmethod's
    if isinstance(value, property):
        function = value.fget
    if not isinstance(function, types.FunctionType):
        return None
    return function.__code__, function.__defaults__, function.__kwdefaults__


class Snapshot:
    """What the checks rely on, by identity, at one moment: each object, and for a
    function what it runs."""

    def __init__(self, entries: dict[str, object], environment: dict[str, str | None]):
        self._entries = entries
        self._insides = {name: _insides(value) for name, value in entries.items()}
        self._environment = environment

    @classmethod
    def take(cls) -> Snapshot:
        entries: dict[str, object] = {}
        modules = _modules()
        classes = {spec: cls_ for spec in WATCHED_CLASSES if (cls_ := _resolve(spec))}
        for name, module in modules.items():
            entries[f"sys.modules[{name!r}]"] = module
            for attr, value in list(vars(module).items()):
                if _kept(value):
                    entries[f"{name}.{attr}"] = value
                if isinstance(value, type) and value.__module__ == name and \
                        any(name == p or name.startswith(p + ".") for p in WATCHED_PACKAGES):
                    classes[f"{name}:{value.__qualname__}"] = value
        for spec, class_ in classes.items():
            entries[f"class {spec}"] = class_
            for attr, value in list(vars(class_).items()):
                if _kept(value):
                    entries[f"{spec.replace(':', '.')}.{attr}"] = value
        environment = {name: os.environ.get(name) for name in WATCHED_ENVIRONMENT}
        return cls(entries, environment)

    def __len__(self) -> int:
        return len(self._entries)

    def changes(self) -> list[Change]:
        """What differs now from when the snapshot was taken."""
        now = Snapshot.take()._entries
        found = []
        for name, value in self._entries.items():
            if now.get(name) is not value:
                found.append(Change(name, "replaced" if name in now else "replaced or deleted"))
                continue
            kept, current = self._insides[name], _insides(value)
            if kept is not None and any(a is not b for a, b in zip(kept, current, strict=True)):
                found.append(Change(name, "rewritten (its __code__ or defaults replaced)"))
        for name, value in self._environment.items():
            current = os.environ.get(name)
            if current != value:
                found.append(Change(f"the environment variable {name}",
                                    f"changed from {value!r} to {current!r}"))
        return found


def describe(changes: list[Change], limit: int = 5) -> str:
    shown = "; ".join(str(c) for c in changes[:limit])
    more = f"; and {len(changes) - limit} more" if len(changes) > limit else ""
    return shown + more
