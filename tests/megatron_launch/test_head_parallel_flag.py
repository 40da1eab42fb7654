"""``--zeppelin-head-parallel {on,off}`` -> ``PlannerOptions.head_parallel``; ``zeppelin plan --no-head-parallel``."""

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
    assert zeppelin_config_from_args(_parse(base)).options.head_parallel is True
    assert PlannerOptions().head_parallel is True  # the flag's default is the planner's
    off = zeppelin_config_from_args(_parse(base + ["--zeppelin-head-parallel", "off"]))
    assert off.options == PlannerOptions(head_parallel=False)
    assert zeppelin_config_from_args(_parse(base + ["--zeppelin-head-parallel", "on"])).options.head_parallel


def test_bad_values_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse's choices
        _parse(["--zeppelin", "--zeppelin-head-parallel", "maybe"])
    assert "--zeppelin-head-parallel" in capsys.readouterr().err
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-head-parallel yes: expected on or off"):
        planner_options_from_args(megatron_namespace(zeppelin_head_parallel="yes"))
    # a namespace without the attribute (an older caller) gets the planner's default
    assert planner_options_from_args(megatron_namespace()).head_parallel is True


def test_planner_options_validates_head_parallel() -> None:
    from zeppelin_megatron.planner import PlanError
    with pytest.raises(PlanError, match="head_parallel is 1, expected True or False"):
        PlannerOptions(head_parallel=1)  # type: ignore[arg-type]


def test_plan_command_flag(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from zeppelin_megatron.cli import main
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("30000\n1000\n800\n")  # one node of 8: the 30k document as Ulysses over all 8
    argv = ["plan", "--lengths", str(lengths), "--cluster", "1x8"]
    assert main(argv) == 0
    assert "rings: 1 (0 plain, 1 Ulysses, 0 head-parallel hybrid; block widths [8])" in capsys.readouterr().out
    assert main(argv + ["--no-head-parallel"]) == 0
    assert "rings: 1 (1 plain, 0 Ulysses, 0 head-parallel hybrid; block widths [])" in capsys.readouterr().out


def test_simulate_flag_maps_the_zeppelin_strategy() -> None:
    from zeppelin_megatron.commands.simulate import no_head_parallel
    assert no_head_parallel(["zeppelin", "te-cp"]) == ["zeppelin-no-head-parallel", "te-cp"]
    assert no_head_parallel(["zeppelin", "zeppelin-no-head-parallel"]) == ["zeppelin-no-head-parallel"]
    with pytest.raises(ValueError, match="--no-head-parallel applies to the zeppelin strategy only"):
        no_head_parallel(["zeppelin", "zeppelin-no-routing"])
