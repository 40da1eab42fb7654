"""``zeppelin demo``: train a small megatron-core GPT with Zeppelin on CPU, 4 gloo ranks as 2 nodes x 2 GPUs.

What runs, end to end, with the project's real parts:

1. a Megatron indexed dataset (``.bin``/``.idx``, written with megatron-core's
   ``IndexedDatasetBuilder``) of documents with long-tailed lengths, tokens drawn
   from a fixed random bigram chain (so there is something to learn);
2. per rank: :class:`DocumentDataset`, :class:`TokenBudgetSampler` and
   :class:`ZeppelinDataIterator` plan each step with :func:`plan_step` and hand the
   rank its linear-layout tokens; a GPT built with the Zeppelin layer spec runs
   forward and backward through :class:`ZeppelinCoreAttention` (remap, ring and
   local queues); gradients are summed over the data-parallel ranks; Adam steps;
3. with ``compare_baseline``: the same steps again as plain data parallelism
   (whole documents per rank, megatron-core's own attention, one document at a
   time) from the same initial weights, and the per-step loss difference.

CPU accommodations come from :mod:`.cpu_support` (Megatron's schedules and DDP
need CUDA, so the loop here calls the model directly and all-reduces gradients
itself). Times are measured on this CPU; balance figures are cost-model
predictions for the plan, labelled as such.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..planner.capacity_level import LEVEL_MARGIN

__all__ = ["DemoConfig", "write_corpus", "run_demo", "quiet_third_party_warnings", "THIRD_PARTY"]

THIRD_PARTY = r"(megatron|megatron_fsdp|transformer_engine|apex|torch\.distributed)(\.|$)"
"""Modules whose import-time warnings the demo hides (e.g. megatron-core's "Transformer Engine and Apex
are not installed", once per module and rank: 44 lines before the first step)."""


def quiet_third_party_warnings() -> None:
    """Ignore warnings raised from :data:`THIRD_PARTY` modules (this process; called in the parent and
    in every spawned rank before anything imports megatron). Zeppelin's own warnings still show."""
    warnings.filterwarnings("ignore", module=THIRD_PARTY)


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """Demo settings. ``tokens_per_step``: global token budget of one training step.

    ``tokens_per_gpu``: attention-layout capacity of one rank; the default (1.125 x
    the step's share: 2304 tokens for 8192 over 4 ranks) is well below
    ``seq_length``, so long documents must be split: over the 2 ranks of a node
    (intra-node ring) up to 4608 tokens, across nodes (inter-node ring) beyond,
    as in a real long-context run.
    """

    steps: int = 20
    nodes: int = 2
    gpus_per_node: int = 2
    seq_length: int = 6144
    tokens_per_step: int = 8192
    tokens_per_gpu: int | None = None
    documents: int = 2000
    vocab: int = 256
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 256
    lr: float = 3e-3
    seed: int = 0
    compare_baseline: bool = False
    packed: bool = True
    """The planner's packed candidates (``PlannerOptions.packed``): on by default, as for every user; for this
    tiny model they win most steps, so ``False`` shows the partitioner's plans instead (the same losses: the
    same math on another placement)."""
    out_dir: str = "zeppelin_demo_out"

    def __post_init__(self) -> None:
        for name in ("steps", "nodes", "gpus_per_node", "seq_length", "tokens_per_step", "documents", "vocab",
                     "layers", "hidden", "heads", "kv_heads", "ffn"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"demo {name} must be a positive integer, got {value!r}")
        if not isinstance(self.packed, bool):
            raise ValueError(f"demo packed must be True or False, got {self.packed!r}")
        if self.heads % self.kv_heads or self.hidden % self.heads:
            raise ValueError(
                f"demo heads={self.heads} must be a multiple of kv_heads={self.kv_heads} and divide "
                f"hidden={self.hidden}"
            )
        if self.tokens_per_step < self.seq_length:
            raise ValueError(
                f"tokens_per_step={self.tokens_per_step} must be >= seq_length={self.seq_length} (a step holds at "
                "least one whole sequence)"
            )
        keep = LEVEL_MARGIN if self.world > 1 else 0  # tokens a rank keeps free: every step then fits (capacity_level)
        if self.tokens_per_gpu is not None and (self.tokens_per_gpu - keep) * self.world < self.tokens_per_step:
            raise ValueError(
                f"tokens_per_gpu={self.tokens_per_gpu} x {self.world} ranks leaves fewer than {keep} tokens per rank "
                f"free for tokens_per_step={self.tokens_per_step}: tokens_per_gpu must be at least "
                f"{-(-self.tokens_per_step // self.world) + keep}"
            )

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def capacity(self) -> int:
        """Tokens per rank for the planner's cluster."""
        if self.tokens_per_gpu is not None:
            return self.tokens_per_gpu
        return math.ceil(1.125 * self.tokens_per_step / self.world)


# -- corpus ------------------------------------------------------------------------------


def document_lengths(cfg: DemoConfig) -> np.ndarray:
    """Long-tailed lengths: log-normal short documents (median 48 tokens, capped at 512) and 4% long ones
    uniform in [seq_length / 2, 2 * seq_length] (those above seq_length + 1 get truncated by the dataset)."""
    rng = np.random.default_rng([cfg.seed, 1])
    short = np.clip(rng.lognormal(math.log(48), 1.0, cfg.documents), 2, 512).astype(np.int64)
    long = rng.integers(cfg.seq_length // 2, 2 * cfg.seq_length + 1, cfg.documents)
    return np.where(rng.random(cfg.documents) < 0.04, long, short)


def write_corpus(prefix: str | Path, cfg: DemoConfig) -> str:
    """Write ``prefix.bin``/``prefix.idx``: documents from a fixed random bigram chain over ``cfg.vocab`` tokens.

    Each token has 4 likely successors (probability 0.9 shared) and a uniform tail,
    so a model can lower its loss from ln(vocab) towards the chain's entropy.
    """
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng([cfg.seed, 2])
    v = cfg.vocab
    probs = np.full((v, v), 0.1 / v)
    for a in range(v):
        probs[a, rng.choice(v, 4, replace=False)] += 0.9 / 4
    cdf = np.cumsum(probs / probs.sum(1, keepdims=True), axis=1)
    prefix = str(prefix)
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for n in document_lengths(cfg):
        doc = np.empty(int(n), dtype=np.int64)
        doc[0] = rng.integers(v)
        u = rng.random(int(n))
        for i in range(1, int(n)):
            doc[i] = min(int(np.searchsorted(cdf[doc[i - 1]], u[i])), v - 1)
        builder.add_document(doc, [int(n)])
    builder.finalize(prefix + ".idx")
    return prefix


# -- the spawned ranks ---------------------------------------------------------------------


def _bar(i: int, n: int, width: int = 20) -> str:
    """``[#####...............] 5/20``: the progress shown at the start of each step line."""
    done = int(width * i / n)
    return f"[{'#' * done}{'.' * (width - done)}] {i:>{len(str(n))}}/{n}"


def _worker(rank: int, world: int, port: int, cfg: DemoConfig, prefix: str, result_path: str) -> None:
    quiet_third_party_warnings()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        _train(rank, cfg, prefix, result_path)
    finally:
        dist.destroy_process_group()


def _train(rank: int, cfg: DemoConfig, prefix: str, result_path: str) -> None:
    import torch
    import torch.distributed as dist
    from ..planner import ModelShape, PlannerOptions
    from ..planner.setup import build_planning
    from .cpu_support import allreduce_grads, build_gpt, init_parallel_state, megatron_on_cpu, tiny_gpt_config
    from .data.indexed import DocumentDataset
    from .data.iterator import ZeppelinDataIterator
    from .data.plan_worker import PlanWorker
    from .data.sampler import TokenBudgetSampler
    from .groups import zeppelin_group_from_megatron
    from .loss import per_token_loss
    from .metrics import format_step, plan_metrics, step_metrics
    from .spec import get_gpt_layer_zeppelin_spec
    from .step import ZeppelinStep, bind_step, prepare_model

    with megatron_on_cpu():
        init_parallel_state(1)
        group = zeppelin_group_from_megatron(gpus_per_node=cfg.gpus_per_node)
        shape = ModelShape(name="demo", layers=cfg.layers, hidden=cfg.hidden, q_heads=cfg.heads,
                           kv_heads=cfg.kv_heads, ffn=cfg.ffn, vocab=cfg.vocab)
        # NODESxGPUS: H100 link figures (one NIC per GPU up to 8 GPUs per node), the demo's rank capacity
        # (TP 1: one rank per GPU), the bundled H100 profile, default planner options (but cfg.packed).
        planner = build_planning(f"{cfg.nodes}x{cfg.gpus_per_node}", shape, tokens_per_gpu=cfg.capacity,
                                 options=PlannerOptions(packed=cfg.packed))
        dataset = DocumentDataset(prefix=prefix, seq_length=cfg.seq_length)
        sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=cfg.tokens_per_step, seed=cfg.seed)
        config = tiny_gpt_config(num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
                                 num_query_groups=cfg.kv_heads, ffn_hidden_size=cfg.ffn)
        torch.manual_seed(cfg.seed)
        model = build_gpt(config, get_gpt_layer_zeppelin_spec(), vocab_size=cfg.vocab,
                          max_sequence_length=cfg.seq_length)
        init_state = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        prepare_model(model)
        optim = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        if rank == 0:
            print(f"zeppelin demo: {cfg.nodes} nodes x {cfg.gpus_per_node} ranks (gloo, CPU), "
                  f"{dataset.describe()}", flush=True)
            print(f"model: GPT {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads ({cfg.kv_heads} KV), "
                  f"vocab {cfg.vocab}; {cfg.tokens_per_step} tokens per step, {cfg.capacity} tokens per rank",
                  flush=True)

        steps: list[dict[str, Any]] = []
        # planned in a worker process, as training plans by default (--zeppelin-plan-worker; closed with the iterator)
        with ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=PlanWorker(planner),
                                  rank=group.rank) as it:
            for i in range(cfg.steps):
                t0 = time.perf_counter()
                batch = next(it)
                bind_step(model, ZeppelinStep(plan=batch.plan, group=group, position_ids=batch.position_ids[0],
                                              real_tokens=batch.real_tokens))
                out = model(batch.tokens, batch.position_ids, None, labels=batch.labels)  # [1, T] token losses
                loss_sum, _ = per_token_loss(out, batch.loss_mask)
                (loss_sum / batch.global_tokens).backward()
                allreduce_grads(model, group.pg)
                optim.step()
                optim.zero_grad(set_to_none=True)
                stats = torch.tensor([float(loss_sum.detach()), time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(stats[:1], group=group.pg)
                dist.all_reduce(stats[1:], op=dist.ReduceOp.MAX, group=group.pg)
                # The plan's figures are cost-model predictions for H100s; the time is this CPU's.
                m = step_metrics(i + 1, [plan_metrics(batch.plan)])
                steps.append(dict(step=i + 1, loss=float(stats[0]) / batch.global_tokens,
                                  seq_ids=[int(x) for x in batch.seq_ids], tokens=batch.global_tokens,
                                  cpu_step_s=float(stats[1]), metrics=asdict(m)))
                if rank == 0:
                    detail = format_step(m).split(" | ", 1)[1].replace(", measured n/a", "")
                    print(f"{_bar(i + 1, cfg.steps)} | zeppelin loss {steps[-1]['loss']:.5f} | "
                          f"CPU step {float(stats[1]):.2f} s | {detail}", flush=True)

        if cfg.compare_baseline:
            _baseline(rank, cfg, group, dataset, steps, config, init_state)
        if rank == 0:
            Path(result_path).write_text(json.dumps(dict(config=asdict(cfg), steps=steps), indent=1))


def _baseline(rank: int, cfg: DemoConfig, group: Any, dataset: Any, steps: list[dict[str, Any]], config: Any,
              init_state: dict[str, Any]) -> None:
    """The same steps as plain data parallelism: whole documents per rank, Megatron's own attention."""
    import torch
    import torch.distributed as dist
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from .cpu_support import allreduce_grads, build_gpt, causal_mask
    from .loss import per_token_loss

    model = build_gpt(config, get_gpt_layer_local_spec(), vocab_size=cfg.vocab, max_sequence_length=cfg.seq_length)
    model.load_state_dict(init_state, strict=False)
    optim = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for rec in steps:
        # Longest-first onto the least-loaded rank (ties: lower rank), the usual token packing.
        load = [0] * group.size
        mine: list[int] = []
        for s in sorted(rec["seq_ids"], key=lambda s: (-int(dataset.lengths[s]), s)):
            r = min(range(group.size), key=lambda r: (load[r], r))
            load[r] += int(dataset.lengths[s])
            if r == group.rank:
                mine.append(s)
        loss_sum = torch.zeros(())
        for s in mine:
            n = int(dataset.lengths[s])
            tokens, labels = (torch.as_tensor(a, dtype=torch.long)[None] for a in dataset.read(s, 0, n))
            out = model(tokens, torch.arange(n)[None], causal_mask(n), labels=labels)
            part, _ = per_token_loss(out, torch.ones_like(out))
            (part / rec["tokens"]).backward()
            loss_sum += part.detach()
        allreduce_grads(model, group.pg)
        optim.step()
        optim.zero_grad(set_to_none=True)
        dist.all_reduce(loss_sum, group=group.pg)
        rec["baseline_loss"] = float(loss_sum) / rec["tokens"]
        rec["loss_diff"] = rec["loss"] - rec["baseline_loss"]
        if rank == 0:
            print(f"{_bar(rec['step'], cfg.steps)} | data-parallel loss {rec['baseline_loss']:.5f} | "
                  f"zeppelin - baseline = {rec['loss_diff']:+.2e}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Write the corpus, spawn ``cfg.world`` gloo ranks, train; returns the per-step record of rank 0."""
    quiet_third_party_warnings()
    import torch.multiprocessing as mp

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    prefix = write_corpus(out / "corpus", cfg)
    print(f"corpus: {cfg.documents} documents in {prefix}.bin/.idx ({time.perf_counter() - t0:.1f} s); starting "
          f"{cfg.world} ranks (each imports torch and megatron-core first)", flush=True)
    result = out / "demo.json"
    if result.exists():
        result.unlink()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    mp.spawn(_worker, args=(cfg.world, _free_port(), cfg, prefix, str(result)), nprocs=cfg.world, join=True)
    doc = json.loads(result.read_text())
    losses = [s["loss"] for s in doc["steps"]]
    print(f"\nzeppelin: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
    if cfg.compare_baseline:
        worst = max(abs(s["loss_diff"]) for s in doc["steps"])
        print(f"baseline (plain data parallelism, same batches, same initial weights): "
              f"max |loss difference| {worst:.2e} over {len(losses)} steps")
    print(f"wrote {result}")
    return doc
