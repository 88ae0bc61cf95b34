"""Bandwidth checks: a kernel's speed as a fraction of the copy bandwidth measured on the
same GPU in the same process. GPU only; without one they say so instead of guessing.

A speed is only worth something for the function the correctness checks accepted, so every
call a speed check makes is judged, not only the first:

- one call at the timing shape runs watched (`course.check.sandbox`) before timing and one
  after: the exercise's launch limit, no PyTorch compute, inputs left unchanged, the output
  right;
- every call made while timing is logged (`TimedOutputs`), and afterwards the outputs the
  timer kept alive, and the latest one of every rotating input set, are compared with the
  reference computed for that call's own inputs;
- a measurement faster than a copy of the kernel's bytes (`IMPOSSIBLE_FRACTION`) is refused:
  a kernel that reads its inputs once and writes its outputs once cannot beat that.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from course import bench, hardware, runtime
from course.check import sandbox
from course.check.compare import compare
from course.check.learner_facing import learner_facing
from course.check.runner import rule_findings
from course.hardware import NeedsGPU

import torch

# Above this fraction of the copy bandwidth a measurement is refused. Honest kernels here
# have measured up to about 101 % of copy on an H100 (docs/benchmarks.md); the margin covers
# noise, not a kernel that skips work.
IMPOSSIBLE_FRACTION = 1.10


@dataclass(frozen=True)
class BandwidthResult:
    label: str
    target: float
    attempts: tuple[bench.Measurement, ...]

    @property
    def best(self) -> bench.Measurement:
        return max(self.attempts, key=lambda m: m.fraction_of_copy or 0.0)

    @property
    def passed(self) -> bool:
        return (self.best.fraction_of_copy or 0.0) >= self.target

    def __str__(self) -> str:
        best = self.best
        verdict = "passes" if self.passed else "is below"
        return (f"{best} (best of {len(self.attempts)}); {verdict} the target of "
                f"{100 * self.target:.0f} % of copy bandwidth "
                f"({hardware.copy_bandwidth() / 1e9:.0f} GB/s measured here)")

    def __repr__(self) -> str:
        # One line under a cell that ends with the check, which has printed str() already.
        verdict = "passes" if self.passed else "is below"
        return (f"<{self.label}: {100 * (self.best.fraction_of_copy or 0.0):.0f} % of copy, "
                f"{verdict} the {100 * self.target:.0f} % target>")


@dataclass(frozen=True)
class CallSpec:
    """What makes one call at the timing shape right, for the arguments it was given.

    `reference(*args)` returns the float64 reference outputs for those arguments (one tensor
    or a sequence, in the order of `names`); `extra_atol(*args)`, if given, one extra
    absolute tolerance per output (None where there is none, see `compare`). A call may
    launch up to `max_launches` Triton kernels and run no PyTorch compute op, as in the
    exercise's correctness checks. `arg_names` name the arguments in messages.

    `read_once` names arguments no element of which the call's kernels may load twice,
    `write_only` outputs (of `names`) no element of which they may load at all: a fused
    kernel keeps what it stores in registers, and reading an output back is one more pass
    over it. Both are counted on the call's own kernels (`refuse_second_reads`), and with
    either, no memory the call allocated may be loaded at all (a buffer it does not return
    included: `own_memory_loads`); `scratch_advice` says what to do instead
    (`read_once_advice` where empty).
    """

    names: tuple[str, ...]
    reference: Callable[..., torch.Tensor | Sequence[torch.Tensor]]
    dtypes: tuple[torch.dtype, ...]
    extra_atol: Callable[..., Sequence[float | torch.Tensor | None]] | None = None
    max_launches: int = 1
    arg_names: tuple[str, ...] = ()
    # Arguments no element of which may be loaded twice: a name, or several.
    read_once: str | tuple[str, ...] | None = None
    read_once_advice: str = ""     # what to do about it, for the message
    # Outputs no element of which may be loaded, and what to do instead, for the message.
    write_only: tuple[str, ...] = ()
    read_back_advice: str = ""
    # What to do instead of loading back a buffer of the call's own, for the message.
    scratch_advice: str = ""

    def __post_init__(self) -> None:
        if len(self.dtypes) != len(self.names):
            raise ValueError(f"{len(self.names)} output names but {len(self.dtypes)} dtypes")
        if self.max_launches < 1:
            raise ValueError(f"max_launches must be at least 1, got {self.max_launches}")
        for name in self.read_once_names:
            if name not in self.arg_names:
                raise ValueError(f"read_once names {name!r}, not one of arg_names")
        for name in self.write_only:
            if name not in self.names:
                raise ValueError(f"write_only names {name!r}, not one of the output names")

    @property
    def read_once_names(self) -> tuple[str, ...]:
        if self.read_once is None:
            return ()
        return (self.read_once,) if isinstance(self.read_once, str) else tuple(self.read_once)

    @property
    def counts_loads(self) -> bool:
        """Whether a call's loads are counted (of an input read once, or an output; then of
        the call's own memory too)."""
        return bool(self.read_once_names or self.write_only)

    def expected(self, args: Sequence[Any]) -> tuple[tuple[torch.Tensor, ...],
                                                     tuple[float | torch.Tensor | None, ...]]:
        """The reference outputs for `args`, and the extra tolerance of each."""
        want = self.reference(*args)
        want = (want,) if isinstance(want, torch.Tensor) else tuple(want)
        extra = (tuple(self.extra_atol(*args)) if self.extra_atol is not None
                 else (None,) * len(self.names))
        return want, extra

    def problems(self, got: object, expected: Sequence[torch.Tensor],
                 extra_atol: Sequence[float | torch.Tensor | None]) -> list[str]:
        """What is wrong with `got` (one call's return value), in words; empty when right."""
        return output_problems(self.names, got, expected, self.dtypes, extra_atol)

    def arg_name(self, index: int) -> str:
        if index < len(self.arg_names):
            return f"`{self.arg_names[index]}`"
        return f"argument {index + 1}"


def output_problems(names: Sequence[str], got: object, expected: Sequence[torch.Tensor],
                    dtypes: Sequence[torch.dtype],
                    extra_atol: Sequence[float | torch.Tensor | None] | None = None
                    ) -> list[str]:
    """One line (or paragraph) per output of `got` that differs from its float64 reference."""
    outs = got if isinstance(got, (tuple, list)) else (got,)
    if len(outs) != len(names):
        return [f"returned {len(outs)} value(s), expected {len(names)} ({', '.join(names)})"]
    extras = list(extra_atol) if extra_atol is not None else [None] * len(names)
    problems = []
    for name, out, want, dtype, extra in zip(names, outs, expected, dtypes, extras, strict=True):
        try:
            mismatch = compare(name, out, want, dtype, extra_atol=extra)
        except AssertionError as wrong_kind:  # shape, dtype or device: not a tolerance matter
            problems.append(str(wrong_kind))
            continue
        if mismatch is not None:
            problems.append(mismatch.describe())
    return problems


def _changed_inputs(args: Sequence[Any], before: Sequence[Any], spec: CallSpec) -> list[str]:
    return [f"changed its input {spec.arg_name(i)}" for i, (now, then)
            in enumerate(zip(args, before, strict=True))
            if isinstance(now, torch.Tensor) and not torch.equal(now, then)]


# For each moment a watched call runs: where it ran, and what a failure there means.
_WHEN = {
    "before": ("called once at the timing shape before timing", "so it is not timed."),
    "after": ("called again at the timing shape after timing",
              "so its time does not count. It passed the same checks before timing: a "
              "function that behaves differently on later calls is timed doing something the "
              "checks never accepted."),
}


def check_watched_call(label: str, fn: Callable[..., Any], args: Sequence[Any], spec: CallSpec,
                       *, when: str = "before",
                       refill: Callable[[], Sequence[Any]] | None = None) -> Callable[..., Any]:
    """Call `fn(*args)` once inside `sandbox.watch()` and hold it to the correctness checks'
    rules: at most `spec.max_launches` Triton launches and at least one, no PyTorch compute
    ops, its inputs unchanged, and outputs that match the reference. Raise AssertionError
    otherwise (a wrapper that switches to PyTorch, or to more launches, on large inputs is
    refused here). `when` ("before" or "after" timing) only changes the message. With
    `refill` (it makes new arguments), the same argument tensors are then refilled in place
    with new values and the function called on them again: a result cached by the inputs'
    addresses is refused at the timing shape too.

    With `spec.read_once` or `spec.write_only`, "before" also counts how many times the
    call's kernels load each element of those arguments and outputs
    (`refuse_second_reads`), on the call's own trace.

    Return what the timing then times: `fn`, or for a function that runs in the learner's
    process (course.verify), the replay of this very call's GPU work, traced "before"
    (`timed_here` says why), so that the call checked here is the call timed."""
    from course.verify import replay

    if when not in _WHEN:
        raise ValueError(f"when must be 'before' or 'after', not {when!r}")
    args = tuple(args)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    runtime.synchronize()
    # Not tracking what each launch changed: at the timing shape that copies every argument
    # before each launch, and nothing here reads it.
    traced = getattr(fn, "traced", None) if when == "before" else None
    counted = when == "before" and spec.counts_loads
    tracer, keys = replay.tracer_for(args) if counted and traced is None else (None, [])
    with sandbox.watch(track_changes=False, tracer=tracer) as record:
        if traced is not None:
            got, call = traced(*args)
        else:
            got = fn(*args)
            call = replay.traced_call(tracer, keys, got) if tracer is not None else None
    runtime.synchronize()
    where, verdict = _WHEN[when]
    broken_rules = [f.message for f in rule_findings(record, max_launches=spec.max_launches)]
    broken_rules += _changed_inputs(args, before, spec)
    if broken_rules:
        raise AssertionError(
            f"{label}: {where}, your function " + "; it ".join(broken_rules) + ". The "
            f"correctness checks refuse that at every shape, {verdict}")
    del before
    wrong = spec.problems(got, *spec.expected(args))
    if wrong:
        raise AssertionError(f"{label}: wrong output at the timing shape ({where}), "
                             f"{verdict}\n" + "\n".join(wrong))
    if refill is not None:
        _check_refilled_call(label, fn, args, spec, refill, got)
    if counted:
        refuse_second_reads(label, call, args, spec)
    return fn if traced is None else _replayed(label, call.replay)


def refuse_second_reads(label: str, call: Any, args: Sequence[Any], spec: CallSpec) -> None:
    """Raise AssertionError when the kernels of a traced call (a replay.TracedCall) load any
    element of an argument of `spec.read_once` more than once, or any element of an output
    of `spec.write_only` at all (`read_backs`), or any byte of other memory the call
    allocated (`own_memory_loads`), or when their loads cannot be counted. They are counted
    on the kernels rebuilt from their source with a counter on every load, the call's work
    replayed on `args` (course.verify.load_count), once per argument or storage counted. For
    a function in the learner's process (course.verify) that happens here, in the verifier,
    on a GPU: the kernels are compiled there, never run as Python."""
    from course.verify.load_count import OwnMemory, load_counts

    for name in spec.read_once_names:
        _refuse_loads(label, name, partial(load_counts, call, args, spec.arg_names.index(name)),
                      second_reads, f"for one read of `{name}`", spec.read_once_advice)
    memory = OwnMemory(call, args)
    for name in spec.write_only:
        _refuse_loads(label, name, partial(memory.output, spec.names.index(name)),
                      read_backs, f"that your kernel never load `{name}` back after storing "
                      "it", spec.read_back_advice)
    _refuse_own_memory_loads(label, memory, spec)


def _refuse_own_memory_loads(label: str, memory: Any, spec: CallSpec) -> None:
    """Raise AssertionError when the call's kernels load any byte of memory the call
    allocated (a load_count.OwnMemory): a buffer it does not return (scratch), or an
    output's memory outside the outputs of `spec.write_only` (counted first, with their
    own message).

    The rule is "no load of the call's own memory", not "no load of what the call stored
    earlier": the specs that count loads describe one fused pass (chapters 04 to 06), which
    loads its inputs and stores its outputs, and loads nothing else. Memory a call
    allocated holds nothing before the call writes it (memory kept from an earlier call is
    replayed as new memory too), so a load of it that leaves the outputs right reads what
    was stored, filled or copied there earlier in the call: the two rules refuse the same
    right answers, and this one needs no count of stores. Chapters 07 and 08 count no loads
    (their split reductions may store partial sums and load them again) and are not held to
    it."""
    from course.verify.replay import NotReplayable

    advice = spec.scratch_advice or spec.read_once_advice
    for key in memory.storages():  # one at a time: at a timing shape each count is large
        try:
            counts = memory.bytes_loaded(key)
        except NotReplayable as why:
            raise AssertionError(
                f"{label}: this exercise asks that your kernel load no memory your function "
                "allocated (a fused kernel loads its inputs and only stores the rest), and the "
                "grader counts the reads by running your kernels again with a counter on "
                f"every load; it cannot count yours: {why}. {advice}") from None
        message = own_memory_loads(memory.call.trace, key, counts, spec.names)
        memory.forget(key)
        if message is not None:
            raise AssertionError(f"{label}: {message} (counted over every load your kernels "
                                 f"made in one call). {advice}")


def own_memory_loads(trace: dict, key: str, counts: torch.Tensor,
                     names: Sequence[str]) -> str | None:
    """What `counts` (loads per byte of the storage `key` of a traced call, one the call
    allocated) says of the call's own memory loaded back, in words; None when none was."""
    from course.verify.load_count import output_views, per_element

    if not bool((counts > 0).any()):
        return None
    # Counted in elements of the view the kernel was given (the storage may be larger: the
    # checks' allocator surrounds new memory with guard bytes).
    passed_as, view = next(
        ((name, field["tensor"]) for step in trace["steps"] if step["op"] == "launch"
         for name, field in step["args"].items()
         if field.get("tensor", {}).get("storage") == key),
        (None, {"dtype": torch.uint8, "shape": (counts.numel(),), "stride": (1,),
                "offset": 0}))
    size = torch.empty(0, dtype=view["dtype"]).element_size()
    per, unit = per_element(counts, size, view["shape"], view["stride"], view["offset"]), \
        "elements"
    if not bool((per > 0).any()):  # loads outside the view only: counted in bytes
        per, unit = counts, "bytes"
    count, total, most = int((per > 0).sum()), per.numel(), int(per.max())
    times = "once" if most == 1 else ("twice" if most == 2 else f"{most} times")
    returned = [f"`{names[i]}`" for i, out in enumerate(output_views(trace))
                if out is not None and out["storage"] == key and i < len(names)]
    written = {step["op"] for step in trace["steps"] if step["op"] in ("fill", "copy")
               and step["target"]["storage"] == key}
    what = (f"the memory of {' and '.join(returned)}, which your function returns"
            if returned else "a buffer your function allocates and does not return")
    if passed_as is not None:
        what += f" (passed to your kernel as `{passed_as}`)"
    how = (f"your wrapper copies values into {what} and your kernel loads them"
           if "copy" in written else
           f"your wrapper fills {what} and your kernel loads it" if "fill" in written else
           f"your kernel stores values into {what} and loads them back")
    amount = ("every element of that buffer was" if count == total else
              f"{count} of its {total} {unit} were")
    # The count is of the call replayed, which without a GPU is a few rows, not the shape
    # the cell names: the buffer's shape says which.
    shape = " x ".join(str(d) for d in view["shape"])
    return (f"{how}: {amount} loaded {times}, an extra write and read of {count} {unit} in "
            f"the call counted (a {shape} buffer) that a fused kernel never makes (it loads "
            "its inputs, and only stores the rest)")


def _refuse_loads(label: str, name: str, count: Callable[[], torch.Tensor],
                  describe: Callable[[torch.Tensor, str], str | None], asked: str,
                  advice: str) -> None:
    """Raise AssertionError when `count()` (loads per element of `name`) cannot be had, or
    `describe` finds too many in it; `asked`: what the exercise asks, for the message."""
    from course.verify.replay import NotReplayable

    try:
        counts = count()
    except NotReplayable as why:
        raise AssertionError(
            f"{label}: this exercise asks {asked}, and the grader counts the reads by running "
            "your kernels again with a counter on every load; it cannot count yours: "
            f"{why}. {advice}") from None
    message = describe(counts, name)
    if message is not None:
        raise AssertionError(
            f"{label}: {message} (counted over every load your kernels made in one call, "
            f"with `{name}` of shape {tuple(counts.shape)}). {advice}")


def second_reads(counts: torch.Tensor, name: str) -> str | None:
    """What `counts` (loads of each element of `name`) say of elements loaded more than
    once, in words; None when none was."""
    again = counts > 1
    if not bool(again.any()):
        return None
    most = int(counts.max())
    times = "twice" if most == 2 else f"{most} times"
    if bool((counts == most).all()):
        return (f"your kernel reads each row of `{name}` {times}: every element of `{name}` "
                f"was loaded {times}")
    rows = again.reshape(-1, counts.shape[-1]).any(dim=-1).nonzero().flatten().tolist()
    return (f"your kernel reads part of `{name}` more than once: {int(again.sum())} of its "
            f"{counts.numel()} elements were loaded up to {times}, in {len(rows)} of its "
            f"rows (the first: row {rows[0]})")


def read_backs(counts: torch.Tensor, name: str) -> str | None:
    """What `counts` (loads of each element of the output `name`) say of an output read
    back, in words; None when no element of it was loaded."""
    loaded = counts > 0
    if not bool(loaded.any()):
        return None
    most = int(counts.max())
    times = "once" if most == 1 else ("twice" if most == 2 else f"{most} times")
    if bool(loaded.all()):
        return (f"your kernel reads `{name}` back after storing it: every element of `{name}` "
                f"was loaded {times}, an extra read of M*N elements that a fused kernel "
                "never makes")
    rows = loaded.reshape(-1, counts.shape[-1]).any(dim=-1).nonzero().flatten().tolist()
    return (f"your kernel reads part of `{name}` back after storing it: {int(loaded.sum())} "
            f"of its {counts.numel()} elements were loaded, up to {times}, in {len(rows)} of "
            f"its rows (the first: row {rows[0]}), extra reads that a fused kernel never makes")


def _check_refilled_call(label: str, fn: Callable[..., Any], args: tuple, spec: CallSpec,
                         refill: Callable[[], Sequence[Any]], earlier: Any) -> None:
    """The same argument tensors refilled in place with new values, and `fn` called on
    them again: it must return the answer for the new values."""
    old = [e.detach().clone() if isinstance(e, torch.Tensor) else e
           for e in (earlier if isinstance(earlier, (tuple, list)) else (earlier,))]
    for arg, new in zip(args, refill(), strict=True):
        if isinstance(arg, torch.Tensor) and isinstance(new, torch.Tensor) and \
                arg.shape == new.shape and arg.dtype == new.dtype:
            arg.copy_(new)
    runtime.synchronize()
    got = fn(*args)
    runtime.synchronize()
    wrong = spec.problems(got, *spec.expected(args))
    if not wrong:
        return
    outs = got if isinstance(got, (tuple, list)) else (got,)
    stale = any(isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor)
                and o.shape == e.shape and bool(torch.equal(o, e))
                for o, e in zip(outs, old, strict=False))
    raise AssertionError(
        f"{label}: called again at the timing shape with the same input tensors refilled "
        "with new values, your function returned "
        + ("the answer for their old values: a result cached by the input's address. "
           "Keep no results between calls, under any key." if stale else
           "a wrong answer, so its time would not be the time of a right one.")
        + "\n" + "\n".join(wrong))


class TimedOutputs:
    """A log of the calls of a function being timed: for each, its arguments and what it
    returned. It keeps alive the latest output of every input set, and as many of the latest
    outputs overall as the timer itself keeps (`bench.outputs_to_hold`, the same tensors), so
    that afterwards each can be compared with the reference for its own inputs (`verify`).

    Use `wrap(fn)` in place of `fn` wherever it is timed.
    """

    def __init__(self) -> None:
        self.calls = 0
        self._args: dict[tuple[int, ...], tuple[Any, ...]] = {}  # input set -> its arguments
        self._latest: dict[tuple[int, ...], tuple[int, Any]] = {}  # -> (call number, output)
        self._recent: collections.deque | None = None  # (call number, input set, output)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def logged(*args: Any) -> Any:
            out = fn(*args)
            self._record(args, out)
            return out
        return logged

    def _record(self, args: tuple[Any, ...], out: Any) -> None:
        self.calls += 1
        # Rotating input sets are distinct objects, alive for the whole measurement (and
        # here, after it): their identities name the set.
        key = tuple(id(a) for a in args)
        self._args.setdefault(key, args)
        self._latest[key] = (self.calls, out)
        if self._recent is None:
            self._recent = collections.deque(
                maxlen=bench.outputs_to_hold(bench.result_bytes(out)))
        self._recent.append((self.calls, key, out))

    @property
    def input_sets(self) -> int:
        return len(self._args)

    def kept(self) -> list[tuple[int, tuple[int, ...], Any]]:
        """(call number, input set, output) of every output kept, in call order."""
        entries = {call: (call, key, out) for key, (call, out) in self._latest.items()}
        for call, key, out in self._recent or ():
            entries[call] = (call, key, out)
        return [entries[call] for call in sorted(entries)]

    def verify(self, label: str, spec: CallSpec) -> None:
        """Raise AssertionError if any kept output is wrong for the inputs of its call, or
        if two calls returned the same memory (a later call overwrote an earlier result)."""
        kept = self.kept()
        if not kept:
            raise AssertionError(f"{label}: the timer never called the function")
        self._refuse_shared_memory(label, kept)
        order = list(self._args)
        for key in order:
            calls = [(call, out) for call, k, out in kept if k == key]
            if not calls:
                continue
            expected, extra = spec.expected(self._args[key])
            for call, out in calls:
                wrong = spec.problems(out, expected, extra)
                if wrong:
                    raise AssertionError(
                        f"{label}: the output of a timed call is wrong: call {call} of the "
                        f"{self.calls} made while timing (warm-up included), on input set "
                        f"{order.index(key) + 1} of {len(order)}. Its output was right when "
                        "checked before timing, so on later calls your function does "
                        "something else (skips the kernel, returns memory it did not write, "
                        "or a result it computed for other inputs); the time of such calls "
                        "says nothing about your kernel.\n" + "\n".join(wrong))
            del expected, extra

    def _refuse_shared_memory(self, label: str, kept: list[tuple[int, tuple[int, ...], Any]]
                              ) -> None:
        owner: dict[int, int] = {}
        for call, _, out in kept:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for t in outs:
                if not isinstance(t, torch.Tensor) or t.numel() == 0:
                    continue
                first = owner.setdefault(t.data_ptr(), call)
                if first != call:
                    raise AssertionError(
                        f"{label}: calls {first} and {call} made while timing returned the "
                        "same memory, so the later call overwrote the earlier call's result. "
                        "Allocate each output anew in every call (torch.empty_like(x)); "
                        "returning a buffer kept from an earlier call, or a cached result, "
                        "is refused.")


def refuse_impossible_speed(label: str, measurement: bench.Measurement) -> None:
    """Raise AssertionError when `measurement` beats the copy bandwidth by more than
    IMPOSSIBLE_FRACTION: these kernels move at least their ideal bytes, and nothing moves
    bytes faster than a copy."""
    fraction = measurement.fraction_of_copy
    if fraction is not None and fraction > IMPOSSIBLE_FRACTION:
        raise AssertionError(
            f"{label}: {measurement}, faster than copying its bytes: the call probably skips "
            "work. A kernel that reads its inputs once and writes its outputs once cannot "
            f"beat a plain copy of those bytes by more than noise (the limit here is "
            f"{100 * IMPOSSIBLE_FRACTION:.0f} % of copy), so this time is refused. Does every "
            "call launch your kernel over the whole input?")


def timed_here(label: str, fn: Callable[..., Any],
               make_args: Callable[[], Sequence[Any]]) -> Callable[..., Any]:
    """What a speed check times: `fn`, or, for a function that runs in the learner's
    process (course.verify), its GPU work replayed in this one, so that nothing the
    learner's code does can reach the timer (course.verify.replay)."""
    replayed = getattr(fn, "replayed", None)
    if replayed is None:
        return fn
    return _replayed(label, lambda: replayed(tuple(make_args())))


def _replayed(label: str, make_replay: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    from course.verify.replay import NotReplayable

    try:
        return make_replay()
    except NotReplayable as why:
        raise AssertionError(
            f"{label}: your function's work cannot be timed apart from your code: {why}. The "
            "grader times the kernels your wrapper launches, with the allocations, fills and "
            "copies around them, repeated in a process of its own.") from None


def measure_checked(label: str, fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]],
                    nbytes: int, spec: CallSpec, *, reps: int = 50) -> bench.Measurement:
    """`bench.measure` of `fn` on rotating inputs (GPU time only), then every output kept
    from the timed calls checked against the reference for its inputs, and a time faster
    than a copy of the bytes refused. Raise AssertionError on either."""
    fn = timed_here(label, fn, make_args)
    log = TimedOutputs()
    # GPU time only (hide_launch): the grading machine's Python speed is not the
    # learner's kernel. Under nbgrader one call's host time was measured at 71 us on an
    # H100 host, enough to starve a 95 us kernel between per-call events
    # (docs/sweeps/2026-11-23-gpu-suite/README.md, "Python's launch time is not the kernel's").
    measurement = bench.measure(label, log.wrap(fn), make_args, nbytes, reps=reps,
                                hide_launch=True)
    log.verify(label, spec)
    del log
    refuse_impossible_speed(label, measurement)
    return measurement


def needs_gpu_message(label: str) -> str:
    return (f"{label}: the bandwidth check needs a GPU. Kernels here run in Triton's interpreter "
            "on the CPU, which says nothing about memory bandwidth. Run this cell on a machine "
            "with a CUDA GPU (for example Colab with a GPU runtime).")


def resolve_on_cpu(on_cpu: str) -> str:
    """What a check without a GPU does: the notebook's choice, except under the autograder
    (COURSE_GRADING=1, set by `make autograde`), where it always fails. A learner reading on
    a laptop sees a skip; a submission graded without a GPU earns no bandwidth points."""
    if on_cpu not in ("skip", "fail"):
        raise ValueError(f"on_cpu must be 'skip' or 'fail', not {on_cpu!r}")
    return "fail" if runtime.grading() else on_cpu


@learner_facing
def check_bandwidth(label: str, fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]],
                    nbytes: int, *, spec: CallSpec, target: float, retries: int = 3,
                    reps: int = 50, on_cpu: str = "fail", advice: str = "",
                    small_args: Callable[[], Sequence[Any]] | None = None
                    ) -> BandwidthResult | None:
    """Time `fn(*make_args())` on rotating inputs; pass when some attempt reaches `target`
    (a fraction of copy bandwidth). Retries absorb a noisy neighbour or clock ramp. Every
    call is held to `spec` (see `timed_bandwidth_check`).

    Without a GPU: on_cpu="skip" prints why and returns None, on_cpu="fail" raises NeedsGPU.
    Before that, with `spec.read_once` or `spec.write_only` and `small_args`, the loads are
    counted where they can be (`count_without_gpu`).
    """
    on_cpu = resolve_on_cpu(on_cpu)
    if not runtime.on_gpu():
        if spec.counts_loads and small_args is not None:
            count_without_gpu(label, fn, tuple(small_args()), spec)
        if on_cpu == "skip":
            print(needs_gpu_message(label) + " Skipped.")
            return None
        raise NeedsGPU(needs_gpu_message(label))
    return timed_bandwidth_check(label, fn, make_args, nbytes, spec, target=target,
                                 retries=retries, reps=reps, advice=advice)


def count_without_gpu(label: str, fn: Callable[..., Any], args: tuple, spec: CallSpec) -> None:
    """In Triton's interpreter, call `fn(*args)` once and, if its output is right (a wrong
    one is the correctness checks' to explain), refuse it when its kernels load an element
    of `spec.read_once` twice, or one of `spec.write_only` at all (`refuse_second_reads`).
    Only for a function of this process: the interpreter runs a kernel's body as Python,
    which the verifier never runs, so a function of the learner's process (course.verify)
    is counted on a GPU only."""
    from course.verify.replay import trace_call

    if getattr(fn, "traced", None) is not None:
        return
    got, call = trace_call(fn, args)
    if not spec.problems(got, *spec.expected(args)):
        refuse_second_reads(label, call, args, spec)


def timed_bandwidth_check(label: str, fn: Callable[..., Any],
                          make_args: Callable[[], Sequence[Any]], nbytes: int, spec: CallSpec,
                          *, target: float, retries: int = 3, reps: int = 50,
                          advice: str = "") -> BandwidthResult:
    """`check_bandwidth` once a GPU is known to be there (tests run it with a fake timer):
    a watched call at the timing shape, the timed attempts with every kept output checked
    and impossible speeds refused, a watched call again, then the verdict."""
    # A warning on stderr would cost the whole cell its points under nbgrader: collected,
    # and shown on stdout instead.
    with sandbox.collect_warnings() as warned:
        timed = check_watched_call(label, fn, make_args(), spec, when="before",
                                   refill=make_args)
        attempts = []
        for _ in range(max(1, retries)):
            attempts.append(measure_checked(label, timed, make_args, nbytes, spec, reps=reps))
            if (attempts[-1].fraction_of_copy or 0.0) >= target:
                break
        check_watched_call(label, fn, make_args(), spec, when="after")
    for text in warned:
        print(f"note: {label}: your function raised a warning while timed: {text}")
    result = BandwidthResult(label, target, tuple(attempts))
    if not result.passed:
        raise AssertionError(f"{result}.\nIdeal bytes counted: {nbytes / 1e6:.1f} MB per call "
                             f"(each input read once, each output written once). {advice}")
    print(result)  # one line: the speed it reached, and the target
    return result
