"""Broken ``.bin``/``.idx`` pairs are refused on open with a DataError naming the file and the problem."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from zeppelin_megatron.megatron.data.index_check import IDX_HEADER_BYTES, check_indexed_files
from zeppelin_megatron.megatron.data.indexed import DataError, DocumentDataset, document_lengths

from .conftest import write_indexed

DOCS = [np.arange(1, 11, dtype=np.int64), np.arange(20, 27, dtype=np.int64), np.arange(30, 35, dtype=np.int64)]


def _good(tmp_path: Path, name: str = "good") -> str:
    """Three documents of 10, 7 and 5 uint16 tokens (S = 3 sequences, .bin = 44 bytes)."""
    return write_indexed(tmp_path / name, DOCS)


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _all_openers(prefix: str) -> list[Callable[[], object]]:
    return [
        lambda: check_indexed_files(prefix),
        lambda: DocumentDataset(prefix=prefix, seq_length=8),
        lambda: document_lengths(prefix),
    ]


def _expect(prefix: str, *fragments: str) -> None:
    for open_ in _all_openers(prefix):
        with pytest.raises(DataError) as info:
            open_()
        msg = str(info.value)
        for frag in fragments:
            assert frag in msg, f"{msg!r} does not mention {frag!r}"


def test_good_dataset_passes(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    check_indexed_files(prefix)
    assert document_lengths(prefix).tolist() == [10, 7, 5]
    assert DocumentDataset(prefix=prefix, seq_length=8).lengths.tolist() == [8, 6, 4]


def test_good_dataset_with_empty_documents_and_items_passes(tmp_path: Path) -> None:
    docs = [np.zeros(0, dtype=np.int64), np.arange(9, dtype=np.int64), np.array([5], dtype=np.int64),
            np.zeros(0, dtype=np.int64)]
    prefix = write_indexed(tmp_path / "edges", docs, items={1: [2, 3, 4]}, dtype=np.int32)
    check_indexed_files(prefix)
    assert document_lengths(prefix).tolist() == [0, 9, 1, 0]


def test_truncated_bin(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    _truncate(prefix + ".bin", 40)  # the last sequence (5 tokens at byte 34) needs bytes 34..44
    _expect(prefix, prefix + ".bin", "sequence 2", "ends at byte 44", "40 bytes", "truncated")


def test_bin_with_half_a_token(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    _truncate(prefix + ".bin", 43)
    _expect(prefix, prefix + ".bin", "43 bytes", "2-byte tokens")


def test_bin_longer_than_the_index(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\x00" * 8)
    _expect(prefix, prefix + ".bin", "52 bytes", "end at byte 44", "8 bytes unaccounted")


def test_empty_bin(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    _truncate(prefix + ".bin", 0)
    _expect(prefix, prefix + ".bin", "empty (0 bytes)", "3 sequences")


def test_empty_idx(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    _truncate(prefix + ".idx", 0)
    _expect(prefix, prefix + ".idx", "empty (0 bytes)")


def test_truncated_idx(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    size = Path(prefix + ".idx").stat().st_size
    assert size == IDX_HEADER_BYTES + 12 * 3 + 8 * 4
    _truncate(prefix + ".idx", size - 8)
    _expect(prefix, prefix + ".idx", "3 sequences and 4 document indices", f"{size} bytes", f"has {size - 8} bytes")
    _truncate(prefix + ".idx", 20)
    _expect(prefix, prefix + ".idx", "20 bytes", "header")


def test_bad_header_version_dtype(tmp_path: Path) -> None:
    prefix = _good(tmp_path, "magic")
    _patch(prefix + ".idx", 0, b"XXXXXXX")
    _expect(prefix, prefix + ".idx", "not a Megatron index file")
    prefix = _good(tmp_path, "version")
    _patch(prefix + ".idx", 9, struct.pack("<Q", 7))
    _expect(prefix, prefix + ".idx", "version 7")
    prefix = _good(tmp_path, "dtype")
    _patch(prefix + ".idx", 17, bytes([42]))
    _expect(prefix, prefix + ".idx", "dtype code 42")


def test_empty_dataset(tmp_path: Path) -> None:
    """An index of zero documents: megatron-core's builder writes it, its reader fails on the empty .bin."""
    prefix = write_indexed(tmp_path / "none", [])
    _expect(prefix, prefix + ".idx", "empty (0 sequences, 0 documents)")


def test_dataset_of_only_one_token_documents(tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "ones", [np.array([3]), np.array([4])])
    check_indexed_files(prefix)  # valid files ...
    with pytest.raises(DataError, match=r"ones: none of its 2 documents has the 2 tokens"):
        DocumentDataset(prefix=prefix, seq_length=8)  # ... but nothing to train on


def test_huge_length(tmp_path: Path) -> None:
    """A sequence length of 10^9 in the .idx is rejected: more than the .bin's 22 tokens."""
    prefix = _good(tmp_path)
    _patch(prefix + ".idx", IDX_HEADER_BYTES + 4, struct.pack("<i", 1_000_000_000))
    _expect(prefix, prefix + ".idx", "sequence 1 has length 1000000000 tokens", "22 tokens", prefix + ".bin")


def test_negative_length(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    _patch(prefix + ".idx", IDX_HEADER_BYTES, struct.pack("<i", -3))
    _expect(prefix, prefix + ".idx", "sequence 0 has a negative length -3")


def test_pointer_outside_the_bin(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    _patch(prefix + ".idx", IDX_HEADER_BYTES + 12 + 8, struct.pack("<q", 40))  # sequence 1: 7 tokens at byte 40
    _expect(prefix, prefix + ".bin", "sequence 1 (7 tokens at byte 40) ends at byte 54")


def test_bad_document_indices(tmp_path: Path) -> None:
    prefix = _good(tmp_path, "last")
    doc_off = IDX_HEADER_BYTES + 12 * 3
    _patch(prefix + ".idx", doc_off + 3 * 8, struct.pack("<q", 2))
    _expect(prefix, prefix + ".idx", "from 0 to the 3 sequences", "last 2")
    prefix = _good(tmp_path, "order")
    _patch(prefix + ".idx", doc_off + 1 * 8, struct.pack("<q", 3))  # [0, 3, 2, 3]
    _expect(prefix, prefix + ".idx", "decrease at document 1 (3 -> 2)")


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    prefix = _good(tmp_path)
    Path(prefix + ".bin").unlink()
    Path(prefix + ".bin").mkdir()
    with pytest.raises(DataError, match=r"good\.bin'\] is a directory"):
        DocumentDataset(prefix=prefix, seq_length=8)
