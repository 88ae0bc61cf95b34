"""Test cases: a shape, a dtype, a layout and the kind of values, each tagged with what it
probes so that the pattern of passes and failures can name the bug."""

from __future__ import annotations

from dataclasses import dataclass, field

from course import runtime
from course.check.inputs import GuardedInput, guarded

import torch

# Tags say what a case probes; course.check.diagnose reads the pattern of passes and
# failures across them: pow2 / odd_n (N a power of two or not: masks), edge (N = 1 or
# M = 1), wide (N beyond any fixed block), strided (row stride > N), nd (3-D input), half
# and bf16 (16-bit inputs), magnitude (values whose square overflows float16), long (rows
# that expose low-precision accumulation), zeros (all-zero rows), eps (a non-default eps
# that matters), mean (a large row mean: cancellation in LayerNorm).


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    tags: frozenset[str] = field(default_factory=frozenset)
    row_padding: int = 0
    scale: float = 1.0
    offset: float = 0.0
    zero_rows: tuple[int, ...] = ()
    eps: float = 1e-6
    param_dtype: torch.dtype | None = None  # weight (and bias) dtype when it differs from x's

    @property
    def n(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        rows = 1
        for d in self.shape[:-1]:
            rows *= d
        return rows

    def label(self) -> str:
        dims = "x".join(map(str, self.shape))
        dtype = str(self.dtype).replace("torch.", "")
        if self.param_dtype is not None and self.param_dtype != self.dtype:
            dtype += f", weight {str(self.param_dtype).replace('torch.', '')}"
        return f"{self.name} ({dims}, {dtype})"

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.param_dtype or self.dtype

    def runnable(self) -> bool:
        return self.dtype != torch.bfloat16 or runtime.supports_bf16()

    def row_values(self, gen: torch.Generator) -> torch.Tensor:
        """Random rows in float32 on the CPU (the generator is CPU-side, for repeatability)."""
        values = torch.randn(self.shape, generator=gen) * self.scale + self.offset
        if self.zero_rows:
            flat = values.reshape(-1, self.n)
            flat[list(self.zero_rows)] = 0.0
        return values

    def make_input(self, gen: torch.Generator) -> GuardedInput:
        values = self.row_values(gen).to(self.dtype).to(runtime.DEVICE)
        return guarded(values, row_padding=self.row_padding)

    def make_vector(self, gen: torch.Generator, *, low: float = 0.25, high: float = 1.75,
                    dtype: torch.dtype | None = None) -> GuardedInput:
        """A per-column parameter such as the weight: not all ones, so ignoring it shows."""
        values = torch.rand(self.n, generator=gen) * (high - low) + low
        return guarded(values.to(dtype or self.weight_dtype).to(runtime.DEVICE))

    def make_like_input(self, gen: torch.Generator, *, scale: float = 1.0,
                        offset: float = 0.0, zero_rows: bool = False,
                        row_padding: int | None = None) -> GuardedInput:
        """A second tensor of the input's shape and dtype (a residual, an upstream gradient),
        with its own values; zero on the case's zero rows if `zero_rows`. Its rows are laid
        out like the input's unless `row_padding` gives them their own stride."""
        values = torch.randn(self.shape, generator=gen) * scale + offset
        if zero_rows and self.zero_rows:
            values.reshape(-1, self.n)[list(self.zero_rows)] = 0.0
        padding = self.row_padding if row_padding is None else row_padding
        return guarded(values.to(self.dtype).to(runtime.DEVICE), row_padding=padding)


def row_shape_cases(eps: float = 1e-6) -> list[Case]:
    """The float32 shapes every row-wise forward exercise must handle, first in its list: a
    power of two, odd N, N = 1, M = 1, rows wider than one block, padded rows."""
    f32 = torch.float32
    return [
        Case("power-of-two N", (8, 128), f32, frozenset({"pow2"}), eps=eps),
        Case("odd N", (7, 100), f32, frozenset({"odd_n"}), eps=eps),
        Case("N = 1", (5, 1), f32, frozenset({"edge"}), eps=eps),
        Case("M = 1", (1, 257), f32, frozenset({"edge", "odd_n"}), eps=eps),
        Case("wide rows", (3, 3000), f32, frozenset({"wide", "odd_n"}), eps=eps),
        Case("strided rows", (6, 128), f32, frozenset({"strided"}), row_padding=40, eps=eps),
    ]
