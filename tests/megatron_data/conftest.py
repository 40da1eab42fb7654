"""Fixtures: a small Megatron indexed dataset written with Megatron's own builder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@dataclass(frozen=True)
class WrittenDataset:
    prefix: str
    documents: list[np.ndarray]  # every document's tokens, as written (int64)


def write_indexed(path: Path, documents: list[np.ndarray], *, items: dict[int, list[int]] | None = None,
                  dtype: type = np.uint16) -> str:
    """Write ``documents`` as ``path.bin``/``path.idx``; ``items[j]`` splits document ``j`` into items."""
    pytest.importorskip("megatron.core", reason="writing an indexed dataset needs megatron-core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(path)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for j, doc in enumerate(documents):
        parts = (items or {}).get(j, [len(doc)])
        assert sum(parts) == len(doc)
        builder.add_document(doc.astype(np.int64), parts)  # numpy in: Megatron converts with numpy.array
    builder.finalize(prefix + ".idx")
    return prefix


def random_documents(seed: int, count: int, *, seq_length: int) -> tuple[list[np.ndarray], dict[int, list[int]]]:
    """Mostly short documents, some longer than ``seq_length + 1``, some of 0 or 1 tokens,
    and a few made of several items (as with ``--split-sentences``)."""
    rng = np.random.default_rng(seed)
    docs: list[np.ndarray] = []
    items: dict[int, list[int]] = {}
    for j in range(count):
        r = rng.random()
        if r < 0.06:
            n = int(rng.integers(0, 2))  # 0 or 1 token: skipped
        elif r < 0.18:
            n = int(rng.integers(seq_length + 2, 3 * seq_length))  # truncated
        else:
            n = int(rng.integers(2, seq_length + 2))
        docs.append(rng.integers(1, 60000, size=n).astype(np.int64))
        if n >= 6 and rng.random() < 0.15:
            cuts = sorted(int(c) for c in rng.choice(np.arange(1, n), size=2, replace=False))
            items[j] = [cuts[0], cuts[1] - cuts[0], n - cuts[1]]
    # make sure every category is present whatever the seed
    docs[0] = rng.integers(1, 60000, size=2 * seq_length + 5).astype(np.int64)
    docs[1] = np.array([7], dtype=np.int64)
    docs[2] = np.zeros(0, dtype=np.int64)
    docs[3] = rng.integers(1, 60000, size=seq_length + 1).astype(np.int64)
    items[4] = [1] * len(docs[4]) if len(docs[4]) <= 8 else [4, len(docs[4]) - 4]
    for j in (0, 1, 2, 3):
        items.pop(j, None)
    return docs, items


SEQ_LENGTH = 64


@pytest.fixture(scope="session")
def written(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    docs, items = random_documents(1234, 240, seq_length=SEQ_LENGTH)
    prefix = write_indexed(tmp_path_factory.mktemp("indexed") / "corpus_text_document", docs, items=items)
    return WrittenDataset(prefix, docs)
