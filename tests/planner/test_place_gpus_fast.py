"""Level 2 places a length no ring takes whole rounds at a time past the node's target too.

:func:`~zeppelin_megatron.planner.place_gpus.never_split` says :func:`pick_ring` would return
``None`` for a length whatever the loads; such sequences go to the least loaded GPU over the
target as under it, so :func:`place_node` takes whole rounds of them with no load limit and
skips the ring search one by one. Both must give what the plain one-by-one path gives.
"""

from __future__ import annotations

import math
import random

import pytest

from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner import partition as partition_mod
from zeppelin_megatron.planner import place_gpus as place_gpus_mod
from zeppelin_megatron.planner.even_rounds import even_rounds
from zeppelin_megatron.planner.partition import PartitionContext, partition
from zeppelin_megatron.planner.place_gpus import never_split, pick_ring

from .conftest import make_cost


def _batch(seed: int) -> list[int]:
    rng = random.Random(seed)
    lengths = [1] * rng.randrange(2000, 9000) + [2] * rng.randrange(2000, 9000) + [7] * rng.randrange(2000, 9000)
    lengths += [rng.randrange(10_000, 60_000) for _ in range(rng.randrange(1, 4))]
    rng.shuffle(lengths)
    return lengths


@pytest.mark.parametrize("spec, lengths", [
    ("2x8", _batch(0)),
    ("2x8", _batch(1)),
    ("4x8", _batch(2)),
    ("1x8", _batch(3)),
    ("2x4", [3] * 5000 + [5] * 3000 + [40_000]),
])
def test_partition_same_as_plain_level_2(monkeypatch: pytest.MonkeyPatch, spec: str, lengths: list[int]) -> None:
    past_target: list[int] = []

    def counting(*args, **kw):  # type: ignore[no-untyped-def]
        got = even_rounds(*args, **kw)
        if kw.get("load_limit") == math.inf:
            past_target.append(got[1])
        return got

    with monkeypatch.context() as m:
        m.setattr(place_gpus_mod, "even_rounds", counting)
        fast = partition(lengths, make_cost(spec), PlannerOptions())
    with monkeypatch.context() as m:
        none = lambda loads, *a, **k: ([], 0, list(loads))  # noqa: E731
        m.setattr(partition_mod, "even_rounds", none)
        m.setattr(place_gpus_mod, "even_rounds", none)
        m.setattr(place_gpus_mod, "never_split", lambda *a: False)
        plain = partition(lengths, make_cost(spec), PlannerOptions())
    assert fast == plain
    assert any(past_target)  # whole rounds placed with no load limit


def test_never_split_agrees_with_pick_ring() -> None:
    """Where ``never_split`` is True, ``pick_ring`` (not forced) returns None for any loads."""
    rng = random.Random(4)
    ctx = PartitionContext([1], make_cost("1x8"), PlannerOptions())
    said = []
    for s in list(range(1, 300)) + [rng.randrange(300, 70_000) for _ in range(100)]:
        for whole_node in (False, True):
            never = never_split(ctx, s, 8, whole_node)
            said.append(never)
            for _ in range(5):
                load = [rng.uniform(0, 50) for _ in range(8)]
                tok = [rng.randrange(0, 30_000) for _ in range(8)]
                by_load = sorted(range(8), key=lambda l: (load[l], l))
                got = pick_ring(ctx, s, by_load, load, tok, rng.uniform(0, 80), force=False, whole_node=whole_node)
                if never:
                    assert got is None, (s, whole_node)
    assert any(said) and not all(said)  # both answers exercised
