"""Kernel backends: the reference kernel against SDPA, the LSE merge, and the registry."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zeppelin_megatron.runtime import BackendUnavailableError, available_backends, get_kernel
from zeppelin_megatron.runtime.kernels import VarlenBatch
from zeppelin_megatron.runtime.kernels.reference import ReferenceKernel
from zeppelin_megatron.runtime.ring import merge_lse

CPU = torch.device("cpu")


def _sdpa(q, k, v, lens_q, lens_k, causal, scale):  # type: ignore[no-untyped-def]
    """Per-segment SDPA with bottom-right causal alignment; -> out [T_q, Hq, D]."""
    outs, oq, ok = [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        qs, ks, vs = q[oq:oq + lq], k[ok:ok + lk], v[ok:ok + lk]
        mask = None
        if causal:
            a = torch.arange(lq)[:, None]
            b = torch.arange(lk)[None, :]
            mask = b <= a + (lk - lq)
        outs.append(F.scaled_dot_product_attention(
            qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), attn_mask=mask, scale=scale,
            enable_gqa=True).transpose(0, 1))
        oq, ok = oq + lq, ok + lk
    return torch.cat(outs)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_reference_matches_sdpa(causal: bool, hq: int, hkv: int, dtype: torch.dtype, tol: float) -> None:
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    lens_q, lens_k = (5, 3, 7, 1), ((5, 3, 7, 1) if causal else (2, 6, 7, 4))
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, 8, dtype=torch.float64, generator=g).requires_grad_(True)
    k = torch.randn(tk, hkv, 8, dtype=torch.float64, generator=g).requires_grad_(True)
    v = torch.randn(tk, hkv, 8, dtype=torch.float64, generator=g).requires_grad_(True)
    dout = torch.randn(tq, hq, 8, dtype=torch.float64, generator=g)
    ref = _sdpa(q, k, v, lens_q, lens_k, causal, 0.3)
    ref.backward(dout)
    kern = ReferenceKernel()
    batch = VarlenBatch(lens_q=lens_q, lens_k=lens_k, causal=causal, device=CPU)
    args = [t.detach().to(dtype) for t in (q, k, v)]
    out, lse = kern.forward(*args, batch, 0.3)
    assert out.dtype == dtype and lse.shape == (tq, hq)
    assert (out.double() - ref).abs().max() < tol
    dq, dk, dv = kern.backward(dout.to(dtype), *args, out, lse, batch, 0.3)
    for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert got.shape == want.shape and (got.double() - want).abs().max() < 10 * tol


def test_reference_bottom_right_and_empty_rows() -> None:
    """Lq > Lk with a causal mask: the first Lq - Lk queries see nothing (out 0, lse -inf)."""
    q, k = torch.randn(4, 1, 2, dtype=torch.float64), torch.randn(2, 1, 2, dtype=torch.float64)
    batch = VarlenBatch(lens_q=(4, 0), lens_k=(2, 3), causal=True, device=CPU)
    k = torch.cat([k, torch.randn(3, 1, 2, dtype=torch.float64)])
    out, lse = ReferenceKernel().forward(q, k, k, batch, 1.0)
    assert torch.all(out[:2] == 0) and torch.all(torch.isinf(lse[:2]))
    assert torch.isfinite(lse[2:]).all()
    dq, dk, dv = ReferenceKernel().backward(torch.ones_like(q), q, k, k, out, lse, batch, 1.0)
    assert torch.isfinite(dq).all() and torch.all(dk[2:] == 0)


def test_merge_lse_equals_attention_over_the_union() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 2, 4, dtype=torch.float64, generator=g)
    k = torch.randn(10, 2, 4, dtype=torch.float64, generator=g)
    v = torch.randn(10, 2, 4, dtype=torch.float64, generator=g)
    kern = ReferenceKernel()
    full = VarlenBatch(lens_q=(6,), lens_k=(10,), causal=False, device=CPU)
    part = VarlenBatch(lens_q=(6,), lens_k=(4,), causal=False, device=CPU)
    rest = VarlenBatch(lens_q=(6,), lens_k=(6,), causal=False, device=CPU)
    o, l = kern.forward(q, k, v, full, 0.5)
    o1, l1 = kern.forward(q, k[:4], v[:4], part, 0.5)
    o2, l2 = kern.forward(q, k[4:], v[4:], rest, 0.5)
    om, lm = merge_lse(o1, l1, o2, l2)
    assert (om - o).abs().max() < 1e-13 and (lm - l).abs().max() < 1e-13


def test_registry() -> None:
    assert get_kernel(None, CPU, torch.float32).name == "reference"
    assert get_kernel("reference", CPU, torch.bfloat16).name == "reference"
    avail = available_backends(CPU, torch.float16)
    assert avail["reference"] is None and avail["torch_varlen"] is not None
    with pytest.raises(BackendUnavailableError, match="'flash_attn' is unavailable on cpu"):
        get_kernel("flash_attn", CPU, torch.float16)
    with pytest.raises(BackendUnavailableError, match="unknown attention backend 'nope'"):
        get_kernel("nope", CPU, torch.float16)


def test_registry_answers_for_a_cuda_device_anywhere() -> None:
    """Asking about a CUDA device must give reasons, never raise (torch_varlen once raised UnboundLocalError)."""
    reasons = available_backends(torch.device("cuda"), torch.bfloat16)
    assert set(reasons) == {"reference", "torch_varlen", "flash_attn", "te"}
    assert reasons["reference"] is None
    if not torch.cuda.is_available():
        assert all(isinstance(reasons[n], str) for n in ("torch_varlen", "flash_attn", "te")), reasons
        assert "CUDA is not available" in reasons["torch_varlen"]


def test_merge_lse_in_place_weights_masked_rows_zero_and_casts_a_half_block() -> None:
    from zeppelin_megatron.runtime.ring import merge_lse_

    g = torch.Generator().manual_seed(1)
    out = torch.randn(3, 2, 4, dtype=torch.float32, generator=g)
    lse = torch.randn(3, 2, dtype=torch.float32, generator=g)
    out_b = torch.randn(3, 2, 4, generator=g).to(torch.bfloat16)
    lse_b = torch.randn(3, 2, dtype=torch.float32, generator=g)
    lse_b[0] = float("-inf")  # row 0 sees none of block b's keys
    new = torch.logaddexp(lse, lse_b)
    want = out * torch.exp(lse - new).unsqueeze(-1) + out_b.float() * torch.exp(lse_b - new).unsqueeze(-1)
    o0, l0 = out.clone(), lse.clone()
    merge_lse_(out, lse, out_b, lse_b)  # in place
    assert torch.equal(out[0], o0[0]) and torch.equal(lse[0], l0[0])
    assert (out - want).abs().max() < 1e-6 and (lse - new).abs().max() < 1e-6
    # worked example of the docstring: lse = log 3, lse_b = log 1 -> weight 1/4, lse -> log 4
    o, l = torch.zeros(1, 1, 1, dtype=torch.float64), torch.full((1, 1), math.log(3.0), dtype=torch.float64)
    merge_lse_(o, l, torch.ones(1, 1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))
    assert abs(o.item() - 0.25) < 1e-15 and abs(l.item() - math.log(4.0)) < 1e-15


def test_late_calls_merge_into_held_rows_and_a_full_call_writes_them_back_first() -> None:
    """diag, late, late, full (out of the zigzag order on purpose), finish == attention over all keys."""
    from zeppelin_megatron.runtime.ring import RingState, StepIndex, finish, forward_step

    g = torch.Generator().manual_seed(2)
    q = torch.randn(6, 2, 4, dtype=torch.float64, generator=g)
    blocks = [torch.randn(2, n, 2, 4, dtype=torch.float64, generator=g) for n in (6, 3, 5, 4)]  # packed K/V, Hkv=2
    late = torch.tensor([1, 4, 5])
    kern = ReferenceKernel()
    s = RingState(q=q, kv=blocks[0])
    steps = [(None, 6), (late, 3), (late, 5), (None, 4)]
    for (ix, nk), kv in zip(steps, blocks):
        s.kv = kv
        nq = 6 if ix is None else 3
        forward_step(kern, 0.5, StepIndex(batch=VarlenBatch(lens_q=(nq,), lens_k=(nk,), causal=False, device=CPU),
                                              q_index=ix, kv_index=None), s)
        if ix is not None:
            assert s.held is not None and s.held[0] is late
    finish(s)
    assert s.held is None and s.out is not None and s.lse is not None
    for rows, used in ((late, blocks), (torch.tensor([0, 2, 3]), [blocks[0], blocks[3]])):
        kv = torch.cat(used, dim=1)
        o, lse = kern.forward(q[rows], kv[0], kv[1], VarlenBatch(
            lens_q=(3,), lens_k=(kv.shape[1],), causal=False, device=CPU), 0.5)
        assert (s.out[rows] - o).abs().max() < 1e-13 and (s.lse[rows] - lse).abs().max() < 1e-13
