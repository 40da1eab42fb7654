"""A rank's rows of an attention-layout tensor: read as a view or a gather, written as a slice or a scatter.

The engine (:mod:`.engine`) and a head-parallel member (:mod:`.heads`) read and write the rows of a ring or a local
chunk. When those rows are one range ``range(start, end)`` of the attention buffer (``span``: what ``plan_step``'s
engine order gives every ring and chunk, ``RingPart.span`` / ``LocalChunk.span``) they are a ``narrow`` view and a
slice ``copy_``; otherwise (plans from JSON or other tools) an ``index_select`` gather and an ``index_copy_``.

Example: ``rows = tensor([4, 5, 6])``, ``span = (4, 7)``: ``take(t, rows, span)`` is ``t[4:7]`` (no copy);
with ``span = None`` the same rows are gathered into a new tensor.
"""

from __future__ import annotations

import torch

__all__ = ["take", "put"]


def take(t: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None) -> torch.Tensor:
    """``t``'s rows [n, ...]: a ``narrow`` view when they are ``range(*span)``, else an ``index_select`` gather."""
    return t.index_select(0, rows) if span is None else t.narrow(0, span[0], span[1] - span[0])


def put(dst: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None, src: torch.Tensor) -> None:
    """Write ``src`` [n, ...] (any float dtype) into ``dst``'s rows (``dst`` may be a column slice): one slice
    ``copy_`` casting on the way when they are ``range(*span)``, else ``.to(dst.dtype)`` (a copy when the
    dtypes differ) and ``index_copy_``."""
    if span is None:
        dst.index_copy_(0, rows, src.to(dst.dtype))
    else:
        dst.narrow(0, span[0], span[1] - span[0]).copy_(src)
