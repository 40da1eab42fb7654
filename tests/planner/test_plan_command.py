"""``zeppelin plan --remap auto|on|off`` / ``--no-remap``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zeppelin_megatron.cli import main
from zeppelin_megatron.planner.workloads import long_tailed_batch


@pytest.fixture(scope="module")
def lengths_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("plan") / "lengths.txt"
    f.write_text("\n".join(str(s) for s in long_tailed_batch(1 << 18, 1)) + "\n")
    return f


def _plan(lengths_file: Path, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
    rc = main(["plan", "--lengths", str(lengths_file), "--cluster", "2x4", "--json", str(out), *flags])
    assert rc == 0
    return json.loads(out.read_text())


def test_remap_flags(lengths_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    off = _plan(lengths_file, tmp_path, "--no-remap")
    assert "remap: off" in capsys.readouterr().out
    assert off["linear_layout"] == off["attention_layout"]
    assert _plan(lengths_file, tmp_path, "--remap", "off") == off
    on = _plan(lengths_file, tmp_path, "--remap", "on")
    text = capsys.readouterr().out
    assert "remap: on" in text
    slotted = sum(len(x["seqs"]) for x in on.get("local_slots", []))
    assert f"local sequences in ring waits: {slotted} (in {len(on.get('local_slots', []))} calls" in text
    assert ("cross-node rows routed over local GPUs" in text) == bool(on.get("remap_proxies"))
    assert on["linear_layout"] != on["attention_layout"]
    assert on["linear"] == "token_balanced" and off["linear"] == "attention"
    auto = _plan(lengths_file, tmp_path, "--remap", "auto")
    assert _plan(lengths_file, tmp_path) == auto   # the default
    assert auto["predicted"]["step_ms"] <= min(on["predicted"]["step_ms"], off["predicted"]["step_ms"])
    with pytest.raises(SystemExit):
        main(["plan", "--lengths", str(lengths_file), "--cluster", "2x4", "--remap", "on", "--no-remap"])
    with pytest.raises(SystemExit):
        main(["plan", "--lengths", str(lengths_file), "--cluster", "2x4", "--remap", "maybe"])
