"""The fused log-sum-exp merge: the Triton kernel (run by the Triton interpreter on CPU tensors) against the
torch merge, and which path ``ring.merge_lse_`` takes.

No GPU here: the kernel's arithmetic is checked with ``TRITON_INTERPRET=1``; the dispatch tests point the
CUDA check (``fused_merge._on_cuda``) at CPU tensors so that the interpreted kernel really runs in the
engine's place (its results are compared, never assumed).
"""

from __future__ import annotations

import math
import sys
from typing import Iterator

import pytest
import torch

from zeppelin_megatron.runtime.kernels import VarlenBatch, fused_merge
from zeppelin_megatron.runtime.kernels.reference import ReferenceKernel
from zeppelin_megatron.runtime.ring import RingState, StepIndex, finish, forward_step, merge_lse_

triton_kernel = pytest.importorskip("zeppelin_megatron.runtime.kernels.fused_merge_triton",
                                    reason="Triton is not importable")

# numpy's warnings inside the interpreter: the kernel's unselected branches (log1p's 0/0 at e = 0, inf * 0)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

CPU = torch.device("cpu")
INF = float("inf")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run Triton kernels with the interpreter (numpy on CPU tensors)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Count kernel launches (shape of ``out`` each); every launch still runs the kernel."""
    seen: list[tuple[int, ...]] = []
    real = triton_kernel.launch

    def spy(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
        seen.append(tuple(out.shape))
        real(out, lse, out_b, lse_b)

    monkeypatch.setattr(triton_kernel, "launch", spy)
    return seen


def _torch_merge(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """The torch path of ``merge_lse_`` (as it runs on CPU), on the given tensors."""
    assert fused_merge.unavailable_reason(out, lse, out_b, lse_b) is not None
    merge_lse_(out, lse, out_b, lse_b)


def _inputs(t: int, h: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """Random ``out`` [t, h, d] fp32, ``lse`` [t, h], ``out_b`` in ``dtype``, ``lse_b``; rows without keys:
    token 0 has ``lse = -inf`` (its ``out`` 0, as a kernel returns it), token 1 ``lse_b = -inf`` (``out_b``
    0), token 2 head 0 both; ``lse`` is a transposed view, as the flash-attn backend returns it."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(t, h, d, generator=g)
    lse = (4 * torch.randn(h, t, generator=g)).t()  # [t, h], strides (1, t)
    out_b = torch.randn(t, h, d, generator=g).to(dtype)
    lse_b = 4 * torch.randn(t, h, generator=g)
    lse[0], out[0] = -INF, 0.0
    lse_b[1], out_b[1] = -INF, 0.0
    lse[2, 0] = lse_b[2, 0] = -INF
    out[2, 0] = out_b[2, 0] = 0.0
    return out, lse, out_b, lse_b


def _assert_same_merge(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Equal up to a few float32 ulp (exp/log are not bitwise the same across libraries); NaN and inf
    exactly where the torch merge has them."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(torch.isnan(g), torch.isnan(w)) and torch.equal(torch.isinf(g), torch.isinf(w))
        fin = torch.isfinite(w)
        assert torch.equal(g[torch.isinf(w)], w[torch.isinf(w)])
        torch.testing.assert_close(g[fin], w[fin], rtol=4e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, h, d", [(37, 3, 80), (20, 5, 128), (9, 12, 64), (50, 7, 128), (3, 1, 64)])
def test_interpreted_kernel_equals_the_torch_merge(interpret: None, dtype: torch.dtype, t: int, h: int,
                                                   d: int) -> None:
    out, lse, out_b, lse_b = _inputs(t, h, d, dtype, seed=t * 1000 + h * 10 + d)
    want_o, want_l = out.clone(), lse.clone()
    _torch_merge(want_o, want_l, out_b, lse_b)
    got_o, got_l = out.clone(), lse.clone()
    triton_kernel.launch(got_o, got_l, out_b, lse_b)
    _assert_same_merge((got_o, got_l), (want_o, want_l))
    # rows without keys, exactly as the torch merge leaves them: lse_b = -inf keeps (out, lse) bit for bit,
    # lse = -inf takes (out_b, lse_b) bit for bit, both -inf: out NaN, lse -inf
    assert torch.equal(got_o[1], out[1]) and torch.equal(got_l[1], lse[1])
    assert torch.equal(got_o[0], out_b[0].float()) and torch.equal(got_l[0], lse_b[0])
    assert torch.isnan(got_o[2, 0]).all() and got_l[2, 0].item() == -INF
    assert torch.isfinite(got_o[2, 1:]).all() and torch.isfinite(got_o[3:]).all()


def test_interpreted_kernel_worked_example_and_far_apart_lse(interpret: None) -> None:
    """``lse = log 3``, ``lse_b = log 1`` -> weight 1/4, lse log 4 (``merge_lse_``'s docstring); lse values
    40 apart: the smaller one's weight is exp(-40) = 4.2e-18, below a float32 ulp of 1, and the new lse keeps
    it only through log1p (``log(1 + 4.2e-18)`` would be 0 and so would ``lse - max``)."""
    o, lg = torch.zeros(1, 1, 64), torch.full((1, 1), math.log(3.0))
    triton_kernel.launch(o, lg, torch.ones(1, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 1))
    assert torch.allclose(o, torch.full_like(o, 0.25), atol=1e-7, rtol=0)
    assert abs(lg.item() - math.log(4.0)) < 2e-7
    o, lg = torch.zeros(2, 1, 64), torch.tensor([[0.0], [0.0]])
    triton_kernel.launch(o, lg, torch.ones(2, 1, 64), torch.tensor([[-40.0], [40.0]]))
    want_o, want_l = torch.zeros(2, 1, 64), torch.tensor([[0.0], [0.0]])
    _torch_merge(want_o, want_l, torch.ones(2, 1, 64), torch.tensor([[-40.0], [40.0]]))
    _assert_same_merge((o, lg), (want_o, want_l))
    assert lg[0].item() == pytest.approx(math.exp(-40.0), rel=1e-6, abs=0) and lg[1].item() == 40.0


def test_dispatch_picks_torch_on_cpu_and_the_kernel_on_cuda_with_triton(
        interpret: None, launches: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    out, lse, out_b, lse_b = _inputs(11, 6, 80, torch.bfloat16, seed=3)
    want_o, want_l = out.clone(), lse.clone()
    # CPU: torch path, no launch
    assert fused_merge.unavailable_reason(out, lse, out_b, lse_b) == "tensors are on cpu, not CUDA"
    merge_lse_(want_o, want_l, out_b, lse_b)
    assert launches == []
    with pytest.raises(RuntimeError, match="the fused merge cannot run: tensors are on cpu, not CUDA"):
        fused_merge.merge_(out.clone(), lse.clone(), out_b, lse_b)
    # "CUDA" (the device check pointed at CPU tensors, the interpreter runs the kernel): one launch
    monkeypatch.setattr(fused_merge, "_on_cuda", lambda t: True)
    assert fused_merge.unavailable_reason(out, lse, out_b, lse_b) is None
    got_o, got_l = out.clone(), lse.clone()
    merge_lse_(got_o, got_l, out_b, lse_b)
    assert launches == [(11, 6, 80)]
    _assert_same_merge((got_o, got_l), (want_o, want_l))
    # ... but float64 (exact tests), an fp32 out_b with an fp64 lse, or no rows: the torch path
    o64, l64, b64, lb64 = (x.double() for x in (out, lse, out_b, lse_b))
    assert "float64, not float32" in str(fused_merge.unavailable_reason(o64, l64, b64, lb64))
    merge_lse_(o64, l64, b64, lb64)
    assert "out, lse, lse_b are torch.float32, torch.float64" in str(
        fused_merge.unavailable_reason(out, l64, out_b, lse_b))
    empty = (torch.zeros(0, 6, 80), torch.zeros(0, 6), torch.zeros(0, 6, 80), torch.zeros(0, 6))
    assert fused_merge.unavailable_reason(*empty) == "no rows to merge"
    merge_lse_(*empty)
    assert "out_b is torch.int32" in str(fused_merge.unavailable_reason(out, lse, out_b.int(), lse_b))
    assert launches == [(11, 6, 80)]
    # "CUDA" but no Triton: the torch path
    monkeypatch.setitem(sys.modules, "zeppelin_megatron.runtime.kernels.fused_merge_triton", None)
    fused_merge.triton_reason.cache_clear()
    try:
        assert str(fused_merge.unavailable_reason(out, lse, out_b, lse_b)).startswith("Triton is not importable")
        again_o, again_l = out.clone(), lse.clone()
        merge_lse_(again_o, again_l, out_b, lse_b)
        assert launches == [(11, 6, 80)]
        assert torch.equal(again_o.isnan(), want_o.isnan())
        assert torch.equal(again_o.nan_to_num(), want_o.nan_to_num()) and torch.equal(again_l, want_l)
    finally:
        monkeypatch.undo()
        fused_merge.triton_reason.cache_clear()
    assert fused_merge.triton_reason() is None


def test_the_engines_ring_steps_merge_with_the_kernel_on_cuda(
        interpret: None, launches: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """``ring.forward_step`` (the engine's forward of a ring call): diag, full, late, late, as the engine's
    lowering orders them; every merge after the diagonal is one launch (the late ones on the held rows), and
    the result is attention over all keys, as with the torch path."""
    g = torch.Generator().manual_seed(4)
    hq, hkv, d = 6, 3, 80
    q = torch.randn(8, hq, d, generator=g)
    blocks = [torch.randn(2, n, hkv, d, generator=g) for n in (8, 4, 8, 5)]
    late = torch.tensor([2, 3, 6, 7])
    steps = [(None, 8), (None, 4), (late, 8), (late, 5)]

    def run() -> RingState:
        s = RingState(q=q, kv=blocks[0])
        for (ix, nk), kv in zip(steps, blocks):
            s.kv = kv
            nq = 8 if ix is None else 4
            batch = VarlenBatch(lens_q=(nq,), lens_k=(nk,), causal=False, device=CPU)
            forward_step(ReferenceKernel(), 0.3, StepIndex(batch=batch, q_index=ix, kv_index=None), s)
        finish(s)
        return s

    plain = run()
    assert launches == []
    monkeypatch.setattr(fused_merge, "_on_cuda", lambda t: True)
    fused = run()
    assert launches == [(8, hq, d), (4, hq, d), (4, hq, d)]
    assert fused.out is not None and fused.lse is not None and plain.out is not None and plain.lse is not None
    _assert_same_merge((fused.out, fused.lse), (plain.out, plain.lse))
    for rows, used in ((late, blocks), (torch.tensor([0, 1, 4, 5]), blocks[:2])):
        kv = torch.cat(used, dim=1)
        o, lse = ReferenceKernel().forward(q[rows], kv[0], kv[1], VarlenBatch(
            lens_q=(4,), lens_k=(kv.shape[1],), causal=False, device=CPU), 0.3)
        torch.testing.assert_close(fused.out[rows], o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused.lse[rows], lse, rtol=1e-5, atol=1e-5)


def test_merge_lse_rejects_shapes_that_do_not_fit() -> None:
    out, lse = torch.zeros(4, 2, 8), torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"got out \(4, 2, 8\), lse \(4, 2\), out_b \(4, 2, 4\), lse_b \(4, 2\)"):
        merge_lse_(out, lse, torch.zeros(4, 2, 4), torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"lse \(4, 1\)"):
        merge_lse_(out, torch.zeros(4, 1), torch.zeros(4, 2, 8), torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"lse_b \(2, 4\)"):
        merge_lse_(out, lse, torch.zeros(4, 2, 8), torch.zeros(2, 4))


def test_kernel_compiles_for_h100_ahead_of_time() -> None:
    """The kernel compiles to an sm_90 cubin (no GPU needed; never run here), with 128-bit loads and stores of
    ``out``/``out_b`` rows when their last stride is 1 and the rest divisible by 16, as the JIT specializes them
    for contiguous [T, H, 128] tensors."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(triton_kernel._merge_rows).parameters)
    sig = {n: "i32" for n in names}
    sig.update({"out_ptr": "*fp32", "lse_ptr": "*fp32", "outb_ptr": "*bf16", "lseb_ptr": "*fp32"})
    consts = {"BLOCK_R": 16, "BLOCK_D": 128, "so_d": 1, "sb_d": 1}
    sig.update({n: "constexpr" for n in consts})
    aligned = ("out_ptr", "lse_ptr", "outb_ptr", "lseb_ptr", "dim", "so_t", "so_h", "sb_t", "sb_h")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    try:
        compiled = triton.compile(ASTSource(fn=triton.jit(triton_kernel._merge_rows), signature=sig,
                                            constexprs=consts, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": True})
    except RuntimeError as exc:  # e.g. no ptxas in this Triton build
        pytest.skip(f"Triton cannot compile for CUDA here: {exc}")
    ptx = compiled.asm["ptx"]
    assert "cubin" in compiled.asm
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
