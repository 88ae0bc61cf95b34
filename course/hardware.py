"""What the GPU in hand can do: published peak figures, and the copy bandwidth measured here.

Peak figures come from the vendors' datasheets (dense tensor-core throughput, no
sparsity). They bound what is possible; the course's bandwidth targets are always
relative to `copy_bandwidth()`, which is measured on the device itself.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from course import runtime

import torch


@dataclass(frozen=True)
class GPUSpec:
    name: str
    hbm_gbps: float            # peak DRAM bandwidth, GB/s (1e9 bytes per second)
    bf16_tflops: float | None  # dense tensor-core bf16; None where the chip has none
    fp16_tflops: float         # dense tensor-core fp16 (fp32 accumulation)
    fp32_tflops: float         # non-tensor fp32 (FMA counted as two FLOPs)
    l2_mb: float
    memory_gb: float
    pattern: str               # regular expression matched against torch's device name

    def peak_flops(self, dtype: torch.dtype) -> float:
        """Peak FLOP/s for math in `dtype` (tensor cores for 16-bit types)."""
        if dtype == torch.bfloat16:
            tflops = self.bf16_tflops if self.bf16_tflops is not None else self.fp32_tflops
        elif dtype == torch.float16:
            tflops = self.fp16_tflops
        else:
            tflops = self.fp32_tflops
        return tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9


# Order matters: the first pattern that matches wins, so specific names come first.
# L2 sizes are for display; sources disagree for the B200, and anything that depends on
# L2 (input rotation in course.bench) asks the driver instead (l2_bytes()).
# Sources: each vendor's datasheet, dense (no-sparsity) tensor figures, i.e. half the
# "with sparsity" ones quoted beside them.
SPECS: tuple[GPUSpec, ...] = (
    # HGX B200, per GPU (1000 W). NVIDIA's Blackwell datasheet: 7.7 TB/s of HBM3e
    # (nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-3384703, as cited in
    # ai-dynamo/aiconfigurator#1246), which matches the driver's 7680-bit bus at 3996 MHz,
    # 7.67 TB/s (pytorch/ao#4002; the first DGX B200 datasheet said 64 TB/s for 8 GPUs,
    # 8 TB/s each). NVIDIA's HGX B200 table, for 8 GPUs: FP16/BF16 tensor 36 PFLOPS with
    # sparsity (2250 TFLOPS dense each), FP32 600 TFLOPS (75 each; an earlier Blackwell
    # technical brief gave 80, the GB200's figure), 1.4 TB of memory (180 GB each). L2:
    # 126.5 MB as the driver reports it (pytorch/ao#4002). A GB200 matches this pattern
    # too: its tensor and FP32 peaks are about 10 % above these.
    GPUSpec("B200", 7700, 2250, 2250, 75, 126, 180, r"B200"),
    # H200 SXM datasheet: 4.8 TB/s, BF16/FP16 1979 TFLOPS with sparsity, FP32 67, 141 GB
    GPUSpec("H200", 4800, 989, 989, 67, 50, 141, r"H200"),
    # H100 datasheet, PCIe: 2 TB/s, BF16/FP16 1513 with sparsity, FP32 51; SXM: 3.35 TB/s,
    # 1979 with sparsity, FP32 67; 50 MB L2 (Hopper whitepaper)
    GPUSpec("H100 PCIe", 2000, 756, 756, 51, 50, 80, r"H100.*PCIe"),
    GPUSpec("H100 SXM", 3350, 989, 989, 67, 50, 80, r"H100"),
    # A100 datasheet (SXM): 2039 GB/s (80 GB) or 1555 (40 GB), BF16/FP16 312, FP32 19.5
    GPUSpec("A100 80GB", 2039, 312, 312, 19.5, 40, 80, r"A100.*80GB"),
    GPUSpec("A100 40GB", 1555, 312, 312, 19.5, 40, 40, r"A100"),
    # A10 datasheet: 600 GB/s, BF16/FP16 125 (250 with sparsity), FP32 31.2
    GPUSpec("A10", 600, 125, 125, 31.2, 6, 24, r"\bA10\b|A10G"),
    # L4 datasheet: 300 GB/s, BF16/FP16 242 with sparsity, FP32 30.3; 48 MB L2
    GPUSpec("L4", 300, 121, 121, 30.3, 48, 24, r"\bL4\b"),
    # T4 datasheet: 320 GB/s, mixed-precision FP16 65, FP32 8.1 (no bfloat16 tensor cores)
    GPUSpec("T4", 320, None, 65, 8.1, 4, 16, r"\bT4\b"),
    # Ada whitepaper, RTX 4090: 1008 GB/s, BF16/FP16 tensor with FP32 accumulate 165.2
    # dense, FP32 82.6, 72 MB L2
    GPUSpec("RTX 4090", 1008, 165.2, 165.2, 82.6, 72, 24, r"RTX 4090"),
)


def spec_by_name(name: str) -> GPUSpec | None:
    """The spec whose pattern matches a device name such as 'NVIDIA H100 80GB HBM3'."""
    for spec in SPECS:
        if re.search(spec.pattern, name, flags=re.IGNORECASE):
            return spec
    return None


def lookup(short_name: str) -> GPUSpec:
    """The spec with this exact short name, e.g. lookup('H100 SXM')."""
    for spec in SPECS:
        if spec.name == short_name:
            return spec
    names = ", ".join(s.name for s in SPECS)
    raise KeyError(f"no GPU called {short_name!r} in the table; known: {names}")


def current() -> GPUSpec | None:
    """The spec of the GPU in use, or None without a GPU or for a GPU not in the table."""
    if not runtime.on_gpu():
        return None
    return spec_by_name(torch.cuda.get_device_name())


def l2_bytes() -> int:
    """L2 size of the GPU in use as the driver reports it (0 without a GPU)."""
    if not runtime.on_gpu():
        return 0
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0))


class NeedsGPU(RuntimeError):
    """Raised by measurements that only mean something on a GPU."""


@functools.cache
def _copy_bandwidth(device_index: int, nbytes: int) -> float:
    from course import bench  # bench reports fractions of this number: import lazily

    src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device_index}").random_(0, 255)
    dst = torch.empty_like(src)
    timing = bench.time_fn(lambda: dst.copy_(src), warmup=5, reps=40)
    return 2 * nbytes / timing.median_s


def copy_bandwidth(nbytes: int | None = None) -> float:
    """Bytes per second that a device-to-device copy reaches (read + write counted), measured
    once per process: the practical ceiling for any memory-bound kernel on this GPU.

    The buffers are far larger than L2 so the copy really streams through HBM.
    """
    if not runtime.on_gpu():
        raise NeedsGPU("copy_bandwidth() needs a GPU: Triton's interpreter on the CPU says "
                       "nothing about HBM. Run this on a CUDA machine (or Colab with a GPU).")
    if nbytes is None:
        nbytes = max(512 * 2**20, 8 * l2_bytes())
    return _copy_bandwidth(torch.cuda.current_device(), int(nbytes))


@functools.cache
def _broadcast_bandwidth(device_index: int, rows: int, cols: int) -> float:
    from course import bench

    a = torch.randn(rows, cols, device=f"cuda:{device_index}")
    b = torch.randn(rows, 1, device=f"cuda:{device_index}")
    out = torch.empty_like(a)
    timing = bench.time_fn(lambda: torch.mul(a, b, out=out), warmup=5, reps=40)
    return (a.numel() + out.numel()) * a.element_size() / timing.median_s


def broadcast_bandwidth() -> float:
    """Bytes per second of PyTorch's non-vectorised elementwise path, measured on a float32
    multiply that broadcasts a column (the shape of `h * rstd` in eager RMSNorm).

    PyTorch vectorises an elementwise kernel only when every operand is contiguous, of one
    dtype and not broadcast; otherwise it falls back to a slower kernel, and eager
    RMSNorm runs three of those. The traffic model uses this figure for them.
    """
    if not runtime.on_gpu():
        raise NeedsGPU("broadcast_bandwidth() needs a GPU")
    cols = 8192
    rows = max(8192, 8 * l2_bytes() // (4 * cols))
    return _broadcast_bandwidth(torch.cuda.current_device(), rows, cols)


@functools.cache
def _launch_overhead(device_index: int, kernels: int = 200) -> float:
    from course import bench

    # Replayed from a CUDA graph, so the CPU's launch cost (which Python makes large) is
    # out of the picture: what is left is what each kernel costs the GPU itself.
    tiny = torch.zeros(1, device=f"cuda:{device_index}")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tiny.add_(1.0)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            tiny.add_(1.0)
    return bench.time_fn(graph.replay, warmup=3, reps=20).median_s / kernels


def launch_overhead() -> float:
    """Seconds each kernel in a back-to-back chain costs the GPU beyond its memory traffic
    (start-up and drain of a tiny kernel), measured on the device."""
    if not runtime.on_gpu():
        raise NeedsGPU("launch_overhead() needs a GPU")
    return _launch_overhead(torch.cuda.current_device())
