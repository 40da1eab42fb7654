"""Document-level view of a Megatron indexed dataset (``PREFIX.bin`` / ``PREFIX.idx``).

This is the only module of zeppelin_megatron that reads Megatron's indexed
format; it goes through ``megatron.core.datasets.indexed_dataset.IndexedDataset``.

Megatron's index holds *sequences* (items written by ``tools/preprocess_data.py``:
one per document, or one per sentence with ``--split-sentences``) and
``document_indices``: document ``j`` is sequences
``[document_indices[j], document_indices[j + 1])``. Here a document is that
whole group, its tokens the concatenation of its sequences.

Documents become training sequences as every source's do (:mod:`.documents`: truncation at
``seq_length`` inputs, skipped documents, ``--split`` shares, with worked examples).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .documents import Documents, EmptySplitError
from .index_check import DataError, check_indexed_files

__all__ = ["DataError", "DocumentDataset", "EmptySplitError", "document_lengths"]


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
class DocumentDataset(Documents):
    """Whole documents of one indexed dataset, truncated at ``seq_length`` inputs, ``split``'s share of them
    (:class:`~.documents.Documents`: the attributes, training sequences and splits, with worked examples)."""

    prefix: str
    _indexed: Any = field(init=False, repr=False, compare=False)
    _doc_start: np.ndarray = field(init=False, repr=False, compare=False)
    _seq_cumsum: np.ndarray = field(init=False, repr=False, compare=False)
    _first_item: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise DataError(f"prefix must be a non-empty path prefix string, got {self.prefix!r}")
        self._check_arguments()
        indexed = _open(self.prefix)
        doc_len, seq_cumsum = _document_layout(indexed)
        self._take(doc_len)  # (every index has a document: index_check)
        doc_idx = np.asarray(indexed.document_indices, dtype=np.int64)
        set_ = object.__setattr__
        set_(self, "_indexed", indexed)
        set_(self, "_seq_cumsum", seq_cumsum)
        set_(self, "_doc_start", seq_cumsum[doc_idx[self.documents]])  # token offset of each sequence's document
        set_(self, "_first_item", doc_idx[self.documents])  # first Megatron sequence (item) of each document

    @property
    def name(self) -> str:
        return self.prefix

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
