"""Megatron's data flags read into train / validation / test sources (``data_sources``), as the start-up checks and
the data provider both read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zeppelin_megatron.megatron.data.indexed import DataError
from zeppelin_megatron.megatron.data.sources import DataSources, data_sources


def test_data_path_split_by_split() -> None:
    got = data_sources(data_path=["0.3", "a", "0.7", "b"], split="98,2,0")
    assert got == DataSources(train=(["0.3", "a", "0.7", "b"], (0.0, 0.98)),
                              valid=(["0.3", "a", "0.7", "b"], (0.98, 1.0)), test=None)
    # --split unset: Megatron's legacy default 969, 30, 1
    assert data_sources(data_path="a").test == (["a"], (0.999, 1.0))


def test_data_args_path_reads_the_words_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "blend.txt"
    f.write_text("30 /d/a\n70 /d/b\n")
    assert data_sources(data_args_path=str(f), split="100,0,0") == DataSources(
        train=(["30", "/d/a", "70", "/d/b"], (0.0, 1.0)), valid=None, test=None)
    with pytest.raises(DataError, match="--data-args-path .*missing.txt: cannot read it"):
        data_sources(data_args_path=str(tmp_path / "missing.txt"))
    with pytest.raises(DataError, match="give --data-path or --data-args-path, not both"):
        data_sources(data_path="a", data_args_path=str(f))


def test_per_split_paths_are_read_whole(tmp_path: Path) -> None:
    assert data_sources(train_data_path=["t"], valid_data_path=["1", "v1", "1", "v2"], split="9,1,0") == DataSources(
        train=(["t"], None), valid=(["1", "v1", "1", "v2"], None), test=None)
    f = tmp_path / "splits.json"
    f.write_text(json.dumps({"train": "0.5 t1 0.5 t2", "valid": ["v"], "test": None}))
    assert data_sources(per_split_data_args_path=str(f)) == DataSources(
        train=(["0.5", "t1", "0.5", "t2"], None), valid=(["v"], None), test=None)
    f.write_text("{not json")
    with pytest.raises(DataError, match="--per-split-data-args-path .*: not JSON"):
        data_sources(per_split_data_args_path=str(f))
    f.write_text(json.dumps({"valid": ["v"]}))
    with pytest.raises(DataError, match='expected a JSON object with "train"'):
        data_sources(per_split_data_args_path=str(f))
    with pytest.raises(DataError, match="--per-split-data-args-path or --train/valid/test-data-path, not both"):
        data_sources(per_split_data_args_path=str(f), train_data_path=["t"])


def test_a_validation_path_beside_data_path_is_read() -> None:
    """The one difference from Megatron (module docstring): --valid-data-path beside --data-path is the validation
    set; the training set is still --split's share of --data-path."""
    got = data_sources(data_path=["a"], valid_data_path=["v"], split="969,30,1")
    assert got.train == (["a"], (0.0, 0.969)) and got.valid == (["v"], None) and got.test == (["a"], (0.999, 1.0))


@pytest.mark.parametrize("kwargs, match", [
    ({}, "needs --data-path PREFIX"),
    ({"data_path": ["a"], "train_data_path": ["t"]}, "a training path of its own, not both"),
    ({"data_path": ["a"], "split": "0,1,0"}, "--split 0,1,0: gives training no share"),
    ({"data_path": ["a"], "split": "x"}, "--split 'x': give up to three"),
    ({"data_path": ["1", "a", "b", "c"]}, "--data-path 1 a b c: give a weight before every prefix"),
    ({"train_data_path": ["t"], "test_data_path": ["-1", "x", "1", "y"]}, "--test-data-path: weight -1.0 for x"),
])
def test_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(DataError, match=match):
        data_sources(**kwargs)
