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


def test_packed_rerank_flag(tmp_path: Path) -> None:
    """``--packed-rerank``: the plan of ``PlannerOptions(packed_rerank=True)`` (docs/planner.md, "Post-trade
    ranking"), here a different one from the default's (Llama-7B prolong-128k on 128 GPUs, batch 1)."""
    from zeppelin_megatron.planner import PlannerOptions, plan_step
    from zeppelin_megatron.planner.setup import build_planning
    from zeppelin_megatron.sim.lengths import sample_steps
    lengths = sample_steps("prolong-128k", 2, 1 << 20, 0)[1]
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(map(str, lengths)) + "\n")
    model = str(Path(__file__).parents[2] / "configs/models/llama_7b.yaml")
    plans = {}
    for flags in ((), ("--packed-rerank",)):
        out = tmp_path / f"plan{len(flags)}.json"
        assert main(["plan", "--lengths", str(f), "--cluster", "16x8", "--model", model, "--json", str(out),
                     *flags]) == 0
        plans[bool(flags)] = json.loads(out.read_text())
    cost = build_planning("16x8", model, None).cost
    for rerank, doc in plans.items():
        expected = plan_step(lengths, cost, PlannerOptions(packed_rerank=rerank))
        assert doc["predicted"]["step_ms"] == pytest.approx(expected.predicted.step_ms)  # type: ignore[union-attr]
    assert plans[True]["predicted"]["step_ms"] < plans[False]["predicted"]["step_ms"]
