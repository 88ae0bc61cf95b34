"""How many times a traced call's kernels load each element of one of its inputs, or of
the memory the call made itself: its outputs, and any buffer it allocated and did not return
(a fused kernel stores into those and never loads them back).

The kernels of a traced call (course.verify.replay) travel as source. Here each is
rewritten so that every `tl.load` and every atomic operation (which also reads) first hands
its pointers and mask to a counter, `_course_count_load`, which adds one, for every lane the
mask leaves on, to a count per byte of the input's storage; the rewritten kernels are
compiled and the call's work replayed on its own arguments. A fused RMSNorm kernel loads
each byte of x once, chapter 03's two-pass kernel twice.

Like a timing replay, this compiles the kernels' source and runs nothing of it as Python
on a GPU, so the verifier can count a learner's loads itself. In Triton's interpreter a
kernel's body is Python: there, counting is for the learner's own process (and the tests).

What the counter cannot see is refused rather than guessed (`CannotCount`): loads through a
block pointer or a tensor descriptor, inline assembly, `tl.load` reached other than as
`tl.load(...)` (a name for it, getattr, a module's __dict__). That is a reading of the
source, not a proof: Triton's compiler runs Python it meets while compiling, and a kernel
written to hide a load from this reading may find a way.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence

from course.verify.replay import (
    NotReplayable,
    Replay,
    TracedCall,
    rebuild_kernels,
    refuse_shipped_copy,
)

import torch

# triton.language's operations that read memory through pointers: the position of their
# mask among the positional arguments (atomic_cas has none).
COUNTED = {"load": 1, "atomic_add": 2, "atomic_and": 2, "atomic_max": 2, "atomic_min": 2,
           "atomic_or": 2, "atomic_xchg": 2, "atomic_xor": 2, "atomic_cas": None}
# What reads memory without a pointer the counter could follow, or could reach tl.load
# under another name (Triton's compiler runs such Python while it compiles).
UNSEEN = {"make_block_ptr": "a block pointer", "make_tensor_descriptor": "a tensor descriptor",
          "load_tensor_descriptor": "a tensor descriptor",
          "inline_asm_elementwise": "inline assembly",
          **dict.fromkeys(("getattr", "vars", "globals", "locals", "eval", "exec",
                           "__import__"), "Python's introspection")}
COUNTER = "_course_count_load"

# The counter, with the counts' and the input's addresses written in as numbers: a new
# source for new addresses, so that no compiled copy for other addresses is reused.
_COUNTER_SOURCE = f'''
def {COUNTER}(pointer, mask):
    offsets = pointer.to(tl.int64) - {{start}}
    seen = (offsets >= 0) & (offsets < {{nbytes}})
    if mask is not None:
        seen = seen & mask
    offsets, seen = tl.broadcast(offsets, seen)
    counts = tl.cast({{counts}}, tl.int64).to(tl.pointer_type(tl.int32))
    for byte in tl.static_range((pointer.dtype.element_ty.primitive_bitwidth + 7) // 8):
        tl.atomic_add(counts + offsets + byte, 1, mask=seen, sem="relaxed")
    return pointer
'''


class CannotCount(NotReplayable):
    """A kernel reads memory in a way the counter cannot see; the message says how."""


class _Counting(ast.NodeTransformer):
    """Hands the pointer of every tl.load and atomic to the counter (with a copy of the
    mask, as written: a load in the mask is then counted once, where it stands)."""

    def __init__(self, bundle: dict):
        self.kernel = bundle["name"]
        found = bundle["globals"]
        self.tl = {name for name, g in found.items() if g.get("module") == "triton.language"}
        self.triton = {name for name, g in found.items() if g.get("module") == "triton"}

    def _is_tl(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.tl
        return (isinstance(node, ast.Attribute) and node.attr == "language"
                and isinstance(node.value, ast.Name) and node.value.id in self.triton)

    def _refuse(self, what: str) -> None:
        raise CannotCount(f"kernel {self.kernel} reads memory through {what}, which the count "
                          "of loads cannot follow: load with tl.load(pointers, mask=...)")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in UNSEEN:
            self._refuse(UNSEEN[node.id])
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        # A counted operation reached here is not called as tl.<op>(...) (visit_Call).
        if node.attr in UNSEEN:
            self._refuse(UNSEEN[node.attr])
        if node.attr.startswith("__"):
            self._refuse(f"Python's introspection (`{ast.unparse(node)}`)")
        if node.attr in COUNTED:
            self._refuse(f"`{ast.unparse(node)}` used other than as a call of tl.{node.attr}")
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in COUNTED
                and self._is_tl(func.value)):
            return self.generic_visit(node)
        mask = _argument(node, COUNTED[func.attr], "mask")
        mask = copy.deepcopy(mask) if mask is not None else ast.Constant(None)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        if node.args:
            node.args[0] = _counted(node.args[0], mask)
        else:
            keyword = next((k for k in node.keywords if k.arg == "pointer"), None)
            if keyword is None:
                self._refuse(f"tl.{func.attr} without a pointer argument")
            keyword.value = _counted(keyword.value, mask)
        return node


def _counted(pointer: ast.expr, mask: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(COUNTER, ast.Load()), [pointer, mask], [])


def _argument(call: ast.Call, position: int | None, name: str) -> ast.expr | None:
    if position is not None and len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == name), None)


def counting_kernels(bundles: dict[str, dict], counts: torch.Tensor, start: int,
                     nbytes: int) -> dict[str, object]:
    """The traced kernels rebuilt with their loads counted into `counts` (int32, one per
    byte of the storage that begins at address `start`, `nbytes` long)."""
    counter = f"{__name__}.{COUNTER}"
    rewritten = {counter: {
        "name": COUNTER, "options": {}, "globals": {"tl": {"module": "triton.language"}},
        "source": _COUNTER_SOURCE.format(start=start, nbytes=nbytes,
                                         counts=counts.data_ptr())}}
    for name, bundle in bundles.items():
        refuse_shipped_copy(bundle)  # before its source is rewritten out of recognition
        tree = ast.parse(bundle["source"])
        tree = ast.fix_missing_locations(_Counting(bundle).visit(tree))
        rewritten[name] = dict(bundle, source=ast.unparse(tree),
                               globals={**bundle["globals"], COUNTER: {"kernel": counter}})
    return rebuild_kernels(rewritten)


def load_counts(call: TracedCall, args: Sequence[object], index: int) -> torch.Tensor:
    """How many times the traced call's kernels load each element of `args[index]` (the
    most loads of any of its bytes), when its work is replayed on `args`: a tensor of x's
    shape, on the CPU. Raise NotReplayable (CannotCount) where the loads cannot be counted."""
    x = args[index]
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"argument {index} is not a tensor")
    return per_element(_input_bytes_loaded(call, args, x), x.element_size(), tuple(x.shape),
                       tuple(x.stride()), x.storage_offset())


def _input_bytes_loaded(call: TracedCall, args: Sequence[object], x: torch.Tensor
                        ) -> torch.Tensor:
    """Loads of each byte of the storage of `x`, one of `args`, when the traced call's work
    is replayed on `args` (int32, on x's device)."""
    storage = x.untyped_storage()
    counts = torch.zeros(storage.nbytes(), dtype=torch.int32, device=x.device)
    kernels = counting_kernels(call.trace["kernels"], counts, storage.data_ptr(),
                               storage.nbytes())
    Replay(call.trace, call.keys, kernels)(*args)
    return counts


# The key under which an output's storage travels into a replay that counts its loads.
_COUNTED = "counted"


def output_load_counts(call: TracedCall, args: Sequence[object], position: int
                       ) -> torch.Tensor:
    """How many times the traced call's kernels load each element of the call's output
    number `position` (in the order it returned them; 0 for a lone tensor), when its work
    is replayed on `args`: a tensor of that output's shape, on the CPU. A fused kernel
    keeps what it stores in registers and loads none of it. (`OwnMemory.output`.)"""
    return OwnMemory(call, args).output(position)


class OwnMemory:
    """The loads of the memory a traced call made itself (its outputs, and any buffer it
    allocated and did not return), counted per byte when its work is replayed on `args`:
    one replay per storage, kept until `forget` (the counts take four bytes a byte, on the
    device the call ran on: at a timing shape, several times the storage).

    That memory is made by the replay, so its address is not known when the counter is
    written: each storage counted is made here instead and handed to the replay as one
    more input (its allocation taken out of the trace). Memory the call kept from before
    it is traced as an allocation too (the replay makes it new). Raise NotReplayable
    (CannotCount) where the loads cannot be counted."""

    def __init__(self, call: TracedCall, args: Sequence[object]):
        self.call, self.args = call, args
        self._counts: dict[str, torch.Tensor] = {}

    def storages(self) -> list[str]:
        """The key of every storage the call allocated, in the order it did."""
        return [s["storage"] for s in self.call.trace["steps"] if s["op"] == "alloc"]

    def bytes_loaded(self, key: str) -> torch.Tensor:
        """Loads of each byte of the allocated storage `key` (int32, on the device)."""
        if key not in self._counts:
            self._counts[key] = self._count(key)
        return self._counts[key]

    def forget(self, key: str) -> None:
        """Let the counts of storage `key` go."""
        self._counts.pop(key, None)

    def _count(self, key: str) -> torch.Tensor:
        call, args = self.call, self.args
        nbytes = next(s["nbytes"] for s in call.trace["steps"]
                      if s["op"] == "alloc" and s["storage"] == key)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        made = torch.empty(nbytes, dtype=torch.uint8, device=device)
        trace = dict(call.trace, outputs=_renamed(call.trace["outputs"], key),
                     steps=[_renamed(s, key) for s in call.trace["steps"]
                            if not (s["op"] == "alloc" and s["storage"] == key)])
        counts = torch.zeros(nbytes, dtype=torch.int32, device=device)
        kernels = counting_kernels(call.trace["kernels"], counts, made.data_ptr(), nbytes)
        Replay(trace, [*call.keys, _COUNTED], kernels)(*args, made)
        return counts

    def output(self, position: int) -> torch.Tensor:
        """Loads of each element of the call's output number `position` (in the order it
        returned them; 0 for a lone tensor): a tensor of that output's shape, on the CPU.
        An output that is an input's memory is counted as that input (the correctness
        checks refuse writing an input)."""
        view = output_view(self.call.trace, position)
        key = view["storage"]
        size = torch.empty(0, dtype=view["dtype"]).element_size()
        if key.startswith("input:"):
            index = self.call.keys.index(key.removeprefix("input:"))
            counts = _input_bytes_loaded(self.call, self.args, self.args[index])
        else:
            counts = self.bytes_loaded(key)
        return per_element(counts, size, view["shape"], view["stride"], view["offset"])


def output_views(trace: dict) -> list[dict | None]:
    """Where each output of the traced call lives (a `Tracer.describe` field), None for one
    that is not a tensor, in the order it returned them."""
    field = trace["outputs"]
    items = field["sequence"] if "sequence" in field else [field]
    return [item.get("tensor") for item in items]


def output_view(trace: dict, position: int) -> dict:
    """Where the traced call's output number `position` lives (a `Tracer.describe` field)."""
    views = output_views(trace)
    if not 0 <= position < len(views):
        raise ValueError(f"the traced call returned {len(views)} values, no {position}"
                         if "sequence" in trace["outputs"] else
                         f"the traced call returned one value, no {position}")
    if views[position] is None:
        raise NotReplayable(f"output {position} of the traced call is not a tensor")
    return views[position]


def _renamed(value: object, key: str) -> object:
    """`value` (a trace's step or outputs) with every view of storage `key` on the storage
    of the counted input instead."""
    if isinstance(value, dict):
        return {k: (f"input:{_COUNTED}" if k == "storage" and v == key else _renamed(v, key))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, key) for v in value]
    return value


def per_element(counts: torch.Tensor, size: int, shape: tuple, stride: tuple,
                offset: int) -> torch.Tensor:
    """Counts per byte of a storage as counts per element of a view on it (the most loads
    of any of the element's bytes), on the CPU."""
    per_byte = counts.as_strided((*shape, size), (*(s * size for s in stride), 1),
                                 offset * size)
    return per_byte.amax(dim=-1).cpu()
