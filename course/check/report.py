"""What a checker returns: one line per case, and the advice that explains the failures."""

from __future__ import annotations

from dataclasses import dataclass, field

from course import runtime
from course.check.runner import CaseResult


@dataclass
class Report:
    exercise: str
    seed: int
    results: list[CaseResult]
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Under a failure about addresses: what the kernel touched on a smaller run of the case,
    # and what a correct kernel touches (course.access_picture.AccessPicture; a notebook
    # shows them under the message, see course.check.address_pictures).
    pictures: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.advice and all(r.passed for r in self.results)

    def rows(self) -> list[tuple[str, str, str]]:
        out = []
        for r in self.results:
            if r.error:
                verdict, detail = "ERROR", r.error.splitlines()[0][:80]
            elif not r.passed:
                verdict = "FAIL"
                parts = [f.kind for f in r.findings]
                parts += [f"{m.name}: {m.n_bad} wrong, max err {m.max_abs_err:.3g}" if m.n_bad
                          else f"{m.name}: rows off by a common factor (up to "
                               f"{100 * m.row_scale_err:.2f} %)" for m in r.mismatches]
                detail = "; ".join(parts)
            else:
                verdict = "ok"
                # Exercises in plain PyTorch launch nothing: no count to show.
                detail = (f"{len(r.launches)} launch" + ("es" if len(r.launches) != 1 else "")
                          if r.launches else "")
            out.append((r.case.label(), verdict, detail))
        return out

    def summary(self) -> str:
        rows = self.rows()
        width = max((len(r[0]) for r in rows), default=10)
        lines = [f"{self.exercise}: {sum(r.passed for r in self.results)}/{len(self.results)} "
                 f"cases pass ({runtime.MODE} mode, seed {self.seed})"]
        lines += [f"  {name:<{width}}  {verdict:<5}  {detail}" for name, verdict, detail in rows]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def message(self) -> str:
        """The text of the AssertionError raised when the report fails."""
        head = f"{self.exercise} check failed.\n\n" + "\n\n".join(self.advice)
        if self.pictures:
            head += "\n\nWhat the kernels touched (pictured under this message in a notebook):\n"
            head += "\n".join(f"  {p.title}: {p.caption}" for p in self.pictures)
        return f"{head}\n\n{self.summary()}"

    def show(self) -> None:
        print(self.summary())

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        # One line. A test cell ends with a bare checker call, whose report the checker has
        # just printed: Jupyter shows the repr of a cell's last value under it, and the
        # dataclass's own repr (every case's inputs and results) ran to thousands of
        # characters. report.show() prints the table again.
        passed = sum(r.passed for r in self.results)
        return (f"<{self.exercise} report: {passed}/{len(self.results)} cases pass, "
                f"seed {self.seed}>")
