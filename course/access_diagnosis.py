"""What a kernel's recorded accesses show is wrong, in one line: the caption of its
access picture (course.access_picture).

Each rule looks for the pattern one address bug leaves, and the first that finds one names
it: rows started mid-row (a row offset that uses N, or another tensor's stride, instead of
the row stride), program p on row k·p (a row offset that steps over k rows: a 3-D tensor's
stride(0)), every program on the same rows (no row offset), rows never written with fewer
programs than rows (the grid), the weight loaded with a row offset, blocks that run past
the end of their row or of the weight (no mask, or none on a row's last block), rows past
the end of the tensor (several rows per program without a row mask), accesses far from
every tensor, then outputs partly never written or written twice. `outside_lines` lists
what reached outside a tensor, by program and offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course import accesses
from course.accesses import LOAD, STORE, Launch, TensorAccesses

import numpy as np

_MAX_LISTED = 8               # out-of-bounds lines listed under a picture
_VERB = {LOAD: "read", STORE: "wrote"}



@dataclass(frozen=True)
class _LaneRow:
    """The lanes along the last axis of one access's block: one row's worth of columns."""

    program: int
    kind: str
    tensor: str
    pointer: str
    block: int            # 0 for the first lane row of this program at this home row, ...
    home: tuple[int, int]  # (row, col) its first lane points at
    length: int
    overrun: int          # lanes on that leave the home row (next row, padding, past the end)
    reach: int            # the column of its last lane on, counted from the home row's start


def _lane_rows(t: TensorAccesses) -> list[_LaneRow]:
    if t.layout is None:
        return []
    shape = t.layout
    found, blocks = [], {}
    for a in t.accesses:
        length = a.offsets.shape[-1] if a.offsets.ndim else 1
        for offsets, on in zip(a.offsets.reshape(-1, length), a.on.reshape(-1, length),
                               strict=True):
            home_row, home_col = (int(v) for v in divmod(int(offsets[0]), shape.row_stride))
            rows, cols = shape.cell(offsets)
            leaves = on & ((rows != home_row) | (cols >= shape.cols))
            key = (a.program, a.kind, home_row)
            blocks[key] = blocks.get(key, -1) + 1
            reach = int(offsets[on].max()) - home_row * shape.row_stride if on.any() else -1
            found.append(_LaneRow(a.program, a.kind, t.name, a.pointer, blocks[key],
                                  (home_row, home_col), length, int(leaves.sum()), reach))
    return found


def _span(values: Sequence[int]) -> str:
    """'3', '1–7' or '0, 2, 5' for a set of indices."""
    values = sorted(set(values))
    if len(values) > 2 and values[-1] - values[0] == len(values) - 1:
        return f"{values[0]}–{values[-1]}"
    shown = ", ".join(map(str, values[:6]))
    return shown + (f" and {len(values) - 6} more" if len(values) > 6 else "")


def _rows_word(values: Sequence[int]) -> str:
    return ("row " if len(set(values)) == 1 else "rows ") + _span(values)


def _laid_out(tensors: dict[str, TensorAccesses]) -> list[TensorAccesses]:
    """The caller's tensors that can be read as rows (what the rules look at)."""
    return [t for t in tensors.values() if t.layout is not None]


def matrices(tensors: dict[str, TensorAccesses]) -> list[TensorAccesses]:
    """The tensors of rows (2-D and more) that can be read as rows: the ones a picture
    draws; vectors (the weight) are only listed."""
    return [t for t in _laid_out(tensors) if t.dims >= 2]


def own_kind(t: TensorAccesses) -> str:
    """What a tensor's picture shows: loads for an input, stores for an output."""
    return LOAD if t.role == "input" else STORE


def never_written(t: TensorAccesses) -> np.ndarray:
    """rows x cols: True where no program stored."""
    shape = t.layout
    grid = np.ones((shape.rows, shape.cols), dtype=bool)
    for cells in t.by_program(STORE).values():
        for r, c in cells:
            grid[r, c] = False
    return grid


def _stride_rule(tensors, rows_by_lane) -> str | None:
    """Programs start a tensor's row mid-row: the row offset uses another length."""
    for t in matrices(tensors):
        shape = t.layout
        if shape.rows < 2:
            continue
        starts = {}
        for lane in rows_by_lane[t.name]:
            if lane.kind == own_kind(t):
                starts.setdefault(lane.program, lane.home[0] * shape.row_stride + lane.home[1])
        wrong = {p: s for p, s in starts.items() if s % shape.row_stride}
        if not wrong:
            continue
        candidates = {"N (the row length)": shape.cols}
        candidates.update({f"{o.name}'s row stride": o.layout.row_stride
                           for o in matrices(tensors) if o.layout.rows > 1})
        for what, step in candidates.items():
            if step != shape.row_stride and all(s == p * step for p, s in starts.items()):
                p, s = max(wrong.items())
                return (f"program {p} starts its row of {t.name} at element {s} = {p} × "
                        f"{step}, but {t.name}'s rows are {shape.row_stride} elements apart: "
                        f"the row offset uses {what} instead of {t.name}'s row stride; pass "
                        f"the stride of the 2-D view ({t.name}2.stride(0)) and offset by "
                        "row * stride")
    return None


def _step_per_program(starts: dict[int, int]) -> int | None:
    """The step, when two programs or more each start at program * step (step > 0)."""
    if len(starts) < 2:
        return None
    last = max(starts)
    step = starts[last] // last
    return step if step and all(s == p * step for p, s in starts.items()) else None


def _skipped_rows_rule(tensors, rows_by_lane) -> str | None:
    """One row per program, program p on row k·p (k > 1): the row offset steps over k rows at
    a time, as the stride(0) of a 3-D tensor does."""
    for t in matrices(tensors):
        shape, kind = t.layout, own_kind(t)
        starts: dict[int, set[int]] = {}
        for lane in rows_by_lane[t.name]:
            if lane.kind == kind and lane.reach >= 0:
                starts.setdefault(lane.program, set()).add(
                    lane.home[0] * shape.row_stride + lane.home[1])
        if len(starts) < 2 or any(len(s) != 1 for s in starts.values()):
            continue
        start = {p: next(iter(s)) for p, s in starts.items()}
        step = _step_per_program(start)
        if step is None or step % shape.row_stride or step // shape.row_stride < 2:
            continue
        last, rows = max(start), step // shape.row_stride
        text = (f"program p {_VERB[kind]} row {rows}·p of {t.name} (program {last} row "
                f"{last * rows}; {t.name} has {shape.rows} rows): the row offset steps {rows} "
                f"rows ({step} elements) at a time, but {t.name}'s rows are "
                f"{shape.row_stride} elements apart, so rows are skipped and the later "
                "programs run past the last row")
        leading = [d for d, stride in enumerate(t.strides[:-2]) if stride == step]
        if leading:
            return (f"{text}. {step} is {t.name}.stride({leading[0]}) of the {t.dims}-D "
                    f"{t.name}, which steps over {rows} rows at once: launch on the 2-D view "
                    f"of its rows ({t.name}2 = validation.as_rows({t.name})) and pass "
                    f"{t.name}2.stride(0)")
        return f"{text}. Offset by row * {t.name}'s row stride"
    return None


def _same_rows_rule(tensors) -> str | None:
    """Every program touched the same rows: the row offset is missing."""
    for t in matrices(tensors):
        kind = own_kind(t)
        cells = t.by_program(kind)
        if t.layout.rows < 2 or len(cells) < 2:
            continue
        first = next(iter(cells.values()))
        if first and all(c == first for c in cells.values()):
            rows = sorted({r for r, _ in first})
            pointer = next((a.pointer for a in t.accesses if a.kind == kind), f"{t.name}_ptr")
            text = f"every program {_VERB[kind]} {_rows_word(rows)} of {t.name}"
            if kind == STORE:
                missing = [r for r, row in enumerate(never_written(t)) if row.all()]
                if missing:
                    text += f" and {_rows_word(missing)} were never written"
            return (f"{text}: the {kind}'s row offset is missing ({pointer} + row * "
                    f"stride_{t.name}_row)")
    return None


def _grid_rule(tensors, launches: list[Launch]) -> str | None:
    """Rows never written, and fewer programs than rows."""
    programs = sum(launch.programs for launch in launches)
    for t in matrices(tensors):
        if t.role != "output" or t.layout.rows < 2:
            continue
        missing = [r for r, row in enumerate(never_written(t)) if row.all()]
        if missing and programs < t.layout.rows:
            count = f"{programs} program" + ("s" if programs != 1 else "")
            return (f"{_rows_word(missing)} of {t.name} were never written: the grid has "
                    f"{count} for {t.layout.rows} rows. Launch one program per row, "
                    "grid = (M,), or have each program loop over the rows it owns")
    return None


def _vectors(tensors) -> list[TensorAccesses]:
    """The inputs of one row of N entries, N the row length of the tensors of rows: the
    weight (and a bias), shared by every row."""
    lengths = {t.layout.cols for t in matrices(tensors)}
    return [t for t in _laid_out(tensors) if t.dims == 1 and t.role == "input"
            and t.layout.cols in lengths and t.layout.cols > 1]


def _shared_row_rule(tensors, rows_by_lane) -> str | None:
    """The weight loaded from p · step in program p: a row offset on a vector every row
    shares."""
    for t in _vectors(tensors):
        starts: dict[int, int] = {}
        for lane in rows_by_lane[t.name]:
            if lane.kind == LOAD and lane.length > 1:
                starts.setdefault(lane.program, lane.home[0] * t.layout.cols + lane.home[1])
        step = _step_per_program(starts)
        if step is not None:
            last = max(starts)
            pointer = next(a.pointer for a in t.accesses if a.kind == LOAD)
            n = t.layout.cols
            return (f"program {last} loads {t.name} from element {starts[last]} = {last} × "
                    f"{step}, past its end ({n} entries): {t.name} is one row of {n} that "
                    f"every row shares, and its load takes no row offset. Load it at "
                    f"{pointer} + cols, with the row's mask, the same in every program")
    return None


def _overrun_rule(tensors, rows_by_lane) -> str | None:
    """Lanes that leave their row: past its end, into the next row or past the tensor."""
    overruns = [lane for t in _laid_out(tensors) for lane in rows_by_lane[t.name]
                if lane.overrun and 0 <= lane.home[0] < t.layout.rows]
    if not overruns:
        return None
    where = " and ".join(dict.fromkeys(
        f"{'loads of' if lane.kind == LOAD else 'stores to'} {lane.tensor}" for lane in overruns))
    n = tensors[overruns[0].tensor].layout.cols
    reach = max(lane.reach for lane in overruns)
    length = overruns[0].length
    vectors = {t.name for t in _vectors(tensors)}
    if all(lane.tensor in vectors for lane in overruns):
        # The rows are masked and only the weight's load is not.
        name = overruns[0].tensor
        return (f"each program's load of {name} runs {reach + 1 - n} entries past its end: "
                f"a block of {length} lanes over {name}'s {n} entries, with no mask on that "
                f"load. {name} is read with the same cols as a row, so its load takes the "
                f"row's mask: tl.load({overruns[0].pointer} + cols, mask=cols < n_cols, "
                "other=0.0)")
    if reach == n and any(lane.home[1] + lane.length - 1 > n for lane in overruns):
        # Blocks whose lanes go further than column n stop there: a mask that is one off.
        return (f"blocks of {length} lanes over rows of {n} stop exactly 1 column past the "
                f"end of the row in {where}: the mask lets column n_cols ({n}) through. "
                "Use cols < n_cols, not cols <= n_cols, on every tl.load and tl.store")
    if all(lane.home[1] > 0 for lane in overruns):
        # Only blocks that start inside a row run past its end: the row's last block.
        return (f"the last block of each row runs past its end in {where}: blocks of "
                f"{length} columns over a row of {n} reach column {reach}. Mask every block "
                "at the row's end, cols < n_cols with cols = start + tl.arange(0, BLOCK_N), "
                "not the block's own lanes")
    return (f"each block of {length} lanes runs {reach + 1 - n} column(s) past the end of its "
            f"row of {n} in {where}: into the next row, and past the end of the tensor for "
            "the last row. The mask is missing: mask = cols < n_cols on every tl.load and "
            "tl.store")


def _past_rows_rule(tensors, rows_by_lane) -> str | None:
    """Lane rows whose home row lies past the tensor's last row (or before its first)."""
    parts, programs = [], set()
    for t in matrices(tensors):
        rows = t.layout.rows  # an overhang is shorter than the tensor; farther is _far_rule's
        lanes = [lane for lane in rows_by_lane[t.name]
                 if (-rows <= lane.home[0] < 0 or rows <= lane.home[0] < 2 * rows)
                 and lane.reach >= 0]
        for kind in (LOAD, STORE):
            rows = sorted({lane.home[0] for lane in lanes if lane.kind == kind})
            if rows:
                parts.append(f"{_VERB[kind]} {_rows_word(rows)} of {t.name} "
                             f"({t.layout.rows} rows)")
                programs |= {lane.program for lane in lanes if lane.kind == kind}
    if not parts:
        return None
    who = (f"program {min(programs)}" if len(programs) == 1
           else f"programs {_span(sorted(programs))}")
    return (f"{who} {' and '.join(parts)}, past the last row: with several rows per "
            "program the last program overhangs the end, and there is no row mask. Mask "
            "the rows too: (rows < n_rows)[:, None] & (cols < n_cols)[None, :]")


def _far_rule(tensors) -> str | None:
    """Lanes farther outside a tensor than any overhang: an offset gone wrong."""
    far = tensors.get(accesses.FAR)
    if far is not None and far.accesses:
        a = far.accesses[0]
        offsets = a.offsets[a.on]
        return (f"program {a.program} {_VERB[a.kind]} {offsets.size} element(s) far outside "
                f"every tensor the launch was given, {int(offsets.min())} elements from the "
                f"start of {far.near}, the nearest: the {a.kind}'s offset is wrong (a pointer "
                "of another tensor, or an offset added twice?)")
    for t in _laid_out(tensors):
        shape = t.layout
        end = (shape.rows - 1) * shape.row_stride + shape.cols
        for kind in (LOAD, STORE):
            for program, offsets in sorted(t.beyond(kind).items()):
                far = [o for o in offsets if o >= end + shape.rows * shape.row_stride
                       or o < -shape.rows * shape.row_stride]
                if far:
                    where = (f"{min(far) - end} elements past the end" if min(far) >= end
                             else f"{-max(far)} elements before the start")
                    return (f"program {program} {_VERB[kind]} {len(far)} element(s) {where} of "
                            f"{t.name}, far outside it: the {kind}'s offset is wrong (a pointer "
                            "of another tensor, or an offset added twice?)")
    return None


def _coverage_rule(tensors) -> str | None:
    """Outputs partly never written, or written by several programs; inputs partly unread."""
    for t in matrices(tensors):
        if t.role != "output":
            continue
        missing = never_written(t)
        if missing.all():
            return f"no program wrote any element of {t.name}"
        if missing.any():
            cols = np.flatnonzero(missing.all(axis=0))
            if len(cols) and missing.sum() == len(cols) * t.layout.rows and cols[-1] == \
                    t.layout.cols - 1 and len(cols) == t.layout.cols - cols[0]:
                return (f"columns {_span(cols.tolist())} of every row of {t.name} were never "
                        f"written: the block covers {cols[0]} of the {t.layout.cols} "
                        "columns. BLOCK_N must be at least N (triton.next_power_of_2(N)), or "
                        "loop over the row in blocks")
            rows = sorted({int(r) for r in np.nonzero(missing)[0]})
            return (f"{int(missing.sum())} element(s) of {t.name} were never written (in "
                    f"{_rows_word(rows)})")
        twice = _touched_by_several(t, STORE)
        if twice:
            return (f"{len(twice)} element(s) of {t.name} were written by more than one "
                    f"program (in {_rows_word([r for r, _ in twice])})")
    for t in matrices(tensors):
        if t.role == "input" and t.layout.rows > 1:
            read = set().union(*t.by_program(LOAD).values()) if t.by_program(LOAD) else set()
            unread = sorted({r for r in range(t.layout.rows)
                             if not any((r, c) in read for c in range(t.layout.cols))})
            if unread:
                return f"{_rows_word(unread)} of {t.name} were never read"
    return None


def _touched_by_several(t: TensorAccesses, kind: str) -> set[tuple[int, int]]:
    seen: dict[tuple[int, int], int] = {}
    for cells in t.by_program(kind).values():
        for cell in cells:
            seen[cell] = seen.get(cell, 0) + 1
    return {cell for cell, count in seen.items() if count > 1}


def _outside_rule(tensors) -> str | None:
    for t in tensors.values():
        for kind in (LOAD, STORE):
            if t.beyond(kind):
                return f"some {kind}s of {t.name} fall outside it (listed below)"
    return None


def looks_right(tensors) -> str:
    """The caption when no rule finds anything wrong."""
    rows_of = {}
    for t in matrices(tensors):
        if t.layout.rows > 1:
            for p, cells in t.by_program(own_kind(t)).items():
                rows_of.setdefault(p, set()).add(frozenset(r for r, _ in cells))
    one_row = rows_of and all(len(s) == 1 and len(next(iter(s))) == 1 and
                              next(iter(next(iter(s)))) == p for p, s in rows_of.items())
    names = [t.name for t in matrices(tensors)]
    if one_row:
        return ("each program p read row p and wrote row p, every element once, nothing "
                "outside the tensors (" + ", ".join(names) + ")")
    return "every element written once, nothing touched outside the tensors"


def problem(tensors: dict[str, TensorAccesses], launches: list[Launch],
            error: str | None = None) -> str | None:
    """One line saying what the accesses show is wrong (the first rule that finds
    something), or None when they look right."""
    if not launches:
        if error:
            return f"your function raised {error} before launching a kernel: nothing to draw"
        return "your function launched no Triton kernel: nothing to draw"
    rows_by_lane = {t.name: _lane_rows(t) for t in _laid_out(tensors)}
    found = (_stride_rule(tensors, rows_by_lane) or _skipped_rows_rule(tensors, rows_by_lane)
             or _same_rows_rule(tensors) or _grid_rule(tensors, launches)
             or _shared_row_rule(tensors, rows_by_lane) or _overrun_rule(tensors, rows_by_lane)
             or _past_rows_rule(tensors, rows_by_lane) or _far_rule(tensors))
    failed = next((launch for launch in launches if launch.error), None)
    if failed is not None:
        head = (f"program {failed.failed_program} of {failed.kernel} raised {failed.error}; "
                "the picture shows what the launch did until then")
        return f"{head}. Before that: {found}" if found else head
    if error:
        found = found or _coverage_rule(tensors)
        head = f"your function raised {error} after its launch"
        return f"{head}; {found}" if found else head
    return found or _coverage_rule(tensors) or _outside_rule(tensors)


def outside_lines(tensors: dict[str, TensorAccesses],
                  kinds: Sequence[str] = (LOAD, STORE)) -> list[str]:
    """What reached outside a tensor's elements: one line per tensor, kind and place, with
    the programs that did it."""
    programs_of: dict[str, list[int]] = {}
    for t in tensors.values():
        for kind in kinds:
            refused = t.refused(kind)
            for program, offsets in sorted(t.beyond(kind).items()):
                skipped = len(refused.get(program, set()) & offsets)
                note = (f"; {skipped} not performed: outside every tensor the launch was given"
                        if skipped else "")
                what = (f"{_VERB[kind]} {len(offsets)} element(s) {_where(t, sorted(offsets))}"
                        f"{note}")
                programs_of.setdefault(what, []).append(program)
    lines = []
    for what, programs in programs_of.items():
        who = (f"program {programs[0]}" if len(programs) == 1
               else f"programs {_span(programs)} each")
        lines.append(f"{who} {what}")
    if len(lines) > _MAX_LISTED:
        lines = lines[:_MAX_LISTED] + [f"and {len(lines) - _MAX_LISTED} more lines like these"]
    return lines


def _where(t: TensorAccesses, offsets: list[int]) -> str:
    if t.name == accesses.FAR:
        return (f"{t.name}, at {t.near}[{offsets[0]}..{offsets[-1]}] (offsets from the first "
                f"element of {t.near}, the nearest)")
    shown = f"{t.name}[{offsets[0]}..{offsets[-1]}] (offsets from its first element)"
    if t.layout is None:
        return f"outside {shown}"
    end = (t.layout.rows - 1) * t.layout.row_stride + t.layout.cols
    if offsets[0] >= end:
        return f"past the end of {shown}"
    if offsets[-1] < 0:
        return f"before the start of {shown}"
    return f"outside the rows of {shown}: in row padding or past an end"
