"""A red team's second round (2026-11-28): three ways a submission's code kept the points
of checks it should have lost, each tried here in a fresh Python with the walls up
(tests/test_walls.py's probe), its code compiled as a cell's is.

- copies of course.traffic's functions rebuilt under another module's name ran unseen by
  the profile hook of chapters 03 and 07 (`roofline._model_of` knew the models by name);
- chapter 03's timer read the simulated GPU's true parameters from the device it is
  handed (`gpu._gpu.params`: no call, so no hook saw it);
- the walls' list of refusals was a module attribute the submission could clear, and then
  its process reported none.
"""

from __future__ import annotations

from course.verify import tamper, walls

from test_walls import _probe

# course.traffic's functions and classes rebuilt from their code objects with globals of
# their own whose __name__ is "scratch" (the red team's reglobal__ch03/ch07 submissions).
CLONE = """
import types
from course import traffic


def clone(module):
    ns = dict(vars(module))
    ns["__name__"] = "scratch"

    def fn(v):
        f = types.FunctionType(v.__code__, ns, v.__name__, v.__defaults__, v.__closure__)
        f.__kwdefaults__ = v.__kwdefaults__
        return f

    def member(v):
        if isinstance(v, types.FunctionType):
            return fn(v)
        if isinstance(v, property):
            return property(*(fn(g) if g else None for g in (v.fget, v.fset, v.fdel)))
        if isinstance(v, (staticmethod, classmethod)):
            return type(v)(fn(v.__func__))
        return v

    for k, v in list(ns.items()):
        if isinstance(v, types.FunctionType) and v.__module__ == module.__name__:
            ns[k] = fn(v)
        elif isinstance(v, type) and v.__module__ == module.__name__:
            body = {a: member(b) for a, b in vars(v).items()
                    if a not in ("__dict__", "__weakref__")}
            ns[k] = type(v.__name__, v.__bases__, body)
    return types.SimpleNamespace(**ns)


T = clone(traffic)
"""


def test_copies_of_the_models_under_another_modules_name_are_seen(tmp_path):
    got = _probe(CLONE + """
from course import check
from course.check import roofline


def eager_launch_bytes(M, N, elem_bytes):
    model = T.eager_rmsnorm(M, N, {2: "bf16", 4: "fp32"}[elem_bytes])
    return [(k.name, k.bytes) for k in model.kernels]


def honest_split(M, N, sms):
    return max(1, min(M, 4 * sms))


with roofline._traffic_calls() as called:
    T.best_split(4096, 4096, 132)
results["a copy's best_split"] = list(called)
with roofline._traffic_calls() as called:
    honest_split(4096, 4096, 132)
results["arithmetic"] = list(called)
try:
    check.eager_launch_bytes(eager_launch_bytes, seed=0, quiet=True)
    results["chapter 03's check"] = "passed"
except AssertionError as failure:
    results["chapter 03's check"] = str(failure)
""", tmp_path)
    results = got["results"]
    assert results["a copy's best_split"] == ["best_split"], got
    assert results["arithmetic"] == [], got
    assert "calls course.traffic (eager_rmsnorm" in results["chapter 03's check"], got
    assert got["refused"] == [], got


# Everything an attribute read leads to from what chapter 03's timer is handed (the device,
# the workload, its inputs, an event, an output), through closures and defaults too, and
# through the frames of a traceback the workload raised with the stack nearly full.
REACH = """
import sys, types
from course import timing

gpu, fn, inputs = timing.workload("sim:5")
event = gpu.Event(enable_timing=True)
event.record()
output = fn(*inputs[0])


def deep(n):
    if n:
        return deep(n - 1)
    return fn(*inputs[1])


frames = []
try:
    deep(sys.getrecursionlimit())
except RecursionError as error:
    tb = error.__traceback__
    while tb is not None:
        try:
            frames.append(dict(tb.tb_frame.f_locals))
        except PermissionError:
            pass
        tb = tb.tb_next

found, seen, todo = [], set(), [gpu, fn, inputs, event, output, *frames]


def ours(value):
    return getattr(value, "__module__", "") == "course.timing"


while todo and len(seen) < 50000:
    value = todo.pop()
    if id(value) in seen or isinstance(value, types.ModuleType):
        continue
    seen.add(id(value))
    if isinstance(value, (timing.SimulatedGPU, timing.SimParams)):
        found.append(type(value).__name__)
        continue
    nexts = []
    if isinstance(value, dict):
        nexts += list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        nexts += list(value)
    elif isinstance(value, types.CellType):
        nexts.append(value.cell_contents)
    if isinstance(value, type) and not ours(value):
        continue
    for name in ["__closure__", "__kwdefaults__", "__defaults__", "__self__", "__func__",
                 "__wrapped__", "__dict__", *(dir(value) if ours(value) or
                                              ours(type(value)) else ())]:
        try:
            nexts.append(getattr(value, name))
        except PermissionError:
            results.setdefault("refused", []).append(name)
        except Exception:
            pass
    if isinstance(value, types.FunctionType) and ours(value):
        nexts.append(value.__globals__)
    nexts += [type(value)] if ours(type(value)) else []
    todo += nexts
results["found"] = sorted(set(found))
"""


def test_the_simulated_gpus_parameters_are_out_of_a_timers_reach(tmp_path):
    got = _probe(REACH, tmp_path)
    assert got["results"]["found"] == [], got
    assert "__kwdefaults__" in got["results"].get("refused", []), got


def test_a_timer_reading_the_simulated_gpu_fails_and_an_honest_one_passes(tmp_path):
    got = _probe("""
from course import check, timing


def time_workload_with(time_per_call):
    return lambda spec, reps=30: time_per_call(*timing.workload(spec), reps)


def private(gpu, fn, inputs, reps=30):  # the red team's privtimer__ch03_two_pass
    p = gpu._gpu.params
    return (p.read_bytes + p.write_bytes) / p.hbm_bytes_per_s


def honest(gpu, fn, inputs, reps=30):
    for i in range(3):
        fn(*inputs[i % len(inputs)])
    gpu.synchronize()
    starts = [gpu.Event(enable_timing=True) for _ in range(reps)]
    ends = [gpu.Event(enable_timing=True) for _ in range(reps)]
    kept = []
    for i in range(reps):
        starts[i].record()
        kept.append(fn(*inputs[i % len(inputs)]))
        ends[i].record()
    gpu.synchronize()
    return sum(s.elapsed_time(e) for s, e in zip(starts, ends)) / reps / 1e3


for name, timer in (("private", private), ("honest", honest)):
    try:
        check.honest_timer(time_workload_with(timer), seed=0, quiet=True)
        results[name] = "passed"
    except AssertionError as failure:
        results[name] = str(failure)
""", tmp_path)
    assert got["results"]["honest"] == "passed", got
    assert "raised AttributeError" in got["results"]["private"], got
    assert got["refused"] == [], got


def test_the_refusals_cannot_be_cleared_by_the_submission(tmp_path):
    got = _probe("""
from course.verify import walls

try:
    open("graded.ipynb")
except PermissionError as error:
    refusal = error
if isinstance(getattr(walls, "REFUSED", None), list):
    walls.REFUSED.clear()
if hasattr(walls, "refusals"):
    attempt("the keyword defaults", lambda: walls.refusals.__kwdefaults__["_refused"].clear())
tb = refusal.__traceback__
while tb is not None:  # the hook's frame holds the list it appends to
    try:
        for value in list(tb.tb_frame.f_locals.values()):
            if isinstance(value, list):
                value.clear()
    except PermissionError:
        results["a frame of the walls"] = "refused"
    tb = tb.tb_next
results["kept"] = (walls.refusals if hasattr(walls, "refusals") else lambda: walls.REFUSED)()
""", tmp_path)
    assert any("graded.ipynb" in what for what in got["results"]["kept"]), got
    assert got["results"]["the keyword defaults"] == "refused", got
    assert got["results"]["a frame of the walls"] == "refused", got


def test_replacing_the_refusals_reader_is_noticed():
    snapshot = tamper.Snapshot.take()
    kept = walls.refusals
    try:
        walls.refusals = lambda: []
        changes = [str(c) for c in snapshot.changes()]
    finally:
        walls.refusals = kept
    assert "course.verify.walls.refusals was replaced" in changes, changes
