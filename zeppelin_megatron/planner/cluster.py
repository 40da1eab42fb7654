"""Cluster description: nodes, GPUs, NICs, link bandwidths and token capacity.

Rank numbering is node-major: ``rank = node * gpus_per_node + local``. This file
is the one place that converts between a rank and its ``(node, local)`` pair.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Cluster", "ClusterError", "load_cluster"]

_SPEC_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class ClusterError(ValueError):
    """A cluster description that is malformed or inconsistent."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A homogeneous GPU cluster.

    Bandwidths are per direction. ``gpu_nic[l]`` is the NIC (``0 ..
    nics_per_node - 1``) nearest to local GPU ``l``; GPUs sharing a NIC share
    its bandwidth.
    """

    nodes: int
    gpus_per_node: int
    nics_per_node: int
    gpu_nic: tuple[int, ...]
    nvlink_GBps: float
    nic_Gbps: float
    tokens_per_gpu: int
    nvlink_latency_us: float = 5.0
    nic_latency_us: float = 15.0
    name: str = ""
    bandwidth_source: str = "nominal"

    def __post_init__(self) -> None:
        for attr in ("nodes", "gpus_per_node", "nics_per_node", "tokens_per_gpu"):
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ClusterError(f"cluster {attr} must be a positive integer, got {value!r}")
        object.__setattr__(self, "gpu_nic", tuple(self.gpu_nic))
        if len(self.gpu_nic) != self.gpus_per_node:
            raise ClusterError(
                f"gpu_nic lists {len(self.gpu_nic)} entries but the cluster has "
                f"{self.gpus_per_node} GPUs per node"
            )
        for local, nic in enumerate(self.gpu_nic):
            if not isinstance(nic, int) or not 0 <= nic < self.nics_per_node:
                raise ClusterError(
                    f"gpu_nic[{local}] = {nic!r} is not a NIC index in [0, {self.nics_per_node})"
                )
        unused = sorted(set(range(self.nics_per_node)) - set(self.gpu_nic))
        if unused:
            raise ClusterError(f"NICs {unused} of {self.nics_per_node} are attached to no GPU")
        for attr in ("nvlink_GBps", "nic_Gbps"):
            value = getattr(self, attr)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ClusterError(f"cluster {attr} must be a positive number, got {value!r}")
        for attr in ("nvlink_latency_us", "nic_latency_us"):
            value = getattr(self, attr)
            if not isinstance(value, (int, float)) or value < 0:
                raise ClusterError(f"cluster {attr} must be >= 0, got {value!r}")

    # -- rank arithmetic (the only place) ---------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def rank_of(self, node: int, local: int) -> int:
        return node * self.gpus_per_node + local

    def nic_of(self, rank: int) -> int:
        return self.gpu_nic[self.local_of(rank)]

    def gpus_sharing_nic(self, nic: int) -> int:
        return sum(1 for n in self.gpu_nic if n == nic)

    # -- bandwidths ----------------------------------------------------------
    @property
    def nic_GBps(self) -> float:
        """One NIC's bandwidth in GB/s (1 GB = 1e9 bytes)."""
        return self.nic_Gbps / 8.0

    def total_capacity(self) -> int:
        return self.world_size * self.tokens_per_gpu

    def with_shape(self, nodes: int, gpus_per_node: int | None = None) -> "Cluster":
        """Same hardware, another node count (NIC map kept, so G is fixed)."""
        if gpus_per_node is not None and gpus_per_node != self.gpus_per_node:
            raise ClusterError(
                f"cluster {self.name or '<unnamed>'} has {self.gpus_per_node} GPUs per node, "
                f"not {gpus_per_node}"
            )
        return replace(self, nodes=nodes)

    def with_tokens_per_gpu(self, tokens: int) -> "Cluster":
        return replace(self, tokens_per_gpu=tokens)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "nics_per_node": self.nics_per_node,
            "nvlink_GBps": self.nvlink_GBps,
            "nic_Gbps": self.nic_Gbps,
            "tokens_per_gpu": self.tokens_per_gpu,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> "Cluster":
        if not isinstance(data, dict):
            raise ClusterError(f"{source}: a cluster must be a mapping, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ClusterError(f"{source}: unknown cluster keys {unknown}; known keys: {sorted(known)}")
        data = dict(data)
        if "gpu_nic" not in data and "gpus_per_node" in data and "nics_per_node" in data:
            g, n = data["gpus_per_node"], data["nics_per_node"]
            if isinstance(g, int) and isinstance(n, int) and n > 0 and g % n == 0:
                data["gpu_nic"] = [local // (g // n) for local in range(g)]
        missing = sorted(
            f for f, spec in cls.__dataclass_fields__.items()
            if f not in data and spec.default is MISSING and spec.default_factory is MISSING
        )
        if missing:
            raise ClusterError(f"{source}: cluster is missing keys {missing}")
        try:
            return cls(**data)
        except ClusterError as exc:
            raise ClusterError(f"{source}: {exc}") from None


_H100_DEFAULTS: dict[str, Any] = {
    "name": "h100",
    "nics_per_node": 8,
    "nvlink_GBps": 450.0,
    "nic_Gbps": 400.0,
    "tokens_per_gpu": 65536,
    "bandwidth_source": "nominal",
}


def load_cluster(spec: str | Path, *, tokens_per_gpu: int | None = None) -> Cluster:
    """Read a cluster from ``NODESxGPUS`` (H100 defaults) or a YAML file.

    A YAML file may omit ``nodes``; then ``nodes`` must be given with the
    ``NODESxGPUS@file.yaml`` form, e.g. ``4x8@configs/clusters/h100.yaml``.
    """
    text = str(spec)
    nodes_override: tuple[int, int] | None = None
    if "@" in text:
        shape, _, text = text.partition("@")
        m = _SPEC_RE.match(shape)
        if not m:
            raise ClusterError(f"cluster spec {spec!r}: {shape!r} is not of the form NODESxGPUS")
        nodes_override = (int(m.group(1)), int(m.group(2)))
    m = _SPEC_RE.match(text)
    if m:
        nodes, gpus = int(m.group(1)), int(m.group(2))
        nics = _H100_DEFAULTS["nics_per_node"] if gpus % _H100_DEFAULTS["nics_per_node"] == 0 else gpus
        data = dict(_H100_DEFAULTS, nodes=nodes, gpus_per_node=gpus, nics_per_node=min(nics, gpus))
        data["name"] = f"h100-{nodes}x{gpus}"
        cluster = Cluster.from_dict(data, source=str(spec))
    else:
        path = Path(text)
        if not path.is_file():
            raise ClusterError(
                f"cluster {spec!r} is neither NODESxGPUS (e.g. 4x8) nor an existing YAML file"
            )
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ClusterError(f"{path}: not valid YAML: {exc}") from None
        if isinstance(data, dict) and nodes_override is not None:
            data = dict(data, nodes=nodes_override[0])
            if data.get("gpus_per_node", nodes_override[1]) != nodes_override[1]:
                raise ClusterError(
                    f"{path}: the file has {data['gpus_per_node']} GPUs per node, "
                    f"the spec asks for {nodes_override[1]}"
                )
            data["gpus_per_node"] = nodes_override[1]
        cluster = Cluster.from_dict(data, source=str(path))
    if tokens_per_gpu is not None:
        cluster = cluster.with_tokens_per_gpu(tokens_per_gpu)
    return cluster
