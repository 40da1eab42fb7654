"""GPU kernel backends against the reference kernel (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from zeppelin_megatron.runtime import available_backends, get_kernel
from zeppelin_megatron.runtime.kernels import VarlenBatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("name", ["torch_varlen", "flash_attn", "te"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2)])
def test_backend_matches_reference(name: str, causal: bool, hq: int, hkv: int) -> None:
    dev = torch.device("cuda")
    reason = available_backends(dev, torch.bfloat16)[name]
    if reason is not None:
        pytest.skip(reason)
    g = torch.Generator(device=dev).manual_seed(0)
    lens_q = (128, 7, 300)
    lens_k = lens_q if causal else (64, 33, 300)
    batch = VarlenBatch(lens_q=lens_q, lens_k=lens_k, causal=causal, device=dev)
    q = torch.randn(sum(lens_q), hq, 64, device=dev, generator=g).bfloat16()
    k = torch.randn(sum(lens_k), hkv, 64, device=dev, generator=g).bfloat16()
    v = torch.randn(sum(lens_k), hkv, 64, device=dev, generator=g).bfloat16()
    dout = torch.randn_like(q)
    ref = get_kernel("reference", dev, torch.float32)
    out_r, lse_r = ref.forward(q.float(), k.float(), v.float(), batch, 0.125)
    grads_r = ref.backward(dout.float(), q.float(), k.float(), v.float(), out_r, lse_r, batch, 0.125)
    kern = get_kernel(name, dev, torch.bfloat16)
    out, lse = kern.forward(q, k, v, batch, 0.125)
    assert out.shape == q.shape and lse.shape == (q.shape[0], hq)
    assert (out.float() - out_r).abs().max() < 2e-2
    assert (lse.float() - lse_r).abs().max() < 1e-2
    # backward driven by the reference's out/lse, as the ring does after a merge
    grads = kern.backward(dout, q, k, v, out_r.bfloat16(), lse_r, batch, 0.125)
    for got, want in zip(grads, grads_r):
        assert got.shape == want.shape
        assert (got.float() - want).abs().max() < 5e-2 * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("name", ["torch_varlen", "flash_attn", "te"])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2)])
def test_backend_takes_head_buffer_views(name: str, hq: int, hkv: int) -> None:
    """q, k, v as column views of one [T, hq + 2 hkv, D] buffer (a Ulysses ring's head buffer, runtime/heads.py)
    give what contiguous copies give (the forward bit for bit; the backward to bf16 rounding: flash-attn's dq
    accumulation order is not deterministic); ``backward_into`` (where the backend has it) writes into column
    views of a packed gradient buffer what ``backward`` returns."""
    dev = torch.device("cuda")
    reason = available_backends(dev, torch.bfloat16)[name]
    if reason is not None:
        pytest.skip(reason)
    g = torch.Generator(device=dev).manual_seed(1)
    lens = (128, 7, 300)
    batch = VarlenBatch(lens_q=lens, lens_k=lens, causal=True, device=dev)
    buf = torch.randn(sum(lens), hq + 2 * hkv, 64, device=dev, generator=g).bfloat16()
    q, k, v = buf[:, :hq], buf[:, hq:hq + hkv], buf[:, hq + hkv:]
    assert not q.is_contiguous()
    kern = get_kernel(name, dev, torch.bfloat16)
    out, lse = kern.forward(q, k, v, batch, 0.125)
    out_c, lse_c = kern.forward(q.contiguous(), k.contiguous(), v.contiguous(), batch, 0.125)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)
    dout = torch.randn_like(out)
    grads = kern.backward(dout, q, k, v, out, lse, batch, 0.125)
    grads_c = kern.backward(dout, q.contiguous(), k.contiguous(), v.contiguous(), out, lse, batch, 0.125)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        err = float((a.float() - b.float()).abs().max())
        return a.shape == b.shape and err <= 1e-2 * max(1.0, float(b.abs().max()))

    assert all(close(a, b) for a, b in zip(grads, grads_c))
    into = getattr(kern, "backward_into", None)
    if into is not None:
        send = torch.full_like(buf, float("nan"))
        into(dout, q, k, v, out, lse, batch, 0.125, send[:, :hq], send[:, hq:hq + hkv], send[:, hq + hkv:])
        assert all(close(a, b) for a, b in zip((send[:, :hq], send[:, hq:hq + hkv], send[:, hq + hkv:]), grads))
