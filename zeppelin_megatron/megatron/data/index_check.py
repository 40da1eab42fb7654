"""Up-front validation of a Megatron indexed dataset (``PREFIX.bin`` / ``PREFIX.idx``).

Megatron's ``IndexedDataset`` trusts its files: a truncated ``.bin`` builds a
dataset that fails later in ``numpy.frombuffer`` with a message naming no file,
an empty ``.bin`` fails with numpy's "cannot mmap an empty file", and a
sequence length of 10^9 in the ``.idx`` is accepted. :func:`check_indexed_files`
reads the ``.idx`` once (a memory map, vectorised checks) and raises
:class:`~zeppelin_megatron.megatron.data.indexed.DataError` naming the file and
the problem before anything is built.

The ``.idx`` layout (megatron-core ``_IndexWriter``, version 1), for ``S``
sequences (items) and ``D + 1`` document indices::

    offset  size      field
    0       9         magic b"MMIDIDX\\x00\\x00"
    9       8         version (uint64, = 1)
    17      1         token dtype code (1..8: uint8 int8 int16 int32 int64 float64 float32 uint16)
    18      8         S = sequence count (uint64)
    26      8         D + 1 = document index count (uint64)
    34      4 S       sequence lengths, tokens (int32)
    34+4S   8 S       sequence pointers, bytes into .bin (int64)
    34+12S  8 (D+1)   document indices: document j is sequences [idx[j], idx[j+1])
    (+ S bytes of int8 sequence modes for multimodal datasets)

Worked example: two documents of 3 and 2 uint16 tokens: ``S = 2``, lengths
``[3, 2]``, pointers ``[0, 6]``, document indices ``[0, 1, 2]``; the ``.idx``
is ``34 + 8 + 16 + 24 = 82`` bytes and the ``.bin`` ``(3 + 2) * 2 = 10`` bytes.
Checked: both files non-empty, the header, the ``.idx`` size against ``S`` and
``D``, ``S >= 1`` (an empty dataset is an error), the ``.bin`` size a multiple
of the token size and equal to the end of the last sequence, every length
``>= 0`` and every sequence ``[pointer, pointer + length * itemsize)`` inside
the ``.bin`` (so no length exceeds the ``.bin``'s token count), and document
indices from 0 to ``S``, non-decreasing.
"""

from __future__ import annotations

import os
import struct

import numpy as np

__all__ = ["DataError", "check_indexed_files", "IDX_HEADER_BYTES"]

_MAGIC = b"MMIDIDX\x00\x00"
IDX_HEADER_BYTES = 34
# megatron.core.datasets.indexed_dataset.DType codes -> token size in bytes
_TOKEN_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}


class DataError(ValueError):
    """Bad data input: a missing or malformed dataset, an out-of-range request (re-exported by
    :mod:`.indexed`, which imports this module)."""


def _error(message: str) -> Exception:
    return DataError(message)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise _error(f"{path}: cannot read the file ({exc.strerror or exc})") from exc


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_indexed_files(prefix: str) -> None:
    """Raise ``DataError`` unless ``prefix.bin`` / ``prefix.idx`` form a consistent, non-empty dataset.

    Costs one pass over the ``.idx`` (12 bytes per sequence + 8 per document);
    the ``.bin`` is only measured, never read.
    """
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    idx_size, bin_size = _size(idx_path), _size(bin_path)
    if idx_size == 0:
        raise _error(f"{idx_path}: the index file is empty (0 bytes); rewrite it with tools/preprocess_data.py")
    if idx_size < IDX_HEADER_BYTES:
        raise _error(
            f"{idx_path}: the index file has {idx_size} bytes, fewer than its {IDX_HEADER_BYTES}-byte header "
            "(truncated or not a Megatron .idx)"
        )
    try:
        with open(idx_path, "rb") as f:
            head = f.read(IDX_HEADER_BYTES)
    except OSError as exc:
        raise _error(f"{idx_path}: cannot read the file ({exc.strerror or exc})") from exc
    if head[:9] != _MAGIC:
        raise _error(f"{idx_path}: not a Megatron index file (header {head[:9]!r}, expected {_MAGIC!r})")
    (version,) = struct.unpack("<Q", head[9:17])
    if version != 1:
        raise _error(f"{idx_path}: index version {version} is not supported (only version 1)")
    code = head[17]
    if code not in _TOKEN_BYTES:
        raise _error(f"{idx_path}: token dtype code {code} is not one of Megatron's codes 1..8")
    itemsize = _TOKEN_BYTES[code]
    sequences, doc_count = struct.unpack("<QQ", head[18:34])
    expected = IDX_HEADER_BYTES + 12 * sequences + 8 * doc_count
    if idx_size not in (expected, expected + sequences):  # + S bytes of sequence modes (multimodal)
        raise _error(
            f"{idx_path}: the header announces {sequences} sequences and {doc_count} document indices, "
            f"which take {expected} bytes, but the file has {idx_size} bytes (truncated, or a different .idx)"
        )
    if sequences == 0 or doc_count < 2:
        raise _error(
            f"{idx_path}: the dataset is empty ({sequences} sequences, {max(doc_count - 1, 0)} documents); "
            "give a dataset with at least one document"
        )
    if bin_size == 0:
        raise _error(f"{bin_path}: the data file is empty (0 bytes) but {idx_path} lists {sequences} sequences")
    if bin_size % itemsize:
        raise _error(
            f"{bin_path}: {bin_size} bytes is not a whole number of {itemsize}-byte tokens (the dtype of "
            f"{idx_path}): truncated, or written with another dtype"
        )
    mm = np.memmap(idx_path, dtype=np.uint8, mode="r")
    try:
        _check_arrays(mm, int(sequences), int(doc_count), itemsize, bin_size, idx_path, bin_path)
    finally:
        mm._mmap.close()  # type: ignore[attr-defined]


def _check_arrays(
    mm: np.ndarray, sequences: int, doc_count: int, itemsize: int, bin_size: int, idx_path: str, bin_path: str
) -> None:
    """Lengths, pointers and document indices of the ``.idx`` against the ``.bin``'s ``bin_size`` bytes."""
    off = IDX_HEADER_BYTES
    lengths = np.frombuffer(mm, dtype="<i4", count=sequences, offset=off).astype(np.int64)
    pointers = np.frombuffer(mm, dtype="<i8", count=sequences, offset=off + 4 * sequences)
    doc_idx = np.frombuffer(mm, dtype="<i8", count=doc_count, offset=off + 12 * sequences)
    bin_tokens = bin_size // itemsize
    neg = lengths < 0
    if neg.any():
        i = _first(neg)
        raise _error(f"{idx_path}: sequence {i} has a negative length {int(lengths[i])}")
    big = lengths > bin_tokens
    if big.any():
        i = _first(big)
        raise _error(
            f"{idx_path}: sequence {i} has length {int(lengths[i])} tokens, more than the {bin_tokens} tokens "
            f"of {bin_path} ({bin_size} bytes)"
        )
    ends = pointers + lengths * itemsize
    outside = (pointers < 0) | (pointers % itemsize != 0) | (ends > bin_size)
    if outside.any():
        i = _first(outside)
        raise _error(
            f"{bin_path}: sequence {i} ({int(lengths[i])} tokens at byte {int(pointers[i])}) ends at byte "
            f"{int(ends[i])}, outside the file's {bin_size} bytes (a truncated .bin, or an .idx written for "
            f"another .bin)"
        )
    last = int(ends.max())
    if last != bin_size:
        raise _error(
            f"{bin_path}: the file has {bin_size} bytes but the sequences of {idx_path} end at byte {last} "
            f"({bin_size - last} bytes unaccounted for: an .idx written for another .bin?)"
        )
    if doc_idx[0] != 0 or doc_idx[-1] != sequences:
        raise _error(
            f"{idx_path}: document indices must run from 0 to the {sequences} sequences, got first "
            f"{int(doc_idx[0])} and last {int(doc_idx[-1])}"
        )
    steps = np.diff(doc_idx)
    if (steps < 0).any():
        j = _first(steps < 0)
        raise _error(
            f"{idx_path}: document indices decrease at document {j} ({int(doc_idx[j])} -> {int(doc_idx[j + 1])})"
        )
