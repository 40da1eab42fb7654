"""Pure planning side: cluster, cost model, partitioner, layouts, routing, plans.

Nothing here imports torch or torch.distributed: planning takes integers and
lists and returns frozen dataclasses that the runtime executes.
"""

from .api import check_lengths, plan_step
from .cluster import Cluster, ClusterError, load_cluster
from .cost_model import CostModel
from .model import ModelError, ModelShape, load_model
from .options import PlannerOptions
from .plan import PLACEMENTS, PLAN_SCHEMA, PlanError, Prediction, Ring, SequencePlan, StepPlan
from .profile import CostProfile, ProfileError, default_profile, load_profile
from .routing import Route, split_counts

__all__ = [
    "Cluster", "ClusterError", "CostModel", "CostProfile", "ModelError", "ModelShape", "PLACEMENTS", "PlannerOptions",
    "PLAN_SCHEMA", "PlanError", "Prediction", "ProfileError", "Ring", "Route", "SequencePlan", "StepPlan",
    "check_lengths", "default_profile", "load_cluster", "load_model", "load_profile", "plan_step", "split_counts",
]
