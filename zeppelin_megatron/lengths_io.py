"""Reading a lengths file: one positive integer per line (``zeppelin plan/simulate/replay --lengths``).

Pure (standard library only), below both :mod:`zeppelin_megatron.commands` and
:mod:`zeppelin_megatron.sim`. Every problem is reported before any planning,
naming the file (and ``file:line`` for a bad line)::

    # batch.txt
    812
    40000   # a long document
    -3

    read_lengths("batch.txt")  ->  LengthsError: batch.txt:3: length -3 must be >= 1
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["LengthsError", "read_lengths"]


class LengthsError(ValueError):
    """A lengths file that is missing, unreadable, not text, or holds a bad line."""


def read_lengths(path: str | Path) -> list[int]:
    """The lengths of ``path``: one integer >= 1 per line; blank lines and ``#`` comments skipped.

    Raises:
        LengthsError: the path is missing or a directory, cannot be read, is not
            UTF-8 text, holds no lengths, or a line is not an integer >= 1
            (``file:line: ...``).
    """
    p = Path(path)
    if p.is_dir():
        raise LengthsError(f"lengths file {str(path)!r} is a directory, expected a text file with one length "
                           "per line")
    if not p.exists():
        raise LengthsError(f"lengths file {str(path)!r} does not exist")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise LengthsError(f"lengths file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if b"\0" in data:
        raise LengthsError(f"lengths file {str(path)!r} is binary (it holds NUL bytes), expected text with one "
                           "length per line")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LengthsError(f"lengths file {str(path)!r} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})"
                           ", expected one length per line") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise LengthsError(f"{p}:{n}: {item!r} is not an integer length") from None
        if value < 1:
            raise LengthsError(f"{p}:{n}: length {value} must be >= 1")
        out.append(value)
    if not out:
        raise LengthsError(f"lengths file {str(path)!r} holds no lengths (one integer per line expected)")
    return out
