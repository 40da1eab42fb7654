"""Cost-profile file format (``zeppelin-profile/1``): measured kernel timings.

A profile holds measurements of one GPU type, all forward+backward, one layer::

    {
      "schema": "zeppelin-profile/1",
      "device": "NVIDIA H100 80GB HBM3", "dtype": "bf16", "source": "...",
      "attention": {"q_heads": 32, "kv_heads": 8, "head_dim": 128,
                    "rows": [{"seqlen": 128, "num_seqs": 1024, "causal": true,
                              "fwd_bwd_ms": 13.72}, ...]},
      "ring_blocks": {"q_heads": 32, "head_dim": 128,
                      "rows": [{"q_len": 128, "k_len": 64, "num_seqs": 512,
                                "fwd_bwd_ms": 5.20}, ...]},          # optional
      "linear": {"hidden": 4096, "ffn": 11008, "q_heads": 32, "kv_heads": 8,
                 "head_dim": 128, "rows": [{"tokens": 1024, "fwd_bwd_ms": 2.18}, ...]},
      "call_overhead_ms": 1.09,                                        # optional
      "hbm": {"GBps": 2951.7, "source": "measured"},                   # optional
      "links": {"nvlink_GBps": 370.0, "nic_GBps": 48.0}                # optional
    }

``attention.rows`` time a varlen call over ``num_seqs`` sequences of ``seqlen``
tokens each; ``causal`` rows are required, non-causal ones optional.
``ring_blocks`` time non-causal rectangular blocks (as ring steps make them).
``hbm.GBps`` is device-memory bandwidth counted as bytes read + bytes written per
second by a large device-to-device copy; ``hbm.source`` says ``measured`` or
``datasheet``. A profile without ``hbm`` gets its device's datasheet figure
(:data:`HBM_DATASHEET_GBPS`, matched by a substring of ``device``, labelled
``datasheet``); for a device not in that table loading fails with a
:class:`ProfileError` naming the device and the key to add. The simulator prices
the engine's merges and gathers from it (``docs/simulator.md``, "Charges").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "ProfileError",
    "AttentionRow",
    "BlockRow",
    "LinearRow",
    "CostProfile",
    "load_profile",
    "default_profile",
    "PROFILE_SCHEMA",
    "HBM_DATASHEET_GBPS",
    "hbm_datasheet_GBps",
]

PROFILE_SCHEMA = "zeppelin-profile/1"


class ProfileError(ValueError):
    """A cost profile that is malformed."""


HBM_DATASHEET_GBPS: dict[str, float] = {
    "H100 80GB HBM3": 3350.0,   # H100 SXM5 HBM3 datasheet: 3.35 TB/s
    "H100 SXM": 3350.0,
    "H100 PCIe": 2000.0,        # H100 PCIe HBM2e: 2.0 TB/s
    "H100 NVL": 3900.0,         # H100 NVL HBM3: 3.9 TB/s
    "H200": 4800.0,             # H200 HBM3e: 4.8 TB/s
    "A100-SXM4-80GB": 2039.0,   # A100 80GB SXM HBM2e: 2.039 TB/s
    "A100-SXM4-40GB": 1555.0,   # A100 40GB HBM2: 1.555 TB/s
}
"""Datasheet device-memory bandwidth (GB/s) by a substring of the profile's ``device``
(first match in this order). Not measured: used only when a profile has no ``hbm``."""


def hbm_datasheet_GBps(device: str) -> float | None:
    """Datasheet HBM bandwidth of ``device`` (GB/s), or None when no entry matches.

    Example: ``hbm_datasheet_GBps("NVIDIA H100 80GB HBM3") == 3350.0``.
    """
    for key, value in HBM_DATASHEET_GBPS.items():
        if key.lower() in device.lower():
            return value
    return None


@dataclass(frozen=True, kw_only=True)
class AttentionRow:
    seqlen: int
    num_seqs: int
    causal: bool
    fwd_bwd_ms: float


@dataclass(frozen=True, kw_only=True)
class BlockRow:
    q_len: int
    k_len: int
    num_seqs: int
    fwd_bwd_ms: float


@dataclass(frozen=True, kw_only=True)
class LinearRow:
    tokens: int
    fwd_bwd_ms: float


@dataclass(frozen=True, kw_only=True)
class CostProfile:
    """Parsed, validated profile. Shapes describe what was measured."""

    device: str
    dtype: str
    dtype_bytes: int
    source: str
    attn_q_heads: int
    attn_head_dim: int
    attention: tuple[AttentionRow, ...]
    block_q_heads: int
    block_head_dim: int
    blocks: tuple[BlockRow, ...]
    lin_hidden: int
    lin_ffn: int
    lin_q_heads: int
    lin_kv_heads: int
    lin_head_dim: int
    linear: tuple[LinearRow, ...]
    call_overhead_ms: float
    nvlink_GBps: float | None = None
    nic_GBps: float | None = None
    hbm_GBps: float = 3350.0
    """Device-memory bandwidth, bytes read + written per second (GB/s)."""
    hbm_source: str = "datasheet"
    """``measured`` or ``datasheet`` (where :attr:`hbm_GBps` comes from)."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": PROFILE_SCHEMA,
            "device": self.device,
            "dtype": self.dtype,
            "source": self.source,
            "attention": {
                "q_heads": self.attn_q_heads,
                "head_dim": self.attn_head_dim,
                "rows": [vars(r) for r in self.attention],
            },
            "linear": {
                "hidden": self.lin_hidden,
                "ffn": self.lin_ffn,
                "q_heads": self.lin_q_heads,
                "kv_heads": self.lin_kv_heads,
                "head_dim": self.lin_head_dim,
                "rows": [vars(r) for r in self.linear],
            },
            "call_overhead_ms": self.call_overhead_ms,
            "hbm": {"GBps": self.hbm_GBps, "source": self.hbm_source},
        }
        if self.blocks:
            doc["ring_blocks"] = {
                "q_heads": self.block_q_heads,
                "head_dim": self.block_head_dim,
                "rows": [vars(r) for r in self.blocks],
            }
        links = {k: v for k, v in (("nvlink_GBps", self.nvlink_GBps), ("nic_GBps", self.nic_GBps)) if v}
        if links:
            doc["links"] = links
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp32": 4, "float32": 4, "float64": 8}


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise ProfileError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise ProfileError(f"{where}: missing key {key!r}")
    value = d[key]
    if kind in (int, float) or kind == (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{where}.{key}: expected a number, got {value!r}")
        if kind is int and not float(value).is_integer():
            raise ProfileError(f"{where}.{key}: expected an integer, got {value!r}")
        if value <= 0:
            raise ProfileError(f"{where}.{key}: must be > 0, got {value!r}")
        return int(value) if kind is int else float(value)
    if not isinstance(value, kind):
        raise ProfileError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _rows(section: dict[str, Any], where: str) -> list[dict[str, Any]]:
    rows = _get(section, "rows", list, where)
    if not rows:
        raise ProfileError(f"{where}.rows: needs at least one row")
    return rows


def parse_profile(doc: Any, *, source: str = "<profile>") -> CostProfile:
    """Validate a profile document (already JSON-decoded)."""
    if not isinstance(doc, dict):
        raise ProfileError(f"{source}: a profile must be a JSON object")
    schema = doc.get("schema")
    if schema != PROFILE_SCHEMA:
        raise ProfileError(f"{source}: schema is {schema!r}, expected {PROFILE_SCHEMA!r}")
    dtype = _get(doc, "dtype", str, source)
    if dtype not in _DTYPE_BYTES:
        raise ProfileError(f"{source}.dtype: {dtype!r} is not one of {sorted(_DTYPE_BYTES)}")

    att = _get(doc, "attention", dict, source)
    att_rows = []
    for i, r in enumerate(_rows(att, f"{source}.attention")):
        w = f"{source}.attention.rows[{i}]"
        causal = _get(r, "causal", bool, w)
        att_rows.append(AttentionRow(
            seqlen=_get(r, "seqlen", int, w), num_seqs=_get(r, "num_seqs", int, w),
            causal=causal, fwd_bwd_ms=_get(r, "fwd_bwd_ms", float, w)))
    if not any(r.causal for r in att_rows):
        raise ProfileError(f"{source}.attention.rows: needs at least one causal row")
    _check_increasing([r.seqlen for r in att_rows if r.causal], f"{source}.attention causal seqlen")
    _check_increasing([r.seqlen for r in att_rows if not r.causal], f"{source}.attention non-causal seqlen")

    blocks: list[BlockRow] = []
    block_q_heads = block_head_dim = 0
    if "ring_blocks" in doc:
        rb = _get(doc, "ring_blocks", dict, source)
        block_q_heads = _get(rb, "q_heads", int, f"{source}.ring_blocks")
        block_head_dim = _get(rb, "head_dim", int, f"{source}.ring_blocks")
        for i, r in enumerate(_rows(rb, f"{source}.ring_blocks")):
            w = f"{source}.ring_blocks.rows[{i}]"
            blocks.append(BlockRow(
                q_len=_get(r, "q_len", int, w), k_len=_get(r, "k_len", int, w),
                num_seqs=_get(r, "num_seqs", int, w), fwd_bwd_ms=_get(r, "fwd_bwd_ms", float, w)))

    lin = _get(doc, "linear", dict, source)
    lin_rows = [
        LinearRow(tokens=_get(r, "tokens", int, f"{source}.linear.rows[{i}]"),
                  fwd_bwd_ms=_get(r, "fwd_bwd_ms", float, f"{source}.linear.rows[{i}]"))
        for i, r in enumerate(_rows(lin, f"{source}.linear"))
    ]
    _check_increasing([r.tokens for r in lin_rows], f"{source}.linear tokens")

    overhead = 0.0
    if "call_overhead_ms" in doc:
        overhead = doc["call_overhead_ms"]
        if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or overhead < 0:
            raise ProfileError(f"{source}.call_overhead_ms: must be a number >= 0, got {overhead!r}")
    links = doc.get("links", {}) or {}
    if not isinstance(links, dict):
        raise ProfileError(f"{source}.links: expected an object")
    nvlink = _get(links, "nvlink_GBps", float, f"{source}.links") if "nvlink_GBps" in links else None
    nic = _get(links, "nic_GBps", float, f"{source}.links") if "nic_GBps" in links else None
    device = str(doc.get("device", ""))
    hbm, hbm_source = _hbm(doc, device, source)

    return CostProfile(
        device=device,
        dtype=dtype,
        dtype_bytes=_DTYPE_BYTES[dtype],
        source=str(doc.get("source", source)),
        attn_q_heads=_get(att, "q_heads", int, f"{source}.attention"),
        attn_head_dim=_get(att, "head_dim", int, f"{source}.attention"),
        attention=tuple(att_rows),
        block_q_heads=block_q_heads,
        block_head_dim=block_head_dim,
        blocks=tuple(blocks),
        lin_hidden=_get(lin, "hidden", int, f"{source}.linear"),
        lin_ffn=_get(lin, "ffn", int, f"{source}.linear"),
        lin_q_heads=_get(lin, "q_heads", int, f"{source}.linear"),
        lin_kv_heads=_get(lin, "kv_heads", int, f"{source}.linear"),
        lin_head_dim=_get(lin, "head_dim", int, f"{source}.linear"),
        linear=tuple(lin_rows),
        call_overhead_ms=float(overhead),
        nvlink_GBps=nvlink,
        nic_GBps=nic,
        hbm_GBps=hbm,
        hbm_source=hbm_source,
    )


def _hbm(doc: dict[str, Any], device: str, source: str) -> tuple[float, str]:
    """``(GB/s, "measured" | "datasheet")`` from the ``hbm`` section, else the device's datasheet figure."""
    if "hbm" not in doc:
        value = hbm_datasheet_GBps(device)
        if value is None:
            raise ProfileError(
                f"{source}: no 'hbm' section and no datasheet HBM bandwidth for device {device!r} (known: "
                f"{', '.join(HBM_DATASHEET_GBPS)}); add \"hbm\": {{\"GBps\": <bytes read + written per second / 1e9>, "
                f"\"source\": \"measured\"}} (`zeppelin profile` measures it)")
        return value, "datasheet"
    sec = _get(doc, "hbm", dict, source)
    value = _get(sec, "GBps", float, f"{source}.hbm")
    label = _get(sec, "source", str, f"{source}.hbm")
    if label not in ("measured", "datasheet"):
        raise ProfileError(f"{source}.hbm.source: {label!r} is not 'measured' or 'datasheet'")
    return value, label


def _check_increasing(values: list[int], what: str) -> None:
    for a, b in zip(values, values[1:]):
        if b <= a:
            raise ProfileError(f"{what}: rows must be strictly increasing, got {a} then {b}")


def load_profile(path: str | Path | None = None) -> CostProfile:
    """Read a profile JSON file; ``None`` gives the bundled H100 bf16 profile."""
    if path is None:
        return default_profile()
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"profile file {str(path)!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{p}: not valid JSON: {exc}") from None
    return parse_profile(doc, source=str(p))


def default_profile() -> CostProfile:
    """The bundled profile measured on one H100 (see its ``source`` field)."""
    text = resources.files("zeppelin_megatron.data").joinpath("h100_bf16_profile.json").read_text()
    return parse_profile(json.loads(text), source="h100_bf16_profile.json")
