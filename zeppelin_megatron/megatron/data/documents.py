"""Whole documents as training sequences: what every Zeppelin data source shares.

A source (an indexed dataset, :class:`~.indexed.DocumentDataset`; Megatron's mock data,
:class:`~.mock.MockDocuments`) knows its documents' lengths and how to read their tokens; this base turns the
lengths into training sequences the same way for all of them, takes a ``--split`` share and checks reads.

Training sequences. Megatron trains on ``seq_length`` inputs whose labels are the next tokens, so a sample reads
``seq_length + 1`` tokens. A document of ``L`` tokens gives one training sequence of
``n = min(L, seq_length + 1) - 1`` inputs: ``tokens = doc[0:n]``, ``labels = doc[1:n + 1]``. Every input has a
label, nothing is padded; tokens past ``seq_length + 1`` are dropped (the document is *truncated*, counted in
``truncated_documents`` and ``truncated_tokens``). Documents with ``L < 2`` have no (input, label) pair and are
skipped (``skipped_documents``).

Worked example, ``seq_length = 4``, documents of lengths ``[7, 5, 1, 3]``: ``n = [4, 4, -, 2]``; sequences map to
documents ``[0, 1, 3]``; document 0 is truncated (7 > 5, 2 tokens dropped), document 1 fits exactly (5 = 4 + 1),
document 2 is skipped.

``split``: ``(begin, end)`` fractions of the documents, as Megatron splits one source into train, valid and test
(``--split``): documents ``[round(begin * N), round(end * N))`` of the ``N`` (Python's ``round``, as megatron-core's
builder). Example: ``--split 969,30,1`` on 1000 documents: train ``(0, 0.969)`` -> documents 0-968, valid
``(0.969, 0.999)`` -> 969-998, test ``(0.999, 1.0)`` -> 999.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .index_check import DataError

__all__ = ["DataError", "Documents", "EmptySplitError"]


class EmptySplitError(DataError):
    """A ``split`` of a source's documents that holds none (e.g. ``--split 969,30,1``'s test share of fewer than
    500 documents): Megatron's validation and test sets may be empty, its training set may not."""


@dataclass(frozen=True, kw_only=True)
class Documents:
    """A source's documents ``[first_document, end_document)`` as training sequences (module docstring).

    Attributes (set by :meth:`_take`, from the subclass's ``__post_init__``):
        lengths: ``int64 [num_sequences]``, inputs of each training sequence (``1 <= n_i <= seq_length``).
        documents: ``int64 [num_sequences]``, the document index of each sequence.
        num_documents: documents in the source.
        first_document, end_document: the documents ``[first, end)`` taken (``split``; all by default).
        truncated_documents: documents longer than ``seq_length + 1`` tokens.
        truncated_tokens: tokens dropped by truncation.
        skipped_documents: documents with fewer than 2 tokens.

    A subclass names itself (:attr:`name`) and reads (:meth:`_read_span`).
    """

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

    @property
    def name(self) -> str:
        """What the log lines and errors call the source."""
        raise NotImplementedError

    def _check_arguments(self) -> None:
        """``seq_length`` and ``split`` checked (before a subclass opens anything)."""
        if isinstance(self.seq_length, bool) or not isinstance(self.seq_length, int) or self.seq_length < 1:
            raise DataError(f"seq_length must be a positive integer, got {self.seq_length!r}")
        split = self.split
        if split is not None and not (len(split) == 2 and 0.0 <= split[0] < split[1] <= 1.0):
            raise DataError(f"split must be (begin, end) fractions with 0 <= begin < end <= 1, got {split!r}")

    def _take(self, doc_len: np.ndarray) -> None:
        """Set the attributes from the source's document lengths (``int64 [num_documents]``). Raises
        :class:`EmptySplitError` for a split holding no document, :class:`DataError` for one (or a source) whose
        documents all have fewer than 2 tokens."""
        split = self.split
        n_docs = int(doc_len.size)
        lo, hi = (0, n_docs) if split is None else (int(round(split[0] * float(n_docs))),
                                                     int(round(split[1] * float(n_docs))))
        if hi <= lo and split is not None:
            raise EmptySplitError(f"{self.name}: the split {split[0]:g}-{split[1]:g} of its {n_docs} documents is "
                                  f"documents [{lo}, {hi}): none (a larger share in --split, or more documents)")
        keep = lo + np.flatnonzero(doc_len[lo:hi] >= 2)
        if keep.size == 0:
            where = f"its {n_docs} documents" if split is None else f"its documents [{lo}, {hi}) (the split)"
            raise DataError(f"{self.name}: none of {where} has the 2 tokens a training sequence "
                            "needs (an input and its label): the dataset is empty")
        over = doc_len[lo:hi] - (self.seq_length + 1)  # the split's documents
        set_ = object.__setattr__
        set_(self, "documents", keep.astype(np.int64))
        set_(self, "lengths", (np.minimum(doc_len[keep], self.seq_length + 1) - 1).astype(np.int64))
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
            f"zeppelin data: {self.name}: {docs} -> {len(self)} sequences, "
            f"{self.total_tokens} tokens; {self.truncated_documents} documents truncated at "
            f"seq_length {self.seq_length} + 1 ({self.truncated_tokens} tokens dropped); "
            f"{self.skipped_documents} documents skipped (fewer than 2 tokens)"
        )

    def read(self, seq: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[start, end)`` of training sequence ``seq`` and their labels.

        Returns ``(tokens, labels)``, both ``int64 [end - start]``: document ``documents[seq]``'s tokens
        ``doc[start:end]`` and ``doc[start+1:end+1]`` (only those ``end - start + 1`` tokens are read).
        """
        n = len(self)
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < n:
            raise DataError(f"sequence index {seq!r} is outside [0, {n})")
        length = int(self.lengths[seq])
        if not 0 <= start < end <= length:
            raise DataError(f"range [{start}, {end}) of sequence {seq} is empty or outside [0, {length})")
        span = self._read_span(int(seq), int(start), int(end) + 1)
        return span[:-1], span[1:]

    def _read_span(self, seq: int, start: int, end: int) -> np.ndarray:
        """Tokens ``[start, end)`` of sequence ``seq``'s document as ``int64`` (``end <= lengths[seq] + 1``)."""
        raise NotImplementedError
