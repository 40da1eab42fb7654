"""Pure-torch reference kernel: any device, any floating dtype, exact in float64.

Loops over the segments of a :class:`VarlenBatch`, materialising the
[Hq, Lq, Lk] score matrix of each (fine for tests and small CPU runs; this is
not a production kernel). Half-precision inputs are computed in float32.
"""

from __future__ import annotations

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


class ReferenceKernel:
    name = "reference"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        work = acc_dtype(q.dtype)
        hq = q.shape[1]
        groups = hq // k.shape[1]
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.full((q.shape[0], hq), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
        oq = ok = 0
        for lq, lk in zip(batch.lens_q, batch.lens_k):
            if lq and lk:
                qs = q[oq:oq + lq].to(work)
                ks = _expand(k[ok:ok + lk].to(work), groups)
                vs = _expand(v[ok:ok + lk].to(work), groups)
                s = _scores(qs, ks, scale, batch.causal)
                m = torch.logsumexp(s, dim=-1)  # [H, Lq]; -inf for fully masked rows
                safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
                p = torch.exp(s - safe[..., None])
                out[oq:oq + lq] = torch.einsum("hqk,khd->qhd", p, vs).to(q.dtype)
                lse[oq:oq + lq] = m.transpose(0, 1).to(lse.dtype)
            oq += lq
            ok += lk
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
        oq = ok = 0
        for lq, lk in zip(batch.lens_q, batch.lens_k):
            if lq and lk:
                qs = q[oq:oq + lq].to(work)
                ks = _expand(k[ok:ok + lk].to(work), groups)
                vs = _expand(v[ok:ok + lk].to(work), groups)
                dos = dout[oq:oq + lq].to(work)
                m = lse[oq:oq + lq].to(work).transpose(0, 1)  # [H, Lq]
                safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
                p = torch.exp(_scores(qs, ks, scale, batch.causal) - safe[..., None])  # [H, Lq, Lk]
                dvs = torch.einsum("hqk,qhd->khd", p, dos)
                dp = torch.einsum("qhd,khd->hqk", dos, vs)
                delta = (dos * out[oq:oq + lq].to(work)).sum(-1).transpose(0, 1)  # [H, Lq]
                ds = p * (dp - delta[..., None])
                dq[oq:oq + lq] = (torch.einsum("hqk,khd->qhd", ds, ks) * scale).to(q.dtype)
                dks = torch.einsum("hqk,qhd->khd", ds, qs) * scale
                # Sum the query heads of each group back onto their key/value head.
                dk[ok:ok + lk] = dks.view(lk, hkv, groups, d).sum(2).to(k.dtype)
                dv[ok:ok + lk] = dvs.view(lk, hkv, groups, d).sum(2).to(v.dtype)
            oq += lq
            ok += lk
        return dq, dk, dv
