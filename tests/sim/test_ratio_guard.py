"""The simulated yardstick's regression guard (benchmarks/ratio_guard.py): Zeppelin / best peer on twelve
configurations must not rise above the recorded values (benchmarks/ratio_guard.json)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _guard() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ratio_guard", ROOT / "benchmarks" / "ratio_guard.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ratio_guard", mod)
    spec.loader.exec_module(mod)
    return mod


guard = _guard()
JOBS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
"""Worker processes for the guard: the CPUs this process may use, at most 4 (each holds a simulation)."""


def test_record_covers_every_configuration_and_size() -> None:
    rec = guard.load_record()
    assert set(rec) == {guard.key(*c) for c in guard.CONFIGS}
    assert {int(k.rsplit(":", 1)[1]) for k in rec} == {16, 32, 64, 128}
    assert {k.split(":")[0] for k in rec} == {"3B", "7B", "13B"}
    for v in rec.values():  # every recorded configuration was planned by Zeppelin and every peer
        assert set(v["planned"]) == set(guard.STRATEGIES)
        assert v["ratio"] == pytest.approx(v["zeppelin_ms"] / v["best_peer_ms"], abs=1e-4)


def test_compare_flags_a_rise_a_loss_and_a_missing_record() -> None:
    old = {"a": {"ratio": 1.03, "zeppelin_ms": 103.0, "best_peer": "flexsp", "best_peer_ms": 100.0,
                 "planned": ["flexsp", "zeppelin"]}}
    same = {"a": dict(old["a"])}
    assert guard.compare(old, same) == ([], [])
    worse = {"a": dict(old["a"], ratio=1.04, zeppelin_ms=104.0)}
    bad, good = guard.compare(old, worse)
    assert len(bad) == 1 and "1.0300 -> 1.0400" in bad[0] and not good
    within = {"a": dict(old["a"], ratio=1.034)}
    assert guard.compare(old, within) == ([], [])
    better = {"a": dict(old["a"], ratio=1.0)}
    assert guard.compare(old, better)[1] and not guard.compare(old, better)[0]
    lost = {"a": dict(old["a"], planned=["zeppelin"])}
    assert "flexsp no longer planned" in guard.compare(old, lost)[0][0]
    assert "not recorded" in guard.compare({}, same)[0][0]


def test_simulated_ratios_do_not_regress() -> None:
    """The guard itself (about 5.5 minutes of CPU since layers are chained, 23 on a slow 2-core host): every
    configuration simulated as recorded, spread over up to :data:`JOBS` processes (CI's two cores: half the wall
    time)."""
    bad, _ = guard.compare(guard.load_record(), guard.measure(jobs=JOBS))
    assert not bad, "simulated Zeppelin / best peer regressed (benchmarks/ratio_guard.py):\n" + "\n".join(bad)


def test_worker_processes_give_the_same_records() -> None:
    """``measure`` splits each configuration into one task per strategy and merges them: the same records in two
    worker processes, in one, and from one run of every strategy together in this process, to the last digit (a small
    configuration: Llama-3B, 8 GPUs)."""
    configs = (("3B", "arxiv-64k", 1),)
    one = {guard.key(*c): guard._summary(guard.st.run_config(guard._job(*c, guard.STRATEGIES))) for c in configs}
    assert guard.measure(configs, jobs=2) == one
    assert guard.measure(configs) == one
    assert set(one["3B:arxiv-64k:8"]["planned"]) == set(guard.STRATEGIES)
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        guard.measure(configs, jobs=0)
