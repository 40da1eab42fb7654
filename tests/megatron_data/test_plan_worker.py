"""PlanWorker (megatron/data/plan_worker.py): the data iterator's planner in a child process, off the GIL."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zeppelin_megatron.megatron.data.indexed import DataError, DocumentDataset
from zeppelin_megatron.megatron.data.iterator import ZeppelinDataIterator
from zeppelin_megatron.megatron.data.plan_worker import PlanWorker
from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler
from zeppelin_megatron.planner import PlanError
from zeppelin_megatron.planner.setup import build_planning

from .conftest import SEQ_LENGTH, WrittenDataset
from .test_iterator import SETUPS, assert_same, make_iter, make_planner, take


@pytest.fixture(scope="module")
def dataset(written: WrittenDataset) -> DocumentDataset:
    return DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH)


def test_plans_what_the_planner_plans_in_this_process() -> None:
    setup = build_planning("2x4", tokens_per_gpu=8192)
    rng = random.Random(3)
    with PlanWorker(setup) as worker:
        assert worker.pid is not None and worker.pid != os.getpid()
        for _ in range(6):
            lengths = [rng.choice([rng.randint(1, 300), rng.randint(300, 4000), rng.randint(4000, 20_000)])
                       for _ in range(rng.randint(1, 40))]
            lengths = lengths if sum(lengths) <= 8 * 8192 else lengths[:3]
            assert worker(lengths).to_json() == setup(lengths).to_json()


def test_a_planner_error_is_raised_again_with_its_message() -> None:
    setup = build_planning("2x4", tokens_per_gpu=8192)
    with PlanWorker(setup) as worker:
        with pytest.raises(PlanError) as there:
            worker([10 ** 6])
        with pytest.raises(PlanError) as here:
            setup([10 ** 6])
        assert str(there.value) == str(here.value)
        assert worker([100, 200]).to_json() == setup([100, 200]).to_json()  # still serving


def test_a_dead_worker_is_named_and_a_closed_one_refuses() -> None:
    setup = build_planning("1x2", tokens_per_gpu=4096)
    worker = PlanWorker(setup)
    worker([10, 20])
    pid = worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(DataError, match=rf"planning worker \(pid {pid}\) exited with code -9"):
        worker([10, 20])
    with pytest.raises(DataError, match="closed"):
        worker([10, 20])
    worker.close()  # idempotent
    other = PlanWorker(setup)
    other.close()
    other.close()
    assert other.pid is None
    with pytest.raises(DataError, match="closed"):
        other([10, 20])


def test_a_planner_that_cannot_be_sent_is_refused_up_front() -> None:
    with pytest.raises(DataError, match="cannot be sent to a planning worker"):
        PlanWorker(lambda lengths: None)  # type: ignore[arg-type,return-value]


def test_the_iterator_gives_the_same_batches_and_closes_it(dataset: DocumentDataset) -> None:
    for setup in ("megatron", "splits"):
        budget, tpg = SETUPS[setup]
        for rank in (0, 3):
            plain = take(make_iter(dataset, setup, rank, prefetch=False), 5)
            worker = PlanWorker(make_planner(tpg))
            sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=budget, seed=17)
            got = take(ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=worker, rank=rank), 5)
            for a, b in zip(plain, got):
                assert_same(a, b)
            assert worker.pid is None  # closed with the iterator


def test_the_gil_benchmark_runs_and_reports_three_times() -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "plan_gil.py"
    done = subprocess.run([sys.executable, str(script), "--cluster", "1x8", "--tokens", "30000", "--rounds", "1",
                           "--work", "5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-800:]
    got = re.search(r"alone (\d+) ms; planner in a thread (\d+) ms \(([\d.]+)x\); planner in a worker process (\d+) ms",
                    done.stdout)
    assert got is not None and int(got.group(1)) > 0, done.stdout
