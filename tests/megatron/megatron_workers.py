"""Spawned-rank bodies for the megatron-core equivalence tests (module-level so spawn can pickle them).

Every rank first computes the single-process reference itself (TP = 1, stock
megatron-core local spec with DotProductAttention, one sequence at a time,
positions 0..L-1), then rebuilds Megatron's parallel state with the TP size under
test, loads the reference weights (sharded for TP > 1) into a GPT built with the
Zeppelin spec and runs the same global batch as Zeppelin micro-steps.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from zeppelin_megatron.megatron.cpu_support import (
    allreduce_grads,
    build_gpt,
    causal_mask,
    init_parallel_state,
    megatron_on_cpu,
    tiny_gpt_config,
)
from zeppelin_megatron.planner import Cluster, CostModel, ModelShape, StepPlan, plan_step

VOCAB = 128
MAX_LEN = 512
# Two micro-steps that, on 2 nodes x 2 ranks with 160 tokens per rank, produce local, intra-node and
# inter-node placements (checked below).
MICRO_STEPS = ([380, 170, 40, 25, 7], [330, 161, 50, 31, 12, 30])


def zeppelin_cost() -> CostModel:
    cluster = Cluster(nodes=2, gpus_per_node=2, nics_per_node=2, gpu_nic=(0, 1), nvlink_GBps=450.0,
                      nic_Gbps=400.0, tokens_per_gpu=160)
    return CostModel(model=ModelShape(name="tiny", layers=2, hidden=64, q_heads=4, kv_heads=2, ffn=128,
                                      vocab=VOCAB), cluster=cluster)


def documents(seed: int) -> list[list[torch.Tensor]]:
    """Per micro-step, per sequence: L + 1 token ids (inputs are [:L], labels [1:])."""
    g = torch.Generator().manual_seed(seed)
    return [[torch.randint(0, VOCAB, (n + 1,), generator=g) for n in lengths] for lengths in MICRO_STEPS]


def reference(
    docs: list[list[torch.Tensor]], seed: int
) -> tuple[dict[str, torch.Tensor], float, dict[str, torch.Tensor]]:
    """(full state dict, loss, full grads): mean token loss over the whole global batch, one process."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    init_parallel_state(1)
    torch.manual_seed(seed)
    model = build_gpt(tiny_gpt_config(), get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=MAX_LEN)
    total = sum(len(d) - 1 for step in docs for d in step)
    loss = torch.zeros((), dtype=torch.float64)
    for step in docs:
        for d in step:
            n = len(d) - 1
            out = model(d[None, :n], torch.arange(n)[None], causal_mask(n), labels=d[None, 1:])  # [1, n]
            part = out.float().sum() / total
            part.backward()
            loss += part.detach().double()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    return state, float(loss), grads


def shard(full: torch.Tensor, like: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    """The TP shard of a TP=1 tensor: split along the one dimension whose size differs."""
    if full.shape == like.shape:
        return full
    dims = [d for d in range(full.dim()) if full.shape[d] != like.shape[d]]
    assert len(dims) == 1 and full.shape[dims[0]] == tp * like.shape[dims[0]], (full.shape, like.shape)
    return full.chunk(tp, dim=dims[0])[tp_rank]


def rank_batch(plan: StepPlan, rank: int, docs: list[torch.Tensor], pad_to: int) -> dict[str, Any]:
    """This rank's linear-layout tokens, labels, positions ([1, T]); padded to a multiple of ``pad_to``."""
    toks, labs, pos = [], [], []
    for s, a, b in plan.linear_layout[rank]:
        toks.append(docs[s][a:b])
        labs.append(docs[s][a + 1:b + 1])
        pos.append(torch.arange(a, b))
    real = sum(len(t) for t in toks)
    pad = -real % pad_to
    z = torch.zeros(pad, dtype=torch.long)
    mask = torch.cat([torch.ones(real), torch.zeros(pad)])
    return dict(tokens=torch.cat(toks + [z])[None], labels=torch.cat(labs + [z])[None],
                position_ids=torch.cat(pos + [z])[None], loss_mask=mask[None], real=real)


def _check_one(rank: int, world: int, tp: int, pad_to: int, seed: int,
               ref: tuple[dict[str, torch.Tensor], float, dict[str, torch.Tensor]],
               docs: list[list[torch.Tensor]], config: dict[str, Any] | None = None) -> None:
    """``pad_to``: pad each rank's rows to a multiple (the sequence-parallel path's padding; megatron-core's
    torch LayerNorm refuses real sequence parallelism on CPU, so the padding is checked on its own).
    ``config``: TransformerConfig settings of the Zeppelin model (activation recomputation)."""
    from megatron.core import parallel_state

    from zeppelin_megatron.megatron.groups import zeppelin_group_from_megatron
    from zeppelin_megatron.megatron.loss import per_token_loss
    from zeppelin_megatron.megatron.spec import get_gpt_layer_zeppelin_spec
    from zeppelin_megatron.megatron.step import ZeppelinStep, bind_step, prepare_model

    ref_sd, ref_loss, ref_grads = ref
    init_parallel_state(tp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    # 2 "nodes" of world/2 processes: the Zeppelin group of each TP rank is 2 nodes x 2 ranks.
    group = zeppelin_group_from_megatron(gpus_per_node=world // 2)
    assert (group.size, group.gpus_per_node) == (4, 2), (group.size, group.gpus_per_node)
    model = build_gpt(tiny_gpt_config(**(config or {})), get_gpt_layer_zeppelin_spec(),
                      vocab_size=VOCAB, max_sequence_length=MAX_LEN)
    own = model.state_dict()
    model.load_state_dict({k: shard(v, own[k], tp_rank, tp) for k, v in ref_sd.items()}, strict=False)
    missing = sorted(k for k, v in own.items() if isinstance(v, torch.Tensor) and k not in ref_sd)
    assert not missing, f"weights not loaded from the reference: {missing}"
    prepare_model(model)

    cost = zeppelin_cost()
    total = sum(MICRO_STEPS[0]) + sum(MICRO_STEPS[1])
    loss = torch.zeros((), dtype=torch.float64)
    placements: set[str] = set()
    for lengths, step_docs in zip(MICRO_STEPS, docs):
        plan = plan_step(lengths, cost)
        placements |= {s.placement for s in plan.sequences}
        b = rank_batch(plan, group.rank, step_docs, pad_to=pad_to)
        bind_step(model, ZeppelinStep(plan=plan, group=group, position_ids=b["position_ids"][0],
                                      real_tokens=b["real"]))
        out = model(b["tokens"], b["position_ids"], None, labels=b["labels"])  # [1, T] per-token losses
        loss_sum, n_tokens = per_token_loss(out, b["loss_mask"])
        assert int(n_tokens) == b["real"]
        (loss_sum / total).backward()
        loss += loss_sum.detach().double() / total
    assert placements == {"local", "intra_node", "inter_node"}, placements

    allreduce_grads(model, group.pg)  # data-parallel sum (Megatron's DDP on GPUs)
    dist.all_reduce(loss, group=group.pg)

    if pad_to == 1:
        # Ranks holding different plans: caught by the first attention layer (the only one that checks),
        # on every rank, instead of a hang in a later layer's transfers.
        from zeppelin_megatron.runtime import PlanMismatchError

        k = 0 if group.rank == 0 else 1
        plan = plan_step(MICRO_STEPS[k], cost)
        b = rank_batch(plan, group.rank, docs[k], pad_to=1)
        bind_step(model, ZeppelinStep(plan=plan, group=group, position_ids=b["position_ids"][0],
                                      real_tokens=b["real"]))
        try:
            model(b["tokens"], b["position_ids"], None, labels=b["labels"])
        except PlanMismatchError as exc:
            assert "different step plans" in str(exc)
        else:
            raise AssertionError(f"rank {rank}: ranks with different plans were not detected")

    what = f"rank {rank} TP={tp} pad_to={pad_to} {config or ''}"
    assert abs(float(loss) - ref_loss) <= 1e-5 * abs(ref_loss), f"{what}: loss {float(loss)} vs {ref_loss}"
    for name, p in model.named_parameters():
        want = shard(ref_grads[name], p.grad, tp_rank, tp)
        err = float((p.grad - want).abs().max()) / max(float(want.abs().max()), 1e-30)
        assert err <= 1e-5, f"{what}: grad of {name} relative error {err:.2e}"


def check_equivalence(rank: int, world: int, tp: int, pads: tuple[int, ...] = (1,), seed: int = 0) -> None:
    """Reference once, then a Zeppelin run per entry of ``pads`` (rows padded to that multiple)."""
    with megatron_on_cpu():
        docs = documents(seed)
        ref = reference(docs, seed)
        for pad_to in pads:
            _check_one(rank, world, tp, pad_to, seed, ref, docs)


RECOMPUTE = (
    {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1},
    {"recompute_granularity": "selective"},  # megatron-core's default module: core attention
)
"""Megatron's activation recomputation (--recompute-granularity full / selective): every layer, the first layer
only, and Zeppelin's core attention alone run again in the backward pass, transfers and all."""


def check_recompute(rank: int, world: int) -> None:
    """The reference once, then the Zeppelin model under each of :data:`RECOMPUTE` (TP 1), counting the calls of
    Zeppelin's core attention: 2 micro-steps x 2 layers, each layer's again where it is recomputed, and one more
    (the plan-mismatch check's forward, which stops in the first layer)."""
    from zeppelin_megatron.megatron.attention import ZeppelinCoreAttention

    calls = [0]
    forward = ZeppelinCoreAttention.forward

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward(self, *args, **kwargs)

    ZeppelinCoreAttention.forward = counted  # type: ignore[method-assign]
    try:
        with megatron_on_cpu():
            docs = documents(1)
            ref = reference(docs, 1)
            for config, expected in zip(RECOMPUTE, (2 * 2 * 2 + 1, 2 * (2 + 1) + 1, 2 * 2 * 2 + 1)):
                calls[0] = 0
                _check_one(rank, world, 1, 1, 1, ref, docs, config)
                assert calls[0] == expected, (config, calls[0], expected)
    finally:
        ZeppelinCoreAttention.forward = forward  # type: ignore[method-assign]
