from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, load_cluster, load_model


def make_cost(spec: str, *, tokens_per_gpu: int | None = None, model: str | None = None) -> CostModel:
    cluster = load_cluster(spec, tokens_per_gpu=tokens_per_gpu)
    return CostModel(model=load_model(model), cluster=cluster)


@pytest.fixture(scope="session")
def cost_4x8() -> CostModel:
    return make_cost("4x8")
