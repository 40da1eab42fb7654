"""Per-rank micro-step batches: plan, read the rank's linear-layout tokens, prefetch the next.

Budget arithmetic (Megatron semantics kept). One Megatron *sample* is a budget
of ``seq_length`` tokens. The Zeppelin group is the ``N`` ranks of one TP rank
(Megatron's data-parallel ranks; ``rank`` below is the index in it). A Megatron
micro-batch across it is one Zeppelin *micro-step* with a global budget of
``micro_batch_size * seq_length * N`` tokens, and a Megatron step runs
``global_batch_size / (micro_batch_size * N)`` micro-steps.
Megatron's ``consumed_train_samples`` grows by ``global_batch_size`` per step,
so training resumes at micro-step ``consumed_samples // (micro_batch_size * N)``.
(The run's budget and micro-step count are ``ZeppelinParallel.token_budget`` and
``.num_micro_batches`` in :mod:`zeppelin_megatron.megatron.run_shape`.)

Worked example: ``seq_length = 8192``, ``micro_batch_size = 1``, 4 nodes x 8
GPUs at TP 1 (``N = 32``), ``global_batch_size = 128``: budget
``1 * 8192 * 32 = 262144`` tokens per micro-step, ``128 / 32 = 4`` micro-steps per step; a checkpoint at
``consumed_train_samples = 1280`` (10 steps) resumes at micro-step ``1280 / 32 = 40``.

Every rank runs the same pure planner on the same micro-step, so all ranks
agree on the plan without communication; rank ``r`` keeps the tokens of
``plan.linear_layout[r]``.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import torch

from .blend import BlendedDocuments
from .documents import Documents
from .index_check import DataError
from .sampler import TokenBudgetSampler

if TYPE_CHECKING:
    from ...planner import StepPlan

__all__ = ["ZeppelinBatch", "ZeppelinDataIterator", "from_consumed_samples"]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def from_consumed_samples(consumed_samples: int, micro_batch_size: int, n_ranks: int) -> int:
    """The micro-step to resume at: ``consumed_samples // (micro_batch_size * n_ranks)``.

    ``consumed_samples`` is Megatron's ``consumed_train_samples`` counter; it
    must be a multiple of ``micro_batch_size * n_ranks`` (it always is when
    ``global_batch_size`` is).
    """
    if isinstance(consumed_samples, bool) or not isinstance(consumed_samples, (int, np.integer)) \
            or consumed_samples < 0:
        raise DataError(f"consumed_samples must be a non-negative integer, got {consumed_samples!r}")
    per = _positive("micro_batch_size", micro_batch_size) * _positive("n_ranks", n_ranks)
    if consumed_samples % per:
        raise DataError(
            f"consumed_samples = {consumed_samples} is not a multiple of micro_batch_size x zeppelin ranks = "
            f"{micro_batch_size} x {n_ranks} = {per}: the checkpoint was written with another batch shape"
        )
    return int(consumed_samples) // per


@dataclass(frozen=True, kw_only=True)
class ZeppelinBatch:
    """One rank's share of one micro-step, in the plan's linear layout.

    ``T`` is the rank's tokens after padding (``T >= real_tokens``, a multiple
    of the iterator's ``pad_to_multiple``). Tensors are on the CPU:

    * ``tokens``: ``int64 [1, T]`` input ids;
    * ``labels``: ``int64 [1, T]`` next-token ids;
    * ``loss_mask``: ``float32 [1, T]``, 1 on real tokens, 0 on padding (and, with ``eod_mask_token``, on the
      real tokens whose input is that token: Megatron's ``--eod-mask-loss``);
    * ``position_ids``: ``int64 [1, T]``, each token's position inside its
      sequence (0 on padding).
    """

    step: int
    plan: "StepPlan"
    seq_ids: tuple[int, ...]
    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    real_tokens: int
    global_tokens: int

    def __post_init__(self) -> None:
        t = self.tokens.shape[-1]
        for name in ("labels", "loss_mask", "position_ids"):
            shape = tuple(getattr(self, name).shape)
            if shape != (1, t):
                raise DataError(f"ZeppelinBatch.{name} has shape {shape}, expected (1, {t})")
        if not 0 <= self.real_tokens <= t:
            raise DataError(f"real_tokens = {self.real_tokens} is outside [0, {t}]")


class _Failure:
    """A producer-thread exception carried through the queue."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ZeppelinDataIterator(Iterator[ZeppelinBatch]):
    """Micro-step batches for one rank: ``next()`` gives micro-step ``start_step``, then +1, ...

    Args:
        dataset: the training sequences (``read``, ``lengths`` and ``parts``): one dataset or a blend.
        sampler: micro-step -> sequence ids (built with the dataset's ``parts``).
        planner: lengths of a micro-step's sequences -> its ``StepPlan`` (pure:
            every rank computes the same plan), e.g.
            ``functools.partial(plan_step, cluster=cluster, cost_model=cost)``, or a
            :class:`~.plan_worker.PlanWorker` (planning in a child process); one with a ``close``
            method is closed with the iterator.
        rank: this rank's index in the Zeppelin group (``0 <= rank < plan.world_size``).
        start_step: first micro-step (see :func:`from_consumed_samples`).
        pad_to_multiple: pad the rank's tokens to a multiple of this (e.g. the
            TP size under sequence parallelism).
        prefetch: plan and read the next micro-step in a background (daemon)
            thread while the current one trains; call :meth:`close` (or use the
            iterator as a context manager) to stop it.
        prefetch_depth: batches the background thread may hold ready (1 or 2).
        eod_mask_token: the tokenizer's end-of-document id under Megatron's ``--eod-mask-loss`` (no loss where it
            is the input; with documents kept whole it is an input only inside a document), else ``None``.
    """

    def __init__(
        self,
        *,
        dataset: Documents | BlendedDocuments,
        sampler: TokenBudgetSampler,
        planner: Callable[[Sequence[int]], "StepPlan"],
        rank: int,
        start_step: int = 0,
        pad_to_multiple: int = 1,
        prefetch: bool = True,
        prefetch_depth: int = 2,
        eod_mask_token: int | None = None,
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
            raise DataError(f"rank must be a non-negative integer, got {rank!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)) or start_step < 0:
            raise DataError(f"start_step must be a non-negative integer, got {start_step!r}")
        self.pad_to_multiple = _positive("pad_to_multiple", pad_to_multiple)
        if prefetch_depth not in (1, 2):
            raise DataError(f"prefetch_depth must be 1 or 2, got {prefetch_depth!r}")
        if eod_mask_token is not None and (isinstance(eod_mask_token, bool) or not isinstance(
                eod_mask_token, (int, np.integer)) or eod_mask_token < 0):
            raise DataError(f"eod_mask_token must be a token id (>= 0) or None, got {eod_mask_token!r}")
        self.eod_mask_token = None if eod_mask_token is None else int(eod_mask_token)
        if sampler.num_sequences != len(dataset):
            raise DataError(
                f"the sampler covers {sampler.num_sequences} sequences but the dataset has {len(dataset)}"
            )
        if not np.array_equal(sampler.lengths, dataset.lengths):
            raise DataError("the sampler's lengths differ from the dataset's: build it from dataset.lengths")
        if tuple(sampler.parts) != dataset.parts:
            raise DataError(f"the sampler's parts {tuple(sampler.parts)} differ from the dataset's {dataset.parts}: "
                            "build it with parts=dataset.parts (a blend)")
        self.dataset = dataset
        self.sampler = sampler
        self.planner = planner
        self.rank = int(rank)
        self.start_step = int(start_step)
        self.prefetch = bool(prefetch)
        self._next_step = self.start_step
        self._closed = False
        self._failure: BaseException | None = None
        self._queue: queue.Queue[ZeppelinBatch | _Failure] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.prefetch:
            self._queue = queue.Queue(maxsize=prefetch_depth)
            self._thread = threading.Thread(
                target=self._produce, name=f"zeppelin-data-rank{self.rank}", daemon=True
            )
            self._thread.start()

    # -- planning and reading (pure in the step) ------------------------------
    def plan_for(self, step: int) -> "StepPlan":
        """The plan of micro-step ``step`` (what every rank computes)."""
        seq_ids = self.sampler.micro_step(step)
        return self.planner([int(self.dataset.lengths[i]) for i in seq_ids])

    def batch(self, step: int) -> ZeppelinBatch:
        """This rank's batch of micro-step ``step`` (computed now, no prefetch)."""
        seq_ids = self.sampler.micro_step(step)
        lengths = [int(self.dataset.lengths[i]) for i in seq_ids]
        plan = self.planner(lengths)
        if tuple(s.length for s in plan.sequences) != tuple(lengths):
            raise DataError(
                f"micro-step {step}: the planner returned a plan for lengths "
                f"{[s.length for s in plan.sequences]}, asked for {lengths}"
            )
        if self.rank >= plan.world_size:
            raise DataError(f"rank {self.rank} is outside the plan's {plan.world_size} ranks")
        ranges = plan.linear_layout[self.rank]
        real = sum(e - s for _, s, e in ranges)
        # Pad up to a multiple: e.g. 13 real tokens, pad_to_multiple 4 -> T = 16, 3 pad tokens.
        total = -(-real // self.pad_to_multiple) * self.pad_to_multiple
        tokens = np.zeros(total, dtype=np.int64)
        labels = np.zeros(total, dtype=np.int64)
        positions = np.zeros(total, dtype=np.int64)
        mask = np.zeros(total, dtype=np.float32)
        at = 0
        for i, start, end in ranges:  # i indexes seq_ids; [start, end) are positions in that sequence
            tok, lab = self.dataset.read(seq_ids[i], start, end)
            tokens[at:at + end - start] = tok
            labels[at:at + end - start] = lab
            positions[at:at + end - start] = np.arange(start, end, dtype=np.int64)
            at += end - start
        mask[:real] = 1.0
        if self.eod_mask_token is not None:  # Megatron's --eod-mask-loss: no loss where the input is end-of-document
            mask[:real][tokens[:real] == self.eod_mask_token] = 0.0
        return ZeppelinBatch(
            step=int(step), plan=plan, seq_ids=seq_ids,
            tokens=torch.from_numpy(tokens).unsqueeze(0), labels=torch.from_numpy(labels).unsqueeze(0),
            loss_mask=torch.from_numpy(mask).unsqueeze(0), position_ids=torch.from_numpy(positions).unsqueeze(0),
            real_tokens=real, global_tokens=int(sum(lengths)),
        )

    # -- background prefetch ---------------------------------------------------
    def _produce(self) -> None:
        assert self._queue is not None
        step = self.start_step
        while not self._stop.is_set():
            try:
                item: ZeppelinBatch | _Failure = self.batch(step)
            except BaseException as exc:  # re-raised by next() in the consumer thread
                item = _Failure(exc)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return
            step += 1

    # -- iterator protocol -------------------------------------------------------
    def __iter__(self) -> "ZeppelinDataIterator":
        return self

    def __next__(self) -> ZeppelinBatch:
        if self._closed:
            raise DataError("the data iterator is closed")
        if self._failure is not None:
            raise self._failure
        if self._queue is None:
            out = self.batch(self._next_step)
        else:
            item = self._queue.get()
            if isinstance(item, _Failure):
                self._failure = item.exc
                raise item.exc
            out = item
        self._next_step += 1
        return out

    @property
    def next_step(self) -> int:
        """The micro-step the next ``next()`` returns."""
        return self._next_step

    def close(self) -> None:
        """Stop the prefetch thread, then close the planner where it has a ``close`` (idempotent)."""
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        close = getattr(self.planner, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> "ZeppelinDataIterator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
