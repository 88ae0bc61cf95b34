"""Noticing, in the learner's process, that code replaced what the checks rely on.

Before any of the learner's code runs, `Snapshot.take()` keeps every function, class and
module that the course's modules hold, and those of the torch, triton and standard-library
modules the checks and the timer use (for classes, their methods too), and which module
object `sys.modules` gives for each name. It also keeps the course's settings: every other
value its modules and classes hold (a frozenset of names, a tuple of packages, a number, a
dict of advice), each by identity and by a digest of its contents, so that rebinding one
and changing one in place both show. `Snapshot.changes()` lists what is no longer the same:
a checker replaced with `setattr` or by assignment, a module swapped in `sys.modules`,
`torch.allclose` or `torch.testing.assert_close` replaced, `time.perf_counter` or
`torch.cuda.Event.elapsed_time` patched, a builtin replaced, a setting of the course
rebound or refilled. Attributes added later, and the settings of torch, triton and the
standard library, are not compared: honest code and the libraries themselves change those;
nor are the few settings of the course that honest runs change (`CHANGING_SETTINGS`, each
with why). A cache the course fills as it runs and decides by (`kernel_records._seen`) is
checked entry by entry against what the course would have put there.

This runs in the process the learner's code runs in, so it is a tripwire, not a wall. The
learner's serve loop holds the snapshot, its seal and `Snapshot.changes` in its own frame
from before any of the submission's code runs, and `changes` binds its helpers as it is
defined, so rebinding them, or patching the snapshot and sealing it again, shows. It sends
every change with each reply; the verifier tells which are new. Open: a change made and
undone within one call; a value reached only through an object kept by identity (a
library object's attributes); code that rewrites the objects the snapshot holds through
native code. What decides the points (the inputs, the references, the comparison) never
runs there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import types
from dataclasses import dataclass

from course import kernel_records

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
# Packages all of whose loaded modules are kept: the course itself. Their settings (values
# that are not functions, classes or modules) are kept too, and those of their classes.
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

# Settings of the course that honest runs change between one reply and the next, by name:
# not compared, and why. (Honest grading without a GPU changes none of the others at a
# reply: the stacks of watches and guards are empty again, the fence is None again.)
CHANGING_SETTINGS = {
    "course.gpu_lock._files": "the lock files this process opened, at its first timing",
    "course.gpu_lock.waited": "seconds this process waited for the GPU lock: a running count",
    "course.verify.gpu_lane._driver_lib": "the CUDA driver, loaded at the first mailbox",
}
# Attributes every module or class has that are not the course's settings.
_NOT_SETTINGS = frozenset({
    "__builtins__",    # the builtins' namespace: its functions are kept by identity
    "__dict__", "__weakref__", "__doc__",
    "_abc_impl",       # abc's cache of subclasses seen, filled by isinstance
    "__abstractmethods__", "__parameters__", "__orig_bases__",
})
# Caches the checks decide by whose contents are settings all the same: the snapshot calls
# each once (filling it, from the course's data files) and keeps what it returns.
CACHED_SETTINGS = ("course.kernel_records.shipped_fingerprints", "course.kernel_records._plans")
# The cache of fingerprints seen (function -> (its code, the reference kernel it copies or
# None)), which the course-kernel refusal reads: honest checks fill it, so each entry is
# checked against a fingerprint computed again, never compared with the snapshot's.
KERNELS_SEEN = "course.kernel_records._seen"

# How deep a setting's contents are followed; past it, objects count by identity.
_DEPTH = 8
# Values compared by value: immutable and of these exact types.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))


def _kept(value: object) -> bool:
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                              types.ModuleType, type, staticmethod, classmethod, property,
                              types.MethodDescriptorType, types.WrapperDescriptorType,
                              types.GetSetDescriptorType, types.MemberDescriptorType)) \
        or callable(value) and type(value).__module__.startswith(("torch", "triton", "course"))


def _in_packages(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in WATCHED_PACKAGES)


def _modules() -> dict[str, types.ModuleType]:
    found = {name: sys.modules[name] for name in WATCHED_MODULES if name in sys.modules}
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and _in_packages(name):
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


def _contents(value: object, held: list, depth: int = 0) -> object:
    """A setting's contents as nested tuples of plain values, for a digest: containers and
    the course's own objects (an Exercise, a Case) item by item, anything else by identity
    (and held in `held`, so that its id is not reused while the snapshot lives)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if depth < _DEPTH:
        inner = depth + 1
        # A plain item is its own contents: taken as it is, without a call per item.
        if kind in (tuple, list):
            return kind.__name__, tuple(v if type(v) in _PLAIN else _contents(v, held, inner)
                                        for v in value)
        if kind in (set, frozenset):
            return kind.__name__, tuple(sorted(
                repr(v if type(v) in _PLAIN else _contents(v, held, inner)) for v in value))
        if isinstance(value, (dict, types.MappingProxyType)):
            return kind.__name__, tuple(
                (k if type(k) in _PLAIN else _contents(k, held, inner),
                 v if type(v) in _PLAIN else _contents(v, held, inner))
                for k, v in list(value.items()))
        if kind.__module__.split(".")[0] in WATCHED_PACKAGES and not _kept(value):
            if dataclasses.is_dataclass(value):
                fields = {f.name: getattr(value, f.name, None)
                          for f in dataclasses.fields(value)}
            else:
                fields = dict(getattr(value, "__dict__", {}))
            return kind.__qualname__, id(value), _contents(fields, held, inner)
    held.append(value)
    return "object", kind.__qualname__, id(value)


def _immutable(value: object, depth: int = 0) -> bool:
    """Whether nothing in `value` can change in place (plain values, and tuples and
    frozensets of them): its identity then says all a digest would."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    return depth < _DEPTH and kind in (tuple, frozenset) and \
        all(_immutable(v, depth + 1) for v in value)


def _digest(value: object, held: list) -> str | None:
    """A digest of a setting's contents; None for one that cannot change in place."""
    if _immutable(value):
        return None
    return hashlib.sha256(repr(_contents(value, held)).encode()).hexdigest()


def _settings_of(owner: object) -> dict[str, object]:
    """A module's or a class's own values that are not functions, classes or modules."""
    return {attr: value for attr, value in list(vars(owner).items())
            if attr not in _NOT_SETTINGS and not _kept(value)}


def _unfounded_kernels_seen(seen: object, checked: dict[int, tuple[object, object]]
                            ) -> list[str]:
    """Entries of kernel_records' cache that say other than its fingerprint does now (an
    entry whose code is no longer the function's is not read, and not checked); those found
    right are added to `checked`."""
    found = []
    for function, entry in list(getattr(seen, "items", list)()):
        if not (isinstance(entry, tuple) and len(entry) == 2):
            found.append(f"an entry for {getattr(function, '__qualname__', function)!r}")
            continue
        if entry[0] is not getattr(function, "__code__", None):
            continue
        if (kept := checked.get(id(entry[0]))) and kept[0] is entry[0] and kept[1] == entry[1]:
            continue
        try:
            readable, copied = kernel_records.looked_up(function)
        except Exception:  # a key that is not a function the course put there
            readable, copied = False, None
        if not readable or copied != entry[1]:
            found.append(f"the entry for {getattr(function, '__qualname__', function)!r}")
        else:
            checked[id(entry[0])] = entry
    return found


# Where a kept object is looked up again at each check, besides the dict it was found in
# (`sys.modules`, itself kept, or a module's or a class's own attributes): a watched class,
# resolved again by its "module:qualified name"; and a course class, as (its module's dict,
# its qualified name as kept), since one renamed in place is not the class that was kept.
_BY_SPEC = "a watched class's name"


def _watched() -> tuple[dict[str, tuple[object, str, object]], dict[str, object]]:
    """Every function, class and module kept, by name, as (where it is looked up, under
    what key, the object); and the course's modules and classes whose settings are kept, by
    the prefix of their settings' names."""
    entries: dict[str, tuple[object, str, object]] = {}
    owners: dict[str, object] = {}
    classes = {spec: (_BY_SPEC, spec, cls_) for spec in WATCHED_CLASSES
               if (cls_ := _resolve(spec))}
    entries["sys.modules"] = (vars(sys), "modules", sys.modules)  # rebound, it shows
    for name, module in _modules().items():
        entries[f"sys.modules[{name!r}]"] = (sys.modules, name, module)
        namespace = vars(module)
        course = _in_packages(name)
        if course:
            owners[name] = module
        for attr, value in list(namespace.items()):
            if _kept(value):
                entries[f"{name}.{attr}"] = (namespace, attr, value)
            if isinstance(value, type) and value.__module__ == name and course:
                classes[f"{name}:{value.__qualname__}"] = \
                    ((namespace, value.__qualname__), attr, value)
    for spec, (where, key, class_) in classes.items():
        entries[f"class {spec}"] = (where, key, class_)
        prefix = spec.replace(":", ".")
        if _in_packages(class_.__module__):
            owners[prefix] = class_
        namespace = vars(class_)  # a live view of the class's own attributes
        for attr, value in list(namespace.items()):
            if _kept(value):
                entries[f"{prefix}.{attr}"] = (namespace, attr, value)
    return entries, owners


def _seal_of(snapshot: Snapshot) -> tuple:
    """What a snapshot keeps, as the very tuples it keeps it in: tuples cannot be changed in
    place, so a snapshot patched after it was taken holds other tuples than these."""
    return snapshot._entries, snapshot._settings, snapshot._held, snapshot._environment


class Snapshot:
    """What the checks rely on, at one moment: each object by identity, for a function what
    it runs, for a setting a digest of its contents; sealed, so that a snapshot changed in
    place after `take()` says so."""

    __slots__ = ("_entries", "_settings", "_environment", "_held", "_seal", "_kernels_checked")

    def __init__(self, entries: dict[str, tuple[object, str, object]],
                 settings: dict[str, tuple[object, object]], environment: dict[str, str | None]):
        # Tuples, not dicts: what is kept cannot be changed in place, only rebound, which
        # the seal shows.
        self._entries = tuple((name, where, key, value, _insides(value))
                              for name, (where, key, value) in entries.items())
        held: list = []
        self._settings = tuple((name, owner, value, _digest(value, held))
                               for name, (owner, value) in settings.items())
        self._held = tuple(held)
        self._environment = tuple(environment.items())
        self._seal = _seal_of(self)
        # Entries of kernel_records' cache found right, by id of their code (held here):
        # a fingerprint is computed once per kernel, not at every reply.
        self._kernels_checked: dict[int, tuple[object, object]] = {}

    @property
    def seal(self) -> tuple:
        """What it kept, as taken: hold it apart from the snapshot and hand it to `changes`
        (a snapshot patched and sealed again then shows)."""
        return self._seal

    @classmethod
    def take(cls) -> Snapshot:
        entries, owners = _watched()
        settings: dict[str, tuple[object, object]] = {}
        for prefix, owner in owners.items():
            for attr, value in _settings_of(owner).items():
                settings[f"{prefix}.{attr}"] = (owner, value)
        for name in CACHED_SETTINGS:
            cache = settings.get(name, (None, None))[1]
            if callable(cache):
                settings[f"{name}()"] = (cache, cache())
        for name in (*CHANGING_SETTINGS, KERNELS_SEEN):
            settings.pop(name, None)
        environment = {name: os.environ.get(name) for name in WATCHED_ENVIRONMENT}
        return cls(entries, settings, environment)

    def __len__(self) -> int:
        return len(self._entries) + len(self._settings)

    # What it calls is bound here, as it is defined: a module's function rebound later (one
    # that reports nothing) is not called; rewriting these defaults is refused by the walls.
    def changes(self, seal: tuple | None = None, *, _insides=_insides, _digest=_digest,
                _resolve=_resolve, _seal_of=_seal_of, _unfounded=_unfounded_kernels_seen,
                _BY_SPEC=_BY_SPEC) -> list[Change]:
        """What differs now from when the snapshot was taken. `seal`: its `seal` as taken,
        kept apart from it (by default, the one it keeps itself)."""
        found = []
        kept = self._seal if seal is None else seal
        if any(a is not b for a, b in zip(_seal_of(self), kept, strict=True)):
            found.append(Change("the tamper check's own snapshot",
                                "changed after it was taken"))
        missing = object()
        # Each object looked up where it was found (not every module listed again).
        for name, where, key, value, kept in self._entries:
            if where is _BY_SPEC:
                current = _resolve(key)
                current = missing if current is None else current
            elif type(where) is tuple:  # a course class, in its module
                current = where[0].get(key, missing)
                if current is value and value.__qualname__ != where[1]:
                    found.append(Change(name, "renamed (its __qualname__ changed)"))
            else:
                current = where.get(key, missing)
            if current is not value:
                found.append(Change(name, "replaced or deleted" if current is missing
                                    else "replaced"))
            elif kept is not None and ((now := _insides(value))[0] is not kept[0]
                                       or now[1] is not kept[1] or now[2] is not kept[2]):
                found.append(Change(name, "rewritten (its __code__ or defaults replaced)"))
        digests: dict[int, str | None] = {}  # by id of a kept value: once each, in this call
        for name, owner, value, digest in self._settings:
            if name.endswith("()"):
                try:
                    current = owner() if callable(owner) else missing
                except Exception:  # a cache emptied, and its file refused now
                    current = missing
            else:
                current = vars(owner).get(name.rpartition(".")[2], missing)
            if current is missing:
                found.append(Change(name, "deleted"))
            elif current is not value:
                found.append(Change(name, "replaced (a setting the checks read)"))
            elif digest is not None:
                if (now := digests.get(id(value))) is None:
                    now = digests[id(value)] = _digest(value, [])
                if now != digest:
                    found.append(Change(name, "changed in place (a setting the checks read)"))
        module_name, _, attr = KERNELS_SEEN.rpartition(".")
        module = sys.modules.get(module_name)
        if module is not None:
            found += [Change(f"{KERNELS_SEEN}: {what}", "not what its fingerprint says (a "
                             "course kernel's refusal reads it)")
                      for what in _unfounded(vars(module).get(attr), self._kernels_checked)]
        for name, value in self._environment:
            current = os.environ.get(name)
            if current != value:
                found.append(Change(f"the environment variable {name}",
                                    f"changed from {value!r} to {current!r}"))
        return found


def describe(changes: list[Change], limit: int = 5) -> str:
    shown = "; ".join(str(c) for c in changes[:limit])
    more = f"; and {len(changes) - limit} more" if len(changes) > limit else ""
    return shown + more
