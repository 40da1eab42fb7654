"""The ring's log-sum-exp merge in one pass: a Triton kernel, when Triton is importable and the tensors are on CUDA.

:func:`zeppelin_megatron.runtime.ring.merge_lse_` calls :func:`try_merge_` for every merge: it launches the
kernel when :func:`unavailable_reason` answers None; otherwise ``merge_lse_`` runs its torch path (four passes
and a cast: ``sub``, ``sigmoid_``, ``logaddexp``, ``lerp_``). Both compute the same formula
(:mod:`.fused_merge_triton`), with the same results on rows without keys (``lse`` or ``lse_b`` = -inf; both
-inf: ``out`` NaN, ``lse`` -inf, as the torch path gives).

Bytes through device memory per merge of ``T`` rows (``E = H D`` output elements per row, ``b`` bytes of
``out_b``'s dtype): the fused pass reads ``out``, ``out_b``, ``lse``, ``lse_b`` and writes ``out``, ``lse``
once, ``T (E (8 + b) + 12 H)``; the torch path ``T (E (12 + [4 + b if b != 4]) + 36 H)``. Example (bf16,
``H = 32``, ``D = 128``): 10 vs 18 B per output element, 12 vs 36 per lse value.

Like the attention backends (:mod:`.flash_attn`, :mod:`.te`), the optional package is found at run time: the
first call imports ``triton`` (the answer is cached); a machine without it runs the torch path.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import torch

__all__ = ["unavailable_reason", "try_merge_", "merge_", "triton_reason", "OUT_B_DTYPES"]

OUT_B_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""``out_b`` dtypes the kernel reads (cast to float32 in registers); ``out``, ``lse``, ``lse_b`` are float32."""


@lru_cache(maxsize=1)
def triton_reason() -> str | None:
    """None when the Triton kernel module imports, else why not (cached: asked once per process)."""
    try:
        importlib.import_module(f"{__package__}.fused_merge_triton")
    except ImportError as exc:
        return f"Triton is not importable ({exc})"
    return None


def _on_cuda(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on a CUDA device (its own function so tests can point the dispatch at CPU
    tensors run by the Triton interpreter)."""
    return t.is_cuda


def unavailable_reason(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> str | None:
    """None when :func:`merge_` can merge these tensors, else the reason the torch path runs.

    Needs CUDA tensors on one device, ``out``, ``lse``, ``lse_b`` float32 and ``out_b`` in :data:`OUT_B_DTYPES`,
    at least one row, and an importable Triton. Shapes are checked by the caller. Example: CPU tensors ->
    ``"tensors are on cpu, not CUDA"``; float64 (the tests' exact runs) -> ``"... float64, not float32"``.
    """
    if not _on_cuda(out):
        return f"tensors are on {out.device}, not CUDA"
    if any(t.device != out.device for t in (lse, out_b, lse_b)):
        return "tensors are on different devices"
    dtypes = (out.dtype, lse.dtype, lse_b.dtype)
    if any(d != torch.float32 for d in dtypes):
        return f"out, lse, lse_b are {', '.join(str(d) for d in dtypes)}, not float32"
    if out_b.dtype not in OUT_B_DTYPES:
        return f"out_b is {out_b.dtype}, not one of {OUT_B_DTYPES}"
    if out.numel() == 0:
        return "no rows to merge"
    return triton_reason()


def try_merge_(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> bool:
    """Merge in place with the kernel when :func:`unavailable_reason` allows it -> whether it did (False: nothing
    was touched, the caller merges another way)."""
    if unavailable_reason(out, lse, out_b, lse_b) is not None:
        return False
    from .fused_merge_triton import launch

    launch(out, lse, out_b, lse_b)
    return True


def merge_(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Merge ``(out_b, lse_b)`` into ``(out, lse)`` in place, one kernel launch (see the module docstring).

    ``out`` [T, H, D] float32, ``lse`` [T, H] float32, ``out_b`` [T, H, D], ``lse_b`` [T, H] (any strides);
    raises ``RuntimeError`` with :func:`unavailable_reason`'s answer when the kernel cannot run them.
    """
    reason = unavailable_reason(out, lse, out_b, lse_b)
    if reason is not None:
        raise RuntimeError(f"the fused merge cannot run: {reason}")
    from .fused_merge_triton import launch

    launch(out, lse, out_b, lse_b)
