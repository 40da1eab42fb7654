"""``--zeppelin-remap-overlap {on,off}`` -> ``PlannerOptions.remap_overlap``."""

from __future__ import annotations

import argparse

import pytest

from zeppelin_megatron.megatron.arguments import (
    PlannerOptions, ZeppelinArgsError, add_zeppelin_args, planner_options_from_args, zeppelin_config_from_args,
)

from .helpers import megatron_namespace


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_zeppelin_args(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)


def test_default_on_and_off() -> None:
    base = ["--zeppelin", "--zeppelin-cluster", "2x8"]
    assert zeppelin_config_from_args(_parse(base)).options.remap_overlap is True
    assert PlannerOptions().remap_overlap is True  # the flag's default is the planner's
    off = zeppelin_config_from_args(_parse(base + ["--zeppelin-remap-overlap", "off"]))
    assert off.options == PlannerOptions(remap_overlap=False)
    on = zeppelin_config_from_args(_parse(base + ["--zeppelin-remap-overlap", "on"]))
    assert on.options == PlannerOptions(remap_overlap=True)
    # independent of the head-parallel flag
    both = zeppelin_config_from_args(_parse(base + ["--zeppelin-remap-overlap", "off",
                                                    "--zeppelin-head-parallel", "off"]))
    assert both.options == PlannerOptions(remap_overlap=False, head_parallel=False)


def test_bad_values_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse's choices
        _parse(["--zeppelin", "--zeppelin-remap-overlap", "maybe"])
    assert "--zeppelin-remap-overlap" in capsys.readouterr().err
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-remap-overlap yes: expected on or off"):
        planner_options_from_args(megatron_namespace(zeppelin_remap_overlap="yes"))
    # a namespace without the attribute (an older caller) gets the planner's default
    assert planner_options_from_args(megatron_namespace()).remap_overlap is True
    assert planner_options_from_args(megatron_namespace(zeppelin_remap_overlap="off")).remap_overlap is False


def test_planner_options_validates_remap_overlap() -> None:
    from zeppelin_megatron.planner import PlanError
    with pytest.raises(PlanError, match="remap_overlap is 1, expected True or False"):
        PlannerOptions(remap_overlap=1)  # type: ignore[arg-type]


def test_grouped_flag() -> None:
    """``--zeppelin-grouped {on,off}`` -> ``PlannerOptions.grouped`` (default the planner's: off)."""
    base = ["--zeppelin", "--zeppelin-cluster", "2x8"]
    assert zeppelin_config_from_args(_parse(base)).options.grouped is PlannerOptions().grouped is False
    assert zeppelin_config_from_args(_parse(base + ["--zeppelin-grouped", "on"])).options == \
        PlannerOptions(grouped=True)
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-grouped 1: expected on or off"):
        planner_options_from_args(megatron_namespace(zeppelin_grouped="1"))


def test_packed_flag() -> None:
    """``--zeppelin-packed {on,off}`` -> ``PlannerOptions.packed`` (default the planner's: on)."""
    base = ["--zeppelin", "--zeppelin-cluster", "2x8"]
    assert zeppelin_config_from_args(_parse(base)).options.packed is PlannerOptions().packed is True
    assert zeppelin_config_from_args(_parse(base + ["--zeppelin-packed", "off"])).options == \
        PlannerOptions(packed=False)
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-packed no: expected on or off"):
        planner_options_from_args(megatron_namespace(zeppelin_packed="no"))
    assert planner_options_from_args(megatron_namespace()).packed is True  # an older caller: the default
