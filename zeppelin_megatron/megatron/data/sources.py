"""Where the train, validation and test documents come from, read from Megatron's data flags once.

Megatron's flags: ``--data-path`` (a prefix or a blend, :func:`~.blend.parse_blend`) or ``--data-args-path FILE``
(the same words in a file), split into train / valid / test by ``--split`` (Megatron's default ``969, 30, 1`` when
unset, :data:`~.blend.LEGACY_SPLIT`); or per-split sources: ``--train-data-path`` / ``--valid-data-path`` /
``--test-data-path``, or ``--per-split-data-args-path FILE`` (JSON ``{"train": ..., "valid": ..., "test": ...}``,
each a list of words or one string of them). :func:`data_sources` resolves them into one :class:`DataSources`, so
the start-up checks and the data provider read the flags the same way. Example: ``--data-path 0.3 A 0.7 B --split
98,2,0`` -> train ``(["0.3", "A", "0.7", "B"], (0.0, 0.98))``, valid ``(..., (0.98, 1.0))``, no test.

One difference from Megatron, on purpose: beside ``--data-path``, Megatron ignores ``--valid-data-path`` and
``--test-data-path`` (its validation then comes from ``--split`` only); here a per-split path given beside
``--data-path`` is read for its set, since a user who names one means it.

``--mock-data`` (alone, as Megatron requires): megatron-core's mock documents (:mod:`.mock`), split ``1,1,1`` as
megatron-core splits them whatever ``--split`` says; a source's words are then ``None``: train ``(None, (0.0,
1/3))``, valid ``(None, (1/3, 2/3))``, test ``(None, (2/3, 1.0))``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from .blend import LEGACY_SPLIT, parse_blend, split_ranges
from .index_check import DataError
from .mock import MOCK_SPLIT

__all__ = ["DataSource", "DataSources", "data_sources"]

DataSource = tuple["list[str] | None", "tuple[float, float] | None"]
"""``(words, split)``: ``--data-path``-style words (one prefix or a blend; ``None``: Megatron's mock data) and the
share of their documents (``None``: all)."""


@dataclass(frozen=True)
class DataSources:
    """Train, validation and test sources (:data:`DataSource`; ``None``: no such set)."""

    train: DataSource
    valid: DataSource | None
    test: DataSource | None


def _words(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else [str(x) for x in value]


def _read(path: str, flag: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise DataError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def _per_split_file(path: str) -> list[list[str] | None]:
    flag = "--per-split-data-args-path"
    try:
        spec = json.loads(_read(path, flag))
    except json.JSONDecodeError as exc:
        raise DataError(f"{flag} {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(spec, dict) or "train" not in spec:
        raise DataError(f'{flag} {path}: expected a JSON object with "train" (and "valid", "test") entries')
    out: list[list[str] | None] = []
    for key in ("train", "valid", "test"):
        value = spec.get(key)
        out.append(value.split() if isinstance(value, str) else _words(value) if value else None)
    return out


def data_sources(*, data_path: Sequence[str] | str | None = None, data_args_path: str | None = None,
                 train_data_path: Sequence[str] | str | None = None,
                 valid_data_path: Sequence[str] | str | None = None,
                 test_data_path: Sequence[str] | str | None = None, per_split_data_args_path: str | None = None,
                 split: str | None = None, mock_data: bool = False) -> DataSources:
    """The sources Megatron's data flags name (module docstring). Raises :class:`DataError` naming the flag for
    flags given together that exclude each other (``--mock-data`` with another source), no training source, a
    file that cannot be read, a malformed blend (:func:`~.blend.parse_blend`) or ``--split``
    (:func:`~.blend.split_ranges`), or a ``--split`` that leaves training no share."""
    if mock_data:
        given = [flag for flag, value in (("--data-path", data_path), ("--data-args-path", data_args_path),
                                          ("--train-data-path", train_data_path),
                                          ("--valid-data-path", valid_data_path),
                                          ("--test-data-path", test_data_path),
                                          ("--per-split-data-args-path", per_split_data_args_path)) if value]
        if given:
            raise DataError(f"give --mock-data or {' / '.join(given)}, not both (Megatron trains on one data source)")
        mock = split_ranges(MOCK_SPLIT)
        return DataSources(train=(None, mock[0]), valid=(None, mock[1]), test=(None, mock[2]))
    if data_path and data_args_path:
        raise DataError("give --data-path or --data-args-path, not both")
    words = _words(data_path) if data_path else (
        _read(data_args_path, "--data-args-path").split() if data_args_path else None)
    per = [_words(train_data_path) or None, _words(valid_data_path) or None, _words(test_data_path) or None]
    if per_split_data_args_path:
        if any(per):
            raise DataError("give --per-split-data-args-path or --train/valid/test-data-path, not both")
        per = _per_split_file(per_split_data_args_path)
    if words and per[0]:
        raise DataError("give --data-path (or --data-args-path) or a training path of its own, not both")
    if not (words or per[0]):
        raise DataError("Zeppelin needs --data-path PREFIX (an indexed dataset made by tools/preprocess_data.py), "
                        "--data-args-path, a training path or --mock-data")
    for value, flag in ((words, "--data-path"), (per[0], "--train-data-path"), (per[1], "--valid-data-path"),
                        (per[2], "--test-data-path")):
        if value:
            parse_blend(value, flag)
    if not words:
        assert per[0] is not None
        return DataSources(train=(per[0], None), valid=None if per[1] is None else (per[1], None),
                           test=None if per[2] is None else (per[2], None))
    shares = split_ranges(split or LEGACY_SPLIT)
    if shares[0] is None:
        raise DataError(f"--split {split}: gives training no share of --data-path")
    rest: list[DataSource | None] = []
    for own, share in zip(per[1:], shares[1:]):
        rest.append((own, None) if own else (words, share) if share is not None else None)
    return DataSources(train=(words, shares[0]), valid=rest[0], test=rest[1])
