"""What a launch plan knows of the GPU it is made for (docs/launch-rules.md#derived-rules):
the one visible, read from the driver; an H100 where none is; the interpreter's few
programs run one at a time; or, to plan without the hardware, a GPU in `KNOWN_GPUS`."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from course import hardware

import torch

from solutions.kernels.sibling_sync import split_fits


@dataclass(frozen=True, kw_only=True)
class GpuProperties:
    """What the derived rules need to know of a GPU (docs/launch-rules.md#derived-rules)."""

    name: str
    sms: int
    bandwidth_gbps: float  # HBM, GB/s
    l2_bytes: int
    registers_per_sm: int = 65536  # 32-bit registers, every NVIDIA GPU since Maxwell
    shared_memory_per_sm: int = 228 * 1024
    max_warps_per_sm: int = 64
    concurrent: bool = True  # programs run at once (not in the interpreter: split never runs)

    def runs_split(self, split: int) -> bool:
        """Whether a row split over `split` programs can run here: its programs all at once
        (`sibling_sync.split_fits`), which the interpreter, running them one by one, never
        does."""
        return self.concurrent and split_fits(split, self.sms)


def _datasheet(short: str, sms: int, shared_kb: int, max_warps: int) -> GpuProperties:
    spec = hardware.lookup(short)  # bandwidth and L2 from course.hardware's table
    return GpuProperties(name=short, sms=sms, bandwidth_gbps=spec.hbm_gbps,
                         l2_bytes=int(spec.l2_mb * 2**20), shared_memory_per_sm=shared_kb * 1024,
                         max_warps_per_sm=max_warps)


H100 = _datasheet("H100 SXM", 132, 228, 64)  # where no GPU is visible, plans are made for it
KNOWN_GPUS = {gpu.name: gpu for gpu in (
    H100, _datasheet("H200", 132, 228, 64), _datasheet("B200", 148, 228, 64),
    _datasheet("A100 80GB", 108, 164, 64), _datasheet("L4", 58, 100, 48),
    _datasheet("T4", 40, 64, 32))}
# The interpreter runs an H100's plans, on 8 programs (run one by one, fewer cost less).
INTERPRETER = replace(H100, name="Triton interpreter, planning as an H100 SXM", sms=8,
                      concurrent=False)


@functools.cache
def _visible_gpu(index: int) -> GpuProperties:
    props = torch.cuda.get_device_properties(index)
    spec = hardware.spec_by_name(props.name)
    clock_bus = 2 * getattr(props, "memory_clock_rate", 0) * getattr(props, "memory_bus_width", 0)
    return GpuProperties(
        name=props.name, sms=props.multi_processor_count,
        bandwidth_gbps=spec.hbm_gbps if spec else clock_bus / 8e6 or H100.bandwidth_gbps,
        l2_bytes=props.L2_cache_size,
        registers_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        shared_memory_per_sm=props.shared_memory_per_multiprocessor,
        max_warps_per_sm=props.max_threads_per_multi_processor // 32)


def gpu_properties(device: torch.device) -> GpuProperties:
    """The GPU plans for `device` are made for: the one visible, an H100 where none is."""
    if device.type != "cuda":
        return INTERPRETER
    if not torch.cuda.is_available():
        return H100
    return _visible_gpu(device.index if device.index is not None else torch.cuda.current_device())


def multiprocessors(device: torch.device) -> int:
    """SMs the plans for `device` count on."""
    return gpu_properties(device).sms
