"""Pure-torch reference kernel: any device, any floating dtype, exact in float64.

Loops over the segments of a :class:`VarlenBatch`, materialising the
[Hq, Lq, Lk] score matrix of each (fine for tests and small CPU runs; this is
not a production kernel). Half-precision inputs are computed in float32.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .base import VarlenBatch, acc_dtype, lse_dtype

__all__ = ["ReferenceKernel", "unavailable_reason"]


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None: usable (everywhere, for floating dtypes)."""
    return None if dtype.is_floating_point else f"dtype {dtype} is not a floating point type"


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """q [Lq, H, D], k [Lk, H, D] -> masked scores [H, Lq, Lk] (-inf where masked)."""
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal:
        lq, lk = q.shape[0], k.shape[0]
        a = torch.arange(lq, device=q.device)[:, None]
        b = torch.arange(lk, device=q.device)[None, :]
        s = s.masked_fill(b > a + (lk - lq), float("-inf"))  # bottom-right alignment
    return s


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[L, Hkv, D] -> [L, Hkv * groups, D]: head h of the result is head h // groups of x."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _segments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, work: torch.dtype
) -> Iterator[tuple[slice, slice, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Non-empty segments: ``(query rows, key rows, q_b [Lq, Hq, D], k_b, v_b [Lk, Hq, D])`` in ``work``.

    K/V heads are expanded to the query heads. Example: ``lens_q = (2, 0, 3)``,
    ``lens_k = (2, 4, 3)`` yields rows ``0:2``/``0:2`` and ``2:5``/``6:9``.
    """
    groups = q.shape[1] // k.shape[1]
    oq = ok = 0
    for lq, lk in zip(batch.lens_q, batch.lens_k):
        if lq and lk:
            rq, rk = slice(oq, oq + lq), slice(ok, ok + lk)
            yield rq, rk, q[rq].to(work), _expand(k[rk].to(work), groups), _expand(v[rk].to(work), groups)
        oq += lq
        ok += lk


class ReferenceKernel:
    name = "reference"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hq = q.shape[1]
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.full((q.shape[0], hq), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
        for rq, _rk, qs, ks, vs in _segments(q, k, v, batch, acc_dtype(q.dtype)):
            s = _scores(qs, ks, scale, batch.causal)
            m = torch.logsumexp(s, dim=-1)  # [H, Lq]; -inf for fully masked rows
            safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - safe[..., None])
            out[rq] = torch.einsum("hqk,khd->qhd", p, vs).to(q.dtype)
            lse[rq] = m.transpose(0, 1).to(lse.dtype)
        return out, lse

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        batch: VarlenBatch,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        work = acc_dtype(q.dtype)
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        groups = hq // hkv
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        for rq, rk, qs, ks, vs in _segments(q, k, v, batch, work):
            lk = rk.stop - rk.start
            dos = dout[rq].to(work)
            m = lse[rq].to(work).transpose(0, 1)  # [H, Lq]
            safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(_scores(qs, ks, scale, batch.causal) - safe[..., None])  # [H, Lq, Lk]
            dvs = torch.einsum("hqk,qhd->khd", p, dos)
            dp = torch.einsum("qhd,khd->hqk", dos, vs)
            delta = (dos * out[rq].to(work)).sum(-1).transpose(0, 1)  # [H, Lq]
            ds = p * (dp - delta[..., None])
            dq[rq] = (torch.einsum("hqk,khd->qhd", ds, ks) * scale).to(q.dtype)
            dks = torch.einsum("hqk,qhd->khd", ds, qs) * scale
            # Sum the query heads of each group back onto their key/value head.
            dk[rk] = dks.view(lk, hkv, groups, d).sum(2).to(k.dtype)
            dv[rk] = dvs.view(lk, hkv, groups, d).sum(2).to(v.dtype)
        return dq, dk, dv

    def backward_into(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        batch: VarlenBatch,
        scale: float,
        dq: torch.Tensor,
        dk: torch.Tensor,
        dv: torch.Tensor,
    ) -> None:
        """:meth:`backward` written into ``dq``, ``dk``, ``dv`` (views welcome), as flash-attn's
        ``backward_into`` does: the engine's in-place path, checked on CPU."""
        for dst, src in zip((dq, dk, dv), self.backward(dout, q, k, v, out, lse, batch, scale)):
            dst.copy_(src)
