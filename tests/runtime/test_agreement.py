"""The start-of-call check and the Zeppelin timeout, on gloo ranks (CPU).

* every field ranks must agree on (plan, softmax scale, Hq, Hkv, head dim, dtype,
  routing, check setting, autograd state, kernel, device) differing on one rank:
  every rank raises, naming the field and that rank (world 2: 1x2; world 4: 2x2;
  world 3: 1x3);
* a rank that raises and stays alive, before the call or inside it: the others
  raise ZeppelinTimeoutError within the group's timeout (3 s here), naming the step
  and the peers; a point-to-point wait names the step, direction and peer;
* the Megatron core attention: the first layer always checks, the setting adds the
  others, and the setting is sent to the check.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

import agreement_workers
from dist_harness import spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_disagreements_world_2() -> None:
    spawn(2, agreement_workers.run_agreement, 2, 0)


def test_disagreements_world_4() -> None:
    spawn(4, agreement_workers.run_agreement, 2, 1)


def test_disagreements_world_3() -> None:
    spawn(3, agreement_workers.run_agreement, 3, 2)


def test_failed_rank_that_stays_alive_world_2() -> None:
    spawn(2, agreement_workers.run_timeouts, 3.0)


def test_failed_rank_that_stays_alive_world_3() -> None:
    spawn(3, agreement_workers.run_timeouts, 3.0)


def test_peer_that_exits_world_2() -> None:
    """A peer process that is gone: ZeppelinCommError at once (closed connection), not the timeout."""
    spawn(2, agreement_workers.run_dead_peer)


@pytest.mark.parametrize("setting", [True, False])
def test_megatron_layers_check_on_a_shared_schedule(setting: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """First Zeppelin layer: always checks; the others: only with the setting on; the setting is sent along."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer.enums import AttnMaskType

    from zeppelin_megatron.megatron import attention as matt
    from zeppelin_megatron.megatron.cpu_support import tiny_gpt_config
    from zeppelin_megatron.megatron.step import bind_step, prepare_model

    calls: list[tuple[bool, bool | None]] = []

    def recording(q, k, v, plan, group, scale, **kw):  # type: ignore[no-untyped-def]
        calls.append((kw["check_plan"], kw["check_setting"]))
        return torch.zeros_like(q)

    monkeypatch.setattr(matt, "zeppelin_attention", recording)
    config = tiny_gpt_config()
    layers = torch.nn.Sequential(*(matt.ZeppelinCoreAttention(config, i + 1, AttnMaskType.causal, "self")
                                   for i in range(3)))
    prepare_model(layers)

    class Step:  # what ZeppelinCoreAttention reads from a bound ZeppelinStep
        plan, group, backend, routing, check_plan, real_tokens = object(), object(), None, True, setting, 5

    bind_step(layers, Step())  # type: ignore[arg-type]
    x = torch.zeros(5, 1, 2, 16)
    for layer in layers:
        layer(x, x, x, None)
    assert calls == [(True, setting), (setting, setting), (setting, setting)]


def test_zeppelin_timeout_flag() -> None:
    import argparse

    from zeppelin_megatron.megatron.arguments import (
        DEFAULT_TIMEOUT_S,
        ZeppelinArgsError,
        add_zeppelin_args,
        zeppelin_config_from_args,
    )
    from zeppelin_megatron.runtime import DEFAULT_TIMEOUT_S as RUNTIME_DEFAULT

    assert DEFAULT_TIMEOUT_S == RUNTIME_DEFAULT == 300.0
    parser = add_zeppelin_args(argparse.ArgumentParser())
    base = ["--zeppelin", "--zeppelin-cluster", "1x2"]
    assert zeppelin_config_from_args(parser.parse_args(base)).timeout == 300.0
    assert zeppelin_config_from_args(parser.parse_args([*base, "--zeppelin-timeout", "7.5"])).timeout == 7.5
    for bad in ("0", "-3", "inf", "nan"):
        msg = f"--zeppelin-timeout must be a positive number of seconds, got {bad}"
        with pytest.raises(ZeppelinArgsError, match=msg):
            zeppelin_config_from_args(parser.parse_args([*base, "--zeppelin-timeout", bad]))
