"""Megatron's ``--mock-data`` as whole documents: megatron-core's ``MockGPTLowLevelDataset``, read as Zeppelin
reads any source (:class:`~.documents.Documents`).

megatron-core (core_v0.16 to main) makes ``MOCK_DOCUMENTS = 100,000`` documents whose lengths are
``numpy.random.default_rng(0).integers(1, 4096, size=100000, dtype=int32)`` (1 to 4,095 tokens, uniform), document
``i`` of length ``L`` holding ``(1, 2, ..., L - 1) % vocab_size`` and then the tokenizer's end-of-document id; and
it splits them ``1,1,1`` whatever ``--split`` says (its dataset config sets that split for mock data): training
documents ``[0, 33333)``, validation ``[33333, 66667)``, test ``[66667, 100000)``. Megatron packs them into
``seq_length`` samples; Zeppelin trains each document whole (truncated at ``seq_length`` inputs, the one-token ones
skipped), as it trains any dataset.

Worked example, ``vocab_size = 5``, eod ``4``, a document of length 7: tokens ``[1, 2, 3, 4, 0, 1, 4]``; with
``seq_length = 4`` its training sequence is inputs ``[1, 2, 3, 4]``, labels ``[2, 3, 4, 0]`` (2 tokens dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .documents import Documents
from .index_check import DataError

__all__ = ["MOCK_DOCUMENTS", "MOCK_MAX_LENGTH", "MOCK_SEED", "MOCK_SPLIT", "MockDocuments", "mock_document_lengths"]

MOCK_DOCUMENTS = 100_000
"""Documents of megatron-core's mock dataset (``MockGPTLowLevelDataset.size``)."""
MOCK_MAX_LENGTH = 4096
"""Its lengths are drawn from ``[1, MOCK_MAX_LENGTH)`` (``max_sequence_length``, an exclusive bound)."""
MOCK_SEED = 0
"""Its NumPy seed (``MockGPTLowLevelDataset.seed``)."""
MOCK_SPLIT = "1,1,1"
"""The split megatron-core's dataset config sets for mock data, in place of ``--split``."""


@lru_cache(maxsize=1)
def _lengths() -> np.ndarray:
    lengths = np.random.default_rng(seed=MOCK_SEED).integers(low=1, high=MOCK_MAX_LENGTH, size=MOCK_DOCUMENTS,
                                                              dtype=np.int32).astype(np.int64)
    lengths.setflags(write=False)
    return lengths


def mock_document_lengths() -> np.ndarray:
    """Tokens per document of Megatron's mock data (``int64 [100000]``, read-only): the same draw as
    megatron-core's ``MockGPTLowLevelDataset.sequence_lengths``."""
    return _lengths()


@dataclass(frozen=True, kw_only=True)
class MockDocuments(Documents):
    """Megatron's mock documents (module docstring), ``split``'s share of them, for a tokenizer's
    ``vocab_size`` and end-of-document id ``eod`` (Megatron's ``get_tokenizer().vocab_size`` and ``.eod``)."""

    vocab_size: int
    eod: int
    _doc_lengths: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "eod"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (name == "vocab_size"):
                raise DataError(f"mock data: {name} must be an integer >= {int(name == 'vocab_size')} "
                                f"(the tokenizer's), got {value!r}")
        self._check_arguments()
        object.__setattr__(self, "_doc_lengths", mock_document_lengths())
        self._take(self._doc_lengths)

    @property
    def name(self) -> str:
        return f"Megatron's mock data (vocabulary {self.vocab_size}, end-of-document {self.eod})"

    def _read_span(self, seq: int, start: int, end: int) -> np.ndarray:
        """Tokens ``[start, end)`` of the document: ``(i + 1) % vocab_size`` at position ``i``, ``eod`` at the last
        position ``L - 1``. Example: ``vocab_size`` 5, eod 4, ``L = 7``, ``[3, 7)`` -> ``[4, 0, 1, 4]``."""
        last = int(self._doc_lengths[int(self.documents[seq])]) - 1
        tokens = (np.arange(start, end, dtype=np.int64) + 1) % int(self.vocab_size)
        if end > last:  # the span holds the document's last token
            tokens[last - start] = int(self.eod)
        return tokens
