"""The engine and the fused merge on a CUDA device, each with a CPU twin that runs in the default suite.

* ``zeppelin_attention`` in a process group of one (NCCL on CUDA, gloo on CPU) on a plan of local
  sequences: outputs and dq/dk/dv against per-sequence causal SDPA in float64 (float32: 1e-5 of the
  batch's largest reference value; bf16 on the device's default kernel: 3e-2). A single GPU cannot run
  a ring over NCCL (one rank per device), so this is the NCCL path's set-up, agreement and remap
  collectives with nothing to exchange, and the engine's calls on CUDA.
* ``merge_lse_`` on CUDA float32 tensors (the fused Triton pass where Triton is importable) against the
  merge formula in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import spawn
from plan_factory import random_plan
from zeppelin_megatron.runtime import ZeppelinGroup
from zeppelin_megatron.runtime.ring import merge_lse_

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _engine_worker(rank: int, world: int, device: str) -> None:
    """One rank: a random 1 x 1 plan (local sequences only), the engine against float64 SDPA per sequence
    (runtime_workers.check_attention on ``device``)."""
    from runtime_workers import check_attention

    assert world == 1 and rank == 0
    group = ZeppelinGroup(process_group=None, gpus_per_node=1)
    plan = random_plan(11, 1, 1)
    check_attention(group, plan, dtype=torch.float32, routing=True, hq=8, hkv=2, d=64, seed=3, device=device,
                    backend="reference", tol=1e-5)
    if device == "cuda":  # the device's default kernel (available_backends)
        check_attention(group, plan, dtype=torch.bfloat16, routing=True, hq=8, hkv=2, d=64, seed=3, device=device,
                        backend=None, tol=3e-2)


def _nccl_entry() -> None:
    from dist_harness import _free_port

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        _engine_worker(0, 1, "cuda")
    finally:
        dist.destroy_process_group()


def test_engine_in_a_group_of_one_on_cpu_gloo() -> None:
    spawn(1, _engine_worker, "cpu")


@pytest.mark.gpu
@CUDA
def test_engine_in_a_group_of_one_on_cuda_nccl() -> None:
    torch.cuda.set_device(0)
    _nccl_entry()


def _merge_case(device: str) -> None:
    g = torch.Generator().manual_seed(5)
    t, h, d = 1000, 8, 64
    out = torch.randn(t, h, d, generator=g)
    lse = torch.randn(t, h, generator=g) * 4
    out_b = torch.randn(t, h, d, generator=g)
    lse_b = torch.randn(t, h, generator=g) * 4
    lse_b[:7] = -float("inf")  # rows without keys in the second part: unchanged
    new = torch.logaddexp(lse.double(), lse_b.double())
    want = (out.double() * (lse.double() - new).exp().unsqueeze(-1)
            + out_b.double() * (lse_b.double() - new).exp().unsqueeze(-1))
    o, l_ = out.to(device), lse.to(device)
    merge_lse_(o, l_, out_b.to(device), lse_b.to(device))
    assert float((o.double().cpu() - want).abs().max()) < 1e-5
    assert float((l_.double().cpu() - new).abs().max()) < 1e-5
    assert torch.equal(o[:7].cpu(), out[:7]) and torch.equal(l_[:7].cpu(), lse[:7])


def test_merge_on_cpu() -> None:
    _merge_case("cpu")


@pytest.mark.gpu
@CUDA
def test_merge_on_cuda() -> None:
    _merge_case("cuda")
