"""How many bytes each norm kernel moves through HBM, and how many FLOPs it does.

A norm is memory-bound by hundreds of times, so its speed is decided by bytes, not math.
This module counts those bytes for every variant the course teaches: PyTorch's eager
op-by-op chain (with its float32 temporaries), the two-pass and fused Triton kernels,
residual add + norm, LayerNorm and the backward passes. One `KernelTraffic` describes
one kernel launch; a `Traffic` is the list of launches one variant needs.

What is counted, and why:

- HBM traffic only. A row-sized vector that every program reads (the weight, the bias)
  is counted once: after the first program fetches it, the others hit in L2.
- Statistics (rstd, mean) are float32, four bytes per row.
- FLOPs are counted honestly, one per arithmetic operation on a value (no FMA fusion,
  no tensor cores). Datasheet float32 peaks count a fused multiply-add as two FLOPs, so a
  plain add or multiply runs at half the quoted peak: time for this count is at most
  FLOPs / (peak / 2). RMSNorm forward: square, accumulate, multiply by rstd, multiply by
  the weight = 4 per element, plus 4 per row (divide by N, add eps, square root,
  reciprocal). LayerNorm forward: accumulate x, subtract the mean, square, accumulate,
  multiply by rstd, by the weight, add the bias = 7 per element, plus 5 per row.

A correction to a reference text. Seed 001 lists the same four operations per element,
then "call[s] it roughly 5 FLOPs per element" and gets "5N / 8N ~ 0.6 FLOP/byte" in
float32. The operations it lists are four, so the intensity is 4N / 8N = 0.5 FLOP/byte
(0.625 comes from rounding 4 up to 5). Against the H100's bf16 ridge of ~295 FLOP/byte
the norm then sits ~590x to the left, not ~500x. Either way the verdict is the same, and
it is stronger than the seed says: a norm's arithmetic runs on the fp32 CUDA cores, whose
own ridge on an H100 SXM is ~20 FLOP/byte (67 TFLOP/s over 3.35 TB/s), still ~40x to the
right of the norm; against half that peak, the rate that matches a count without FMAs,
the ridge is ~10 FLOP/byte and the norm ~20x to its left. Tensor cores never enter the
picture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course.hardware import GPUSpec

import torch

# FLOPs per element and per row, as counted in the module docstring.
RMSNORM_FLOPS_PER_ELEMENT = 4   # square, accumulate, * rstd, * weight
RMSNORM_FLOPS_PER_ROW = 4       # / N, + eps, sqrt, reciprocal
LAYERNORM_FLOPS_PER_ELEMENT = 7  # accumulate x, - mean, square, accumulate, * rstd, * w, + b
LAYERNORM_FLOPS_PER_ROW = 5     # sum / N, sum of squares / N, + eps, sqrt, reciprocal
# Backward, per element of kernel 1 (dX and the dW partial sums), with x_hat = x * rstd:
#   x_hat (1), g = w * dy (1), g * x_hat (1), accumulate it (1), x_hat * c (1),
#   g - x_hat * c (1), * rstd (1): 7 for dX; dy * x_hat and accumulate it (2) for dW.
RMSNORM_BACKWARD_FLOPS_PER_ELEMENT = 9
RMSNORM_BACKWARD_FLOPS_PER_ROW = 1  # c = sum / N
#   LayerNorm adds: x - mean (1), accumulate g (1), + the second constant (1), and
#   accumulate dy for dB (1).
LAYERNORM_BACKWARD_FLOPS_PER_ELEMENT = 13
LAYERNORM_BACKWARD_FLOPS_PER_ROW = 2  # two sums / N

STAT_BYTES = 4  # rstd and mean are float32

# Programs the backward's kernel 1 aims for by default: four per SM of an H100 (132 SMs),
# enough to fill the GPU, few enough that the float32 partial sums stay small.
DEFAULT_BACKWARD_PROGRAMS = 4 * 132

_DTYPES_BY_NAME: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64,
}
_SHORT_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
}

DTypeLike = torch.dtype | str


def as_torch_dtype(dtype: DTypeLike) -> torch.dtype:
    """The torch dtype for a torch dtype or one of 'fp32', 'bf16', 'float16', ..."""
    if isinstance(dtype, torch.dtype):
        if dtype in _SHORT_NAMES:
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES_BY_NAME:
        return _DTYPES_BY_NAME[dtype.lower()]
    known = ", ".join(_DTYPES_BY_NAME)
    raise ValueError(f"dtype must be a floating torch dtype or one of {known}; got {dtype!r}")


def dtype_bytes(dtype: DTypeLike) -> int:
    """Bytes per element: 4 for float32, 2 for float16 and bfloat16, 8 for float64."""
    return as_torch_dtype(dtype).itemsize


def dtype_name(dtype: DTypeLike) -> str:
    """Short name used in tables: 'fp32', 'fp16', 'bf16', 'fp64'."""
    return _SHORT_NAMES[as_torch_dtype(dtype)]


def _positive_int(value: object, name: str) -> int:
    # bool is an int in Python; M=True is a bug, not a shape.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _positive_rate(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of bytes per second, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class KernelTraffic:
    """One kernel launch: the bytes it reads from and writes to HBM, and its FLOPs.

    `vectorized` is False for kernels that load one element per instruction instead of
    16-byte vectors; they reach less of the copy bandwidth.
    """

    name: str
    bytes_read: int
    bytes_written: int
    flops: int
    vectorized: bool = True
    note: str = ""

    def __post_init__(self) -> None:
        for field in ("bytes_read", "bytes_written", "flops"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be a non-negative int, got {value!r}")

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def predicted_time(self, copy_bytes_per_s: float,
                       unvectorized_bytes_per_s: float | None = None,
                       launch_s: float = 0.0) -> float:
        """Seconds for this launch: its bytes at the bandwidth its access pattern gets,
        plus a fixed cost per launch."""
        bandwidth = _positive_rate(copy_bytes_per_s, "copy_bytes_per_s")
        if not self.vectorized and unvectorized_bytes_per_s is not None:
            bandwidth = _positive_rate(unvectorized_bytes_per_s, "unvectorized_bytes_per_s")
        if launch_s < 0:
            raise ValueError(f"launch_s must be >= 0, got {launch_s!r}")
        return self.bytes / bandwidth + launch_s


@dataclass(frozen=True)
class Traffic:
    """Everything one variant moves: a tuple of launches, in the order they run."""

    variant: str
    kernels: tuple[KernelTraffic, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if not self.kernels:
            raise ValueError("kernels must hold at least one KernelTraffic")

    @property
    def bytes_read(self) -> int:
        return sum(k.bytes_read for k in self.kernels)

    @property
    def bytes_written(self) -> int:
        return sum(k.bytes_written for k in self.kernels)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def launches(self) -> int:
        return len(self.kernels)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte of HBM traffic."""
        return self.flops / self.bytes

    def time_floor(self, bytes_per_s: float) -> float:
        """Seconds to move these bytes at `bytes_per_s`: no kernel can beat it."""
        return self.bytes / _positive_rate(bytes_per_s, "bytes_per_s")

    def predicted_time(self, copy_bytes_per_s: float,
                       unvectorized_bytes_per_s: float | None = None,
                       launch_s: float = 0.0) -> float:
        """Sum over launches of bytes / bandwidth + launch_s; unvectorised launches use
        `unvectorized_bytes_per_s` when given, the copy bandwidth otherwise."""
        return sum(k.predicted_time(copy_bytes_per_s, unvectorized_bytes_per_s, launch_s)
                   for k in self.kernels)

    def table(self) -> str:
        """One line per launch (MB = 1e6 bytes), then the total, for printing in a notebook."""
        width = max(len("total"), *(len(k.name) for k in self.kernels))
        lines = [f"{self.variant}: {self.launches} launch(es)",
                 f"{'kernel':<{width}}  {'read MB':>10}  {'written MB':>10}  access"]
        for k in self.kernels:
            access = "vectorised" if k.vectorized else "NOT vectorised"
            lines.append(f"{k.name:<{width}}  {k.bytes_read / 1e6:>10.2f}  "
                         f"{k.bytes_written / 1e6:>10.2f}  {access}")
        lines.append(f"{'total':<{width}}  {self.bytes_read / 1e6:>10.2f}  "
                     f"{self.bytes_written / 1e6:>10.2f}")
        return "\n".join(lines)


def _shape_and_dtypes(M: int, N: int, dtype: DTypeLike,
                      weight_dtype: DTypeLike | None) -> tuple[int, int, int, int]:
    """Validated M, N and the element sizes of x and of the weight."""
    M = _positive_int(M, "M")
    N = _positive_int(N, "N")
    e = dtype_bytes(dtype)
    ew = dtype_bytes(dtype if weight_dtype is None else weight_dtype)
    return M, N, e, ew


def _rmsnorm_flops(M: int, N: int) -> int:
    return RMSNORM_FLOPS_PER_ELEMENT * M * N + RMSNORM_FLOPS_PER_ROW * M


# ---------------------------------------------------------------- forward variants


def eager_rmsnorm(M: int, N: int, dtype: DTypeLike,
                  weight_dtype: DTypeLike | None = None) -> Traffic:
    """RMSNorm as PyTorch runs the usual op-by-op code (Hugging Face Llama style):

        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + eps)
        y = w * h.to(x.dtype)

    One launch per CUDA kernel, each a full round trip to HBM, with float32 temporaries.
    The vectorised flags are what the profiler showed on an H100 with torch 2.11: the
    bf16 -> fp32 upcast runs `unrolled_elementwise_kernel`, the two broadcasting
    multiplies run the generic `elementwise_kernel`; the rest are vectorised.
    """
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    x_dtype = as_torch_dtype(dtype)
    w_dtype = as_torch_dtype(dtype if weight_dtype is None else weight_dtype)
    # w * h follows type promotion: an fp32 weight makes a bf16 input's output fp32.
    ey = torch.promote_types(w_dtype, x_dtype).itemsize
    MN = M * N
    fp32 = 4
    converts = x_dtype != torch.float32  # .to(float32) on a float32 tensor returns it: no kernel
    kernels: list[KernelTraffic] = []
    if converts:
        kernels.append(KernelTraffic("to(float32)", MN * e, MN * fp32, 0, vectorized=False,
                                     note="unrolled_elementwise_kernel<direct_copy_kernel_cuda>"))
    kernels += [
        KernelTraffic("pow(2)", MN * fp32, MN * fp32, MN),
        KernelTraffic("mean(-1)", MN * fp32, M * fp32, MN + M, note="reduce kernel"),
        KernelTraffic("var + eps", M * fp32, M * fp32, M),
        KernelTraffic("rsqrt", M * fp32, M * fp32, 2 * M, note="sqrt and reciprocal"),
        KernelTraffic("h * rstd", MN * fp32 + M * fp32, MN * fp32, MN, vectorized=False,
                      note="broadcast over rows: elementwise_kernel, not vectorised"),
    ]
    if converts:
        kernels.append(KernelTraffic(f"to({dtype_name(x_dtype)})", MN * fp32, MN * e, 0))
    kernels.append(KernelTraffic("w * h", MN * e + N * ew, MN * ey, MN, vectorized=False,
                                 note="broadcast over columns: elementwise_kernel"))
    return Traffic(f"eager RMSNorm ({dtype_name(x_dtype)})", tuple(kernels))


def two_pass_rmsnorm(M: int, N: int, dtype: DTypeLike, weight_dtype: DTypeLike | None = None,
                     save_rstd: bool = False) -> Traffic:
    """One launch that reads each row twice: once for the sum of squares, once to
    normalise (the row did not stay on chip). 3*M*N*e + N*ew bytes (+ M*4 for rstd)."""
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    written = M * N * e + (M * STAT_BYTES if save_rstd else 0)
    kernel = KernelTraffic("two-pass rmsnorm", 2 * M * N * e + N * ew, written,
                           _rmsnorm_flops(M, N), note="x read twice")
    return Traffic(f"two-pass RMSNorm ({dtype_name(dtype)})", (kernel,))


def fused_rmsnorm(M: int, N: int, dtype: DTypeLike, weight_dtype: DTypeLike | None = None,
                  save_rstd: bool = False) -> Traffic:
    """One launch, the row kept in registers: x read once, y written once.
    2*M*N*e + N*ew bytes (+ M*4 for rstd)."""
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    written = M * N * e + (M * STAT_BYTES if save_rstd else 0)
    kernel = KernelTraffic("fused rmsnorm", M * N * e + N * ew, written, _rmsnorm_flops(M, N))
    return Traffic(f"fused RMSNorm ({dtype_name(dtype)})", (kernel,))


def unfused_add_rmsnorm(M: int, N: int, dtype: DTypeLike,
                        weight_dtype: DTypeLike | None = None,
                        save_rstd: bool = False) -> Traffic:
    """residual = x + residual in one kernel, then the fused norm re-reads that sum.

    The add has to write the sum whether or not the caller keeps it as the new residual:
    it is how the sum reaches the second kernel.
    """
    M, N, e, _ = _shape_and_dtypes(M, N, dtype, weight_dtype)
    add = KernelTraffic("x + residual", 2 * M * N * e, M * N * e, M * N)
    norm = fused_rmsnorm(M, N, dtype, weight_dtype, save_rstd).kernels[0]
    return Traffic(f"add, then RMSNorm ({dtype_name(dtype)})", (add, norm))


def fused_add_rmsnorm(M: int, N: int, dtype: DTypeLike, weight_dtype: DTypeLike | None = None,
                      save_rstd: bool = False, write_residual: bool = True) -> Traffic:
    """One launch: reads x and the residual, writes y and (as vLLM and SGLang do) the
    updated residual. 4*M*N*e + N*ew bytes; 3*M*N*e + N*ew when the sum is not kept."""
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    written = M * N * e * (2 if write_residual else 1) + (M * STAT_BYTES if save_rstd else 0)
    kernel = KernelTraffic("fused add + rmsnorm", 2 * M * N * e + N * ew, written,
                           M * N + _rmsnorm_flops(M, N))
    return Traffic(f"fused add + RMSNorm ({dtype_name(dtype)})", (kernel,))


def layernorm(M: int, N: int, dtype: DTypeLike, weight_dtype: DTypeLike | None = None,
              save_stats: bool = True) -> Traffic:
    """Fused LayerNorm, one launch: x read once, weight and bias read once, y written once,
    plus mean and rstd (float32) when saved for the backward.
    2*M*N*e + 2*N*ew (+ 8*M) bytes."""
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    written = M * N * e + (2 * M * STAT_BYTES if save_stats else 0)
    flops = LAYERNORM_FLOPS_PER_ELEMENT * M * N + LAYERNORM_FLOPS_PER_ROW * M
    kernel = KernelTraffic("fused layernorm", M * N * e + 2 * N * ew, written, flops)
    return Traffic(f"fused LayerNorm ({dtype_name(dtype)})", (kernel,))


# ---------------------------------------------------------------- backward variants


def backward_programs(M: int, partial_rows: int | None = None) -> int:
    """Programs in the backward's kernel 1, each summing its rows' dW into one float32 row.

    By default each program takes enough rows that there are about
    min(M, DEFAULT_BACKWARD_PROGRAMS) of them.
    """
    M = _positive_int(M, "M")
    if partial_rows is None:
        partial_rows = math.ceil(M / min(M, DEFAULT_BACKWARD_PROGRAMS))
    partial_rows = _positive_int(partial_rows, "partial_rows")
    return math.ceil(M / partial_rows)


def _norm_backward(M: int, N: int, dtype: DTypeLike, weight_dtype: DTypeLike | None,
                   partial_rows: int | None, *, with_bias: bool) -> Traffic:
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    P = backward_programs(M, partial_rows)
    sums = 2 if with_bias else 1          # dW partials, and dB partials for LayerNorm
    stats = 2 if with_bias else 1         # rstd, and the mean for LayerNorm
    per_element = (LAYERNORM_BACKWARD_FLOPS_PER_ELEMENT if with_bias
                   else RMSNORM_BACKWARD_FLOPS_PER_ELEMENT)
    per_row = LAYERNORM_BACKWARD_FLOPS_PER_ROW if with_bias else RMSNORM_BACKWARD_FLOPS_PER_ROW
    workspace = sums * P * N * 4          # partial sums kept in float32
    dx = KernelTraffic(
        "dx and partial sums",
        2 * M * N * e + N * ew + stats * M * STAT_BYTES,  # x, dy, w, statistics
        M * N * e + workspace,
        per_element * M * N + per_row * M,
        note=f"{P} programs of up to {math.ceil(M / P)} rows, float32 partials")
    reduce = KernelTraffic(
        "reduce partials",
        workspace,
        sums * N * ew,
        sums * P * N,                     # one add per partial value
        note="column sums of the partials")
    name = "LayerNorm" if with_bias else "RMSNorm"
    return Traffic(f"{name} backward ({dtype_name(dtype)}, {P} programs)", (dx, reduce))


def rmsnorm_backward(M: int, N: int, dtype: DTypeLike, weight_dtype: DTypeLike | None = None,
                     partial_rows: int | None = None) -> Traffic:
    """Two launches. Kernel 1: each of P = ceil(M / partial_rows) programs reads x, dy, w
    and rstd, writes dx, and writes its rows' dW sum as one float32 row (P*N*4 bytes).
    Kernel 2 reads those P rows and writes dW."""
    return _norm_backward(M, N, dtype, weight_dtype, partial_rows, with_bias=False)


def layernorm_backward(M: int, N: int, dtype: DTypeLike,
                       weight_dtype: DTypeLike | None = None,
                       partial_rows: int | None = None) -> Traffic:
    """Like `rmsnorm_backward`, plus the mean read in kernel 1, a second float32
    workspace for the dB partials, and dB written by kernel 2 (which reduces both)."""
    return _norm_backward(M, N, dtype, weight_dtype, partial_rows, with_bias=True)


def ideal_backward_bytes(M: int, N: int, dtype: DTypeLike,
                         weight_dtype: DTypeLike | None = None, with_bias: bool = False) -> int:
    """What a benchmark counts as the backward's ideal: x, dy and w read once, dx and dW
    (and dB) written once. Statistics and partial sums are overheads, not counted."""
    M, N, e, ew = _shape_and_dtypes(M, N, dtype, weight_dtype)
    params = 2 if with_bias else 1
    return 3 * M * N * e + N * ew + params * N * ew


# ---------------------------------------------------------------- the split size

# The split-size model of chapter 07, in which each program of kernel 1 handles one row at
# a time: the GPU streams at its full bandwidth once every SM has a program and about this
# many elements of a row in flight. The course's tuned backward plans keep 8192 to 32768
# elements per SM in flight (rows per tile x N x programs per SM, solutions/kernels/plans/).
ELEMENTS_IN_FLIGHT_PER_SM = 8192


def split_time(M: int, N: int, programs: int, sms: int, dtype: DTypeLike = "bf16",
               with_bias: bool = False) -> float:
    """The split-size model's time for P = `programs`, in bytes at the full bandwidth:
    the backward's bytes (the ideal, plus the float32 workspace written by kernel 1 and
    read by kernel 2) over the fraction of the bandwidth P programs can draw,
    min(1, P / sms, P * N / (ELEMENTS_IN_FLIGHT_PER_SM * sms)): every SM needs a program,
    and the programs, one row each, need that many elements in flight. Not a prediction in
    seconds: a way to compare splits of one shape."""
    M, N = _positive_int(M, "M"), _positive_int(N, "N")
    programs, sms = _positive_int(programs, "programs"), _positive_int(sms, "sms")
    if programs > M:
        raise ValueError(f"programs must be at most M = {M} (a program with no rows does "
                         f"nothing), got {programs}")
    sums = 2 if with_bias else 1
    nbytes = ideal_backward_bytes(M, N, dtype, with_bias=with_bias) + 2 * sums * 4 * programs * N
    needed = max(sms, ELEMENTS_IN_FLIGHT_PER_SM * sms / N)
    return nbytes / min(1.0, programs / needed)


def best_split(M: int, N: int, sms: int) -> int:
    """The P that minimises `split_time`: the fewest programs that fill the GPU, one per SM
    at least and P * N >= ELEMENTS_IN_FLIGHT_PER_SM * sms, at most M (fewer leave bandwidth
    unused; more only add workspace bytes)."""
    M, N, sms = _positive_int(M, "M"), _positive_int(N, "N"), _positive_int(sms, "sms")
    return min(M, max(sms, math.ceil(ELEMENTS_IN_FLIGHT_PER_SM * sms / N)))


# ---------------------------------------------------------------- roofline


def ridge_point(spec: GPUSpec, dtype: DTypeLike) -> float:
    """FLOP per byte at which `spec` turns from memory-bound to compute-bound for math in
    `dtype` (peak FLOP/s over peak HBM bytes/s)."""
    return spec.peak_flops(as_torch_dtype(dtype)) / spec.hbm_bytes_per_s


def distance_from_ridge(traffic: Traffic, spec: GPUSpec, dtype: DTypeLike) -> float:
    """How many times the kernel's intensity would have to grow to reach the ridge."""
    return ridge_point(spec, dtype) / traffic.intensity


def time_floor_at_peak(traffic: Traffic, spec: GPUSpec,
                       compute_dtype: DTypeLike = torch.float32) -> float:
    """The roofline's lower bound on time: the larger of bytes at peak HBM bandwidth and
    FLOPs at peak throughput (a norm's math runs in float32 on CUDA cores)."""
    memory_s = traffic.bytes / spec.hbm_bytes_per_s
    compute_s = traffic.flops / spec.peak_flops(as_torch_dtype(compute_dtype))
    return max(memory_s, compute_s)
