"""zeppelin_megatron: Zeppelin (arXiv 2509.21841) for Megatron-LM GPT pretraining."""

from .planner import (
    Cluster,
    CostModel,
    ModelShape,
    PlanError,
    StepPlan,
    load_cluster,
    load_model,
    load_profile,
    plan_step,
)

__version__ = "0.1.0"

__all__ = [
    "Cluster", "CostModel", "ModelShape", "PlanError", "StepPlan", "load_cluster", "load_model",
    "load_profile", "plan_step", "__version__",
]
