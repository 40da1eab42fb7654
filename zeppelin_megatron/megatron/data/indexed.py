"""Document-level view of a Megatron indexed dataset (``PREFIX.bin`` / ``PREFIX.idx``).

This is the only module of zeppelin_megatron that reads Megatron's indexed
format; it goes through ``megatron.core.datasets.indexed_dataset.IndexedDataset``.

Megatron's index holds *sequences* (items written by ``tools/preprocess_data.py``:
one per document, or one per sentence with ``--split-sentences``) and
``document_indices``: document ``j`` is sequences
``[document_indices[j], document_indices[j + 1])``. Here a document is that
whole group, its tokens the concatenation of its sequences.

Training sequences. Megatron trains on ``seq_length`` inputs whose labels are
the next tokens, so a sample reads ``seq_length + 1`` tokens. A document of
``L`` tokens gives one training sequence of ``n = min(L, seq_length + 1) - 1``
inputs: ``tokens = doc[0:n]``, ``labels = doc[1:n + 1]``. Every input has a
label, nothing is padded; tokens past ``seq_length + 1`` are dropped (the
document is *truncated*, counted in ``truncated_documents`` and
``truncated_tokens``). Documents with ``L < 2`` have no (input, label) pair and
are skipped (``skipped_documents``).

Worked example, ``seq_length = 4``, documents of lengths ``[7, 5, 1, 3]``:
``n = [4, 4, -, 2]``; sequences map to documents ``[0, 1, 3]``; document 0 is
truncated (7 > 5, 2 tokens dropped), document 1 fits exactly (5 = 4 + 1),
document 2 is skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .index_check import DataError, check_indexed_files

__all__ = ["DataError", "DocumentDataset", "EmptySplitError", "document_lengths"]


class EmptySplitError(DataError):
    """A ``split`` of a dataset's documents that holds none (e.g. ``--split 969,30,1``'s test share of fewer than
    500 documents): Megatron's validation and test sets may be empty, its training set may not."""


def _open(prefix: str) -> Any:
    """``IndexedDataset(prefix)`` after checking its files (:func:`.index_check.check_indexed_files`).

    Raises :class:`DataError` naming the file for a missing, empty, truncated or
    inconsistent ``.bin``/``.idx`` pair, before Megatron maps either file.
    """
    dirs = [p for p in (prefix + ".bin", prefix + ".idx") if os.path.isdir(p)]
    if dirs:
        raise DataError(f"Megatron indexed dataset {prefix!r}: {dirs} is a directory, not a data file")
    missing = [p for p in (prefix + ".bin", prefix + ".idx") if not os.path.isfile(p)]
    if missing:
        raise DataError(
            f"Megatron indexed dataset {prefix!r}: missing {missing} (give the prefix, without .bin/.idx, "
            "of files written by Megatron's tools/preprocess_data.py)"
        )
    check_indexed_files(prefix)  # sizes, header, every sequence inside the .bin: DataError naming the file
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(prefix, multimodal=False, mmap=True)


def _document_layout(indexed: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(doc_lengths, seq_cumsum)``: tokens per document and the cumulative sequence lengths.

    ``seq_cumsum[i]`` is the token offset of sequence ``i`` from the start of
    the ``.bin`` file, in tokens (``seq_cumsum[0] = 0``); a document's length
    is ``seq_cumsum[end] - seq_cumsum[begin]`` over its sequence range (this
    also gives 0 for a document with no sequences).
    """
    seq_lengths = np.asarray(indexed.sequence_lengths, dtype=np.int64)
    doc_idx = np.asarray(indexed.document_indices, dtype=np.int64)
    if doc_idx.ndim != 1 or doc_idx.size < 1 or doc_idx[0] != 0 or doc_idx[-1] != seq_lengths.size:
        raise DataError(
            f"{indexed.path_prefix}.idx: document_indices must run from 0 to the {seq_lengths.size} sequences, "
            f"got first {doc_idx[:1].tolist()} and last {doc_idx[-1:].tolist()}"
        )
    if np.any(np.diff(doc_idx) < 0):
        raise DataError(f"{indexed.path_prefix}.idx: document_indices are not non-decreasing")
    seq_cumsum = np.zeros(seq_lengths.size + 1, dtype=np.int64)
    np.cumsum(seq_lengths, out=seq_cumsum[1:])
    return seq_cumsum[doc_idx[1:]] - seq_cumsum[doc_idx[:-1]], seq_cumsum


def document_lengths(prefix: str) -> np.ndarray:
    """Tokens per document of the indexed dataset at ``prefix`` (``int64 [num_documents]``).

    Reads the ``.idx`` index only (the ``.bin`` file is opened, no token is read).
    """
    lengths, _ = _document_layout(_open(prefix))
    return lengths


@dataclass(frozen=True, kw_only=True)
class DocumentDataset:
    """Whole documents of one indexed dataset, truncated at ``seq_length`` inputs.

    Attributes (set in ``__post_init__``):
        lengths: ``int64 [num_sequences]``, inputs of each training sequence
            (``1 <= n_i <= seq_length``).
        documents: ``int64 [num_sequences]``, the document index of each sequence.
        num_documents: documents in the index.
        first_document, end_document: the documents ``[first, end)`` taken (``split``; all by default).
        truncated_documents: documents longer than ``seq_length + 1`` tokens.
        truncated_tokens: tokens dropped by truncation.
        skipped_documents: documents with fewer than 2 tokens.

    ``split``: ``(begin, end)`` fractions of the documents, as Megatron splits one ``--data-path`` into train,
    valid and test (``--split``): documents ``[round(begin * N), round(end * N))`` of the ``N`` in the index
    (Python's ``round``, as megatron-core's builder). Example: ``--split 969,30,1`` on 1000 documents: train
    ``(0, 0.969)`` -> documents 0-968, valid ``(0.969, 0.999)`` -> 969-998, test ``(0.999, 1.0)`` -> 999.
    """

    prefix: str
    seq_length: int
    split: tuple[float, float] | None = None
    lengths: np.ndarray = field(init=False, repr=False)
    documents: np.ndarray = field(init=False, repr=False)
    num_documents: int = field(init=False)
    first_document: int = field(init=False)
    end_document: int = field(init=False)
    truncated_documents: int = field(init=False)
    truncated_tokens: int = field(init=False)
    skipped_documents: int = field(init=False)
    _indexed: Any = field(init=False, repr=False, compare=False)
    _doc_start: np.ndarray = field(init=False, repr=False, compare=False)
    _seq_cumsum: np.ndarray = field(init=False, repr=False, compare=False)
    _first_item: np.ndarray = field(init=False, repr=False, compare=False)
    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise DataError(f"prefix must be a non-empty path prefix string, got {self.prefix!r}")
        if isinstance(self.seq_length, bool) or not isinstance(self.seq_length, int) or self.seq_length < 1:
            raise DataError(f"seq_length must be a positive integer, got {self.seq_length!r}")
        split = self.split
        if split is not None and not (len(split) == 2 and 0.0 <= split[0] < split[1] <= 1.0):
            raise DataError(f"split must be (begin, end) fractions with 0 <= begin < end <= 1, got {split!r}")
        indexed = _open(self.prefix)
        doc_len, seq_cumsum = _document_layout(indexed)
        doc_idx = np.asarray(indexed.document_indices, dtype=np.int64)
        n_docs = int(doc_len.size)
        lo, hi = (0, n_docs) if split is None else (int(round(split[0] * float(n_docs))),
                                                     int(round(split[1] * float(n_docs))))
        if hi <= lo and split is not None:  # (every index has a document: index_check)
            raise EmptySplitError(f"{self.prefix}: the split {split[0]:g}-{split[1]:g} of its {n_docs} documents is "
                                  f"documents [{lo}, {hi}): none (a larger share in --split, or more documents)")
        keep = lo + np.flatnonzero(doc_len[lo:hi] >= 2)
        if keep.size == 0:
            where = f"its {n_docs} documents" if split is None else f"its documents [{lo}, {hi}) (the split)"
            raise DataError(
                f"{self.prefix}.idx: none of {where} has the 2 tokens a training sequence "
                "needs (an input and its label): the dataset is empty"
            )
        over = doc_len[lo:hi] - (self.seq_length + 1)  # the split's documents
        set_ = object.__setattr__
        set_(self, "_indexed", indexed)
        set_(self, "_seq_cumsum", seq_cumsum)
        set_(self, "documents", keep.astype(np.int64))
        set_(self, "lengths", np.minimum(doc_len[keep], self.seq_length + 1) - 1)
        set_(self, "_doc_start", seq_cumsum[doc_idx[keep]])  # token offset of each sequence's document
        set_(self, "_first_item", doc_idx[keep])  # first Megatron sequence (item) of each document
        set_(self, "num_documents", n_docs)
        set_(self, "first_document", lo)
        set_(self, "end_document", hi)
        set_(self, "truncated_documents", int(np.count_nonzero(over > 0)))
        set_(self, "truncated_tokens", int(over[over > 0].sum()))
        set_(self, "skipped_documents", int(hi - lo - keep.size))
        self.lengths.setflags(write=False)
        self.documents.setflags(write=False)

    def __len__(self) -> int:
        return int(self.lengths.size)

    @property
    def parts(self) -> tuple[int, ...]:
        """The sequences of each dataset (one here; a blend's: :class:`~.blend.BlendedDocuments`)."""
        return (len(self),)

    @property
    def weights(self) -> None:
        """No blend weights (a blend's: :class:`~.blend.BlendedDocuments`): ``parts`` and ``weights`` build the
        sampler alike for both, ``TokenBudgetSampler(..., parts=ds.parts, weights=ds.weights)``."""
        return None

    @property
    def total_tokens(self) -> int:
        """Input tokens over all training sequences (one epoch)."""
        return int(self.lengths.sum())

    def summary(self) -> dict[str, int]:
        """What the data path reports: counts of documents, sequences, tokens, truncations."""
        return {
            "documents": self.num_documents,
            "sequences": len(self),
            "tokens": self.total_tokens,
            "truncated_documents": self.truncated_documents,
            "truncated_tokens": self.truncated_tokens,
            "skipped_documents": self.skipped_documents,
        }

    def describe(self) -> str:
        """One log line: documents, sequences, tokens, truncations, skips."""
        docs = (f"{self.num_documents} documents" if self.split is None else
                f"documents [{self.first_document}, {self.end_document}) of {self.num_documents} "
                f"(split {self.split[0]:g}-{self.split[1]:g})")
        return (
            f"zeppelin data: {self.prefix}: {docs} -> {len(self)} sequences, "
            f"{self.total_tokens} tokens; {self.truncated_documents} documents truncated at "
            f"seq_length {self.seq_length} + 1 ({self.truncated_tokens} tokens dropped); "
            f"{self.skipped_documents} documents skipped (fewer than 2 tokens)"
        )

    def read(self, seq: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[start, end)`` of training sequence ``seq`` and their labels.

        Returns ``(tokens, labels)``, both ``int64 [end - start]``: document
        ``documents[seq]``'s tokens ``doc[start:end]`` and ``doc[start+1:end+1]``.
        Only those ``end - start + 1`` tokens are read from the ``.bin`` file.
        """
        n = len(self)
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < n:
            raise DataError(f"sequence index {seq!r} is outside [0, {n})")
        length = int(self.lengths[seq])
        if not 0 <= start < end <= length:
            raise DataError(
                f"range [{start}, {end}) of sequence {seq} is empty or outside [0, {length})"
            )
        span = self._read_span(int(seq), int(start), int(end) + 1)
        return span[:-1], span[1:]

    def _read_span(self, seq: int, start: int, end: int) -> np.ndarray:
        """Document tokens ``[start, end)`` as ``int64``, read item by item.

        A document may span several Megatron items (``--split-sentences``):
        item ``i`` holds document tokens ``[cum[i] - doc0, cum[i + 1] - doc0)``
        with ``cum = _seq_cumsum`` and ``doc0`` the document's first offset.
        Example: items of lengths ``[3, 4]``, span ``[2, 5)`` reads item 0
        ``offset 2, length 1`` and item 1 ``offset 0, length 2``.
        """
        doc0 = int(self._doc_start[seq])
        item = int(self._first_item[seq])
        cum = self._seq_cumsum
        if cum[item + 1] - doc0 >= end:  # one item holds the whole span (the usual case)
            return np.asarray(self._indexed.get(item, offset=start, length=end - start), dtype=np.int64)
        parts = []
        # first item overlapping the span: largest i with cum[i] - doc0 <= start
        i = int(np.searchsorted(cum, doc0 + start, side="right")) - 1
        pos = start
        while pos < end:
            item_begin, item_end = int(cum[i]) - doc0, int(cum[i + 1]) - doc0
            take = min(end, item_end) - pos
            if take > 0:
                parts.append(self._indexed.get(i, offset=pos - item_begin, length=take))
                pos += take
            i += 1
        return np.concatenate(parts).astype(np.int64, copy=False)
