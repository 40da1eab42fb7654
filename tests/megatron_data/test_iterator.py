from __future__ import annotations

import threading
from collections import Counter
from functools import partial
from typing import Callable, Sequence

import pytest
import torch

from zeppelin_megatron import Cluster, CostModel, ModelShape, StepPlan, plan_step
from zeppelin_megatron.megatron.data.indexed import DataError, DocumentDataset
from zeppelin_megatron.megatron.data.iterator import (
    ZeppelinBatch,
    ZeppelinDataIterator,
    from_consumed_samples,
)
from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler

from .conftest import SEQ_LENGTH, WrittenDataset

N = 4  # 2 nodes x 2 GPUs
MBS = 2
SMALL = ModelShape(layers=2, hidden=256, q_heads=4, kv_heads=4, ffn=512)


def make_planner(tokens_per_gpu: int) -> Callable[[Sequence[int]], StepPlan]:
    cluster = Cluster(nodes=2, gpus_per_node=2, nics_per_node=2, gpu_nic=(0, 1), nvlink_GBps=450.0,
                      nic_Gbps=400.0, tokens_per_gpu=tokens_per_gpu)
    return partial(plan_step, cost_model=CostModel(model=SMALL, cluster=cluster))


@pytest.fixture(scope="module")
def dataset(written: WrittenDataset) -> DocumentDataset:
    return DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH)


# Two set-ups: Megatron's arithmetic (budget = mbs * seq_length * N = 512 tokens, all sequences
# placed whole), and a tight capacity (56 tokens per GPU < seq_length) that forces zigzag splits.
SETUPS = {
    "megatron": (MBS * SEQ_LENGTH * N, 2 * MBS * SEQ_LENGTH),
    "splits": (160, 56),
}


def make_iter(dataset: DocumentDataset, setup: str, rank: int, **kw: object) -> ZeppelinDataIterator:
    budget, tpg = SETUPS[setup]
    sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=budget, seed=17)
    return ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=make_planner(tpg), rank=rank, **kw)


def take(it: ZeppelinDataIterator, n: int) -> list[ZeppelinBatch]:
    with it:
        return [next(it) for _ in range(n)]


def assert_same(a: ZeppelinBatch, b: ZeppelinBatch) -> None:
    assert (a.step, a.seq_ids, a.real_tokens, a.global_tokens) == (b.step, b.seq_ids, b.real_tokens, b.global_tokens)
    assert a.plan.digest() == b.plan.digest()
    for name in ("tokens", "labels", "loss_mask", "position_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("setup", list(SETUPS))
def test_union_over_ranks_is_the_micro_step(written: WrittenDataset, dataset: DocumentDataset, setup: str) -> None:
    steps = 8
    per_rank = [take(make_iter(dataset, setup, r, prefetch=False), steps) for r in range(N)]
    split_seen = False
    for k in range(steps):
        batches = [per_rank[r][k] for r in range(N)]
        b0 = batches[0]
        assert all(b.step == k and b.seq_ids == b0.seq_ids for b in batches)
        assert len({b.plan.digest() for b in batches}) == 1  # every rank computed the same plan
        assert make_iter(dataset, setup, 0, prefetch=False).plan_for(k).digest() == b0.plan.digest()
        split_seen |= any(s.placement != "local" for s in b0.plan.sequences)
        expected = Counter()
        for sid in b0.seq_ids:
            doc = written.documents[int(dataset.documents[sid])]
            for p in range(int(dataset.lengths[sid])):
                expected[(sid, p, int(doc[p]), int(doc[p + 1]))] += 1
        assert b0.global_tokens == sum(expected.values()) <= SETUPS[setup][0]
        got = Counter()
        for r, b in enumerate(batches):
            assert b.tokens.dtype == torch.int64 and b.labels.dtype == torch.int64
            assert b.position_ids.dtype == torch.int64 and b.loss_mask.dtype == torch.float32
            assert b.tokens.shape == (1, b.real_tokens) and b.real_tokens == b0.plan.tokens(r, "linear")
            assert torch.all(b.loss_mask == 1)
            # walk the linear layout: token t of the rank is position p of sequence seq_ids[i]
            at = 0
            for i, s, e in b.plan.linear_layout[r]:
                for p in range(s, e):
                    assert int(b.position_ids[0, at]) == p
                    got[(b.seq_ids[i], p, int(b.tokens[0, at]), int(b.labels[0, at]))] += 1
                    at += 1
            assert at == b.real_tokens
        assert got == expected  # every (sequence, position, token, label) exactly once
        # a token-balanced linear layout: floor or ceil of the mean (the planner picks the layout per step)
        if b0.plan.linear == "token_balanced":
            assert max(b.real_tokens for b in batches) - min(b.real_tokens for b in batches) <= 1
        else:
            assert b0.plan.linear in ("workload_balanced", "attention")
    if setup == "splits":
        assert split_seen, "the tight set-up was meant to split sequences"


def test_padding(dataset: DocumentDataset) -> None:
    for r in range(N):
        plain = take(make_iter(dataset, "splits", r, prefetch=False), 4)
        padded = take(make_iter(dataset, "splits", r, prefetch=False, pad_to_multiple=8), 4)
        for a, b in zip(plain, padded):
            t, real = b.tokens.shape[1], b.real_tokens
            assert real == a.real_tokens and t % 8 == 0 and real <= t < real + 8
            for name in ("tokens", "labels", "loss_mask", "position_ids"):
                x = getattr(b, name)
                assert x.shape == (1, t)
                assert torch.equal(x[:, :real], getattr(a, name)), name
                assert torch.all(x[:, real:] == 0), name
    with pytest.raises(DataError, match="pad_to_multiple must be a positive integer, got 0"):
        make_iter(dataset, "splits", 0, prefetch=False, pad_to_multiple=0)


def test_prefetch_matches_plain(dataset: DocumentDataset) -> None:
    for r in (0, 3):
        plain = take(make_iter(dataset, "megatron", r, prefetch=False), 12)
        pre = take(make_iter(dataset, "megatron", r, prefetch=True), 12)
        pre1 = take(make_iter(dataset, "megatron", r, prefetch=True, prefetch_depth=1), 12)
        for a, b, c in zip(plain, pre, pre1):
            assert_same(a, b)
            assert_same(a, c)


@pytest.mark.parametrize("prefetch", [False, True])
def test_resume_from_consumed_samples(dataset: DocumentDataset, prefetch: bool) -> None:
    """Train k steps, 'checkpoint' consumed_train_samples, restart: the following batches are identical,
    and within each epoch no sequence is lost or repeated across the restart."""
    gbs = 2 * MBS * N  # 2 micro-steps per Megatron step
    per_step = gbs // (MBS * N)
    sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=SETUPS["megatron"][0], seed=17)
    epoch0 = sampler.steps_per_epoch(0)
    total_steps = (epoch0 + 6) // per_step + 2  # run past the first epoch boundary
    for rank in (0, 2):
        run = take(make_iter(dataset, "megatron", rank, prefetch=prefetch), total_steps * per_step)
        for k_steps in (1, epoch0 // per_step, total_steps - 2):
            consumed = k_steps * gbs  # Megatron's consumed_train_samples after k_steps steps
            start = from_consumed_samples(consumed, MBS, N)
            assert start == k_steps * per_step
            resumed = take(make_iter(dataset, "megatron", rank, prefetch=prefetch, start_step=start),
                           len(run) - start)
            for a, b in zip(run[start:], resumed):
                assert_same(a, b)
    # epoch 0 over the restart: sequences before + after == every sequence once
    before = [sid for k in range(3) for sid in sampler.micro_step(k)]
    after = [sid for k in range(3, epoch0) for sid in sampler.micro_step(k)]
    assert sorted(before + after) == list(range(len(dataset)))


def test_from_consumed_samples() -> None:
    assert from_consumed_samples(1280, 1, 32) == 40  # the worked example of iterator.py
    assert from_consumed_samples(0, 2, 4) == 0
    with pytest.raises(DataError, match=r"consumed_samples = 12 is not a multiple of .* 2 x 4 = 8"):
        from_consumed_samples(12, 2, 4)
    with pytest.raises(DataError, match="consumed_samples must be a non-negative integer"):
        from_consumed_samples(-8, 2, 4)
    with pytest.raises(DataError, match="n_ranks must be a positive integer, got 0"):
        from_consumed_samples(8, 1, 0)


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("fail_at", [0, 3])
def test_prefetch_exception_surfaces_in_next(dataset: DocumentDataset, fail_at: int) -> None:
    inner = make_planner(SETUPS["megatron"][1])
    calls = {"n": 0}
    worker: list[str] = []

    def planner(lengths: Sequence[int]) -> StepPlan:
        worker.append(threading.current_thread().name)
        calls["n"] += 1
        if calls["n"] == fail_at + 1:
            raise Boom(f"planner failed at call {calls['n']}")
        return inner(lengths)

    sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=SETUPS["megatron"][0], seed=17)
    it = ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=planner, rank=1, prefetch=True)
    for _ in range(fail_at):
        next(it)
    with pytest.raises(Boom, match=f"planner failed at call {fail_at + 1}"):
        next(it)
    with pytest.raises(Boom):  # stays failed
        next(it)
    it.close()
    assert set(worker) == {"zeppelin-data-rank1"}  # planning ran in the background thread
    with pytest.raises(DataError, match="closed"):
        next(it)


def test_close_stops_thread(dataset: DocumentDataset) -> None:
    it = make_iter(dataset, "megatron", 0, prefetch=True)
    next(it)
    thread = it._thread
    assert thread is not None and thread.is_alive()
    it.close()
    assert not thread.is_alive()
    it.close()  # idempotent


def test_iterator_errors(dataset: DocumentDataset) -> None:
    budget, tpg = SETUPS["megatron"]
    sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=budget, seed=1)
    with pytest.raises(DataError, match="rank 4 is outside the plan's 4 ranks"):
        next(ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=make_planner(tpg), rank=4,
                                  prefetch=False))
    other = TokenBudgetSampler(lengths=dataset.lengths[:-1], budget=budget, seed=1)
    with pytest.raises(DataError, match=f"covers {len(dataset) - 1} sequences but the dataset has {len(dataset)}"):
        ZeppelinDataIterator(dataset=dataset, sampler=other, planner=make_planner(tpg), rank=0)
    wrong = make_planner(tpg)
    it = ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=lambda ls: wrong(list(ls)[:-1] or [1]),
                              rank=0, prefetch=False)
    with pytest.raises(DataError, match="the planner returned a plan for lengths"):
        next(it)
    with pytest.raises(DataError, match="start_step must be a non-negative integer, got -1"):
        ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=wrong, rank=0, start_step=-1)


def test_eod_mask_token_masks_exactly_its_inputs(dataset: DocumentDataset) -> None:
    """Megatron's --eod-mask-loss: the loss mask is 0 where the input is the end-of-document token, 1 on every other
    real token, 0 on padding; everything else as without it. The token is picked as one that occurs as an input."""
    plain = take(make_iter(dataset, "splits", 1, prefetch=False, pad_to_multiple=8), 4)
    eod = int(plain[0].tokens[0, plain[0].real_tokens // 2])
    masked = take(make_iter(dataset, "splits", 1, prefetch=False, pad_to_multiple=8, eod_mask_token=eod), 4)
    hits = 0
    for a, b in zip(plain, masked):
        for name in ("tokens", "labels", "position_ids"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        real = b.real_tokens
        is_eod = b.tokens[0, :real] == eod
        assert torch.equal(b.loss_mask[0, :real], (~is_eod).float()) and torch.all(b.loss_mask[0, real:] == 0)
        hits += int(is_eod.sum())
    assert hits >= 1
    with pytest.raises(DataError, match="eod_mask_token must be a token id"):
        make_iter(dataset, "splits", 0, prefetch=False, eod_mask_token=-1)

