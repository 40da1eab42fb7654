from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zeppelin_megatron.megatron.data.indexed import DataError, DocumentDataset, EmptySplitError, document_lengths

from .conftest import SEQ_LENGTH, WrittenDataset, write_indexed


def test_document_lengths(written: WrittenDataset) -> None:
    got = document_lengths(written.prefix)
    assert got.dtype == np.int64
    assert got.tolist() == [len(d) for d in written.documents]


def test_lengths_and_counts(written: WrittenDataset) -> None:
    ds = DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH)
    lens = [len(d) for d in written.documents]
    kept = [j for j, n in enumerate(lens) if n >= 2]
    assert ds.documents.tolist() == kept
    assert ds.lengths.dtype == np.int64
    assert ds.lengths.tolist() == [min(lens[j], SEQ_LENGTH + 1) - 1 for j in kept]
    assert ds.lengths.min() >= 1 and ds.lengths.max() == SEQ_LENGTH
    over = [n - SEQ_LENGTH - 1 for n in lens if n > SEQ_LENGTH + 1]
    assert ds.truncated_documents == len(over) > 0
    assert ds.truncated_tokens == sum(over)
    assert ds.skipped_documents == sum(1 for n in lens if n < 2) >= 2
    assert len(ds) == len(kept)
    assert ds.summary() == {
        "documents": len(lens), "sequences": len(kept), "tokens": int(ds.lengths.sum()),
        "truncated_documents": len(over), "truncated_tokens": sum(over), "skipped_documents": ds.skipped_documents,
    }
    line = ds.describe()
    assert f"{len(lens)} documents -> {len(kept)} sequences" in line
    assert f"{len(over)} documents truncated at seq_length {SEQ_LENGTH} + 1 ({sum(over)} tokens dropped)" in line
    assert f"{ds.skipped_documents} documents skipped" in line
    # a document of exactly seq_length + 1 tokens is whole, not truncated
    assert lens[3] == SEQ_LENGTH + 1 and ds.lengths[kept.index(3)] == SEQ_LENGTH


def test_read_matches_documents(written: WrittenDataset) -> None:
    ds = DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH)
    rng = np.random.default_rng(0)
    for seq in range(len(ds)):
        doc = written.documents[int(ds.documents[seq])]
        n = int(ds.lengths[seq])
        tok, lab = ds.read(seq, 0, n)
        assert tok.dtype == np.int64 and lab.dtype == np.int64
        np.testing.assert_array_equal(tok, doc[:n])
        np.testing.assert_array_equal(lab, doc[1:n + 1])
        for _ in range(3):
            a = int(rng.integers(0, n))
            b = int(rng.integers(a + 1, n + 1))
            tok, lab = ds.read(seq, a, b)
            np.testing.assert_array_equal(tok, doc[a:b])
            np.testing.assert_array_equal(lab, doc[a + 1:b + 1])


def test_read_across_items(tmp_path: Path) -> None:
    """A document made of several Megatron items (``--split-sentences``) reads as one."""
    doc = np.arange(100, 120, dtype=np.int64)
    prefix = write_indexed(tmp_path / "multi", [np.arange(5, dtype=np.int64), doc], items={1: [3, 1, 4, 12]},
                           dtype=np.int32)
    ds = DocumentDataset(prefix=prefix, seq_length=16)
    assert ds.lengths.tolist() == [4, 16] and ds.truncated_documents == 1 and ds.truncated_tokens == 3
    for a in range(16):
        for b in range(a + 1, 17):
            tok, lab = ds.read(1, a, b)
            np.testing.assert_array_equal(tok, doc[a:b])
            np.testing.assert_array_equal(lab, doc[a + 1:b + 1])


def test_errors(written: WrittenDataset, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="missing"):
        DocumentDataset(prefix=str(tmp_path / "nothing"), seq_length=8)
    with pytest.raises(DataError, match="missing"):
        document_lengths(str(tmp_path / "nothing"))
    with pytest.raises(DataError, match="seq_length must be a positive integer, got 0"):
        DocumentDataset(prefix=written.prefix, seq_length=0)
    ds = DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH)
    n0 = int(ds.lengths[0])
    with pytest.raises(DataError, match=r"sequence index -1 is outside"):
        ds.read(-1, 0, 1)
    with pytest.raises(DataError, match=rf"sequence index {len(ds)} is outside \[0, {len(ds)}\)"):
        ds.read(len(ds), 0, 1)
    with pytest.raises(DataError, match=rf"range \[0, {n0 + 1}\) of sequence 0 is empty or outside \[0, {n0}\)"):
        ds.read(0, 0, n0 + 1)
    with pytest.raises(DataError, match="empty"):
        ds.read(0, 2, 2)


def test_split_takes_megatrons_document_range(written: WrittenDataset) -> None:
    """``split=(b, e)``: documents ``[round(b N), round(e N))``, the counts over those only."""
    whole = DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH)
    n = whole.num_documents
    parts = [DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH, split=r)
             for r in ((0.0, 0.9), (0.9, 0.99), (0.99, 1.0))]
    edges = [0, round(0.9 * n), round(0.99 * n), n]
    for ds, lo, hi in zip(parts, edges, edges[1:]):
        assert (ds.first_document, ds.end_document, ds.num_documents) == (lo, hi, n)
        assert ds.documents.tolist() == [d for d in whole.documents.tolist() if lo <= d < hi]
        for seq in range(len(ds)):
            assert ds.lengths[seq] == whole.lengths[whole.documents.tolist().index(int(ds.documents[seq]))]
        assert f"documents [{lo}, {hi}) of {n}" in ds.describe()
    assert sum(len(ds) for ds in parts) == len(whole)
    assert sum(ds.skipped_documents for ds in parts) == whole.skipped_documents
    assert sum(ds.truncated_tokens for ds in parts) == whole.truncated_tokens
    # --split 969,30,1's test share of 240 documents: round(0.999 * 240) = 240, none
    with pytest.raises(EmptySplitError, match=rf"the split 0.999-1 of its {n} documents is documents \[240, 240\)"):
        DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH, split=(0.999, 1.0))
    with pytest.raises(DataError, match="split must be"):
        DocumentDataset(prefix=written.prefix, seq_length=SEQ_LENGTH, split=(0.5, 0.5))

