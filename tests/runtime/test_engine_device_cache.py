"""The engine's lowered program and device-side indices are built once per plan, not once per layer."""

from __future__ import annotations

import torch

from plan_factory import random_plan
from zeppelin_megatron.planner.lowering import RingCall, lower_rank
from zeppelin_megatron.runtime.engine import cached_program, device_program


def test_device_program_is_built_once_per_plan_and_matches_the_lowered_program() -> None:
    cpu = torch.device("cpu")
    plan = random_plan(11, 2, 4)
    for rank in range(plan.world_size):
        dev = device_program(plan, rank, True, 12, cpu)
        assert device_program(plan, rank, True, 12, cpu) is dev  # no rebuild for a second layer
        assert cached_program(plan, rank, True) is dev.program
        prog = lower_rank(plan, rank)
        assert dev.program == prog
        assert {k: r.tolist() for k, r in dev.rows.items()} == {
            p.ring: list(p.rows) for p in prog.rings if p.position is not None}
        assert [(r.tolist(), b.lens_q, b.lens_k, b.causal) for r, b in dev.local] == [
            (list(c.rows), c.lens, c.lens, True) for c in prog.local_chunks]
        for op in prog.forward:
            if isinstance(op, RingCall):
                idx = dev.steps[(op.ring, op.step)]
                assert (idx.batch.lens_q, idx.batch.lens_k, idx.batch.causal) == (op.lens_q, op.lens_k, op.causal)
                q_rows = list(range(len(prog.rings[[p.ring for p in prog.rings].index(op.ring)].rows)))
                assert (idx.q_index.tolist() if idx.q_index is not None else q_rows) == list(op.q_rows)
        for tid, wire in dev.wires.items():
            t = prog.transfers[tid]
            assert wire.sizes == tuple(m.tokens * 12 for m in t.messages)
            assert [h for r in wire.rounds for h in r] == [h for h in t.hops(12) if rank in (h.sender, h.receiver)]
    assert device_program(plan, 0, False, 12, cpu) is not device_program(plan, 0, True, 12, cpu)
