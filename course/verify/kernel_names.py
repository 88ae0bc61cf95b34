"""What a learner's kernel may name, checked before its source is compiled again.

Triton's compiler runs as Python in the process that compiles: a call in a kernel's body to
a plain Python function (not a Triton builtin, not another @triton.jit kernel) is made there
and then, with the body's constant arguments. A replay compiles the learner's kernels in the
verifier, where no walls stand (course.verify.walls), so a body reaching
`getattr(triton.knobs.os, "system")` or Python's `exec` would run the submission's code
there. Before a replay defines a kernel, every name and attribute its source uses is checked
(`python_reach`):

- a name is one of the kernel's parameters or locals, a global the trace carried (another
  kernel, a constant, one of Triton's modules, `math`), or one of a few builtins that
  compute nothing on their own (`range`, `min`, `len`, ...);
- an attribute never starts with an underscore, and another kernel is called, never read
  (its `fn` is a plain Python function);
- an attribute of a module the kernel names is followed down the modules: each one on the
  way must be Triton's language (or `math`), and what it ends at must come from there
  (`tl.math.exp`, `tl.float32`, `tl.extra.cuda.libdevice.rsqrt`), not `tl.core.builtins`;
- the body defines no function, lambda or class and imports nothing, so no Python of the
  learner's own is there to be called.
"""

from __future__ import annotations

import ast
import importlib
import types

# Builtins a kernel may call: Triton evaluates them on constants while it compiles.
BUILTINS = frozenset({"range", "min", "max", "len", "abs", "int", "float", "bool", "print",
                      "isinstance", "zip", "enumerate", "tuple", "list", "divmod"})
# Modules whose contents a kernel may reach, by name prefix, and plain Python functions of
# Triton's that a kernel may call on constants.
LANGUAGE_MODULES = ("triton.language", "math")
PLAIN_FUNCTIONS = frozenset({"triton.cdiv", "triton.next_power_of_2"})
_DEFINES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Import,
            ast.ImportFrom, ast.Global, ast.Nonlocal)


def _in_language(module: types.ModuleType) -> bool:
    name = module.__name__
    return any(name == m or name.startswith(m + ".") for m in LANGUAGE_MODULES)


def _from_language(value: object) -> bool:
    """Whether `value`, reached from a module of Triton's language, is that language's own:
    a module of it, or an object defined in one (a builtin, a dtype, a constexpr)."""
    if isinstance(value, types.ModuleType):
        return _in_language(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True
    # Triton's own @jit functions (tl.sum, tl.zeros) by their Python function's module
    owner = getattr(getattr(value, "fn", value), "__module__", None) or \
        getattr(type(value), "__module__", "")
    return any(owner == m or owner.startswith(m + ".") for m in LANGUAGE_MODULES)


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """`a.b.c` as ("a", ["b", "c"]); None where the root is not a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, parts[::-1]) if isinstance(node, ast.Name) else None


def _bound_names(function: ast.FunctionDef) -> set[str]:
    """The kernel's parameters and every name its body assigns."""
    arguments = function.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def python_reach(function: ast.FunctionDef, carried: dict[str, dict], kernel: str
                 ) -> str | None:
    """Why compiling the kernel `function` (its parsed definition) would run Python of the
    learner's, or None where it would not. `carried`: the globals its trace carried, as
    course.verify.replay's bundles hold them ({"module": name}, {"kernel": ...}, a value)."""
    why = _first_reach(function, carried)
    return None if why is None else (
        f"kernel {kernel}: {why}; a kernel may use Triton's language (tl.*), math, constants "
        "and other kernels")


def _first_reach(function: ast.FunctionDef, carried: dict[str, dict]) -> str | None:
    bound = _bound_names(function)
    modules = {name: field["module"] for name, field in carried.items() if "module" in field}
    checked_roots: set[int] = set()
    # The body only: the signature is evaluated when the kernel is defined, not compiled,
    # and course.verify.replay allows it names and constants alone.
    for node in (n for statement in function.body for n in ast.walk(statement)):
        if isinstance(node, _DEFINES):
            return f"its body holds a {type(node).__name__.lower()}"
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                return f"it reads the attribute {node.attr}"
            if id(node) in checked_roots:
                continue
            chain = _chain(node)
            if chain is None or chain[0] in bound:
                continue
            if "kernel" in carried.get(chain[0], {}):  # kernel.fn is a plain Python function
                return f"it reads {chain[0]}.{chain[1][0]}, an attribute of a kernel"
            if chain[0] not in modules:
                continue
            root, parts = chain
            value: object = importlib.import_module(modules[root])
            path = modules[root]
            for part in parts:
                if not isinstance(value, types.ModuleType):
                    break  # an attribute of a language object (tl.float32.primitive_bitwidth)
                value = getattr(value, part, None)
                path = f"{path}.{part}"
                if path in PLAIN_FUNCTIONS:
                    break
                if not _from_language(value):
                    return f"it reaches {path}, which is not Triton's language"
            inner = node.value  # the chain's own inner attributes are checked with it
            while isinstance(inner, ast.Attribute):
                checked_roots.add(id(inner))
                inner = inner.value
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in bound or node.id in carried or node.id in BUILTINS:
                continue
            return (f"it names {node.id}, which is neither its own, a global the trace "
                    "carried, nor a builtin a kernel may call")
    return None
