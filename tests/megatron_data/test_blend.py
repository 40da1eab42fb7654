"""Blends of several indexed datasets (``--data-path W1 P1 W2 P2``): parsing, the blended order against a plain
stream-merging reference, token shares, the sampler and the iterator over a blend of two written datasets."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zeppelin_megatron.megatron.data.blend import (
    BlendedDocuments,
    blend_order,
    open_documents,
    parse_blend,
    split_ranges,
)
from zeppelin_megatron.megatron.data.indexed import DataError, DocumentDataset
from zeppelin_megatron.megatron.data.iterator import ZeppelinDataIterator
from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler

from .conftest import SEQ_LENGTH, random_documents, write_indexed
from .test_iterator import make_planner


def test_parse_blend_reads_megatrons_forms() -> None:
    assert parse_blend("a/b") == (["a/b"], None)
    assert parse_blend(["a/b"]) == (["a/b"], None)
    assert parse_blend(["0.5", "a/b"]) == (["a/b"], [0.5])
    assert parse_blend(["30", "a", "70", "b"]) == (["a", "b"], [30.0, 70.0])
    assert parse_blend(["a", "b"]) == (["a", "b"], None)  # no weights: by size
    assert parse_blend(["a", "b", "c"]) == (["a", "b", "c"], None)
    with pytest.raises(DataError, match="give a weight before every prefix or none"):
        parse_blend(["0.3", "a", "b", "c"])
    with pytest.raises(DataError, match="--valid-data-path: weight 0.0 for b: weights must be positive"):
        parse_blend(["1", "a", "0", "b"], "--valid-data-path")
    with pytest.raises(DataError, match="weight -1.0 for a"):
        parse_blend(["-1", "a", "2", "b"])
    with pytest.raises(DataError, match="weight inf for a"):
        parse_blend(["inf", "a", "2", "b"])
    with pytest.raises(DataError, match="give a dataset prefix"):
        parse_blend([])


def _merged_reference(lengths: list[list[int]], weights: list[float] | None, seed: int, epochs: int) -> list[int]:
    """The blend's first ``epochs`` epochs as one list: each dataset's stream (its own epochs one after another)
    up to its window's end, every sequence at virtual time start / w, all sorted (ties: the lower dataset)."""
    totals = [sum(x) for x in lengths]
    total = sum(totals)
    raw = [Fraction(t) for t in totals] if weights is None else [Fraction(w) for w in weights]
    w = [r / sum(raw) for r in raw]
    offsets = [sum(len(x) for x in lengths[:i]) for i in range(len(lengths))]
    items = []
    for i, own in enumerate(lengths):
        start, q, end = 0, 0, epochs * w[i] * total  # virtual time start / w below epochs x V (exact)
        while start < end:
            for j in np.random.default_rng([seed, q, i]).permutation(len(own)):
                if start >= end:
                    break
                items.append((start / float(w[i]), i, offsets[i] + int(j)))
                start += own[int(j)]
            q += 1
    return [sid for _, _, sid in sorted(items)]


lengths_st = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=12), min_size=2, max_size=4)


@settings(max_examples=300, deadline=None)
@example(lengths=[[1], [1]], weighted=True, seed=0, raw=[1.0, 2.0, 1.0, 1.0])  # a window ends mid-token (ceil)
@given(lengths=lengths_st, weighted=st.booleans(), seed=st.integers(0, 5),
       raw=st.lists(st.floats(0.05, 10.0), min_size=4, max_size=4))
def test_blend_order_matches_the_stream_merge(lengths: list[list[int]], weighted: bool, seed: int,
                                              raw: list[float]) -> None:
    weights = raw[:len(lengths)] if weighted else None
    flat = np.asarray([x for own in lengths for x in own], dtype=np.int64)
    parts = [len(x) for x in lengths]
    epochs = 3
    got = [blend_order(flat, parts, weights, seed, e) for e in range(epochs)]
    assert all(g.dtype == np.int64 for g in got)
    assert np.concatenate(got).tolist() == _merged_reference(lengths, weights, seed, epochs)
    # token shares: after the epochs every dataset has trained its share of e * V, give or take one sequence
    total = int(flat.sum())
    shares = ([t / total for t in (sum(x) for x in lengths)] if weights is None
              else [x / sum(weights) for x in weights])
    seen = Counter()
    offsets = np.concatenate(([0], np.cumsum(parts)))
    for sid in np.concatenate(got):
        seen[int(np.searchsorted(offsets, sid, side="right")) - 1] += int(flat[sid])
    for i, own in enumerate(lengths):
        assert abs(seen[i] - shares[i] * epochs * total) <= max(own) + 1


def test_unweighted_blend_is_one_pass_over_each_dataset_per_epoch() -> None:
    lengths = [[5, 1, 7, 3], [2, 2], [9, 4, 4, 1, 1]]
    flat = np.asarray([x for own in lengths for x in own], dtype=np.int64)
    for e in range(4):
        order = blend_order(flat, [4, 2, 5], None, 3, e)
        assert sorted(order.tolist()) == list(range(11))
        # dataset 0's sequences in its own epoch e's order
        assert [int(s) for s in order if s < 4] == np.random.default_rng([3, e, 0]).permutation(4).tolist()


def test_worked_example() -> None:
    # module docstring: A = [3, 5], B = [2, 2, 4], weights 0.75 / 0.25, seed 3: A's epochs [1, 0], [0, 1]; B's [2, 0, 1]
    assert np.random.default_rng([3, 0, 0]).permutation(2).tolist() == [1, 0]
    assert np.random.default_rng([3, 1, 0]).permutation(2).tolist() == [0, 1]
    assert np.random.default_rng([3, 0, 1]).permutation(3).tolist() == [2, 0, 1]
    flat = np.asarray([3, 5, 2, 2, 4], dtype=np.int64)
    assert blend_order(flat, [2, 3], [0.75, 0.25], 3, 0).tolist() == [1, 4, 0, 0, 1]
    # epoch 1: A's starts in [12, 24): its epoch 2 (starts 16 and 19 or 21; its epoch 1 ended at 11 + 5 = 16);
    # B's in [4, 8): starts 4 and 6, its sequences 0 and 1 (ids 2, 3)
    assert sorted(blend_order(flat, [2, 3], [0.75, 0.25], 3, 1).tolist()) == [0, 1, 2, 3]


def test_sampler_over_a_blend_cuts_each_blend_epoch() -> None:
    lengths = [[5, 1, 7, 3, 6], [2, 2, 8]]
    flat = [x for own in lengths for x in own]
    s = TokenBudgetSampler(lengths=flat, budget=10, seed=4, parts=[5, 3], weights=[1.0, 3.0])
    for e in range(3):
        first = sum(s.steps_per_epoch(k) for k in range(e))
        steps = [s.micro_step(first + j) for j in range(s.steps_per_epoch(e))]
        assert [x for m in steps for x in m] == blend_order(np.asarray(flat), [5, 3], [1.0, 3.0], 4, e).tolist()
        assert all(sum(flat[x] for x in m) <= 10 for m in steps)
    assert "parts=(5, 3)" in repr(s)
    single = TokenBudgetSampler(lengths=flat, budget=10, seed=4)
    assert single.parts == (8,) and TokenBudgetSampler(lengths=flat, budget=10, seed=4, parts=[8]).micro_step(5) \
        == single.micro_step(5)  # one part: the single-dataset order
    with pytest.raises(DataError, match=r"parts \(5, 2\) sum to 7 sequences but lengths has 8"):
        TokenBudgetSampler(lengths=flat, budget=10, seed=4, parts=[5, 2])
    with pytest.raises(DataError, match="2 weights for 3 parts"):
        TokenBudgetSampler(lengths=flat, budget=10, seed=4, parts=[5, 2, 1], weights=[1.0, 1.0])
    with pytest.raises(DataError, match="weights must be positive finite numbers"):
        TokenBudgetSampler(lengths=flat, budget=10, seed=4, parts=[5, 3], weights=[1.0, 0.0])
    with pytest.raises(DataError, match="weights need parts"):
        TokenBudgetSampler(lengths=flat, budget=10, seed=4, weights=[1.0])


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[list[np.ndarray]]]:
    root: Path = tmp_path_factory.mktemp("blend")
    out, docs = [], []
    for k, (seed, count) in enumerate(((5, 60), (6, 25))):
        d, items = random_documents(seed, count, seq_length=SEQ_LENGTH)
        out.append(write_indexed(root / f"part{k}", d, items=items))
        docs.append(d)
    return out, docs


def test_blended_documents_read_each_datasets_sequences(two: tuple[list[str], list[list[np.ndarray]]]) -> None:
    prefixes, _ = two
    blend = open_documents(["0.3", prefixes[0], "0.7", prefixes[1]], SEQ_LENGTH)
    assert isinstance(blend, BlendedDocuments) and blend.weights == (0.3, 0.7)
    parts = [DocumentDataset(prefix=p, seq_length=SEQ_LENGTH) for p in prefixes]
    assert blend.parts == (len(parts[0]), len(parts[1])) and len(blend) == sum(blend.parts)
    assert blend.lengths.tolist() == parts[0].lengths.tolist() + parts[1].lengths.tolist()
    for sid in (0, len(parts[0]) - 1, len(parts[0]), len(blend) - 1):
        i = int(sid >= len(parts[0]))
        local = sid - i * len(parts[0])
        n = int(blend.lengths[sid])
        for a, b in zip(blend.read(sid, 0, n), parts[i].read(local, 0, n)):
            assert a.tolist() == b.tolist()
    with pytest.raises(DataError, match=r"outside \[0, "):
        blend.read(len(blend), 0, 1)
    text = blend.describe()
    assert text.count("zeppelin data:") == 3 and "weighted" in text and "70.0%" in text
    assert isinstance(open_documents(prefixes[0], SEQ_LENGTH), DocumentDataset)
    by_size = open_documents(prefixes, SEQ_LENGTH)
    assert isinstance(by_size, BlendedDocuments) and by_size.weights is None
    assert by_size.shares() == pytest.approx([p.total_tokens / blend.total_tokens for p in parts])


def test_iterator_over_a_blend(two: tuple[list[str], list[list[np.ndarray]]]) -> None:
    """Four ranks' batches over a weighted blend: every token of each micro-step's sequences once, read from the
    right dataset; a sampler built without the blend's parts is refused."""
    prefixes, docs = two
    blend = open_documents(["1", prefixes[0], "3", prefixes[1]], SEQ_LENGTH)
    assert isinstance(blend, BlendedDocuments)
    sampler = TokenBudgetSampler(lengths=blend.lengths, budget=512, seed=2, parts=blend.parts, weights=blend.weights)
    its = [ZeppelinDataIterator(dataset=blend, sampler=sampler, planner=make_planner(256), rank=r, prefetch=False)
           for r in range(4)]
    datasets = blend.datasets
    for _ in range(6):
        batches = [next(it) for it in its]
        expected, got = Counter(), Counter()
        for sid in batches[0].seq_ids:
            i = int(sid >= blend.parts[0])
            local = sid - i * blend.parts[0]
            doc = docs[i][int(datasets[i].documents[local])]
            for p in range(int(blend.lengths[sid])):
                expected[(sid, p, int(doc[p]), int(doc[p + 1]))] += 1
        for r, b in enumerate(batches):
            at = 0
            for j, s, e in b.plan.linear_layout[r]:
                for p in range(s, e):
                    got[(b.seq_ids[j], p, int(b.tokens[0, at]), int(b.labels[0, at]))] += 1
                    at += 1
        assert got == expected
    with pytest.raises(DataError, match="build it with parts=dataset.parts"):
        ZeppelinDataIterator(dataset=blend, sampler=TokenBudgetSampler(lengths=blend.lengths, budget=512, seed=2),
                             planner=make_planner(256), rank=0, prefetch=False)


@pytest.mark.parametrize("split", ["969, 30, 1", "100,0,0", "90,10", "0,1,0", "1,1,1", "7,2,1", "98,1,1", "3"])
def test_split_ranges_are_megatrons(split: str) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )
    want = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    assert split_ranges(split) == [None if x is None else (float(x[0]), float(x[1])) for x in want]


def test_split_ranges_refuse_what_megatron_cannot_split() -> None:
    for bad in ("", "a,b", "0,0,0", "1,2,3,4"):
        with pytest.raises(DataError, match="give up to three non-negative shares"):
            split_ranges(bad)


def test_a_split_blend_takes_the_same_share_of_each_dataset(two: tuple[list[str], list[list[np.ndarray]]]) -> None:
    prefixes, docs = two
    train, valid = split_ranges("80,20")[:2]
    a = open_documents(["1", prefixes[0], "1", prefixes[1]], SEQ_LENGTH, train)
    b = open_documents(["1", prefixes[0], "1", prefixes[1]], SEQ_LENGTH, valid)
    assert isinstance(a, BlendedDocuments) and isinstance(b, BlendedDocuments)
    for x, y, d in zip(a.datasets, b.datasets, docs):
        n = len(d)
        assert (x.first_document, x.end_document, y.first_document, y.end_document) == (
            0, round(0.8 * n), round(0.8 * n), n)
        assert x.documents.max() < round(0.8 * n) <= y.documents.min()  # no document in both
        assert "split 0.8-1" in y.describe()

