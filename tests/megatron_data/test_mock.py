"""``--mock-data``: megatron-core's mock documents read whole (``MockDocuments``), checked against megatron-core's own
``MockGPTLowLevelDataset`` (lengths, every token, the 1,1,1 split) and through the iterator."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from zeppelin_megatron.megatron.data.index_check import DataError
from zeppelin_megatron.megatron.data.iterator import ZeppelinDataIterator
from zeppelin_megatron.megatron.data.mock import MOCK_DOCUMENTS, MockDocuments, mock_document_lengths
from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler
from zeppelin_megatron.megatron.data.sources import data_sources

from .test_iterator import make_planner


def _megatron_mock(vocab_size: int, eod: int):  # type: ignore[no-untyped-def]
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    return gpt_dataset.MockGPTLowLevelDataset(SimpleNamespace(vocab_size=vocab_size, eod=eod))


@pytest.mark.parametrize("vocab_size, eod", [(50257, 50256), (500, 500), (7, 3)])
def test_documents_are_megatron_cores_mock_documents(vocab_size: int, eod: int) -> None:
    """Lengths and tokens equal megatron-core's: every input and label of 300 random sequences (truncated or not,
    a vocabulary that wraps), and random spans of them."""
    ref = _megatron_mock(vocab_size, eod)
    assert np.array_equal(mock_document_lengths(), np.asarray(ref.sequence_lengths, dtype=np.int64))
    assert len(ref) == MOCK_DOCUMENTS
    seq_length = 1000
    ds = MockDocuments(seq_length=seq_length, vocab_size=vocab_size, eod=eod)
    rng = np.random.default_rng(5)
    picks = rng.choice(len(ds), size=300, replace=False)
    assert any(ds.lengths[s] < seq_length for s in picks) and any(ds.lengths[s] == seq_length for s in picks)
    for s in picks:
        doc = np.asarray(ref[int(ds.documents[s])], dtype=np.int64)
        n = int(ds.lengths[s])
        assert n == min(doc.size, seq_length + 1) - 1
        tokens, labels = ds.read(int(s), 0, n)
        assert np.array_equal(tokens, doc[:n]) and np.array_equal(labels, doc[1:n + 1])
        a = int(rng.integers(0, n))
        b = int(rng.integers(a + 1, n + 1))
        tokens, labels = ds.read(int(s), a, b)
        assert np.array_equal(tokens, doc[a:b]) and np.array_equal(labels, doc[1 + a:1 + b])


def test_the_split_is_megatron_cores_1_1_1_whatever_split_says() -> None:
    """megatron-core's config sets split 1,1,1 for mock data; its builder takes documents [round(b N), round(e N))."""
    config_module = pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_config")
    config = config_module.BlendedMegatronDatasetConfig(random_seed=0, sequence_length=8, blend=None,
                                                        split="98,2,0", tokenizer=None)
    assert config.mock
    for given in (None, "98,2,0"):
        sources = data_sources(mock_data=True, split=given)
        shares = [sources.train, sources.valid, sources.test]
        assert [words for words, _ in shares] == [None, None, None]  # type: ignore[misc]
        assert [share for _, share in shares] == [tuple(m) for m in config.split_matrix]  # type: ignore[misc]
    ranges = []
    for _, share in (sources.train, sources.valid, sources.test):  # type: ignore[misc]
        ds = MockDocuments(seq_length=64, split=share, vocab_size=100, eod=0)
        ranges.append((ds.first_document, ds.end_document))
        lengths = mock_document_lengths()[ds.first_document:ds.end_document]
        assert len(ds) + ds.skipped_documents == ds.end_document - ds.first_document
        assert ds.skipped_documents == int(np.count_nonzero(lengths < 2))
        assert ds.truncated_documents == int(np.count_nonzero(lengths > 65))
        assert ds.truncated_tokens == int((lengths[lengths > 65] - 65).sum())
    assert ranges == [(0, 33333), (33333, 66667), (66667, 100000)]
    assert "Megatron's mock data" in ds.describe() and "documents [66667, 100000) of 100000" in ds.describe()


def test_mock_data_is_the_only_source_and_bad_tokenizer_values_are_refused() -> None:
    with pytest.raises(DataError, match="give --mock-data or --data-path, not both"):
        data_sources(mock_data=True, data_path=["a"])
    with pytest.raises(DataError, match="give --mock-data or --train-data-path / --valid-data-path, not both"):
        data_sources(mock_data=True, train_data_path=["t"], valid_data_path=["v"])
    with pytest.raises(DataError, match="vocab_size must be an integer >= 1 .*got 0"):
        MockDocuments(seq_length=8, vocab_size=0, eod=0)
    with pytest.raises(DataError, match="eod must be an integer >= 0 .*got -1"):
        MockDocuments(seq_length=8, vocab_size=10, eod=-1)
    with pytest.raises(DataError, match="seq_length must be a positive integer, got 0"):
        MockDocuments(seq_length=0, vocab_size=10, eod=0)
    ds = MockDocuments(seq_length=8, vocab_size=10, eod=9)
    with pytest.raises(DataError, match=r"range \[0, 9\) of sequence 0 is empty or outside \[0, 8\)"):
        ds.read(0, 0, 9)


def test_iterator_over_mock_data_hands_out_every_token_once() -> None:
    """Two ranks' batches of 4 micro-steps: every (sequence, position, token, label) of each micro-step exactly
    once, the tokens megatron-core's."""
    vocab_size, eod = 50, 49
    ref = _megatron_mock(vocab_size, eod)
    ds = MockDocuments(seq_length=100, split=(0.0, 1 / 3), vocab_size=vocab_size, eod=eod)
    sampler = TokenBudgetSampler(lengths=ds.lengths, budget=200, seed=3)  # 2 sequences of 100
    iters = [ZeppelinDataIterator(dataset=ds, sampler=sampler, planner=make_planner(64), rank=r, prefetch=False)
             for r in range(4)]
    split_seen = False
    for k in range(4):
        batches = [next(it) for it in iters]
        expected: Counter[tuple[int, int, int, int]] = Counter()
        for sid in batches[0].seq_ids:
            doc = np.asarray(ref[int(ds.documents[sid])], dtype=np.int64)
            for p in range(int(ds.lengths[sid])):
                expected[(sid, p, int(doc[p]), int(doc[p + 1]))] += 1
        got: Counter[tuple[int, int, int, int]] = Counter()
        for r, b in enumerate(batches):
            at = 0
            for i, s, e in b.plan.linear_layout[r]:
                for p in range(s, e):
                    got[(b.seq_ids[i], p, int(b.tokens[0, at]), int(b.labels[0, at]))] += 1
                    at += 1
        assert got == expected and sum(got.values()) > 0, k
        split_seen |= any(s.placement != "local" for s in batches[0].plan.sequences)
    assert split_seen  # 64 tokens per GPU: sequences of 100 split over ranks
    for it in iters:
        it.close()
