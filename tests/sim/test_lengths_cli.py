"""Length sources and the `zeppelin simulate` command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zeppelin_megatron.cli import main
from zeppelin_megatron.sim.lengths import DISTRIBUTIONS, get_distribution, sample_steps, split_steps


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_steps_exact_budget_bounded_and_deterministic(name: str) -> None:
    steps = sample_steps(name, 3, 200_000, seed=7)
    assert len(steps) == 3
    cap = get_distribution(name).max_len
    for s in steps:
        assert sum(s) == 200_000 and min(s) >= 1 and max(s) <= cap
    assert sample_steps(name, 3, 200_000, seed=7) == steps
    assert sample_steps(name, 1, 200_000, seed=7)[0] == steps[0]   # step k independent of K
    assert sample_steps(name, 1, 200_000, seed=8)[0] != steps[0]


def test_distribution_shapes() -> None:
    gh = np.concatenate([np.array(s) for s in sample_steps("github-64k", 4, 1 << 20, 0)])
    ax = np.concatenate([np.array(s) for s in sample_steps("arxiv-64k", 4, 1 << 20, 0)])
    pl = np.concatenate([np.array(s) for s in sample_steps("prolong-64k", 4, 1 << 20, 0)])
    assert np.median(gh) < 1000 < np.median(ax)          # code files short, papers long
    assert pl[pl >= 16384].sum() / pl.sum() > 0.4          # most ProLong tokens in long documents


def test_split_steps_and_errors() -> None:
    assert split_steps([5, 7, 3], 2, 6) == [[5, 1], [6]]
    assert split_steps([10], 1, 8, max_len=3) == [[3, 3, 2]]
    with pytest.raises(ValueError, match="fewer than 2 steps x 10 = 20"):
        split_steps([5, 5], 2, 10)
    with pytest.raises(ValueError, match="unknown length distribution 'x'"):
        sample_steps("x", 1, 10, 0)


def test_simulate_cli(tmp_path, capsys) -> None:
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(x) for x in [30000, 12000, 5000, 900, 700, 400] * 4) + "\n")
    out = tmp_path / "r.json"
    rc = main(["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--steps", "2",
               "--tokens-per-step", "60000", "--strategies", "zeppelin,te-cp,flexsp,lower-bound",
               "--json", str(out), "--timeline", str(tmp_path / "t.png"), "--plot", str(tmp_path / "p.png")])
    text = capsys.readouterr().out
    assert (tmp_path / "t.png").stat().st_size > 1000 and (tmp_path / "p.png").stat().st_size > 1000
    assert rc == 0
    assert "simulated (cost model calibrated on H100 kernel timings; network bandwidths nominal)" in text
    assert "| te-cp |" in text and "1.00x" in text and "| lower-bound |" in text
    doc = json.loads(out.read_text())
    assert doc["steps"] == 2 and set(doc["results"]) == {"zeppelin", "te-cp", "flexsp", "lower-bound"}
    lb = doc["results"]["lower-bound"]["mean_step_ms"]
    assert all(r["mean_step_ms"] >= lb * (1 - 1e-9) for r in doc["results"].values())
    rc = main(["simulate", "--dist", "arxiv-64k", "--cluster", "1x4", "--strategies", "bogus"])
    assert rc == 2 and "unknown strategies" in capsys.readouterr().err
    rc = main(["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--steps", "9",
               "--tokens-per-step", "60000"])
    assert rc == 2 and "fewer than 9 steps" in capsys.readouterr().err


def test_simulate_cli_reads_a_megatron_dataset(tmp_path, capsys) -> None:
    pytest.importorskip("megatron.core", reason="writing an indexed dataset needs megatron-core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zeppelin_megatron.sim.lengths import lengths_from_dataset
    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    sizes = [3000, 500, 0, 1200, 800, 2500]
    for n in sizes:
        builder.add_document(np.arange(n, dtype=np.int64) % 1000, [n])
    builder.finalize(prefix + ".idx")
    assert lengths_from_dataset(prefix) == sizes
    rc = main(["simulate", "--dataset", prefix, "--cluster", "1x2", "--steps", "2", "--tokens-per-step", "4000",
               "--strategies", "zeppelin,te-cp"])
    out = capsys.readouterr().out
    assert rc == 0 and f"indexed dataset {prefix}" in out and "| zeppelin |" in out


def test_simulate_cli_reads_a_blend(tmp_path, capsys) -> None:
    """``--dataset W1 P1 W2 P2``: the blend's documents in training's blend order, their token shares as weighed;
    a bad weight is refused with exit code 2."""
    pytest.importorskip("megatron.core", reason="writing an indexed dataset needs megatron-core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zeppelin_megatron.sim.lengths import lengths_from_blend
    prefixes = []
    for name, sizes in (("a", [300, 500, 0, 1200]), ("b", [40, 60, 80, 20, 100])):
        prefixes.append(str(tmp_path / name))
        builder = IndexedDatasetBuilder(prefixes[-1] + ".bin", dtype=np.uint16)
        for n in sizes:
            builder.add_document(np.arange(n, dtype=np.int64) % 1000, [n])
        builder.finalize(prefixes[-1] + ".idx")
    words = ["1", prefixes[0], "1", prefixes[1]]
    docs = lengths_from_blend(words, 0, 20000)
    assert sum(docs) >= 20000 and 0 not in docs
    a = sum(n for n in docs if n >= 300)  # a's documents are 300 tokens or more, b's under
    assert abs(a - (sum(docs) - a)) <= 2 * 1200  # equal weights: equal token shares, give or take a document
    assert docs == lengths_from_blend(words, 0, 20000) != lengths_from_blend(words, 1, 20000)
    rc = main(["simulate", "--dataset", *words, "--cluster", "1x2", "--steps", "2", "--tokens-per-step", "4000",
               "--strategies", "zeppelin,te-cp"])
    out = capsys.readouterr().out
    assert rc == 0 and f"blend 1 {prefixes[0]} 1 {prefixes[1]}, seed 0" in out and "| zeppelin |" in out
    rc = main(["simulate", "--dataset", "0", prefixes[0], "1", prefixes[1], "--cluster", "1x2"])
    assert rc == 2 and f"--dataset: weight 0.0 for {prefixes[0]}" in capsys.readouterr().err


def test_simulate_cli_runs_the_micro_steps_training_runs(tmp_path, capsys) -> None:
    """``--dataset P --seq-length N``: documents truncated at N inputs and cut by the training sampler, the very
    micro-steps the data iterator would give (same seed, budget, split)."""
    pytest.importorskip("megatron.core", reason="writing an indexed dataset needs megatron-core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zeppelin_megatron.megatron.data.indexed import DocumentDataset
    from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler
    from zeppelin_megatron.sim.lengths import training_steps
    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    rng = np.random.default_rng(0)
    for n in [int(x) for x in rng.integers(1, 3000, size=60)]:
        builder.add_document(np.arange(n, dtype=np.int64) % 1000, [n])
    builder.finalize(prefix + ".idx")
    got = training_steps([prefix], seq_length=1024, tokens_per_step=4000, steps=3, seed=5, split="90,10,0")
    ds = DocumentDataset(prefix=prefix, seq_length=1024, split=(0.0, 0.9))
    sampler = TokenBudgetSampler(lengths=ds.lengths, budget=4000, seed=5)
    assert got == [[int(ds.lengths[i]) for i in sampler.micro_step(k)] for k in range(3)]
    assert all(max(step) <= 1024 and sum(step) <= 4000 for step in got)
    rc = main(["simulate", "--dataset", prefix, "--seq-length", "1024", "--split", "90,10,0", "--cluster", "1x2",
               "--steps", "2", "--tokens-per-step", "4000", "--strategies", "zeppelin,te-cp"])
    out = capsys.readouterr().out
    assert rc == 0 and f"{prefix} as training reads it (seq_length 1024, seed 0, split 90,10,0)" in out
    rc = main(["simulate", "--dist", "arxiv-64k", "--seq-length", "1024", "--cluster", "1x2"])
    assert rc == 2 and "give --dataset" in capsys.readouterr().err
    rc = main(["simulate", "--dataset", prefix, "--split", "9,1", "--cluster", "1x2"])
    assert rc == 2 and "--split needs --seq-length" in capsys.readouterr().err
    rc = main(["simulate", "--dataset", prefix, "--seq-length", "5000", "--tokens-per-step", "1500",
               "--cluster", "1x2"])
    assert rc == 2 and "more than the micro-step budget of 1500 tokens" in capsys.readouterr().err



def test_simulate_steps_keep_training_s_margin(tmp_path, capsys) -> None:
    """A step that fills the cluster to within 5 tokens per rank is cut as training cuts its micro-step budget
    (placeable_budget: 4 x (1000 - 5) = 3980; 1000 / 256 is less than 5), with a note; more than the cluster holds
    is refused before any work; no --tokens-per-step on a cluster holding less than 1M: what it places."""
    from zeppelin_megatron.commands.simulate import step_budget
    from zeppelin_megatron.planner import load_cluster

    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(x) for x in [900, 700, 400, 300, 120, 60, 25, 7] * 20) + "\n")
    out = tmp_path / "r.json"
    rc = main(["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--tokens-per-gpu", "1000", "--steps", "2",
               "--tokens-per-step", "4000", "--strategies", "zeppelin,te-cp", "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "steps of 3980 tokens, not --tokens-per-step 4000: as training's micro-step budget, each of the 4 ranks " \
           "keeps 5 of its 1000 tokens free" in captured.err
    assert "2 steps x 3980 tokens" in captured.out and json.loads(out.read_text())["tokens_per_step"] == 3980
    rc = main(["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--tokens-per-gpu", "1000",
               "--tokens-per-step", "4001"])
    captured = capsys.readouterr()
    assert rc == 2 and not captured.out
    assert "--tokens-per-step 4001 is more than the cluster holds: 4 ranks x 1000 tokens = 4000" in captured.err
    cluster = load_cluster("1x4")
    assert step_budget(None, cluster) == (4 * (65536 - 256), None)  # 4 x 65,280 < 1M; 1/256 of each GPU kept free
    assert step_budget(3000, cluster) == (3000, None)
    assert step_budget(None, cluster, seq_length=4096) == (4 * 4096, None)  # training's budget at --micro-batch-size 1
    assert step_budget(None, cluster, seq_length=65536) == (4 * 65280, None)
