"""Model shape from Megatron flags, the TP-reduced cluster, cost model and planner at start-up; plan, simulate
and training agree."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from zeppelin_megatron.megatron.arguments import ZeppelinArgsError, zeppelin_config_from_args
from zeppelin_megatron.megatron.run_shape import check_megatron_args
from zeppelin_megatron.cli import main
from zeppelin_megatron.commands.simulate import setup as simulate_setup
from zeppelin_megatron.megatron.planning import build_setup, model_shape_from_args
from zeppelin_megatron.planner import Cluster, ClusterError, PlannerOptions, load_cluster, plan_step
from zeppelin_megatron.planner.model import LLAMA_7B
from zeppelin_megatron.planner.setup import build_planning, reduce_cluster_for_tp
from zeppelin_megatron.sim.strategies import plan_with

from .helpers import A800_YAML, H100_YAML, megatron_namespace


def _setup(world_size: int = 32, gpus_per_node: int = 8, **overrides):
    args = megatron_namespace(**overrides)
    cfg = zeppelin_config_from_args(args)
    par = check_megatron_args(args, world_size=world_size, gpus_per_node=gpus_per_node)
    return build_setup(cfg, par, model_shape_from_args(args))


def test_model_shape_llama7b() -> None:
    m = model_shape_from_args(megatron_namespace())
    assert (m.layers, m.hidden, m.q_heads, m.kv_heads, m.ffn, m.head_dim) == (32, 4096, 32, 32, 11008, 128)
    assert m.linear_params_per_layer() == LLAMA_7B.linear_params_per_layer()


def test_model_shape_gqa_and_default_ffn() -> None:
    m = model_shape_from_args(megatron_namespace(group_query_attention=True, num_query_groups=8,
                                                 ffn_hidden_size=None))
    assert m.kv_heads == 8
    assert m.ffn == int((4 * 4096 * 2 / 3) / 64) * 64 == 10880  # Megatron's swiglu default


def test_model_shape_plain_mlp_has_equal_weights() -> None:
    # Plain GELU MLP of width 4h = 16384: 2 * h * 16384 weights = a gated MLP of width 2/3 * 16384.
    m = model_shape_from_args(megatron_namespace(swiglu=False, ffn_hidden_size=None, hidden_size=1536,
                                                 num_attention_heads=12))
    assert 3 * m.ffn * 1536 == 2 * 4 * 1536 * 1536


def test_model_shape_missing_flag() -> None:
    with pytest.raises(ZeppelinArgsError, match="--num-layers is required"):
        model_shape_from_args(megatron_namespace(num_layers=None))


def test_reduce_h100_tp2_keeps_own_rails() -> None:
    c = load_cluster(f"4x8@{H100_YAML}")
    r, share = reduce_cluster_for_tp(c, 2)
    assert (r.gpus_per_node, r.nics_per_node, r.gpu_nic, share) == (4, 4, (0, 1, 2, 3), 1.0)
    assert r.nic_Gbps == c.nic_Gbps and r.nodes == 4 and r.world_size == 16


def test_reduce_a800_tp2_halves_nic_bandwidth() -> None:
    c = load_cluster(f"2x8@{A800_YAML}")  # gpu_nic [0,0,1,1,2,2,3,3]
    r, share = reduce_cluster_for_tp(c, 2)
    assert r.gpu_nic == (0, 1, 2, 3) and share == 0.5 and r.nic_Gbps == c.nic_Gbps / 2
    r4, share4 = reduce_cluster_for_tp(c, 4)  # TP rank 0 -> GPUs 0, 4 -> NICs 0, 2
    assert r4.gpu_nic == (0, 1) and r4.nics_per_node == 2 and share4 == 0.5


def test_reduce_tp_equal_to_node_gives_one_rank_per_node() -> None:
    r, share = reduce_cluster_for_tp(load_cluster(f"4x8@{H100_YAML}"), 8)
    assert (r.gpus_per_node, r.gpu_nic, share) == (1, (0,), 1.0)


def test_reduce_rejects_tp_dependent_nic_map() -> None:
    c = Cluster(nodes=2, gpus_per_node=4, nics_per_node=3, gpu_nic=(0, 1, 1, 2), nvlink_GBps=450.0,
                nic_Gbps=400.0, tokens_per_gpu=8192, name="odd")
    # TP 2: TP rank 0 -> GPUs 0, 2 -> NICs 0, 1 (map [0,1]); TP rank 1 -> GPUs 1, 3 -> NICs 1, 2 (map [0,1]).
    assert reduce_cluster_for_tp(c, 2)[0].gpu_nic == (0, 1)
    c2 = replace(c, gpu_nic=(0, 0, 1, 2))  # rank 0 -> NICs 0, 1 -> [0,1]; rank 1 -> NICs 0, 2 -> [0,1]
    assert reduce_cluster_for_tp(c2, 2)[0].gpu_nic == (0, 1)
    c3 = replace(c, gpus_per_node=6, gpu_nic=(0, 0, 1, 2, 2, 2))
    # TP 2: rank 0 -> GPUs 0,2,4 -> NICs 0,1,2 -> [0,1,2]; rank 1 -> GPUs 1,3,5 -> NICs 0,2,2 -> [0,1,1]
    with pytest.raises(ClusterError, match="different NIC maps"):
        reduce_cluster_for_tp(c3, 2)
    with pytest.raises(ClusterError, match="tensor parallel size 3 does not divide the cluster's 4 GPUs"):
        reduce_cluster_for_tp(c, 3)


def test_cluster_must_match_world_size() -> None:
    with pytest.raises(ZeppelinArgsError, match=r"32 GPUs but the job has world size 16.*2x8@"):
        _setup(world_size=16, gpus_per_node=8, zeppelin_cluster=str(H100_YAML))  # file says 4 nodes
    with pytest.raises(ZeppelinArgsError, match="8 GPUs per node but the job runs 4"):
        _setup(world_size=16, gpus_per_node=4, zeppelin_cluster=str(H100_YAML), global_batch_size=16)
    s = _setup(world_size=32, gpus_per_node=8, zeppelin_cluster=str(H100_YAML), tensor_model_parallel_size=4)
    assert (s.cluster.gpus_per_node, s.cluster.world_size) == (2, 8)


def test_missing_files_fail_at_startup(tmp_path) -> None:
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-cluster nope.yaml"):
        _setup(zeppelin_cluster="nope.yaml")
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-profile .*does not exist"):
        _setup(zeppelin_profile=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-profile"):
        _setup(zeppelin_profile=str(bad))
    with pytest.raises(ZeppelinArgsError, match=f"--zeppelin-profile {tmp_path}: is a directory, expected a file"):
        _setup(zeppelin_profile=str(tmp_path))
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-cluster .*: is a directory"):
        _setup(zeppelin_cluster=f"4x8@{tmp_path}")
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-cluster 4x0: cluster '4x0': GPUs per node is 0"):
        _setup(zeppelin_cluster="4x0")


def test_capacity_check() -> None:
    with pytest.raises(ZeppelinArgsError, match="2 x --seq-length 65536 = 131072 tokens.*1 GPU.*65536 tokens per GPU"):
        _setup(micro_batch_size=2, seq_length=65536)
    s = _setup(micro_batch_size=2, seq_length=65536, zeppelin_tokens_per_gpu=131072)
    assert s.cluster.tokens_per_gpu == 131072


def test_describe_states_the_batch_schedule() -> None:
    s = _setup(rampup_batch_size=["32", "32", "64"])
    assert "2 micro-steps per step (1 at first: --rampup-batch-size 32 32 64, micro-steps of 32 samples);" \
        in s.describe()
    assert "2 micro-steps per step; routing" in _setup().describe()
    assert _setup(fp8="hybrid", fp8_recipe="delayed", tensor_model_parallel_size=2, sequence_parallel=True,
                  global_batch_size=32).describe().endswith(
        "; each rank's rows padded to a multiple of 32 (sequence parallelism over TP 2, low-precision GEMMs need "
        "multiples of 16 rows)")
    assert "padded" not in _setup().describe()
    s = _setup(step_batch_size_schedule="0:32 1M:64 3M:128", global_batch_size=None)
    assert ("4 micro-steps per step (1 at first: --step-batch-size-schedule '0:32 1M:64 3M:128' (thresholds in "
            "tokens), micro-steps of 32 samples); routing") in s.describe()
    s = _setup(rampup_batch_size=["32", "32", "64"], step_batch_size_schedule=None)  # Megatron-LM 0.19 on
    assert ("2 micro-steps per step [--rampup-batch-size 32 32 64 ignored, as this Megatron-LM ignores it (0.19 on: "
            "use --step-batch-size-schedule)]; routing") in s.describe()


def test_micro_step_budget_keeps_the_level_margin() -> None:
    """With mbs x seq_length equal to a rank's capacity, the sampler's budget keeps 1/256 of it free per rank, at least
    5 (capacity_level.budget_margin: every micro-step then plans, balanced in time); with that much to spare,
    Megatron's budget."""
    s = _setup(seq_length=8192, zeppelin_tokens_per_gpu=8192)
    assert s.parallel.token_budget == 32 * 8192 and s.token_budget == 32 * 8160
    assert "micro-step budget 261120 tokens (1024 fewer than --micro-batch-size x --seq-length x 32, so that every " \
           "micro-step leaves 32 tokens per rank free and gets a plan balanced in time)" in s.describe()
    assert "[8192 tokens per rank is within 5% of --micro-batch-size x --seq-length: the fullest micro-steps are " \
           "balanced with few tokens to spare, predicted up to 5% slower" in s.describe()
    s = _setup(seq_length=8192, zeppelin_tokens_per_gpu=8223)
    assert s.token_budget == 32 * (8223 - 32) < s.parallel.token_budget
    s = _setup(seq_length=8192, zeppelin_tokens_per_gpu=8224)
    assert s.token_budget == s.parallel.token_budget == 32 * 8192
    assert "micro-step budget 262144 tokens [8224 tokens per rank is within 5%" in s.describe()
    s = _setup(seq_length=8192, zeppelin_tokens_per_gpu=8602)  # 1.05 x 8192 = 8601.6
    assert "micro-step budget 262144 tokens, " in s.describe()
    s = _setup(seq_length=8192, zeppelin_tokens_per_gpu=8192, tensor_model_parallel_size=8, global_batch_size=4)
    assert s.parallel.zeppelin_ranks == 4 and s.token_budget == 4 * 8192  # a rank (8 GPUs) holds 65536: room to spare
    s = _setup(world_size=8, seq_length=8192, zeppelin_tokens_per_gpu=1024, tensor_model_parallel_size=8,
               global_batch_size=1, zeppelin_cluster=f"1x8@{H100_YAML}")
    assert s.parallel.zeppelin_ranks == 1 and s.token_budget == 8192  # one rank: whole sequences, no margin
    with pytest.raises(ZeppelinArgsError, match=r"a micro-step of 6 tokens \(2 ranks x \(8 - 5\) tokens kept free "
                                                r"per rank\) cannot hold a sequence of --seq-length 8"):
        _setup(world_size=16, seq_length=8, zeppelin_tokens_per_gpu=1, tensor_model_parallel_size=8,
               global_batch_size=2, zeppelin_cluster=f"2x8@{H100_YAML}")  # 2 ranks of 8 GPUs x 1 token


def test_tp_group_capacity_is_tp_times_per_gpu() -> None:
    # A Zeppelin rank at TP 2 is two GPUs, each keeping half the heads (and, with sequence parallelism,
    # half the other activations) of the same tokens: 2 x the per-GPU capacity of the cluster file.
    s = _setup(tensor_model_parallel_size=2, micro_batch_size=2, seq_length=65536)
    assert s.cluster.tokens_per_gpu == 2 * 65536 and s.planning.physical.tokens_per_gpu == 65536
    s = _setup(tensor_model_parallel_size=2, zeppelin_tokens_per_gpu=1000, seq_length=2000)
    assert s.cluster.tokens_per_gpu == 2000
    with pytest.raises(ZeppelinArgsError, match="2001 tokens per Zeppelin rank exceeds the rank's capacity of 2000"):
        _setup(tensor_model_parallel_size=2, zeppelin_tokens_per_gpu=1000, seq_length=2001)


def test_heads_not_divisible_by_tp() -> None:
    with pytest.raises(ZeppelinArgsError, match="not divisible by tensor_parallel"):
        _setup(num_attention_heads=12, hidden_size=1536, ffn_hidden_size=4096, tensor_model_parallel_size=8,
               global_batch_size=4)


def test_setup_planner_matches_plan_step() -> None:
    s = _setup(tensor_model_parallel_size=2, global_batch_size=64)
    assert s.cluster.world_size == s.parallel.zeppelin_ranks == 16
    assert "16 Zeppelin ranks (4 per node" in s.describe()
    lengths = [812, 40_000, 95_000, 2_048] + [4096] * 30
    plan = s.planner(lengths)
    assert plan.world_size == 16
    assert plan.to_json() == plan_step(lengths, s.cost).to_json()
    assert plan.to_json() == s.planner(lengths).to_json()  # deterministic


def test_planner_options_bound() -> None:
    s = _setup(zeppelin_routing=False, zeppelin_remap=False, zeppelin_placements="local,intra_node")
    assert s.planner.options == PlannerOptions(routing=False, remap=False, placements=("local", "intra_node"))
    assert s.config.options is s.planner.options and s.config.routing is False
    plan = s.planner([30_000, 1000, 1000, 5000, 20_000])
    assert plan.routing == () and plan.linear_layout == plan.attention_layout
    assert all(sp.placement != "inter_node" for sp in plan.sequences)



def test_planner_remap_default_auto_on_and_off() -> None:
    assert _setup().planner.options.remap == "auto" and "remap auto" in _setup().describe()  # the default
    s = _setup(zeppelin_remap_auto=True)
    assert s.planner.options.remap == "auto" and "remap auto" in s.describe()
    lengths = [812, 40_000, 95_000, 2_048] + [4096] * 30
    on = _setup(zeppelin_remap=True)  # --zeppelin-remap forces the token-balanced layout
    assert on.planner.options.remap is True and "remap on" in on.describe()
    assert on.planner(lengths).to_json() == plan_step(lengths, on.cost, PlannerOptions(remap=True)).to_json()
    assert on.planner(lengths).linear == "token_balanced"
    off = _setup(zeppelin_remap=False)
    assert "remap off" in off.describe() and off.planner(lengths).linear == "attention"
    auto = s.planner(lengths)
    assert auto.to_json() == _setup().planner(lengths).to_json() == plan_step(lengths, s.cost).to_json()
    assert auto.predicted.step_ms <= min(on.planner(lengths).predicted.step_ms, off.planner(lengths).predicted.step_ms)


@pytest.mark.parametrize("tp", [1, 2])
def test_plan_simulate_and_training_agree(tp: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Same lengths, same cluster and TP: `zeppelin plan`, the simulator's zeppelin strategy and the training
    setup give the same plan JSON (one builder: planner.setup.build_planning)."""
    lengths = [812, 40_000, 95_000, 2_048, 130_000] + [4096] * 30 + [300] * 50
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(map(str, lengths)) + "\n")
    out = tmp_path / "plan.json"
    spec = f"4x8@{H100_YAML}"
    assert main(["plan", "--lengths", str(f), "--cluster", spec, "--tensor-parallel", str(tp),
                 "--json", str(out)]) == 0
    from_cli = out.read_text().strip()
    cluster, cost = simulate_setup(spec, None, None, tp)
    from_sim = plan_with("zeppelin", lengths, cluster, cost).plan.to_json(indent=1)
    training = _setup(tensor_model_parallel_size=tp, global_batch_size=64, zeppelin_cluster=spec)
    from_training = training.planner(lengths).to_json(indent=1)
    direct = build_planning(spec, LLAMA_7B, tensor_parallel=tp).plan(lengths).to_json(indent=1)
    assert from_cli == from_sim == from_training == direct
    doc = json.loads(from_cli)
    assert (doc["nodes"], doc["gpus_per_node"]) == (4, 8 // tp)
    assert training.cluster == cluster and training.cost.profile == cost.profile
    assert training.cost.tensor_parallel == cost.tensor_parallel == tp  # (model names differ: 'megatron', 'llama-7b')
