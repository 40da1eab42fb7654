"""Simulator, baselines and length sources (pure: numpy, scipy and the standard library)."""

from .strategies import BOUND_NAMES, STRATEGY_NAMES, StrategyPlan, plan_with

__all__ = ["BOUND_NAMES", "STRATEGY_NAMES", "StrategyPlan", "plan_with"]
