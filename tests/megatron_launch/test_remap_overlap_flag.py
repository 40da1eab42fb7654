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


@pytest.mark.parametrize("field,default", [("grouped", False), ("packed", True), ("packed_rerank", False)])
def test_candidate_flags(field: str, default: bool) -> None:
    """``--zeppelin-grouped {on,off}`` / ``--zeppelin-packed {on,off}`` / ``--zeppelin-packed-rerank {on,off}`` ->
    ``PlannerOptions.grouped`` / ``.packed`` / ``.packed_rerank`` (defaults the planner's: grouped off, packed on,
    post-trade ranking off)."""
    base, flag = ["--zeppelin", "--zeppelin-cluster", "2x8"], f"--zeppelin-{field.replace('_', '-')}"
    assert getattr(zeppelin_config_from_args(_parse(base)).options, field) is getattr(PlannerOptions(), field) \
        is default
    flipped = "off" if default else "on"
    assert zeppelin_config_from_args(_parse(base + [flag, flipped])).options == PlannerOptions(**{field: not default})
    with pytest.raises(ZeppelinArgsError, match=f"{flag} 1: expected on or off"):
        planner_options_from_args(megatron_namespace(**{f"zeppelin_{field}": "1"}))
    assert getattr(planner_options_from_args(megatron_namespace()), field) is default  # an older caller
