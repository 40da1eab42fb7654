"""Building a Zeppelin data iterator inside a Megatron run: its dataset, sampler and planner
(:func:`build_iterator`, called by :func:`~..pretrain.train_valid_test_datasets_provider` for each set)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from ...planner import StepPlan
from ...planner.setup import PlanningSetup
from ..arguments import ZeppelinConfig
from ..planning import ZeppelinSetup

__all__ = ["build_iterator", "iterator_planner"]


def iterator_planner(config: ZeppelinConfig, planner: PlanningSetup) -> Callable[[Sequence[int]], StepPlan]:
    """What a data iterator plans with: ``planner`` in a worker process (:class:`~.plan_worker.PlanWorker`,
    closed with the iterator) when it prefetches and ``--zeppelin-plan-worker`` is on (the default), so planning
    never holds the training process's GIL; else ``planner`` itself (on the prefetch thread, or inline)."""
    if config.prefetch > 0 and config.plan_worker:
        from .plan_worker import PlanWorker
        return PlanWorker(planner)
    return planner


def build_iterator(words: list[str] | None, *, setup: ZeppelinSetup, rank: int, consumed_samples: int, seed: int,
                   split: tuple[float, float] | None = None, eod_mask_token: int | None = None) -> Iterator[Any]:
    """A set's iterator over ``words`` (one prefix or a blend, "W1 P1 W2 P2" / "P1 P2"; ``None``: Megatron's mock
    data for its tokenizer), ``split``'s share of the documents, from the micro-step ``consumed_samples`` reach."""
    from megatron.training import get_tokenizer, print_rank_0

    from .blend import open_documents
    from .iterator import ZeppelinDataIterator, from_consumed_samples
    from .mock import MockDocuments
    from .sampler import TokenBudgetSampler

    p = setup.parallel
    if words is None:
        tokenizer = get_tokenizer()
        dataset: Any = MockDocuments(seq_length=p.seq_length, split=split, vocab_size=int(tokenizer.vocab_size),
                                     eod=int(tokenizer.eod))
    else:
        dataset = open_documents(words, p.seq_length, split)
    print_rank_0(dataset.describe())
    sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=setup.token_budget, seed=seed, parts=dataset.parts,
                                 weights=dataset.weights)
    prefetch = setup.config.prefetch
    return ZeppelinDataIterator(
        dataset=dataset, sampler=sampler, planner=iterator_planner(setup.config, setup.planner), rank=rank,
        start_step=from_consumed_samples(consumed_samples, p.micro_batch_size, p.zeppelin_ranks),
        pad_to_multiple=p.pad_to_multiple, prefetch=prefetch > 0, prefetch_depth=max(1, prefetch),
        eod_mask_token=eod_mask_token,
    )
