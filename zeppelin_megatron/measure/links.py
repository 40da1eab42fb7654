"""Measure link bandwidth and latency between ranks of a running process group.

Run by every rank of an initialised ``torch.distributed`` group (NCCL on GPUs
under ``torchrun``, gloo on CPU in tests). Ranks are node-major
(``node = rank // gpus_per_node``, torchrun's numbering). Two pairs are timed,
both from rank 0:

* NVLink: rank 0 -> rank 1 (same node), when ``gpus_per_node >= 2``;
* NIC: rank 0 -> rank ``gpus_per_node`` (local index 0 of node 1: the
  rail-aligned peer), when there are >= 2 nodes.

Bandwidth: the sender posts ``iters`` point-to-point sends of ``nbytes`` and
waits for a 1-element acknowledgement; ``GB/s = iters * nbytes / time``
(median over ``repeats``, wall clock with device synchronisation). Latency:
half the median round trip of a 1-element ping-pong. A single pair at a time,
one direction: this is what one unrouted ring hop gets, which is what the cost
model's per-link bandwidth means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .timing import time_ms

__all__ = ["LinkResult", "measure_links"]


@dataclass(frozen=True, kw_only=True)
class LinkResult:
    """Measured links (``None``: that link was not measured). Bandwidths in GB/s, latencies in us."""

    world_size: int
    gpus_per_node: int
    backend: str
    nbytes: int
    nvlink_GBps: float | None = None
    nvlink_latency_us: float | None = None
    nic_GBps: float | None = None
    nic_latency_us: float | None = None

    @property
    def measured(self) -> bool:
        return self.nvlink_GBps is not None or self.nic_GBps is not None

    def profile_links(self) -> dict[str, float]:
        """The profile's ``links`` section: only the measured bandwidths."""
        out = {}
        if self.nvlink_GBps is not None:
            out["nvlink_GBps"] = round(self.nvlink_GBps, 3)
        if self.nic_GBps is not None:
            out["nic_GBps"] = round(self.nic_GBps, 3)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}

    def summary(self) -> str:
        parts = [f"Links measured with {self.backend} point-to-point over {self.world_size} ranks "
                 f"({self.gpus_per_node} per node), {self.nbytes} bytes per message:"]
        if self.nvlink_GBps is not None:
            parts.append(f"intra-node rank 0 -> 1: {self.nvlink_GBps:.2f} GB/s, {self.nvlink_latency_us:.1f} us;")
        else:
            parts.append("intra-node link not measured (one GPU per node): nominal value kept;")
        if self.nic_GBps is not None:
            parts.append(f"inter-node rank 0 -> {self.gpus_per_node}: {self.nic_GBps:.2f} GB/s, "
                         f"{self.nic_latency_us:.1f} us.")
        else:
            parts.append("inter-node link not measured (one node): nominal value kept.")
        return " ".join(parts)


def _pair(src: int, dst: int, *, device: torch.device, nbytes: int, iters: int, warmup: int,
          repeats: int) -> tuple[float, float] | None:
    """-> ``(GB/s, latency us)`` on ``src``; None on every other rank (``dst`` takes part)."""
    me = dist.get_rank()
    if me not in (src, dst):
        return None
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    ack = torch.zeros(1, dtype=torch.float32, device=device)

    def stream(n: int) -> None:
        if me == src:
            for _ in range(n):
                dist.send(buf, dst)
            dist.recv(ack, dst)
        else:
            for _ in range(n):
                dist.recv(buf, src)
            dist.send(ack, src)

    def ping() -> None:
        if me == src:
            dist.send(ack, dst)
            dist.recv(ack, dst)
        else:
            dist.recv(ack, src)
            dist.send(ack, src)

    def median_s(fn: Callable[[], None]) -> float:
        return time_ms(fn, device=device, warmup=warmup, repeats=repeats, wall=True).median / 1e3

    bw_s = median_s(lambda: stream(iters))
    rtt_s = median_s(ping)
    if me != src:
        return None
    return iters * buf.numel() * 4 / bw_s / 1e9, rtt_s / 2 * 1e6


def measure_links(
    *, device: torch.device, gpus_per_node: int, nbytes: int = 64 << 20, iters: int = 10,
    warmup: int = 3, repeats: int = 5,
) -> LinkResult:
    """Every rank calls this; rank 0's result holds the measurements (others get the same shape, no numbers)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("measure_links needs an initialised torch.distributed process group")
    world = dist.get_world_size()
    if gpus_per_node < 1 or world % gpus_per_node:
        raise ValueError(f"world size {world} is not a multiple of gpus_per_node = {gpus_per_node}")
    if nbytes < 4 or iters < 1:
        raise ValueError(f"need nbytes >= 4 and iters >= 1, got nbytes={nbytes}, iters={iters}")
    if warmup < 0 or repeats < 1:  # checked on every rank: time_ms would raise on the pair's ranks only
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    kw = dict(device=device, nbytes=nbytes, iters=iters, warmup=warmup, repeats=repeats)
    intra = inter = None
    if gpus_per_node >= 2:
        intra = _pair(0, 1, **kw)
        dist.barrier()
    if world // gpus_per_node >= 2:
        inter = _pair(0, gpus_per_node, **kw)
        dist.barrier()
    return LinkResult(
        world_size=world, gpus_per_node=gpus_per_node, backend=str(dist.get_backend()).lower(),
        nbytes=max(1, nbytes // 4) * 4,
        nvlink_GBps=intra[0] if intra else None, nvlink_latency_us=intra[1] if intra else None,
        nic_GBps=inter[0] if inter else None, nic_latency_us=inter[1] if inter else None,
    )
