"""Timing one piece of device work: warm-up, repeated timings, median.

On CUDA each repetition is bracketed by CUDA events recorded on the current
stream (GPU time of the work, host launch gaps between kernels included); on
CPU by :func:`time.perf_counter`. ``wall=True`` times with ``perf_counter``
and a device synchronisation on both sides everywhere (host-side cost such as
per-call launch overhead included), which is what the per-call overhead
measurement wants.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..runtime.errors import BackendUnavailableError
from ..runtime.kernels import AttentionKernel, get_kernel

__all__ = ["Timing", "time_ms", "synchronize", "resolve_device", "parse_dtype", "kernel_for", "DTYPE_NAMES"]

# CLI name -> (torch dtype, profile dtype string understood by planner.profile)
DTYPE_NAMES: dict[str, tuple[torch.dtype, str]] = {
    "bf16": (torch.bfloat16, "bf16"),
    "bfloat16": (torch.bfloat16, "bf16"),
    "fp16": (torch.float16, "fp16"),
    "float16": (torch.float16, "fp16"),
    "fp32": (torch.float32, "float32"),
    "float32": (torch.float32, "float32"),
    "fp64": (torch.float64, "float64"),
    "float64": (torch.float64, "float64"),
}


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Repeated timings of one piece of work, milliseconds; ``method``: ``cuda_events`` or ``perf_counter``."""

    samples: tuple[float, ...]
    method: str

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample")

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def min(self) -> float:
        return float(min(self.samples))

    @property
    def max(self) -> float:
        return float(max(self.samples))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(
    fn: Callable[[], object], *, device: torch.device, warmup: int, repeats: int, wall: bool = False
) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed (one sample each)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples: list[float] = []
    if device.type == "cuda" and not wall:
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(float(start.elapsed_time(end)))
        return Timing(samples=tuple(samples), method="cuda_events")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(samples=tuple(samples), method="perf_counter")


def resolve_device(name: str | None) -> torch.device:
    """``None``/``"auto"``: CUDA when available, else CPU. A CUDA device that is absent is an error."""
    if name in (None, "auto"):
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for but CUDA is not available on this machine")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA devices exist")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r}: only cpu and cuda devices are supported")
    return device


def parse_dtype(name: str | None, device: torch.device) -> tuple[torch.dtype, str]:
    """CLI dtype name -> (torch dtype, profile dtype). ``None``: bf16 on CUDA, float32 on CPU."""
    if name is None:
        name = "bf16" if device.type == "cuda" else "float32"
    hit = DTYPE_NAMES.get(name.lower())
    if hit is None:
        raise ValueError(f"dtype {name!r} is not one of {sorted(DTYPE_NAMES)}")
    return hit


def kernel_for(name: str | None, device: torch.device, dtype: torch.dtype) -> AttentionKernel:
    """:func:`get_kernel`, with an unusable backend reported as a ``ValueError`` (a bad-input error)."""
    try:
        return get_kernel(name, device, dtype)
    except BackendUnavailableError as exc:
        raise ValueError(str(exc)) from None
