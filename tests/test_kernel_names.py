"""Kernels compiled again by a replay reach nothing a compile would run as Python
(course.verify.kernel_names): every kernel the course ships passes the check, and bodies
that reach Python through Triton's modules, builtins, nested functions or another kernel's
`fn` are refused before anything is defined or compiled."""

from __future__ import annotations

import importlib
import pkgutil
import textwrap

import course
from course import runtime  # noqa: F401  (picks the interpreter before triton loads)
from course.verify import replay

import pytest

import solutions.kernels


def _shipped_kernels() -> list[object]:
    found = {}
    for package in (course, solutions.kernels):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith(("course.widgets", "course.__main__")):
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if replay._is_kernel(value) and value.fn.__module__ == info.name:
                    found[f"{info.name}.{value.fn.__name__}"] = value
    return list(found.values())


SHIPPED = _shipped_kernels()


def test_the_course_ships_kernels_to_check():
    assert len(SHIPPED) >= 20, [k.fn.__name__ for k in SHIPPED]


@pytest.mark.parametrize("kernel", SHIPPED, ids=lambda k: f"{k.fn.__module__}.{k.fn.__name__}")
def test_every_shipped_kernel_passes(kernel):
    bundles: dict = {}
    replay.kernel_source(kernel, bundles)
    for bundle in bundles.values():
        replay._checked_definition(bundle)  # raises NotReplayable on a refusal


def _bundle(body: str, globals_: dict | None = None) -> dict:
    source = textwrap.dedent('''
        def sneaky(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
        ''') + textwrap.indent(textwrap.dedent(body), "    ")
    carried = {"tl": {"module": "triton.language"}, "triton": {"module": "triton"},
               "math": {"module": "math"}} | (globals_ or {})
    return {"name": "sneaky", "source": source, "globals": carried, "options": {}}


HONEST = {
    "libdevice": "y = tl.extra.cuda.libdevice.rsqrt(tl.load(x_ptr + offs))",
    "math module": "y = tl.math.exp(tl.load(x_ptr + offs).to(tl.float32))",
    "dtype attribute": "bits = tl.float32.primitive_bitwidth",
    "tensor methods": "y = tl.load(x_ptr + offs).to(x_ptr.dtype.element_ty)",
    "builtins on constants": "for i in range(min(4, BLOCK)):\n    pass",
    "plain cdiv": "blocks = triton.cdiv(n, BLOCK)",
    "host math": "scale = math.sqrt(2.0)",
}

REACHES_PYTHON = {
    "os through knobs": ('getattr(triton.knobs.os, "system")("true")', "getattr"),
    "a module of triton's that is not the language": ("triton.knobs.os.system('true')",
                                                       "triton.knobs"),
    "builtins through tl.core": ('tl.core.builtins.exec("0")', "builtins"),
    "an underscore attribute": ("c = x_ptr.__class__", "__class__"),
    "a lambda": ("f = lambda v: v", "lambda"),
    "a nested function": ("def f():\n    return 0", "functiondef"),
    "an import": ("import os", "import"),
    "an unknown name": ('open("/tmp/x", "w")', "open"),
    "another kernel's fn": ("helper.fn(0)", "an attribute of a kernel"),
}


@pytest.mark.parametrize("body", HONEST.values(), ids=HONEST.keys())
def test_what_kernels_use_passes(body):
    replay._checked_definition(_bundle(body))


@pytest.mark.parametrize("body, named", REACHES_PYTHON.values(), ids=REACHES_PYTHON.keys())
def test_reaching_python_is_refused_before_anything_runs(body, named):
    helper = {"name": "helper", "source": "def helper(v):\n    return v\n", "globals": {},
              "options": {}}
    bundle = _bundle(body, {"helper": {"kernel": "helper"}})
    with pytest.raises(replay.NotReplayable) as refusal:
        replay.rebuild_kernels({"helper": helper, "sneaky": bundle})
    assert named in str(refusal.value), str(refusal.value)
