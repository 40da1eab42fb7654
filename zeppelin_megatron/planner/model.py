"""Transformer shape the cost model scales to (Llama-style: GQA attention, gated MLP)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ModelShape", "ModelError", "load_model", "linear_params"]


def linear_params(hidden: int, ffn: int, q_heads: int, kv_heads: int, head_dim: int) -> int:
    """QKV + output projection + gated MLP (gate, up, down) weights of one layer."""
    qkv = hidden * (q_heads + 2 * kv_heads) * head_dim
    out = q_heads * head_dim * hidden
    return qkv + out + 3 * hidden * ffn


class ModelError(ValueError):
    """A model description that is malformed or inconsistent."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """Shape of a decoder-only transformer.

    ``head_dim`` defaults to ``hidden // q_heads``. ``ffn`` is the width of the
    gated MLP (three GEMMs: gate, up, down).
    """

    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    ffn: int
    vocab: int = 32000
    head_dim: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        for attr in ("layers", "hidden", "q_heads", "kv_heads", "ffn", "vocab"):
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelError(f"model {attr} must be a positive integer, got {value!r}")
        if self.q_heads % self.kv_heads:
            raise ModelError(
                f"q_heads = {self.q_heads} is not divisible by kv_heads = {self.kv_heads}"
            )
        if self.head_dim == 0:
            if self.hidden % self.q_heads:
                raise ModelError(
                    f"hidden = {self.hidden} is not divisible by q_heads = {self.q_heads}; "
                    "give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.q_heads)
        elif not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ModelError(f"model head_dim must be a positive integer, got {self.head_dim!r}")

    def linear_params_per_layer(self) -> int:
        """Weights of QKV, output projection and the gated MLP in one layer."""
        return linear_params(self.hidden, self.ffn, self.q_heads, self.kv_heads, self.head_dim)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> "ModelShape":
        if not isinstance(data, dict):
            raise ModelError(f"{source}: a model must be a mapping, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelError(f"{source}: unknown model keys {unknown}; known keys: {sorted(known)}")
        missing = sorted({"layers", "hidden", "q_heads", "kv_heads", "ffn"} - set(data))
        if missing:
            raise ModelError(f"{source}: model is missing keys {missing}")
        try:
            return cls(**data)
        except ModelError as exc:
            raise ModelError(f"{source}: {exc}") from None


LLAMA_7B = ModelShape(name="llama-7b", layers=32, hidden=4096, q_heads=32, kv_heads=32, ffn=11008)


def load_model(path: str | Path | None) -> ModelShape:
    """Read a model YAML; ``None`` gives the Llama-7B shape."""
    if path is None:
        return LLAMA_7B
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ModelError(f"{p}: not valid YAML: {exc}") from None
    return ModelShape.from_dict(data, source=str(p))
